"""A ``.safetensors`` shard, memory-mapped: tensors are zero-copy views of the map.

Converting reads every byte once anyway; copying each tensor out of the file first (as
``safe_open(...).get_tensor`` does) would add a full memory pass, measured at ~20% of
convert time. The header is validated before any view is made.
"""

from __future__ import annotations

import json
import mmap
import struct
from pathlib import Path
from typing import Any

import torch

_DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
    "F8_E4M3": torch.float8_e4m3fn,
}
_MAX_HEADER = 100 << 20


class ShardMap:
    """One safetensors file. Views stay valid after the ``ShardMap`` is dropped (they
    keep the map alive); the map is released when the last view is."""

    def __init__(self, path: Path) -> None:
        self.path = path
        with path.open("rb") as f:
            size = path.stat().st_size
            head = f.read(8)
            if len(head) != 8:
                raise ValueError(f"{path}: not a safetensors file (shorter than 8 bytes)")
            (n,) = struct.unpack("<Q", head)
            if n > min(_MAX_HEADER, size - 8):
                raise ValueError(f"{path}: safetensors header of {n} bytes is impossible")
            header: dict[str, Any] = json.loads(f.read(n))
            self._base = 8 + n
            # ACCESS_COPY: a writable private map (torch wants writable buffers); pages
            # are shared with the page cache until written, and nothing writes them.
            self._mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY) if size > 8 + n else None
        header.pop("__metadata__", None)
        self._entries = {k: self._check(k, v, size - self._base) for k, v in header.items()}

    def _check(
        self, name: str, e: dict[str, Any], data_len: int
    ) -> tuple[str, list[int], int, int]:
        dtype, shape, (begin, end) = e.get("dtype"), e.get("shape"), e.get("data_offsets", (0, -1))
        if dtype not in _DTYPES or not isinstance(shape, list):
            raise ValueError(f"{self.path}: tensor {name!r} has dtype {dtype!r} / shape {shape!r}")
        numel = 1
        for d in shape:
            numel *= int(d)
        want = numel * _DTYPES[dtype].itemsize
        if not 0 <= begin <= end <= data_len or end - begin != want:
            raise ValueError(f"{self.path}: tensor {name!r} has bad data offsets {begin}..{end}")
        return dtype, [int(d) for d in shape], begin, end

    def names(self) -> list[str]:
        return list(self._entries)

    def shape(self, name: str) -> list[int]:
        return list(self._entries[name][1])

    def dtype_name(self, name: str) -> str:
        return self._entries[name][0]

    def nbytes(self, name: str) -> int:
        _, _, begin, end = self._entries[name]
        return end - begin

    def tensor(self, name: str) -> torch.Tensor:
        dtype_name, shape, begin, end = self._entries[name]
        dtype = _DTYPES[dtype_name]
        if end == begin or self._mm is None:
            return torch.empty(shape, dtype=dtype)
        count = (end - begin) // dtype.itemsize
        flat = torch.frombuffer(self._mm, dtype=dtype, count=count, offset=self._base + begin)
        return flat.view(shape)
