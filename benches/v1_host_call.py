"""The fused host call inside a streamed CUDA decode (V1) against the same calls replayed.

Usage: python benches/v1_host_call.py MODEL.ftw [--tokens 16] [--ram-budget 20]
       [--vram-budget 4] [--torch-threads N]

Loads MODEL as ``flint bench --mode full`` does (every expert in RAM once the load's
fill is done), decodes ``--tokens`` random tokens through the default decode path and
times every fused call the CPU makes for the experts outside VRAM. Then replays the
recorded calls (same slots, same inputs, same kernel object) in a tight loop, once as
the decode made them (with the engine, its hits listed) and once with no engine: if the
replay is as slow as the decode, the call's memory or its inputs are what is slow; if
it is fast, something running beside the decode is, or the caches: a random-weight
model routes consecutive tokens to many of the same experts, so a tight replay finds
them in L3, and the next replays read 1 GiB before each call: with torch's threads,
with one of them (torch's OpenMP threads spin for a while after a parallel region, on
the cores the kernels' pool wants), and with torch's threads and 20 ms of idle after.
``--torch-threads`` sets torch's own pool after the load, the kernels' pool unchanged.
Prints one JSON line per case: milliseconds per call (median), experts per call, and
effective GB/s.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from flint.bench.modes import Engine, Setup, load
from flint.bench.runner import Case, run_test


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--ram-budget", type=float, default=20.0)
    parser.add_argument("--vram-budget", type=float, default=4.0)
    parser.add_argument("--torch-threads", type=int, default=0)
    parser.add_argument("--device", default=None)
    args = parser.parse_args()
    engine = Engine(ram_budget=args.ram_budget, vram_budget=args.vram_budget)
    llm = load("full", Setup(model=args.model, device=args.device, engine=engine), print)
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    backend: Any = llm.expert_backend
    fused = backend.host_fused or backend.fused  # CUDA's host share, or a CPU model's
    if fused is None:
        raise SystemExit("no fused kernels here (torch's expert path)")
    calls: list[tuple[Any, ...]] = []
    times: list[float] = []
    inner = fused.expert_outputs

    def timed(x32, ids, listed, y, eng=None, layer=0, hits=None):  # type: ignore[no-untyped-def]
        calls.append((x32.clone(), ids.clone(), list(listed), y.shape, layer, list(hits or [])))
        t0 = time.perf_counter()
        inner(x32, ids, listed, y, eng, layer, hits)
        times.append(time.perf_counter() - t0)

    fused.expert_outputs = timed
    sample = run_test(llm, Case("tg", args.tokens, random_feed=True))
    fused.expert_outputs = inner
    slab = backend.layout.slab_bytes

    def report(case: str, ts: list[float]) -> None:
        experts = statistics.mean(len(c[2]) for c in calls)
        ms = statistics.median(ts) * 1000
        print(json.dumps({
            "case": case, "calls": len(ts), "ms_per_call": round(ms, 3),
            "experts_per_call": round(experts, 2),
            "gb_s": round(experts * slab / (ms / 1000) / 1e9, 2),
            "threads": fused.core.threads, "torch_threads": torch.get_num_threads(),
        }))  # fmt: skip

    report(f"in decode ({sample.tok_s:.2f} tok/s)", times)
    flush = torch.ones(256 << 20)  # 1 GiB: read between calls, the caches start cold
    threads = torch.get_num_threads()
    for case, eng, cold, flush_threads, pause in (
        ("replayed, engine and hits", backend.engine, False, 0, 0.0),
        ("replayed, no engine", None, False, 0, 0.0),
        ("replayed, caches flushed before each call", None, True, threads, 0.0),
        ("replayed, flushed by one torch thread", None, True, 1, 0.0),
        ("replayed, flushed, then 20 ms idle", None, True, threads, 0.02),
    ):
        ts = []
        for x32, ids, listed, shape, layer, hits in calls[:200]:
            y = torch.empty(shape, dtype=torch.float32)
            if cold:
                torch.set_num_threads(flush_threads)
                flush.sum()
                torch.set_num_threads(threads)
                time.sleep(pause)
            t0 = time.perf_counter()
            inner(x32, ids, listed, y, eng, layer, hits)
            ts.append(time.perf_counter() - t0)
        report(case, ts)
    thp = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    rollup = Path("/proc/self/smaps_rollup")
    huge = [ln for ln in rollup.read_text().splitlines() if "AnonHugePages" in ln]
    print(json.dumps({"thp": thp.read_text().strip() if thp.exists() else None, "huge": huge}))
    llm.close()


if __name__ == "__main__":
    main()
