"""Where a long prompt's time goes: one prefill under torch.profiler, GPU time by kind.

Usage: python benches/prompt_profile.py MODEL.ftw [--tokens 8192] [--mode full]
       [--ram-budget 20] [--vram-budget 4] [--device cuda] [--top 15] [--python]

Loads MODEL as ``flint bench --mode MODE`` does (a streamed mode waits for the load's
fill when every expert fits the RAM budget), prefills ``--tokens`` random ids once to
compile and warm everything (as ``flint bench --warm``), then once more under the
profiler. Prints the profiled prefill's wall time; on CUDA the kernels' time by kind
(grouped expert kernels, matrix products, attention, copies, the rest) with each
kind's share of the wall time, and the share of the wall time the GPU was busy at all
(the union of kernel and copy intervals), and the ``--top`` kernels by GPU time; then
the host's operators by self time. A
GPU busy for a small share of the wall time means the host (Python, synchronisation)
is what the prompt waits for; a busy GPU, the kind that dominates.

``--python``: the second prefill under cProfile instead (no CUDA tracing: the host's
Python functions by own time and by cumulative time, waits on the GPU included where
a call synchronises: ``tolist``, ``item``, ``synchronize``).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from flint.bench.modes import Engine, Setup, load
from flint.models.prefill import prefill

KINDS = (  # the first pattern a kernel's name contains decides its kind
    ("grouped experts (Triton)", ("grouped", "gate_up", "down_kernel", "slot")),
    ("attention", ("flash", "fmha", "attention", "sdpa", "softmax")),
    ("matrix products", ("gemm", "gemv", "cutlass", "sm90", "nvjet", "cublas", "splitk")),
    ("copies", ("memcpy", "memset")),
)


def kind_of(name: str) -> str:
    low = name.lower()
    for kind, needles in KINDS:
        if any(n in low for n in needles):
            return kind
    return "the rest"


def busy_us(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of ``intervals`` (start, end) in us."""
    total, end = 0.0, float("-inf")
    for s, e in sorted(intervals):
        if s > end:
            total, end = total + (e - s), e
        elif e > end:
            total, end = total + (e - end), e
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--mode", default="full")
    ap.add_argument("--ram-budget", type=float, default=None)
    ap.add_argument("--vram-budget", type=float, default=None)
    ap.add_argument("--device", default=None)
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--python", action="store_true", help="cProfile the host instead")
    a = ap.parse_args()
    engine = Engine(ram_budget=a.ram_budget, vram_budget=a.vram_budget)
    setup = Setup(a.model, device=a.device, context_length=a.tokens + 8, engine=engine)
    llm = load(a.mode, setup, notice=print)
    model = llm.model
    dev = model.place.device
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (a.tokens,), generator=gen).to(dev)
    cuda = dev.type == "cuda"

    def run() -> float:
        model.reset()
        if cuda:
            torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        prefill(model, ids)
        if cuda:
            torch.cuda.synchronize(dev)
        return time.perf_counter() - t0

    print(f"warm-up prefill of {a.tokens} tokens: {run():.3f} s")
    print(f"unprofiled prefill: {run():.3f} s")
    if a.python:
        host = cProfile.Profile()
        wall = host.runcall(run)
        print(f"prefill under cProfile: {wall:.3f} s")
        for key in ("tottime", "cumulative"):
            pstats.Stats(host).sort_stats(key).print_stats(a.top)
        llm.close()
        return
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=acts) as prof:
        wall = run()
    print(f"profiled prefill: {wall:.3f} s ({a.tokens / wall:.0f} tok/s under the profiler)")
    if cuda:
        by_kind: dict[str, float] = {}
        by_name: dict[str, tuple[int, float]] = {}
        spans = []
        for ev in prof.events():
            if ev.device_type != torch.autograd.DeviceType.CUDA:
                continue
            us = ev.time_range.end - ev.time_range.start
            by_kind[kind_of(ev.name)] = by_kind.get(kind_of(ev.name), 0.0) + us
            n, total = by_name.get(ev.name, (0, 0.0))
            by_name[ev.name] = (n + 1, total + us)
            spans.append((ev.time_range.start, ev.time_range.end))
        print("| GPU work | ms | share of the wall time |")
        print("|---|---|---|")
        for kind, us in sorted(by_kind.items(), key=lambda kv: -kv[1]):
            print(f"| {kind} | {us / 1e3:.1f} | {us / 1e4 / wall:.1f}% |")
        busy = busy_us(spans)
        print(f"| GPU busy (union) | {busy / 1e3:.1f} | {busy / 1e4 / wall:.1f}% |")
        print("| GPU kernel or copy | calls | ms |")
        print("|---|---|---|")
        for name, (n, us) in sorted(by_name.items(), key=lambda kv: -kv[1][1])[: a.top]:
            print(f"| {name[:90]} | {n} | {us / 1e3:.1f} |")
    print(
        prof.key_averages().table(
            sort_by="self_cpu_time_total", row_limit=a.top, max_name_column_width=50
        )
    )
    llm.close()


if __name__ == "__main__":
    main()
