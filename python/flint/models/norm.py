"""RMSNorm as transformers computes it: fp32 statistics, weight applied in input dtype."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

if TYPE_CHECKING:
    from flint.models.config import ModelConfig


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, weight_in_fp32: bool = False
) -> torch.Tensor:
    """``weight * (x / rms(x))`` over the last dim; the normalised value is cast back to
    x's dtype before the weight multiply, exactly as ``Qwen3MoeRMSNorm`` does, or, with
    ``weight_in_fp32``, multiplied in fp32 and then cast (``GptOssRMSNorm``). On CUDA
    the fused kernel computes it (``norm_fused``)."""
    if x.is_cuda and norm_fused(x, weight):
        from flint.graphs.fused import rms_norm as fused  # (graphs imports models)

        rows = x.reshape(-1, x.shape[-1])
        return fused(rows, weight, eps, weight_in_fp32).view(x.shape)
    x32 = x.to(torch.float32)
    variance = x32.pow(2).mean(-1, keepdim=True)
    normed = x32 * torch.rsqrt(variance + eps)
    if weight_in_fp32:
        return (weight.to(torch.float32) * normed).to(x.dtype)
    return weight * normed.to(x.dtype)


def norm_fused(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether an RMSNorm of ``x`` on CUDA runs as one Triton kernel (``flint.graphs.
    fused.rms_norm``, the decode graphs' norm kernel: torch's ops and roundings, the sum
    of squares in another order) instead of torch's ~7 launches: an 8k prompt's 4 norms a
    layer were ~40 ms of its GPU time on the H200 (docs/benchmarks.md). Every call, of
    any number of rows: the kernel normalises each row alone, so a row's bits do not
    depend on the rows beside it (the last token's logits are the same whether or not
    the others' are asked for). Where Triton is, for a weight in ``x``'s dtype (bf16,
    fp16 or fp32; the kernel returns that dtype), unless ``FLINT_FUSED_NORM=0``."""
    if os.environ.get("FLINT_FUSED_NORM", "1") == "0":
        return False
    if weight.dtype != x.dtype or x.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        return False
    from flint.graphs.moe_kernel import available

    return available() is None


def rms_norm_offset(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``(1 + weight) * (x / rms(x))`` as ``Qwen3NextRMSNorm``: zero-centred weights, the
    multiply in fp32, cast back to x's dtype last."""
    x32 = x.to(torch.float32)
    normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return (normed * (1.0 + weight.to(torch.float32))).to(x.dtype)


def gated_rms_norm(
    x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float
) -> torch.Tensor:
    """``Qwen3NextRMSNormGated``: ``rms_norm(x) * silu(gate)``, the gate applied in fp32."""
    out = rms_norm(x, weight, eps).to(torch.float32) * F.silu(gate.to(torch.float32))
    return out.to(x.dtype)


Norm = Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]


def norm_for(config: ModelConfig) -> Norm:
    """The decoder's RMSNorm for ``config``'s family: zero-centred ``1 + w``
    (Qwen3-Next), the weight in fp32 before the cast (GPT-OSS), or the weight after
    the cast (the others)."""
    if config.norm_offset:
        return rms_norm_offset
    if config.norm_weight_fp32:
        return lambda x, w, eps: rms_norm(x, w, eps, weight_in_fp32=True)
    return rms_norm
