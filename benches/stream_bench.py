"""Streaming ablations on the CPU: naive, the full engine, lookahead 0-3 and wider
predictions, as `flint bench` measures them (flint.bench), in one interleaved run.

    python benches/stream_bench.py MODEL.ftw [--cache-share 0.25] [--tokens 64] [--reps 3]

`flint bench MODEL --mode resident,full,naive` is the standard measurement; this script
adds the configurations `flint bench` has one flag for but cannot run side by side
(several lookahead depths and widths of `full` in one invocation). Each run is a fresh,
cold model (tg: the short code prompt, then --tokens greedy tokens); every
configuration's tokens must equal the first run's (naive's), a control that
`flint bench` itself checks against `resident`.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import torch

from flint.bench import Case, Engine, Setup
from flint.bench.modes import load
from flint.bench.runner import Sample, run_test
from flint.models import parse_config
from flint.models.ftw_source import FtwSource

CONFIGS: dict[str, tuple[str, dict[str, float]]] = {  # name -> (mode, Engine fields)
    "naive": ("naive", {}),
    "full (lookahead 2)": ("full", {"lookahead": 2}),
    "lookahead 0": ("full", {"lookahead": 0}),
    "lookahead 1": ("full", {"lookahead": 1}),
    "lookahead 3": ("full", {"lookahead": 3}),
    "lookahead 2, 1.5 x top-k wide": ("full", {"lookahead": 2, "lookahead_width": 1.5}),
    "lookahead 2, 2 x top-k wide": ("full", {"lookahead": 2, "lookahead_width": 2.0}),
}
COLUMNS = ("stall_ms", "demand_reads", "prefetch_reads", "demand_misses", "recall_d1", "recall_d2")


def budget_gib(path: Path, share: float) -> float:
    source = FtwSource(path)
    lay = source.expert_layout
    layers = sum(parse_config(source.config).sparse_layers)
    source.close()
    assert lay is not None, "the model has no routed experts"
    return share * lay.n_experts * lay.slab_bytes * layers / 2**30


def cell(samples: list[Sample], key: str) -> str:
    vals = [
        v for s in samples if (v := s.tok_s if key == "tok_s" else s.streaming[key]) is not None
    ]
    if not vals:
        return "-"
    sd = statistics.stdev(vals) if len(vals) > 1 else 0.0
    return f"{statistics.mean(vals):.2f} ± {sd:.2f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--cache-share", type=float, default=0.25)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    budget = budget_gib(a.model, a.cache_share)
    results: dict[str, list[Sample]] = {name: [] for name in CONFIGS}
    control: list[int] | None = None
    for _ in range(a.reps):
        for name, (mode, fields) in CONFIGS.items():
            engine = Engine(ram_budget=budget, **fields)  # type: ignore[arg-type]
            setup = Setup(a.model, device="cpu", context_length=a.tokens + 80, engine=engine)
            llm = load(mode, setup, notice=lambda _: None)
            try:
                sample = run_test(llm, Case("tg", a.tokens))
                slots = llm.stats()["slots_per_layer"]  # type: ignore[index]
            finally:
                llm.close()
            control = control or sample.tokens
            if sample.tokens != control:
                raise SystemExit(f"{name}: output differs from the control run")
            results[name].append(sample)
    print(
        f"{a.model.name}: RAM cache {a.cache_share:.0%} of experts ({slots} slots/layer), "
        f"tg{a.tokens} after a short code prompt, {a.reps} interleaved cold reps, outputs "
        "identical"
    )
    print("| config | tok/s | " + " | ".join(COLUMNS) + " |\n|" + "---|" * (len(COLUMNS) + 2))
    for name, samples in results.items():
        print(f"| {name} | " + " | ".join(cell(samples, k) for k in ("tok_s", *COLUMNS)) + " |")


if __name__ == "__main__":
    main()
