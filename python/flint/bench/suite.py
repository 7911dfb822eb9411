"""A whole ``flint bench`` invocation: every (repetition, mode, test), interleaved, with
each streamed mode's greedy tokens checked against the ``resident`` control.

Order: for each repetition, for each test, every mode in turn, each in a fresh model
(cold: empty expert cache) unless ``warm``. Interleaving puts a change in the
machine's load on every mode alike. With ``warm`` one model per mode serves every
run, after one untimed warm-up run of each test.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from flint.api import LLM
from flint.bench.modes import MODES, Setup, load, mode_of
from flint.bench.runner import Case, Sample, run_test
from flint.stream import StreamedExperts

CONTROL = "resident"
UNCHECKED = ("nowait",)  # garbage by construction (modes.py)


@dataclass(slots=True, frozen=True)
class Plan:
    """What to run: modes, tests, repetitions."""

    modes: tuple[str, ...]
    tests: tuple[Case, ...]
    reps: int = 3
    warm: bool = False

    def validate(self) -> None:
        if not self.modes:
            raise ValueError("--mode needs at least one of " + ", ".join(MODES))
        for m in self.modes:
            mode_of(m)  # raises on an unknown mode or host split
        if len(set(self.modes)) != len(self.modes):
            raise ValueError("--mode lists a mode twice")
        if not self.tests:
            raise ValueError("nothing to run: -p and -n are both 0")
        if self.reps < 1:
            raise ValueError(f"-r must be >= 1, got {self.reps}")


@dataclass(slots=True)
class Mismatch:
    """A mode whose greedy tokens differ from the control's in one run."""

    mode: str
    test: str
    rep: int
    index: int  # first differing position among the generated tokens
    got: int | None
    want: int | None


@dataclass(slots=True)
class Outcome:
    """Every sample, keyed by (mode, test name), in run order, plus what the runs told
    about the model (slots per layer, budgets, expert scheme)."""

    samples: dict[tuple[str, str], list[Sample]] = field(default_factory=dict)
    mismatches: list[Mismatch] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def checked(self) -> bool:
        return any(k[0] == CONTROL for k in self.samples)


def _first_difference(got: list[int], want: list[int]) -> int:
    for i, (a, b) in enumerate(zip(got, want, strict=False)):
        if a != b:
            return i
    return min(len(got), len(want))


def _describe(llm: LLM, info: dict[str, Any]) -> None:
    layout = getattr(llm.source, "expert_layout", None)
    info.setdefault("experts", "checkpoint" if layout is None else layout.scheme)
    info.setdefault("device", str(llm.device))
    info.setdefault("dtype", str(llm.dtype).removeprefix("torch."))
    backend = llm.expert_backend
    if not isinstance(backend, StreamedExperts):  # the resident mode's step and kernels
        info.setdefault("decode", llm.model.decode_path)
        info.setdefault("expert_kernel", llm.model.expert_kernel)
    else:  # the streamed modes' (the streamed graph step, or the layer loop)
        info.setdefault("streamed_decode", llm.model.decode_path)
    if llm.no_graphs is not None:
        info.setdefault("no_graphs", llm.no_graphs)
    if isinstance(backend, StreamedExperts):
        plan = backend.plan
        info.setdefault("slots_per_layer", plan.slots_per_layer)
        info.setdefault("n_experts", plan.n_experts)
        info.setdefault("cache_gib", plan.cache_bytes / 2**30)
        info.setdefault("experts_gib", plan.expert_bytes / 2**30)
        info.setdefault("io_mode", backend.engine.mode)
        if backend.vram is not None:
            info.setdefault("vram_slots_per_layer", backend.vram.slots)
        if backend.host is not None:  # what --host-split resolved to (auto: fill or cpu)
            info.setdefault("host_split_resolved", backend.host_split)
        if backend.device.type == "cuda":  # which kernels compute the GPU's share
            kernels = "slab kernels (Triton)" if backend.slab_kernels else "torch per expert"
            info.setdefault("streamed_gpu_experts", kernels)
            if "pcie_gb_s" not in info:  # the PCIe bound's rate: pinned host-to-device
                from flint.stream.qsplit import pcie_bandwidth

                info["pcie_gb_s"] = pcie_bandwidth(backend.device) / 1e9  # cached per GPU


Step = Callable[[str], None]  # told "rep i/n . mode . test" before each run


def run_plan(plan: Plan, setup: Setup, notice: Callable[[str], None], step: Step) -> Outcome:
    """Runs ``plan`` (module docs); ``notice`` gets each distinct load note once."""
    plan.validate()
    out = Outcome()
    seen: set[str] = set()

    def note(line: str) -> None:
        if line not in seen:
            seen.add(line)
            notice(line)

    reads = any(mode_of(m)[0] in ("full", "naive") for m in plan.modes)
    if reads and any(t.kind == "tg" for t in plan.tests):
        out.info["disk_gb_s"] = _disk_gb_s(setup)
    warm: dict[str, LLM] = {}
    try:
        if plan.warm:
            for mode in plan.modes:
                warm[mode] = load(mode, setup, note)
                for test in plan.tests:
                    step(f"warm-up · {mode} · {test.name}")
                    run_test(warm[mode], test)
        for rep in range(plan.reps):
            for test in plan.tests:
                control: list[int] | None = None
                for mode in plan.modes:
                    step(f"rep {rep + 1}/{plan.reps} · {mode} · {test.name}")
                    llm = warm.get(mode) or load(mode, setup, note)
                    try:
                        sample = run_test(llm, test)
                        _describe(llm, out.info)
                    finally:
                        if mode not in warm:
                            llm.close()
                    out.samples.setdefault((mode, test.name), []).append(sample)
                    if mode == CONTROL:
                        control = sample.tokens
                _check(plan, out, rep, test, control)
    finally:
        for llm in warm.values():
            llm.close()
    out.info["threads"] = torch.get_num_threads()
    return out


def _disk_gb_s(setup: Setup, passes: int = 3) -> float | None:
    """The model drive's direct-read rate: the best of ``passes`` short passes of
    ``flint tune``'s read test. The Belady bound divides by it, and a higher rate makes
    the bound smaller, so the best pass is the strict choice on a drive whose rate moves
    from pass to pass. None unless the model is a file (a checkpoint directory, or a
    missing path the load then names)."""
    if not setup.model.is_file():
        return None
    from flint.models.ftw_source import FtwSource
    from flint.tune.measure import direct_reads  # here: flint.tune imports flint.bench

    source = FtwSource(setup.model)
    return max(direct_reads(source, setup.engine.io_workers, passes=1).gb_s for _ in range(passes))


def _check(plan: Plan, out: Outcome, rep: int, test: Case, control: list[int] | None) -> None:
    if control is None:
        return
    for mode in plan.modes:
        if mode == CONTROL or mode_of(mode)[0] in UNCHECKED:
            continue
        got = out.samples[(mode, test.name)][rep].tokens
        if got != control:
            i = _first_difference(got, control)
            out.mismatches.append(
                Mismatch(
                    mode,
                    test.name,
                    rep,
                    i,
                    got[i] if i < len(got) else None,
                    control[i] if i < len(control) else None,
                )
            )


def summary(values: list[float]) -> dict[str, float]:
    """mean, sd (0 for one value) and the values."""
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return {"mean": statistics.fmean(values), "sd": sd}
