"""The memory-mapped safetensors reader: zero-copy views, validated headers."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from flint.convert.shard import ShardMap


def test_views_equal_safetensors_and_outlive_the_map(tmp_path: Path) -> None:
    tensors = {
        "a": torch.randn(3, 5).bfloat16(),
        "b": torch.arange(7, dtype=torch.int64),
        "c": torch.zeros(0, 4),
        "d": torch.randn(2, 2, 2),
    }
    save_file(tensors, tmp_path / "x.safetensors")
    m = ShardMap(tmp_path / "x.safetensors")
    views = {k: m.tensor(k) for k in m.names()}
    del m
    for k, t in tensors.items():
        assert views[k].dtype == t.dtype and torch.equal(views[k], t), k


def _raw(tmp_path: Path, header: dict[str, object], data: bytes = b"\0" * 16) -> Path:
    h = json.dumps(header).encode()
    p = tmp_path / "bad.safetensors"
    p.write_bytes(struct.pack("<Q", len(h)) + h + data)
    return p


@pytest.mark.parametrize(
    ("header", "match"),
    [
        ({"t": {"dtype": "F32", "shape": [4], "data_offsets": [0, 32]}}, "bad data offsets"),
        ({"t": {"dtype": "F32", "shape": [3], "data_offsets": [0, 16]}}, "bad data offsets"),
        ({"t": {"dtype": "Q4", "shape": [4], "data_offsets": [0, 16]}}, "dtype"),
    ],
)
def test_bad_headers_are_rejected(tmp_path: Path, header: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        ShardMap(_raw(tmp_path, header))


def test_impossible_header_length_is_rejected(tmp_path: Path) -> None:
    p = tmp_path / "short.safetensors"
    p.write_bytes(struct.pack("<Q", 1 << 40) + b"{}")
    with pytest.raises(ValueError, match="impossible"):
        ShardMap(p)
