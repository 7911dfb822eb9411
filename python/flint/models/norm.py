"""RMSNorm as transformers computes it: fp32 statistics, weight applied in input dtype."""

from __future__ import annotations

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
    ``weight_in_fp32``, multiplied in fp32 and then cast (``GptOssRMSNorm``)."""
    x32 = x.to(torch.float32)
    variance = x32.pow(2).mean(-1, keepdim=True)
    normed = x32 * torch.rsqrt(variance + eps)
    if weight_in_fp32:
        return (weight.to(torch.float32) * normed).to(x.dtype)
    return weight * normed.to(x.dtype)


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
