"""``flint bench``: llama-bench-style speed rows (pp512, tg128, mean ± sd over
interleaved repetitions) with the streaming columns of BENCHMARKS.md, comparing the
modes ``resident``, ``full``, ``naive`` and ``nowait`` in one run and checking every
streamed mode's greedy tokens against the ``resident`` control.

Example::

    from flint.bench import Plan, Setup, Engine, Case, run_plan, to_json

    plan = Plan(("resident", "full"), (Case("pp", 64), Case("tg", 32)), reps=3)
    setup = Setup(Path("model.ftw"), device="cpu", engine=Engine(ram_budget=0.5))
    doc = to_json(plan, setup, run_plan(plan, setup, print, lambda _: None))
"""

from __future__ import annotations

from flint.bench.modes import MODES, POLICIES, Engine, NoWaitExperts, Setup
from flint.bench.report import to_json, to_markdown
from flint.bench.runner import Case, Sample, run_test
from flint.bench.suite import Mismatch, Outcome, Plan, run_plan

__all__ = [
    "MODES",
    "POLICIES",
    "Case",
    "Engine",
    "Mismatch",
    "NoWaitExperts",
    "Outcome",
    "Plan",
    "Sample",
    "Setup",
    "run_plan",
    "run_test",
    "to_json",
    "to_markdown",
]
