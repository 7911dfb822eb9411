"""``flint tune``: measure, pick, then keep the pick only where a paired bench shows it
at least as fast as the defaults.

Picks: I/O workers (the fewest reaching 90% of the best direct-read throughput) and
lookahead distance (layers ahead so one layer's top-k reads finish within the compute
of the layers in between). The paired bench runs ``full`` with the defaults and with
the picks, interleaved, each run cold, and compares mean decode tok/s; both must
produce the same greedy tokens.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from flint.bench.modes import Engine, Setup, load
from flint.bench.runner import Case, run_test
from flint.models import parse_config
from flint.models.ftw_source import FtwSource
from flint.stream.plan import GIB
from flint.tune import measure
from flint.tune.profile import (
    DEFAULT_IO_WORKERS,
    DEFAULT_LOOKAHEAD,
    Profile,
    machine_key,
    model_key,
)

Step = Callable[[str], None]


@dataclass(slots=True, frozen=True)
class TuneOptions:
    worker_counts: tuple[int, ...] = (1, 2, 4, 8, 16)
    ram_budget: float | None = None  # for the paired bench (None: what is free)
    tokens: int = 32  # decoded per paired-bench run
    reps: int = 3

    def validate(self) -> None:
        if not self.worker_counts or any(not 1 <= w <= 256 for w in self.worker_counts):
            raise ValueError("--workers takes counts in 1..256, e.g. 1,2,4,8,16")
        if self.tokens < 1 or self.reps < 1:
            raise ValueError("--tokens and --reps must be >= 1")
        if self.ram_budget is not None and not self.ram_budget >= 0:
            raise ValueError(f"--ram-budget must be >= 0 GiB, got {self.ram_budget}")


@dataclass(slots=True)
class Paired:
    """Decode tok/s of each run, defaults and picks interleaved."""

    default: list[float] = field(default_factory=list)
    tuned: list[float] = field(default_factory=list)

    @property
    def kept(self) -> bool:
        return statistics.fmean(self.tuned) >= statistics.fmean(self.default)


@dataclass(slots=True)
class TuneResult:
    profile: Profile
    paired: Paired | None  # None when the picks equal the defaults (nothing to compare)

    @property
    def kept(self) -> bool:
        return self.paired is None or self.paired.kept


def _measure(source: FtwSource, setup: Setup, opts: TuneOptions, step: Step) -> dict[str, Any]:
    lay = source.expert_layout
    cfg = parse_config(source.config)
    assert lay is not None
    points = []
    for w in opts.worker_counts:
        step(f"direct reads · {w} workers")
        points.append(measure.direct_reads(source, w))
    step("single-read latency")
    idle = measure.idle_latency_us(source)
    step("expert and layer compute")
    layers = sum(cfg.sparse_layers)
    compute_budget = cfg.top_k * lay.slab_bytes * layers / GIB  # top-k slots per layer
    comp = measure.compute(replace(setup, engine=Engine(ram_budget=compute_budget)))
    step("pinned host-to-device copies")
    h2d = measure.pinned_h2d_gb_s()
    workers = measure.pick_workers(points)
    best = next(p for p in points if p.workers == workers)
    read_us = measure.layer_read_us(source, best, idle, cfg.top_k)
    return {
        "io_mode": measure.io_mode(source),
        "direct_reads": measure.as_dict(points),
        "idle_read_us": round(idle, 1),
        "slab_bytes": lay.slab_bytes,
        "scheme": lay.scheme,
        **{k: round(v, 4) for k, v in comp.items()},
        "layer_read_us": round(read_us, 1),
        "pinned_h2d_gb_s": None if h2d is None else round(h2d, 3),
        "pick_io_workers": workers,
        "pick_lookahead": measure.pick_lookahead(read_us, comp["layer_ms"]),
    }


def paired_bench(default: Setup, tuned: Setup, opts: TuneOptions, step: Step) -> Paired:
    """``full`` with each setup, interleaved, ``opts.reps`` cold runs each."""
    out = Paired()
    case = Case("tg", opts.tokens)
    for rep in range(opts.reps):
        tokens = []
        for name, setup, into in (("defaults", default, out.default), ("tuned", tuned, out.tuned)):
            step(f"paired bench rep {rep + 1}/{opts.reps} · {name}")
            llm = load("full", setup, notice=lambda _: None)
            try:
                sample = run_test(llm, case)
            finally:
                llm.close()
            into.append(sample.tok_s)
            tokens.append(sample.tokens)
        if tokens[0] != tokens[1]:
            raise RuntimeError("the tuned settings changed the generated tokens: a bug, not kept")
    return out


def tune(setup: Setup, opts: TuneOptions, step: Step) -> TuneResult:
    """Measures (module docs), picks, and runs the paired bench when the picks differ
    from the defaults."""
    opts.validate()
    source = FtwSource(setup.model)
    try:
        if source.expert_layout is None:
            raise ValueError(f"{setup.model} has no routed experts: nothing to tune")
        measured = _measure(source, setup, opts, step)
    finally:
        source.close()
    profile = Profile(
        io_workers=measured["pick_io_workers"],
        lookahead=measured["pick_lookahead"],
        machine=machine_key(setup.model),
        model=model_key(setup.model),
        measured=measured,
    )
    if (profile.io_workers, profile.lookahead) == (DEFAULT_IO_WORKERS, DEFAULT_LOOKAHEAD):
        return TuneResult(profile, None)
    base = Engine(ram_budget=opts.ram_budget)
    picked = replace(base, lookahead=profile.lookahead, io_workers=profile.io_workers)
    paired = paired_bench(replace(setup, engine=base), replace(setup, engine=picked), opts, step)
    measured["paired_bench"] = {
        "tokens": opts.tokens,
        "ram_budget_gib": opts.ram_budget,
        "default_tok_s": [round(v, 2) for v in paired.default],
        "tuned_tok_s": [round(v, 2) for v in paired.tuned],
    }
    return TuneResult(profile, paired)


def model_exists(path: Path) -> None:
    if not path.is_file():
        raise ValueError(f"{path} does not exist or is not a .ftw file")
