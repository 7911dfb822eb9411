"""RMSNorm as transformers computes it: fp32 statistics, weight applied in input dtype."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``weight * (x / rms(x))`` over the last dim; the normalised value is cast back to
    x's dtype before the weight multiply, exactly as ``Qwen3MoeRMSNorm`` does."""
    x32 = x.to(torch.float32)
    variance = x32.pow(2).mean(-1, keepdim=True)
    return weight * (x32 * torch.rsqrt(variance + eps)).to(x.dtype)


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
