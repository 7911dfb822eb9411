"""A torch-facing wrapper over the Rust streaming writer."""

from __future__ import annotations

import json
from pathlib import Path
from types import TracebackType
from typing import Any

import torch

from flint import _core
from flint.format.constants import DTYPE_NAMES


def _cpu_contiguous(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to("cpu").contiguous()


class FtwFileWriter:
    """Writes a .ftw file from torch tensors: ``add_tensor`` for every dense tensor,
    ``begin_experts`` once, ``add_expert`` in ascending (layer, expert), then ``finish``.
    The file appears at ``path`` only when ``finish`` succeeds."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._w = _core.FtwWriter(str(self.path))
        self.bytes_written = 0

    def add_tensor(self, name: str, tensor: torch.Tensor) -> None:
        t = _cpu_contiguous(tensor)
        dtype = DTYPE_NAMES.get(t.dtype)
        if dtype is None:
            raise ValueError(f"tensor {name!r}: dtype {t.dtype} cannot be stored in a .ftw file")
        nbytes = t.numel() * t.element_size()
        self._w.add_tensor(name, dtype, list(t.shape), t.data_ptr(), nbytes)
        self.bytes_written += nbytes

    def begin_experts(
        self,
        n_layers: int,
        n_experts: int,
        scheme: str,
        dtype: str,
        group_size: int,
        shapes: tuple[tuple[int, int], tuple[int, int], tuple[int, int]],
    ) -> None:
        self._w.begin_experts(n_layers, n_experts, scheme, dtype, group_size, shapes)

    def add_expert(self, layer: int, expert: int, projections: list[torch.Tensor]) -> None:
        """``projections``: gate, up, down, each already in its stored form (raw weights
        or the uint8 bytes from ``flint.format.quant.encode_projection``)."""
        ts = [_cpu_contiguous(p) for p in projections]
        spans = [(t.data_ptr(), t.numel() * t.element_size()) for t in ts]
        self._w.add_expert(layer, expert, spans[0], spans[1], spans[2])
        self.bytes_written += sum(n for _, n in spans)

    def finish(self, metadata: dict[str, Any]) -> int:
        """Writes the metadata, indexes and footer; returns the file size."""
        return int(self._w.finish(json.dumps(metadata, ensure_ascii=False)))

    def abort(self) -> None:
        self._w.abort()

    def __enter__(self) -> FtwFileWriter:
        return self

    def __exit__(
        self, t: type[BaseException] | None, v: BaseException | None, tb: TracebackType | None
    ) -> None:
        if t is not None:
            self.abort()
