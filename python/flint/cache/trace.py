"""Routing traces (the ``.npz`` format of ``shared/traces/``), loaded and checked.

Shapes: T = tokens, L = streamed layers, K = experts selected per token and layer.
"""

from __future__ import annotations

import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt


@dataclass(slots=True, frozen=True)
class Trace:
    """Expert ids per token, layer and router rank, in decode order."""

    experts: npt.NDArray[np.int16]  # [T, L, K], rank 0 = highest router probability
    n_experts: int  # experts per layer (ids are 0..n_experts-1)

    @property
    def n_tokens(self) -> int:
        return int(self.experts.shape[0])

    @property
    def n_layers(self) -> int:
        return int(self.experts.shape[1])

    @property
    def top_k(self) -> int:
        return int(self.experts.shape[2])

    def le_bytes(self) -> bytes:
        """The ids as little-endian int16, row-major: what ``_core.replay`` reads."""
        return self.experts.astype("<i2", copy=False).tobytes(order="C")


def load_trace(path: Path, n_experts: int | None = None) -> Trace:
    """Loads ``experts`` from a trace file; raises ``ValueError`` saying what is wrong.

    ``n_experts`` defaults to the largest id in the trace plus one.
    """
    if not path.is_file():
        raise ValueError(f"trace {path} does not exist or is not a file")
    if not zipfile.is_zipfile(path):  # np.load would try other formats, even pickles
        raise ValueError(f"trace {path} is not a readable .npz file (not a zip archive)")
    try:
        with np.load(path, allow_pickle=False) as npz:
            if "experts" not in npz.files:
                raise ValueError(f"trace {path} has no 'experts' array (has {npz.files})")
            experts = np.asarray(npz["experts"])
    except (OSError, zipfile.BadZipFile, EOFError) as err:
        raise ValueError(f"trace {path} is not a readable .npz file: {err}") from err
    if experts.ndim != 3 or 0 in experts.shape:
        raise ValueError(f"trace 'experts' must be [tokens, layers, top_k], got {experts.shape}")
    if not np.issubdtype(experts.dtype, np.integer):
        raise ValueError(f"trace 'experts' must hold integers, got {experts.dtype}")
    lowest, highest = int(experts.min()), int(experts.max())
    if lowest < 0 or highest > np.iinfo(np.int16).max:
        raise ValueError(f"trace expert ids must be in 0..32767, got {lowest}..{highest}")
    inferred = highest + 1
    if n_experts is None:
        n_experts = inferred
    elif n_experts < inferred:
        raise ValueError(f"n_experts={n_experts} but the trace uses expert id {highest}")
    return Trace(experts=np.ascontiguousarray(experts, dtype=np.int16), n_experts=n_experts)
