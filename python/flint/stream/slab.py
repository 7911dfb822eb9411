"""Expert weights as views of cache slots: no staging copy between the slot the I/O
engine filled and the matmul that reads it.

A slot address comes from ``flint._core.IoEngine``; the view is valid while the engine
lives and the expert stays pinned in its slot (``place`` ... ``unpin``)."""

from __future__ import annotations

import ctypes

import torch


def slot_bytes(address: int, nbytes: int) -> torch.Tensor:
    """``nbytes`` of memory at ``address`` as a uint8 tensor sharing it (zero-copy)."""
    buf = (ctypes.c_uint8 * nbytes).from_address(address)
    return torch.frombuffer(buf, dtype=torch.uint8)
