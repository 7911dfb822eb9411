"""Streaming on the CPU: the full engine against `naive`, and lookahead 0-3.

    python benches/stream_bench.py MODEL.ftw [--cache-share 0.25] [--tokens 64] [--reps 3]

"demand reads" counts read requests served from the demand queue (a promoted
prefetch's remaining chunks included); "demand misses" counts selected experts that were
neither resident nor being read when their layer started.

`naive` is the same O_DIRECT engine, workers and budget with a layer's misses read in
parallel; prediction (lookahead 0), chunking and the decay policy are off (LRU), so
cancel/promote never act. Every configuration decodes the same greedy continuation of
the same prompt; the first run's tokens are the control the others must match.
Configurations run interleaved, `--reps` times each, each in a fresh model.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

import torch

import flint
from flint.models import parse_config
from flint.models.ftw_source import FtwSource
from flint.stream import streamed_backend

PROMPT = "import os\nimport sys\n\n\ndef main(argv):\n"

CONFIGS: dict[str, dict[str, Any]] = {
    "naive": {"policy": "lru", "lookahead": 0, "chunking": False},
    "full (lookahead 2)": {"policy": "decay", "lookahead": 2, "chunking": True},
    "lookahead 0": {"policy": "decay", "lookahead": 0, "chunking": True},
    "lookahead 1": {"policy": "decay", "lookahead": 1, "chunking": True},
    "lookahead 3": {"policy": "decay", "lookahead": 3, "chunking": True},
    "lookahead 2, 1.5 x top-k wide": {
        "policy": "decay",
        "lookahead": 2,
        "chunking": True,
        "lookahead_width": 1.5,
    },
    "lookahead 2, 2 x top-k wide": {
        "policy": "decay",
        "lookahead": 2,
        "chunking": True,
        "lookahead_width": 2.0,
    },
}


def run(path: Path, share: float, tokens: int, cfg: dict[str, Any]) -> dict[str, Any]:
    source = FtwSource(path)
    lay = source.expert_layout
    assert lay is not None
    config = parse_config(source.config)
    budget = share * lay.n_experts * lay.slab_bytes * sum(config.sparse_layers) / 2**30
    backend = streamed_backend(
        source,
        config,
        torch.device("cpu"),
        torch.float32,
        budget,
        usage=False,  # every run starts cold: no usage table, no idle fill
        notice=lambda _: None,
        **cfg,
    )
    llm = flint.LLM(source, device="cpu", context_length=512, expert_backend=backend)
    backend.attach(llm.model)
    ids = llm.tokenizer.encode(PROMPT)
    llm.generate(ids, max_tokens=1)  # prompt once, so decode counters start clean
    before = dict(backend.stats())
    t0 = time.perf_counter()
    out = llm.generate(ids, max_tokens=tokens, ignore_eos=True)
    dt = time.perf_counter() - t0
    s = backend.stats()
    n = s["forward_calls"] - before["forward_calls"]
    res = {
        "tok_s": tokens / dt,
        "stall_ms": 1000 * (s["stall_s"] - before["stall_s"]) / n,
        "demand": (s["reads_demand"] - before["reads_demand"]) / n,
        "misses": (s["demand_placements"] - before["demand_placements"]) / n,
        "prefetch": (s["reads_prefetch"] - before["reads_prefetch"]) / n,
        "recall_d1": s.get("recall_d1"),
        "recall_d2": s.get("recall_d2"),
        "slots": s["slots_per_layer"],
        "tokens": list(out.token_ids),
    }
    llm.close()
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model", type=Path)
    ap.add_argument("--cache-share", type=float, default=0.25)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    results: dict[str, list[dict[str, Any]]] = {k: [] for k in CONFIGS}
    control: list[int] | None = None
    for _ in range(a.reps):
        for name, cfg in CONFIGS.items():
            r = run(a.model, a.cache_share, a.tokens, cfg)
            control = control or r["tokens"]
            assert r["tokens"] == control, f"{name}: output differs from the control run"
            results[name].append(r)
    print(
        f"{a.model.name}: RAM cache {a.cache_share:.0%} of experts "
        f"({results['naive'][0]['slots']} slots/layer), tg{a.tokens} after a "
        f"{len(PROMPT)}-char prompt, {a.reps} interleaved reps, outputs identical"
    )
    print(
        "| config | tok/s | stall ms/token | demand reads/token | prefetch reads/token "
        "| demand misses/token | recall d1 | recall d2 |\n|---|---|---|---|---|---|---|---|"
    )
    for name, rs in results.items():

        def m(key: str, rs: list[dict[str, Any]] = rs) -> str:
            vals = [r[key] for r in rs if r[key] is not None]
            if not vals:
                return "-"
            sd = statistics.stdev(vals) if len(vals) > 1 else 0.0
            return f"{statistics.mean(vals):.2f} ± {sd:.2f}"

        print(
            f"| {name} | {m('tok_s')} | {m('stall_ms')} | {m('demand')} | {m('prefetch')} "
            f"| {m('misses')} | {m('recall_d1')} | {m('recall_d2')} |"
        )


if __name__ == "__main__":
    main()
