"""Expert weights as views of cache slots: no staging copy between the slot the I/O
engine filled and the matmul that reads it.

A slot address comes from ``flint._core.IoEngine``; the view is valid while the engine
lives and the expert stays pinned in its slot (``place`` ... ``unpin``)."""

from __future__ import annotations

import ctypes

import torch

from flint.format.constants import TORCH_DTYPES
from flint.format.quant import decode_projection
from flint.format.reader import ExpertLayout


def slot_bytes(address: int, nbytes: int) -> torch.Tensor:
    """``nbytes`` of memory at ``address`` as a uint8 tensor sharing it (zero-copy)."""
    buf = (ctypes.c_uint8 * nbytes).from_address(address)
    return torch.frombuffer(buf, dtype=torch.uint8)


def projections(slab: torch.Tensor, layout: ExpertLayout) -> list[torch.Tensor]:
    """The three projections' raw bytes inside a slab (views)."""
    return [
        slab[off : off + n] for off, n in zip(layout.proj_offsets, layout.proj_bytes, strict=True)
    ]


def weight(raw: torch.Tensor, p: int, layout: ExpertLayout) -> torch.Tensor:
    """Projection ``p`` (0 gate, 1 up, 2 down) from its raw bytes: a view in the stored
    dtype for raw files, dequantized (f32) for int8/int4."""
    rows, cols = layout.shapes[p]
    if layout.scheme == "raw":
        return raw.view(TORCH_DTYPES[layout.dtype]).view(rows, cols)
    return decode_projection(raw, layout.scheme, layout.dtype, rows, cols, layout.group_size)
