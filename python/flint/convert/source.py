"""Finding a Hugging Face checkpoint (local directory or offline HF cache) and reading
its tensors lazily, shard by shard."""

from __future__ import annotations

import json
import os
import re
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from flint.convert.shard import ShardMap
from flint.models.fp8 import FP8_DTYPES, SCALE_SUFFIX, dequantize_fp8


def hf_cache_dirs() -> list[Path]:
    """Where the Hugging Face hub cache may live, in the order transformers looks."""
    dirs: list[Path] = []
    if v := os.environ.get("HF_HUB_CACHE"):
        dirs.append(Path(v))
    if v := os.environ.get("HF_HOME"):
        dirs.append(Path(v) / "hub")
    dirs.append(Path.home() / ".cache" / "huggingface" / "hub")
    return dirs


def _snapshot(repo_dir: Path) -> Path | None:
    ref = repo_dir / "refs" / "main"
    if ref.is_file():
        snap = repo_dir / "snapshots" / ref.read_text().strip()
        if snap.is_dir():
            return snap
    snaps = sorted((repo_dir / "snapshots").glob("*"), key=lambda p: p.stat().st_mtime)
    return snaps[-1] if snaps else None


def resolve_source(source: str) -> Path:
    """A local checkpoint directory, or the snapshot of repo id ``org/name`` in the local
    HF cache (never downloads). Raises FileNotFoundError naming every place it looked."""
    p = Path(source).expanduser()
    if p.is_dir():
        if not (p / "config.json").is_file():
            raise FileNotFoundError(f"{p} has no config.json: not a Hugging Face checkpoint")
        return p
    looked = [str(p)]
    if source.count("/") == 1 and not p.exists():
        name = "models--" + source.replace("/", "--")
        for cache in hf_cache_dirs():
            looked.append(str(cache / name))
            snap = _snapshot(cache / name) if (cache / name).is_dir() else None
            if snap is not None and (snap / "config.json").is_file():
                return snap
    raise FileNotFoundError(
        f"checkpoint {source!r} not found (offline); looked in: " + ", ".join(looked)
    )


# Shards kept mapped at once: every page touched stays in the process's RSS while its
# map lives, so maps are dropped as the conversion moves on (views keep theirs alive).
_MAX_OPEN_SHARDS = 1


_LAYER = re.compile(r"^model\.layers\.(\d+)\.")


@dataclass
class Checkpoint:
    """The files of one checkpoint and a name -> shard map of the tensors the model
    uses. Left out: layers at index >= ``num_hidden_layers`` (DeepSeek-V3 stores its
    next-token-prediction module there; the model never runs it) and Qwen3-Next's
    ``mtp.*`` module, listed in ``skipped``; and FP8 ``*_scale_inv`` tensors, folded into
    their weights by ``get``."""

    root: Path
    config: dict[str, Any]
    shards: list[Path]
    where: dict[str, Path] = field(default_factory=dict)
    scales: dict[str, Path] = field(default_factory=dict)  # "<weight>_scale_inv" -> shard
    skipped: list[str] = field(default_factory=list)
    _open: OrderedDict[Path, ShardMap] = field(default_factory=OrderedDict)

    @classmethod
    def open(cls, root: Path) -> Checkpoint:
        config = json.loads((root / "config.json").read_text())
        index = root / "model.safetensors.index.json"
        if index.is_file():
            weight_map: dict[str, str] = json.loads(index.read_text())["weight_map"]
            shards = sorted({root / f for f in weight_map.values()})
        else:
            shards = sorted(root.glob("*.safetensors"))
        if not shards:
            raise FileNotFoundError(
                f"{root} has no *.safetensors files (other formats unsupported)"
            )
        missing = [s for s in shards if not s.is_file()]
        if missing:
            raise FileNotFoundError(f"shard listed in the index is missing: {missing[0]}")
        ck = cls(root, config, shards)
        layers = config.get("num_hidden_layers")
        for s in shards:
            for name in ck._handle(s).names():
                m = _LAYER.match(name)
                if (m and isinstance(layers, int) and int(m[1]) >= layers) or name.startswith(
                    "mtp."
                ):
                    ck.skipped.append(name)
                elif name.endswith(SCALE_SUFFIX):
                    ck.scales[name] = s
                else:
                    ck.where[name] = s
        for name in [n for n in ck.scales if n.removesuffix(SCALE_SUFFIX) not in ck.where]:
            ck.where[name] = ck.scales.pop(name)  # not an FP8 scale: an ordinary tensor
        return ck

    def _handle(self, shard: Path) -> ShardMap:
        if shard in self._open:
            self._open.move_to_end(shard)
            return self._open[shard]
        while len(self._open) >= _MAX_OPEN_SHARDS:
            self._open.popitem(last=False)
        self._open[shard] = ShardMap(shard)
        return self._open[shard]

    def names(self) -> list[str]:
        return list(self.where)

    def shape(self, name: str) -> list[int]:
        return self._handle(self.where[name]).shape(name)

    def dtype_name(self, name: str) -> str:
        return self._handle(self.where[name]).dtype_name(name)

    def nbytes(self, name: str) -> int:
        return self._handle(self.where[name]).nbytes(name)

    def get(self, name: str) -> torch.Tensor:
        """A zero-copy view of the tensor in its shard's map; an FP8 weight with a
        ``_scale_inv`` comes back dequantized to bf16 (a new tensor)."""
        t = self._handle(self.where[name]).tensor(name)
        if t.dtype not in FP8_DTYPES:
            return t
        scale = name + SCALE_SUFFIX
        if scale not in self.scales:
            raise ValueError(f"FP8 tensor {name!r} has no {scale!r} to dequantize it with")
        return dequantize_fp8(t, self._handle(self.scales[scale]).tensor(scale))

    def get_row(self, name: str, i: int) -> torch.Tensor:
        """Row ``i`` of a stacked tensor (a view: only that row's pages are read)."""
        return self.get(name)[i]

    def close(self) -> None:
        self._open.clear()

    def text_file(self, name: str) -> str | None:
        p = self.root / name
        return p.read_text(encoding="utf-8") if p.is_file() else None

    def iter_files(self) -> Iterator[Path]:
        for p in sorted(self.root.iterdir()):
            if p.is_file() and not p.name.startswith("."):
                yield p
