"""The decoder stack shared by every family: embed -> layers -> norm -> lm_head."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from flint.models.attention import (
    LINEAR_MEMORY,
    Attention,
    causal_mask,
    linear_memory,
    whole_prompt_attention,
)
from flint.models.config import ModelConfig
from flint.models.kv_cache import KVCache, split_cache
from flint.models.loading import Placement
from flint.models.mla import LatentAttention, latent_cache
from flint.models.mlp import DenseMLP
from flint.models.moe import ExpertBackend, MoEBlock
from flint.models.norm import norm_for
from flint.models.qwen3_next import GatedAttention, GatedDeltaNet, LinearStates, cache_slots
from flint.models.rope import cos_sin_tables
from flint.models.sink_attention import SinkAttention
from flint.models.weights import WeightSource

# T = new tokens, H = hidden, V = vocabulary, S = context length, D = head dim,
# C = tokens per chunk

ATTENTION_CHUNK = 512  # query rows per attention / dense-MLP call in a long forward
# SDPA's errors where no allowed backend applies (CUDA's kernel check, its dispatcher)
NO_KERNEL = ("No available kernel", "No viable backend")


def by_rows(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, rows: int) -> torch.Tensor:
    """``fn`` (row-wise) over x [T, H] in pieces of at most ``rows`` rows: bounds the
    intermediates of a long prompt; one call when x is short."""
    if x.shape[0] <= rows:
        return fn(x)
    return torch.cat([fn(x[s : s + rows]) for s in range(0, x.shape[0], rows)])


class DecoderLayer:
    """Pre-norm attention then pre-norm MLP (MoE or dense), each with a residual add."""

    def __init__(
        self,
        config: ModelConfig,
        layer: int,
        source: WeightSource,
        place: Placement,
        backend: ExpertBackend,
        slots: tuple[int, int] | None = None,
        states: LinearStates | None = None,
    ) -> None:
        """``slots``: the layer's KV cache slot and linear-attention state slot (-1:
        not that kind; None: KV slot = layer index); ``states``: the model's
        linear-attention states (Qwen3-Next)."""
        p = f"model.layers.{layer}."
        self.index, self.eps = layer, config.rms_norm_eps
        self.device = place.device  # with layers split across GPUs: this layer's
        self.norm = norm_for(config)
        # Called with the MoE input (residual after attention) when set: the streaming
        # backend's router lookahead.
        self.observe: Callable[[int, torch.Tensor], None] | None = None
        # Called with the layer's output (residual after the MLP) when set: lookahead
        # from the output instead (later, but closer to the next layers' inputs).
        self.observe_output: Callable[[int, torch.Tensor], None] | None = None
        self.input_norm = place.load(source, p + "input_layernorm.weight")
        self.post_norm = place.load(source, p + "post_attention_layernorm.weight")
        # what post_norm multiplies the normalised input by (router lookahead folds it in)
        self.post_scale = 1.0 + self.post_norm if config.norm_offset else self.post_norm
        kv_slot, state_slot = slots if slots is not None else (layer, -1)
        self.attn: Attention | LatentAttention | GatedAttention | GatedDeltaNet
        if state_slot >= 0:
            assert states is not None
            self.attn = GatedDeltaNet(config, layer, state_slot, source, place, states)
        elif config.attn_output_gate:
            self.attn = GatedAttention(config, layer, kv_slot, source, place)
        elif config.mla is not None:
            self.attn = LatentAttention(config, layer, source, place)
        elif config.attention_sinks:
            self.attn = SinkAttention(config, layer, source, place)
        else:
            self.attn = Attention(config, layer, source, place)
        # a prompt's attention in one call on CUDA (``_whole``): the plain attention only
        self.whole_ok = type(self.attn) is Attention
        self.failed: set[SDPBackend] = set()  # SDPA backends that raised for this layer
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
        cos: torch.Tensor,  # [T, D]
        sin: torch.Tensor,  # [T, D]
        chunk: int,
    ) -> torch.Tensor:
        """Layer-major: attention runs over the T tokens in chunks of ``chunk`` queries
        (each chunk sees the keys of the chunks before it, already in the cache); the
        MoE routes and computes all T tokens in one call, so the backend meets each
        selected expert once for the whole forward."""
        tokens = x.shape[0]
        h = self._whole(x, start, cache, cos, sin, chunk) if self.whole_ok else None
        if h is None:
            h = torch.empty_like(x)  # [T, H]
            for s in range(0, tokens, chunk):
                e = min(tokens, s + chunk)
                h[s:e] = self._attend(x[s:e], start + s, cache, cos[s:e], sin[s:e])
        if self.observe is not None:
            self.observe(self.index, h)
        normed = self.norm(h, self.post_norm, self.eps)  # [T, H]
        if isinstance(self.mlp, MoEBlock):
            out = h + self.mlp(normed, chunk)
        else:
            out = h + by_rows(self.mlp, normed, chunk)
        if self.observe_output is not None:
            self.observe_output(self.index, out)
        return out

    def _whole(
        self,
        x: torch.Tensor,  # [T, H]
        start: int,
        cache: KVCache,
        cos: torch.Tensor,  # [T, D]
        sin: torch.Tensor,  # [T, D]
        chunk: int,
    ) -> torch.Tensor | None:
        """The residual after attention [T, H] from one call over every query
        (``whole_prompt_attention``), or None: attention goes by chunks. Where SDPA has
        no linear-memory kernel for the layer (dtype, head size) it says so
        (``NO_KERNEL``); the layer then keeps the chunks from now on (they rewrite the
        keys and values written). An error from cuDNN's kernel drops cuDNN for the
        layer and tries again (the same keys and values rewritten). Any other error,
        out-of-memory included, is raised as it is."""
        tokens = x.shape[0]
        cfg = self.attn.cfg  # type: ignore[union-attr]
        if not whole_prompt_attention(cfg, tokens, start + tokens, chunk, x.device, x.dtype):
            return None
        while True:
            backends = [b for b in linear_memory(LINEAR_MEMORY) if b not in self.failed]
            try:
                with sdpa_kernel(backends, set_priority=True):
                    return self._attend(x, start, cache, cos, sin)
            except RuntimeError as err:
                if isinstance(err, torch.OutOfMemoryError):
                    raise
                if SDPBackend.CUDNN_ATTENTION in backends and "cudnn" in str(err).lower():
                    self.failed.add(SDPBackend.CUDNN_ATTENTION)
                    continue
                if not any(m in str(err) for m in NO_KERNEL):
                    raise
                self.whole_ok = False
                return None

    def _attend(
        self,
        x: torch.Tensor,  # [C, H]: rows at positions start..start+C-1
        start: int,
        cache: KVCache,
        cos: torch.Tensor,  # [C, D]
        sin: torch.Tensor,  # [C, D]
    ) -> torch.Tensor:
        """``x`` plus the attention of its normed rows over the cache and themselves
        (causal; the rows' keys and values written): a chunk's, or a whole prompt's."""
        xs = self.norm(x, self.input_norm, self.eps)
        mask = causal_mask(start, x.shape[0], x.device)  # [C, start+C] or None
        return x + self.attn(xs, start, cache, cos, sin, mask)


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
        self.config, self.place, self.experts = config, place, backend
        # Bytes a prompt's activations may take (None: a share of free memory), see
        # flint.models.prefill.
        self.activation_budget: int | None = None
        # Set by a streamed backend: lends RAM cache memory (bytes asked -> bytes given)
        # to a prompt whose activations would not fit beside the cache.
        self.prompt_memory: Callable[[int], int] | None = None
        # With layers split across GPUs (``place.layers``): each layer with its KV cache
        # slots (and linear-attention states) on its own GPU; the embedding, final norm
        # and LM head on the first, so logits come back where the caller's tensors are
        # (the hidden state hops back once per forward: [T, H], not [T, V] logits).
        if place.layers and len(place.layers) != config.num_layers:
            raise ValueError(f"{len(place.layers)} layer devices for {config.num_layers} layers")
        self.embed = place.load(source, "model.embed_tokens.weight")  # [V, H]
        self.norm = place.load(source, "model.norm.weight")
        head = place.load_optional(source, "lm_head.weight")
        if head is None and not config.tie_word_embeddings:
            raise ValueError("checkpoint has no lm_head.weight and does not tie embeddings")
        self.lm_head = self.embed if head is None else head  # [V, H]
        # Qwen3-Next: KV cache slots for the full-attention layers only, and the
        # recurrent states of the linear-attention layers
        kv_slots, state_slots = cache_slots(config)
        layer_devices = [place.at(i).device for i in range(config.num_layers)]
        self.states = (
            LinearStates(
                config,
                place,
                [d for d, s in zip(layer_devices, state_slots, strict=True) if s >= 0],
            )
            if config.linear_attention
            else None
        )
        self.layers = [
            DecoderLayer(
                config,
                i,
                source,
                place.at(i),
                backend,
                (kv_slots[i], state_slots[i]),
                self.states,
            )
            for i in range(config.num_layers)
        ]
        self.final_norm = norm_for(config)
        # Decodes one token (ids [1], position) -> logits [1, V] into this model's KV
        # cache, replacing the layer loop below for that case: the Rust CPU decode step
        # (flint.models.cpu_decode, set by load_model where it applies) or the CUDA graph
        # step (flint.graphs, set by flint.LLM).
        self.decoder: Callable[[torch.Tensor, int], torch.Tensor] | None = None
        # Token ids after which the linear-attention states are checkpointed (set from
        # the tokenizer; see flint.models.qwen3_next.ANCHOR_TOKENS)
        self.anchor_tokens: frozenset[int] = frozenset()
        # DeepSeek-V2 rotates in fp32 with fp32 tables; the others in the model's dtype
        pairs = config.mla is not None and config.mla.rope_pairs_kept
        rope_dtype = torch.float32 if pairs else place.dtype
        self.cos, self.sin = cos_sin_tables(config, context_length, rope_dtype, place.device)
        # the same tables on every other device of a split (copies: the same values)
        self.split = len(place.devices) > 1  # layers on several devices: hops in forward
        self.rope = {d: (self.cos.to(d), self.sin.to(d)) for d in (place.device, *place.devices)}
        mla = config.mla

        def part(slots: int, device: torch.device) -> KVCache:
            if mla is not None:
                return latent_cache(
                    config, mla, context_length, Placement(device, place.dtype), slots
                )
            return KVCache(
                slots, config.num_kv_heads, context_length, config.head_dim, place.dtype, device
            )

        self.cache = split_cache(
            part,
            [d for d, slot in zip(layer_devices, kv_slots, strict=True) if slot >= 0],
            context_length,
            place.device,
        )

    @property
    def decode_path(self) -> str:
        """How a one-token forward runs: the decoder's name (CUDA graphs, the Rust CPU
        decode step), or "layer loop"."""
        if self.decoder is None:
            return "layer loop"
        return str(getattr(self.decoder, "name", type(self.decoder).__name__))

    @property
    def expert_kernel(self) -> str:
        """What computes the routed experts: the fused CPU kernels' or a quantized
        kernel's name (a streamed model's: on its own device), the float "matmul", or
        "none" without MoE layers."""
        for layer in self.layers:
            if isinstance(layer.mlp, MoEBlock):
                backend = layer.mlp.backend
                main = getattr(backend, "main", None)  # StreamedExperts' Target
                kernel = (
                    getattr(backend, "fused", None)
                    or getattr(backend, "kernel", None)
                    or getattr(main, "kernel", None)
                    or backend  # one that names itself (the slab experts' Triton kernels)
                )
                return str(getattr(kernel, "name", "matmul"))
        return "none"

    @property
    def context_length(self) -> int:
        return self.cache.context_length

    @torch.inference_mode()
    def forward(
        self, ids: torch.Tensor, all_logits: bool = False, chunk: int = ATTENTION_CHUNK
    ) -> torch.Tensor:
        """Runs ids [T] after the cached positions, layer by layer for all T tokens
        (attention and dense MLPs in chunks of ``chunk`` tokens, each MoE layer's experts
        once for all T); returns logits [T, V] (fp32) when ``all_logits`` else [1, V]
        for the last token only. Advances the cache by T."""
        start, tokens = self.cache.length, ids.shape[0]
        if tokens == 0:
            raise ValueError("forward needs at least one token")
        if chunk < 1:
            raise ValueError(f"chunk must be >= 1, got {chunk}")
        if start + tokens > self.context_length:
            raise ValueError(
                f"{start + tokens} positions exceed the context length {self.context_length}"
            )
        if tokens == 1 and not all_logits and self.decoder is not None:
            logits = self.decoder(ids.to(self.place.device), start)  # [1, V]
            self.cache.tokens[start] = ids[0].to(self.cache.tokens.device)
            self.cache.length = start + 1
            return logits
        x = self.embed[ids.to(self.place.device)]  # [T, H]
        rope = {  # [T, D] each, per device
            d: (cos[start : start + tokens], sin[start : start + tokens])
            for d, (cos, sin) in self.rope.items()
        }
        if self.states is not None:
            anchors = self.anchor_tokens
            marks = [start + i + 1 for i, t in enumerate(ids.tolist()) if t in anchors]
            self.states.begin(marks)
        split = self.split
        for layer in self.layers:
            if split and x.device != layer.device:  # the hop between two GPUs of a split
                x = x.to(layer.device)
            cos, sin = rope[layer.device] if split else rope[self.place.device]
            x = layer(x, start, self.cache, cos, sin, chunk)
        if split:
            x = x.to(self.place.device)
        self.cache.tokens[start : start + tokens] = ids.to(self.cache.tokens.device)
        self.cache.length = start + tokens
        if self.states is not None:
            self.states.commit()
        if not all_logits:
            x = x[-1:]
        normed = self.final_norm(x, self.norm, self.config.rms_norm_eps)
        return F.linear(normed, self.lm_head).float()

    def reset(self, length: int = 0) -> None:
        """Keeps the first ``length`` cached positions (0: start a new sequence). With
        linear-attention layers (Qwen3-Next) only 0, all of them, or a checkpoint (a
        position right after an anchor token): their recurrent state holds the sequence
        up to one position and cannot be rewound otherwise."""
        states = self.states
        if (
            states is not None
            and length not in (0, self.cache.length)
            and (not 0 <= length <= self.cache.length or not states.rewind(length))
        ):
            raise ValueError(
                f"cannot rewind the recurrent state of {self.cache.length} positions "
                f"to {length}: no checkpoint there"
            )
        self.cache.reset(length)
        if states is not None and length == 0:
            states.clear()

    def cached_prefix(self, ids: list[int]) -> int:
        """How many leading tokens of ``ids`` the cache already holds and a forward
        could continue from (the positions it would otherwise compute again). With
        linear-attention layers, whose state cannot be rewound, that is every cached
        position when they all lead ``ids`` with at least one token left to run, else
        the deepest checkpoint within the shared prefix (0: a full prefill)."""
        held = self.cache.tokens[: min(self.cache.length, len(ids))].tolist()
        n = 0
        while n < len(held) and held[n] == ids[n]:
            n += 1
        if self.states is not None and (n != self.cache.length or n >= len(ids)):
            limit = min(n, len(ids) - 1)
            return max((p for p in self.states.checkpoints if p <= limit), default=0)
        return n
