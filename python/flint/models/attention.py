"""Grouped-query attention with RoPE, optional q/k RMSNorm and bias, over a KV cache."""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend

from flint.models.config import ModelConfig
from flint.models.kv_cache import KVCache
from flint.models.loading import Placement
from flint.models.norm import rms_norm
from flint.models.rope import apply_rope
from flint.models.weights import WeightSource

# T = new tokens, S = cached + new positions, H = hidden, Nq / Nkv = query / kv heads,
# D = head dim


class Attention:
    """One layer's self-attention; weights named as ``model.layers.N.self_attn.*``."""

    def __init__(
        self, config: ModelConfig, layer: int, source: WeightSource, place: Placement
    ) -> None:
        p = f"model.layers.{layer}.self_attn."
        self.layer = layer
        self.cfg = config
        self.q_w, self.k_w = (
            place.load(source, p + "q_proj.weight"),
            place.load(source, p + "k_proj.weight"),
        )
        self.v_w, self.o_w = (
            place.load(source, p + "v_proj.weight"),
            place.load(source, p + "o_proj.weight"),
        )
        self.q_b = place.load(source, p + "q_proj.bias") if config.qkv_bias else None
        self.k_b = place.load(source, p + "k_proj.bias") if config.qkv_bias else None
        self.v_b = place.load(source, p + "v_proj.bias") if config.qkv_bias else None
        self.o_b = place.load(source, p + "o_proj.bias") if config.o_bias else None
        norms = config.qk_norm != "none"
        self.q_norm = place.load(source, p + "q_norm.weight") if norms else None
        self.k_norm = place.load(source, p + "k_norm.weight") if norms else None

    def _project(
        self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, norm: torch.Tensor | None
    ) -> torch.Tensor:
        """x [T, H] -> heads [N, T, D] with the family's norm and clipping."""
        cfg = self.cfg
        y = F.linear(x, w, b)  # [T, N*D]
        if norm is not None and cfg.qk_norm == "full":
            y = rms_norm(y, norm, cfg.rms_norm_eps)
        if cfg.clip_qkv is not None:
            y = y.clamp(min=-cfg.clip_qkv, max=cfg.clip_qkv)
        y = y.view(x.shape[0], -1, cfg.head_dim)  # [T, N, D]
        if norm is not None and cfg.qk_norm == "per_head":
            y = rms_norm(y, norm, cfg.rms_norm_eps)
        return y.transpose(0, 1)  # [N, T, D]

    def __call__(
        self,
        x: torch.Tensor,  # [T, H]
        start: int,
        cache: KVCache,
        cos: torch.Tensor,  # [T, D]
        sin: torch.Tensor,  # [T, D]
        mask: torch.Tensor | None,  # [T, S] bool, None for one new token
    ) -> torch.Tensor:
        q = apply_rope(self._project(x, self.q_w, self.q_b, self.q_norm), cos, sin)  # [Nq, T, D]
        k = apply_rope(self._project(x, self.k_w, self.k_b, self.k_norm), cos, sin)  # [Nkv, T, D]
        v = self._project(x, self.v_w, self.v_b, None)  # [Nkv, T, D]
        keys, values = cache.write(self.layer, start, k, v)  # [Nkv, S, D]
        gqa = self.cfg.num_heads != self.cfg.num_kv_heads
        out = F.scaled_dot_product_attention(
            q.unsqueeze(0), keys.unsqueeze(0), values.unsqueeze(0), attn_mask=mask, enable_gqa=gqa
        )  # [1, Nq, T, D]
        out = out[0].transpose(0, 1).reshape(x.shape[0], -1)  # [T, Nq*D]
        return F.linear(out, self.o_w, self.o_b)  # [T, H]


def causal_mask(start: int, tokens: int, device: torch.device) -> torch.Tensor | None:
    """[T, S] bool: query i (at position start+i) sees keys 0..start+i. On CUDA torch's
    lower-right causal bias, the same mask without its tensor, which lets SDPA use its
    flash kernels (an explicit mask rules them out): 2048 x 2048 and 8192 x 8192 2.5x
    and 3.7x faster on an H200 (benches/attention_mask.py, docs/benchmarks.md)."""
    if tokens == 1:
        return None
    if device.type == "cuda":
        # Imported here: the module pulls in torch._dynamo, 1.3 of `import flint`'s 3.7 s
        # on the CPU box, and only CUDA prompts use it.
        from torch.nn.attention.bias import causal_lower_right

        return causal_lower_right(tokens, start + tokens)
    q_pos = torch.arange(start, start + tokens, device=device)[:, None]
    k_pos = torch.arange(start + tokens, device=device)[None, :]
    return k_pos <= q_pos


# SDPA's kernels that never hold a [T, S] score matrix, in the order tried: with one of
# them a prompt's attention needs no chunking for memory. cuDNN's first: a fresh
# 2k-token prompt's causal GQA attention (32 / 4 heads of 128) took 0.112 ms against
# flash's 0.190 on the H200 (``benches/attention_backends.py``, gpu47); where it does not
# apply (a continuation's lower-right mask, an older GPU) SDPA takes the next.
LINEAR_MEMORY = [
    SDPBackend.CUDNN_ATTENTION,
    SDPBackend.FLASH_ATTENTION,
    SDPBackend.EFFICIENT_ATTENTION,
]


def linear_memory(backends: list[SDPBackend]) -> list[SDPBackend]:
    """``backends`` without cuDNN's where ``FLINT_CUDNN_ATTENTION=0`` (to compare)."""
    if os.environ.get("FLINT_CUDNN_ATTENTION", "1") == "0":
        return [b for b in backends if b != SDPBackend.CUDNN_ATTENTION]
    return backends


def whole_prompt_attention(
    cfg: ModelConfig,
    tokens: int,
    positions: int,
    chunk: int,
    device: torch.device,
    dtype: torch.dtype,
) -> bool:
    """Whether a CUDA prompt's attention may run over all ``tokens`` queries in one call
    (under ``LINEAR_MEMORY``) instead of chunks of ``chunk``: its [T, heads x D] tensors
    take no more than a chunk's share the prompt planner counts (``activation_bytes``:
    the chunk's score matrix over ``positions`` keys). One call instead of
    ``tokens / chunk`` launches each of the norms, projections, rope and SDPA: an 8k
    prompt's 16 chunks were ~600 of a layer's ~650 kernel launches (docs/benchmarks.md).
    ``FLINT_WHOLE_ATTENTION=0`` keeps the chunks (to compare)."""
    if device.type != "cuda" or tokens <= chunk:
        return False
    if os.environ.get("FLINT_WHOLE_ATTENTION", "1") == "0":
        return False
    b = torch.finfo(dtype).bits // 8
    per_token = (cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim * b * 2
    return tokens * per_token <= chunk * per_token + cfg.num_heads * chunk * positions * 4
