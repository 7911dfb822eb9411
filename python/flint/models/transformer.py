"""The decoder stack shared by every family: embed -> layers -> norm -> lm_head."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from flint.models.attention import Attention, causal_mask
from flint.models.config import ModelConfig
from flint.models.kv_cache import KVCache
from flint.models.loading import Placement
from flint.models.mlp import DenseMLP
from flint.models.moe import ExpertBackend, MoEBlock
from flint.models.norm import rms_norm
from flint.models.rope import cos_sin_tables
from flint.models.weights import WeightSource

# T = new tokens, H = hidden, V = vocabulary, S = context length, D = head dim


class DecoderLayer:
    """Pre-norm attention then pre-norm MLP (MoE or dense), each with a residual add."""

    def __init__(
        self,
        config: ModelConfig,
        layer: int,
        source: WeightSource,
        place: Placement,
        backend: ExpertBackend,
    ) -> None:
        p = f"model.layers.{layer}."
        self.index, self.eps = layer, config.rms_norm_eps
        # Called with the MoE input (residual after attention) when set: the streaming
        # backend's router lookahead.
        self.observe: Callable[[int, torch.Tensor], None] | None = None
        self.input_norm = place.load(source, p + "input_layernorm.weight")
        self.post_norm = place.load(source, p + "post_attention_layernorm.weight")
        self.attn = Attention(config, layer, source, place)
        self.mlp: Callable[[torch.Tensor], torch.Tensor]
        if config.sparse_layers[layer]:
            self.mlp = MoEBlock(config, layer, source, place, backend)
        else:
            self.mlp = DenseMLP(source, p + "mlp", place)

    def __call__(
        self,
        x: torch.Tensor,  # [T, H]
        start: int,
        cache: KVCache,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor | None,
    ) -> torch.Tensor:
        h = x + self.attn(rms_norm(x, self.input_norm, self.eps), start, cache, cos, sin, mask)
        if self.observe is not None:
            self.observe(self.index, h)
        return h + self.mlp(rms_norm(h, self.post_norm, self.eps))


class MoEModel:
    """A causal MoE language model for one sequence, with its own KV cache."""

    def __init__(
        self,
        config: ModelConfig,
        source: WeightSource,
        place: Placement,
        backend: ExpertBackend,
        context_length: int,
    ) -> None:
        if context_length < 1:
            raise ValueError(f"context_length must be >= 1, got {context_length}")
        self.config, self.place = config, place
        self.embed = place.load(source, "model.embed_tokens.weight")  # [V, H]
        self.norm = place.load(source, "model.norm.weight")
        head = place.load_optional(source, "lm_head.weight")
        if head is None and not config.tie_word_embeddings:
            raise ValueError("checkpoint has no lm_head.weight and does not tie embeddings")
        self.lm_head = self.embed if head is None else head  # [V, H]
        self.layers = [
            DecoderLayer(config, i, source, place, backend) for i in range(config.num_layers)
        ]
        self.cos, self.sin = cos_sin_tables(config, context_length, place.dtype, place.device)
        self.cache = KVCache(
            config.num_layers,
            config.num_kv_heads,
            context_length,
            config.head_dim,
            place.dtype,
            place.device,
        )

    @property
    def context_length(self) -> int:
        return self.cache.context_length

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, all_logits: bool = False) -> torch.Tensor:
        """Runs ids [T] after the cached positions; returns logits [T, V] (fp32) when
        ``all_logits`` else [1, V] for the last token only. Advances the cache by T."""
        start, tokens = self.cache.length, ids.shape[0]
        if tokens == 0:
            raise ValueError("forward needs at least one token")
        if start + tokens > self.context_length:
            raise ValueError(
                f"{start + tokens} positions exceed the context length {self.context_length}"
            )
        x = self.embed[ids.to(self.place.device)]  # [T, H]
        cos, sin = self.cos[start : start + tokens], self.sin[start : start + tokens]  # [T, D]
        mask = causal_mask(start, tokens, x.device)  # [T, S] or None
        for layer in self.layers:
            x = layer(x, start, self.cache, cos, sin, mask)
        self.cache.length = start + tokens
        if not all_logits:
            x = x[-1:]
        return F.linear(rms_norm(x, self.norm, self.config.rms_norm_eps), self.lm_head).float()

    def reset(self, length: int = 0) -> None:
        """Keeps the first ``length`` cached positions (0: start a new sequence)."""
        self.cache.reset(length)
