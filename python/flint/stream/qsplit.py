"""The q* split of a decode step's missing experts on CUDA (issue 9).

An expert in neither VRAM cache slot can be computed two ways: on the CPU from its RAM
slot (no copy; the CPU's expert-compute bandwidth B_host bounds it), or copied up over
PCIe and computed on the GPU (B_pcie bounds it). With m such experts in a layer, q of
them are filled over PCIe and the other m - q computed on the CPU at the same time;
both sides finish together when q / B_pcie = (m - q) / B_host, so

    q = round(m x B_pcie / (B_pcie + B_host))

(the issue writes m x B_pcie / B_host, the ratio of the two sides' work; the balance
above is the same idea solved for q, and never exceeds m). B_pcie is measured at start
(a short pinned copy, cached per GPU in flint's profile directory), B_host starts from
the same figure and both are updated from every step's observed copy and CPU times
(an exponential average), so q follows the machine as it runs.

``--host-split`` chooses: "cpu" (every missing expert on the CPU), "fill" (every one
copied up), "q" (the split), or "auto" (the default): "fill" where the slab kernels
compute the model's experts from the GPU-wave buffers (int8/int4 with Triton), else
"cpu". On the H200 box, V1 with fill ran 20.13 +- 1.25 tok/s against 12.73 +- 1.00 with
cpu, the two interleaved on one machine (docs/benchmarks.md, gpu34); without the slab
kernels a fill is one torch copy and expert call per expert, which was not faster. Which
side computes an expert never changes its output beyond the placement rounding the
exactness contract allows (docs/streaming.md); ``--deterministic`` bypasses all this."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

HOST_SPLITS = ("auto", "cpu", "fill", "q")
SPLITS = HOST_SPLITS[1:]  # what "auto" resolves among


def resolve_host_split(split: str, slab_waves: bool) -> str:
    """``split`` with "auto" resolved: "fill" when ``slab_waves`` (a step's fills go
    through the staging buffers and the slot kernels), else "cpu"."""
    if split not in HOST_SPLITS:
        raise ValueError(f"--host-split must be one of {', '.join(HOST_SPLITS)}")
    if split != "auto":
        return split
    return "fill" if slab_waves else "cpu"


CALIBRATION_BYTES = 32 << 20
EMA = 0.2  # weight of each new observation


def _cache_file() -> Path:
    from flint.tune.profile import profile_dir

    return profile_dir() / "pcie.json"


def pcie_bandwidth(device: torch.device, cache: Path | None = None) -> float:
    """B_pcie for ``device``: from the per-machine cache, else measured and cached."""
    path = cache if cache is not None else _cache_file()
    key = f"{torch.cuda.get_device_name(device)}#{device.index or 0}"
    try:
        known = json.loads(path.read_text())
    except (OSError, ValueError):
        known = {}
    if isinstance(known, dict) and isinstance(known.get(key), int | float):
        return float(known[key])
    from flint.tune.measure import pinned_h2d_gb_s

    gb_s = pinned_h2d_gb_s(device, CALIBRATION_BYTES, reps=3)
    if gb_s is None:
        raise ValueError("the q* split measures PCIe and needs CUDA")
    rate = gb_s * 1e9
    known = known if isinstance(known, dict) else {}
    known[key] = rate
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(known, indent=1))
    except OSError:
        pass  # measured again next time
    return rate


@dataclass(slots=True)
class QSplit:
    """The two bandwidths (bytes/s) and the split they give; updated online."""

    pcie: float
    host: float
    mode: str = "q"
    filled: int = 0  # experts copied up and computed on the GPU by this split
    kept: int = 0  # experts computed on the CPU by it

    def __post_init__(self) -> None:
        if self.mode not in SPLITS:
            raise ValueError(f"a resolved host split is one of {', '.join(SPLITS)}")
        if not (self.pcie > 0 and self.host > 0):
            raise ValueError("bandwidths must be > 0")

    def q(self, m: int) -> int:
        """How many of ``m`` missing experts to fill over PCIe."""
        if self.mode == "cpu" or m == 0:
            return 0
        if self.mode == "fill":
            return m
        return max(0, min(m, round(m * self.pcie / (self.pcie + self.host))))

    def observe_pcie(self, nbytes: int, seconds: float) -> None:
        if nbytes > 0 and seconds > 0:
            self.pcie += EMA * (nbytes / seconds - self.pcie)

    def observe_host(self, nbytes: int, seconds: float) -> None:
        if nbytes > 0 and seconds > 0:
            self.host += EMA * (nbytes / seconds - self.host)

    def record(self, filled: int, kept: int) -> None:
        self.filled += filled
        self.kept += kept
