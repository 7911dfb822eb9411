"""Quantization of expert projections into the exact byte layout of the .ftw file, and back.

Layouts (docs/ftw-format.md, "Expert projections"); W is [rows, cols] = [out, in]:
- int8: int8 W (symmetric, one f32 scale per row), zero pad to 64 bytes, f32 scales [rows].
- int4: bytes [rows, cols/2] (element 2j in the low nibble, 2j+1 in the high one, each
  stored as q + 8 with q in [-8, 7]), zero pad to 64 bytes, bf16 scales [rows, cols/g].
Scales are rounded to their stored dtype before q is computed, so dequantize(quantize(W))
is the value the kernels will see.
"""

from __future__ import annotations

import torch

from flint.format.constants import SCALE_ALIGN


def _pad(nbytes: int) -> int:
    return -nbytes % SCALE_ALIGN


def int8_bytes(rows: int, cols: int) -> int:
    n = rows * cols
    return n + _pad(n) + rows * 4


def int4_bytes(rows: int, cols: int, group: int) -> int:
    n = rows * cols // 2
    return n + _pad(n) + rows * (cols // group) * 2


# Dense matrices that --dense-quant int8 quantizes: attention (Qwen3-Next's DeltaNet
# projections included; its conv, decay and norm weights are not matrices), shared
# experts, dense MLPs, and the LM head (``LM_HEAD``; llama.cpp's Q4_0/Q8_0 files store
# their output matrix in 8 bits too). Not the router (its top-k picks the experts) or
# the embedding (one row is read per token: int8 would save no bandwidth).
_DENSE_QUANT_PARTS = (
    "self_attn.",
    "linear_attn.in_proj_qkvz.",
    "linear_attn.in_proj_ba.",
    "linear_attn.out_proj.",
    "shared_expert.",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
)


# The LM head: a tied model's is the embedding, kept as is, unless its checkpoint also
# stores ``lm_head.weight`` (the model then loads that tensor, quantized like the rest).
LM_HEAD = "lm_head.weight"


def dense_quantized(name: str, dense_quant: str) -> bool:
    """Whether ``dense_quant`` stores the dense matrix ``name`` as int8 (with row
    scales in ``name + "_scale"``); the caller checks it is a matrix."""
    return (
        dense_quant == "int8"
        and name.endswith(".weight")
        and (name == LM_HEAD or any(p in name for p in _DENSE_QUANT_PARTS))
    )


def quantize_int8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row symmetric int8. Returns (q [rows, cols] int8, scales [rows] f32)."""
    w = w.float()
    scale = (w.abs().amax(dim=1) / 127.0).clamp_min(torch.finfo(torch.float32).tiny)
    q = torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8)
    return q, scale


def quantize_int4(w: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Grouped symmetric int4. Returns (q [rows, cols] int8 in [-8, 7], scales [rows, G] bf16)."""
    rows, cols = w.shape
    if cols % group:
        raise ValueError(f"int4: {cols} input features are not a multiple of group size {group}")
    g = w.float().reshape(rows, cols // group, group)  # R x G x g
    scale = (g.abs().amax(dim=2) / 7.0).to(torch.bfloat16)
    s = scale.float().clamp_min(torch.finfo(torch.float32).tiny)
    q = torch.round(g / s[:, :, None]).clamp_(-8, 7).to(torch.int8)
    return q.reshape(rows, cols), scale


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """[rows, cols] int8 in [-8, 7] -> [rows, cols/2] uint8, even element in the low nibble."""
    u = (q.to(torch.int16) + 8).to(torch.uint8)
    return u[:, 0::2] | (u[:, 1::2] << 4)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of pack_int4: [rows, cols/2] uint8 -> [rows, cols] int8."""
    lo = (packed & 0x0F).to(torch.int8) - 8
    hi = (packed >> 4).to(torch.int8) - 8
    return torch.stack([lo, hi], dim=-1).reshape(packed.shape[0], -1)


def _concat(weight: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    w = weight.contiguous().view(torch.uint8).reshape(-1)
    s = scales.contiguous().view(torch.uint8).reshape(-1)
    pad = torch.zeros(_pad(w.numel()), dtype=torch.uint8)
    return torch.cat([w, pad, s])


def encode_projection(w: torch.Tensor, scheme: str, group: int = 32) -> torch.Tensor:
    """One projection [rows, cols] -> its bytes in the file (uint8, 1-D)."""
    if scheme == "int8":
        q, scale = quantize_int8(w)
        return _concat(q, scale)
    if scheme == "int4":
        q, scale = quantize_int4(w, group)
        return _concat(pack_int4(q), scale)
    raise ValueError(f"encode_projection: unknown scheme {scheme!r}")


def split_int8(raw: torch.Tensor, rows: int, cols: int) -> tuple[torch.Tensor, torch.Tensor]:
    """An int8 projection's file bytes -> (q [rows, cols] int8, scales [rows] f32), views."""
    n = rows * cols
    off = n + _pad(n)
    return raw[:n].view(torch.int8).reshape(rows, cols), raw[off : off + rows * 4].view(
        torch.float32
    )


def split_int4(
    raw: torch.Tensor, rows: int, cols: int, group: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """An int4 projection's file bytes -> (packed [rows, cols/2] uint8, scales
    [rows, cols/group] bf16), views."""
    n = rows * cols // 2
    off = n + _pad(n)
    groups = cols // group
    scale = raw[off : off + rows * groups * 2].view(torch.bfloat16).reshape(rows, groups)
    return raw[:n].reshape(rows, cols // 2), scale


def dequantize_int4(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """q [rows, cols] int8 in [-8, 7], scales [rows, G] -> f32 weights [rows, cols]."""
    rows, cols = q.shape
    groups = scale.shape[1]
    w = q.float().reshape(rows, groups, cols // groups) * scale.float()[:, :, None]
    return w.reshape(rows, cols)


def decode_projection(
    raw: torch.Tensor, scheme: str, dtype: str, rows: int, cols: int, group: int
) -> torch.Tensor:
    """A projection's file bytes (uint8, 1-D) -> its weights [rows, cols] (f32 for int8/int4)."""
    from flint.format.constants import TORCH_DTYPES

    if scheme == "raw":
        return raw.view(TORCH_DTYPES[dtype]).reshape(rows, cols)
    if scheme == "int8":
        q, scale = split_int8(raw, rows, cols)
        return q.float() * scale[:, None]
    if scheme == "int4":
        packed, scale = split_int4(raw, rows, cols, group)
        return dequantize_int4(unpack_int4(packed), scale)
    raise ValueError(f"decode_projection: unknown scheme {scheme!r}")
