"""FtwFile: a validated .ftw file as torch tensors."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import torch

from flint import _core
from flint.format.constants import TORCH_DTYPES
from flint.format.quant import decode_projection


@dataclass(slots=True, frozen=True)
class TensorInfo:
    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int


@dataclass(slots=True, frozen=True)
class ExpertLayout:
    """What every routed expert slab of the file looks like."""

    n_layers: int
    n_experts: int
    scheme: str  # "raw", "int8" or "int4"
    dtype: str  # element type of raw weights ("i8"/"u8" for int8/int4)
    group_size: int
    shapes: tuple[tuple[int, int], ...]  # (rows, cols) of gate, up, down
    proj_offsets: tuple[int, ...]
    proj_bytes: tuple[int, ...]
    slab_bytes: int

    def raw(self, slab: torch.Tensor, p: int) -> torch.Tensor:
        """The bytes of projection ``p`` (0 gate, 1 up, 2 down) inside a slab (a view)."""
        off = self.proj_offsets[p]
        return slab[off : off + self.proj_bytes[p]]

    def weight(self, slab: torch.Tensor, p: int) -> torch.Tensor:
        """Projection ``p`` as weights [rows, cols]: a view in the stored dtype for raw
        files, dequantized (f32) for int8/int4."""
        rows, cols = self.shapes[p]
        raw = self.raw(slab, p)
        return decode_projection(raw, self.scheme, self.dtype, rows, cols, self.group_size)


class FtwFile:
    """An open .ftw file. Opening validates the whole structure (raising
    ``flint._core.FormatError`` naming what is wrong) and checks ``verify_sample`` expert
    checksums; every tensor read verifies its checksum."""

    def __init__(self, path: str | Path, verify_sample: int = 16) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"no such model file: {self.path}")
        self._r = _core.FtwReader(str(self.path))
        self.metadata: dict[str, Any] = json.loads(self._r.metadata_json)
        self.tensors: dict[str, TensorInfo] = {
            n: TensorInfo(n, d, tuple(s), o, b) for n, d, s, o, b in self._r.tensors()
        }
        self.layout = self._read_layout()
        if verify_sample:
            self._r.verify_expert_sample(verify_sample)

    def _read_layout(self) -> ExpertLayout | None:
        d = self._r.expert_layout()
        if d["n_layers"] == 0:
            return None
        return ExpertLayout(
            n_layers=d["n_layers"],
            n_experts=d["n_experts"],
            scheme=d["scheme"],
            dtype=d["dtype"],
            group_size=d["group_size"],
            shapes=tuple(tuple(s) for s in d["shapes"]),
            proj_offsets=tuple(d["proj_offsets"]),
            proj_bytes=tuple(d["proj_bytes"]),
            slab_bytes=d["slab_bytes"],
        )

    @property
    def config(self) -> dict[str, Any]:
        """The model's Hugging Face config."""
        cfg: dict[str, Any] = self.metadata.get("config", {})
        return cfg

    @property
    def file_size(self) -> int:
        return int(self._r.file_size)

    @property
    def core(self) -> _core.FtwReader:
        """The underlying Rust reader (for the engine)."""
        return self._r

    def sections(self) -> dict[str, tuple[int, int]]:
        return dict(self._r.sections())

    def experts(self) -> list[tuple[int, int, int, int]]:
        """(layer, expert, offset, slab bytes) of every expert, in ascending id."""
        return list(self._r.experts())

    def tensor(self, name: str) -> torch.Tensor:
        """Reads dense tensor ``name`` (checksum verified) into a new CPU tensor."""
        info = self.tensors.get(name)
        if info is None:
            raise KeyError(f"no tensor named {name!r} in {self.path}")
        out = torch.empty(info.shape, dtype=TORCH_DTYPES[info.dtype])
        self._r.read_tensor_into(name, out.data_ptr(), info.nbytes)
        return out

    def expert_slab(self, layer: int, expert: int) -> torch.Tensor:
        """The raw slab bytes of one expert (uint8, checksum verified)."""
        if self.layout is None:
            raise KeyError(f"{self.path} holds no routed experts")
        out = torch.empty(self.layout.slab_bytes, dtype=torch.uint8)
        self._r.read_expert_into(layer, expert, out.data_ptr(), out.numel())
        return out

    def expert(self, layer: int, expert: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Gate, up and down of one expert as weights [rows, cols] (dequantized to f32
        for int8/int4; the stored dtype for raw)."""
        lay = self.layout
        assert lay is not None
        slab = self.expert_slab(layer, expert)
        return lay.weight(slab, 0), lay.weight(slab, 1), lay.weight(slab, 2)

    def close(self) -> None:
        """Releases the file handle (the object is unusable afterwards)."""
        del self._r

    def __enter__(self) -> FtwFile:
        return self

    def __exit__(
        self, t: type[BaseException] | None, v: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
