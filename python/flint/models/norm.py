"""RMSNorm as transformers computes it: fp32 statistics, weight applied in input dtype."""

from __future__ import annotations

import torch


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
