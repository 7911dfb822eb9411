"""FP8 block-scaled weights (DeepSeek-V3's release format) back to bf16.

Such a checkpoint stores a matrix ``W`` as ``float8_e4m3fn`` plus ``W_scale_inv`` (fp32),
one scale per 128 x 128 block (the last blocks of a dimension may be partial):
``W[i, j] = fp8[i, j] * scale_inv[i // 128, j // 128]``. The product is taken in fp32
and rounded once to bf16, the dtype the released models are served in (DeepSeek's own
fp8-to-bf16 script does the same).
"""

from __future__ import annotations

import torch

FP8_BLOCK = 128
SCALE_SUFFIX = "_scale_inv"  # "....weight" -> "....weight_scale_inv"
FP8_DTYPES = (torch.float8_e4m3fn,)

# R, C = rows, columns of the matrix; Rb, Cb = blocks along each


def dequantize_fp8(
    weight: torch.Tensor,  # [R, C] float8_e4m3fn
    scale_inv: torch.Tensor,  # [Rb, Cb] fp32, Rb = ceil(R / block), Cb = ceil(C / block)
    block: int = FP8_BLOCK,
) -> torch.Tensor:
    """The bf16 matrix ``weight * scale_inv`` with each scale spread over its block."""
    if weight.ndim != 2 or scale_inv.ndim != 2:
        shapes = f"{list(weight.shape)} / {list(scale_inv.shape)}"
        raise ValueError(f"fp8 weight / scale {shapes}: not 2-D")
    rows, cols = weight.shape
    want = (-(-rows // block), -(-cols // block))
    if tuple(scale_inv.shape) != want:
        raise ValueError(
            f"fp8 weight {[rows, cols]} needs a {list(want)} scale_inv for {block}x{block}"
            f" blocks, got {list(scale_inv.shape)}"
        )
    scale = scale_inv.to(torch.float32)
    scale = scale.repeat_interleave(block, 0)[:rows].repeat_interleave(block, 1)[:, :cols]
    return (weight.to(torch.float32) * scale).to(torch.bfloat16)
