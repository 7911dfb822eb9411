"""MXFP4 (OCP microscaling FP4) weights as GPT-OSS checkpoints store them, dequantized.

``*_blocks`` [..., G, 16] uint8 hold 32 E2M1 values per group of a row, two per byte
(low nibble first); ``*_scales`` [..., G] uint8 hold each group's power-of-two scale
with bias 127. Dequantization is exactly transformers' ``convert_moe_packed_tensors``
(integrations/mxfp4.py) before its final transpose: value = E2M1 * 2**(scale - 127),
computed in fp32 and rounded once to ``dtype``. In bf16 that is exact (an E2M1 value
has two significant bits; bf16 has fp32's exponent range), so flint converts MXFP4
sources to bf16 before ``--quant`` requantizes them as usual.
"""

from __future__ import annotations

import torch

# E2M1 code -> value: sign bit 3, exponent bits 2..1, mantissa bit 0
_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
E2M1_VALUES: tuple[float, ...] = _MAGNITUDES + tuple(-v for v in _MAGNITUDES)
SCALE_BIAS = 127
GROUP = 32  # values per scale


def dequantize_mxfp4(
    blocks: torch.Tensor,  # [..., G, 16] uint8
    scales: torch.Tensor,  # [..., G] uint8
    dtype: torch.dtype = torch.bfloat16,
) -> torch.Tensor:
    """[..., G * 32] in ``dtype``: each row's groups laid end to end."""
    if blocks.dtype != torch.uint8 or scales.dtype != torch.uint8:
        raise ValueError(f"MXFP4 blocks/scales must be uint8, not {blocks.dtype}/{scales.dtype}")
    if blocks.dim() < 2 or blocks.shape[-1] != GROUP // 2 or blocks.shape[:-1] != scales.shape:
        raise ValueError(
            f"MXFP4 blocks {tuple(blocks.shape)} / scales {tuple(scales.shape)} do not match"
        )
    lut = torch.tensor(E2M1_VALUES, dtype=dtype)
    out = torch.empty(*blocks.shape[:-1], GROUP, dtype=dtype)  # [..., G, 32]
    out[..., 0::2] = lut[(blocks & 0x0F).long()]
    out[..., 1::2] = lut[(blocks >> 4).long()]
    exp = scales.to(torch.int32)[..., None] - SCALE_BIAS  # [..., G, 1]
    torch.ldexp(out, exp, out=out)
    return out.flatten(-2)
