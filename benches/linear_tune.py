"""Block shapes of the one-token matrix-vector kernel (``flint.graphs.fused.linear``)
against torch's ``F.linear`` on the dense shapes of the 30B-A3B geometry's decode step.

Usage: python benches/linear_tune.py [--shapes qkv,o,router,head] [--quick]
       [--blocks "8,512,8;4,1024,4"]

Per shape, enough distinct weight copies that together they exceed the L2 (every call
reads HBM), one call per copy captured in a CUDA graph, replayed 20 times and timed
with events (launch cost excluded, as in the decode step's graphs). Rows: GB/s of
weight bytes (and scales) read, for torch (bf16 only) and each (rows, columns,
warps) block of the kernel, bf16 and int8 weights. (The eighteenth session's
``--ahead``, two weight tiles in flight, was taken out with the kernel's option:
docs/benchmarks.md.)
"""

from __future__ import annotations

import argparse
import itertools
import json
from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F

from flint.graphs import fused

SHAPES = {"qkv": (5120, 2048), "o": (2048, 4096), "router": (128, 2048), "head": (151936, 2048)}


def timed(calls: list[Callable[[], object]], reps: int = 20) -> float:
    """Seconds per replay of one graph of ``calls``."""
    for call in calls:  # compile
        call()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / reps


def tune(name: str, blocks: list[tuple[int, int, int]], dev: torch.device) -> None:
    """Torch and every block on shape ``name``, bf16 and int8 weights."""
    n, k = SHAPES[name]
    copies = max(2, (512 << 20) // (n * k * 2))
    x = torch.randn(1, k, device=dev).bfloat16()
    ws = [torch.randn(n, k, device=dev).bfloat16() for _ in range(copies)]
    qs = [torch.randint(-127, 128, (n, k), dtype=torch.int8, device=dev) for _ in range(copies)]
    ss = [torch.rand(n, device=dev) / 100 for _ in range(copies)]
    outs = [torch.empty(1, n, device=dev).bfloat16() for _ in range(copies)]
    nbytes = {"bf16": copies * n * k * 2, "int8": copies * n * (k + 4)}

    def report(kernel: str, scheme: str, block: object, sec: float) -> dict:
        row = {"shape": name, "kernel": kernel, "scheme": scheme, "block": block}
        row |= {"us": round(sec / copies * 1e6, 2), "gb_s": round(nbytes[scheme] / sec / 1e9, 1)}
        print(json.dumps(row), flush=True)
        return row

    report("torch", "bf16", None, timed([partial(F.linear, x, w) for w in ws]))
    for scheme in ("bf16", "int8"):
        best: dict | None = None
        if scheme == "bf16":
            calls = [partial(fused.linear, x, w, out=o) for w, o in zip(ws, outs, strict=True)]
        else:
            calls = [
                partial(fused.linear, x, q, scale=s, out=o)
                for q, s, o in zip(qs, ss, outs, strict=True)
            ]
        for block in blocks:
            fused.LINEAR_BLOCK[scheme] = block
            try:
                row = report("flint", scheme, block, timed(calls))
            except Exception as err:  # a shape the compiler refuses: say so, go on
                print(json.dumps({"shape": name, "block": block, "error": str(err)[:80]}))
                continue
            if best is None or row["gb_s"] > best["gb_s"]:
                best = row
        print("best", json.dumps(best), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="qkv,o,router,head")
    parser.add_argument("--quick", action="store_true", help="fewer block shapes")
    parser.add_argument("--blocks", help='block shapes to time, e.g. "8,512,8;4,1024,4"')
    args = parser.parse_args()
    dev = torch.device("cuda", 0)
    blocks = list(itertools.product((4, 8, 16, 32), (512, 1024), (4, 8)))
    if args.quick:
        blocks = list(itertools.product((8, 16), (512, 1024), (4,)))
    if args.blocks:
        blocks = [tuple(int(v) for v in b.split(",")) for b in args.blocks.split(";")]  # type: ignore[misc]
    for name in args.shapes.split(","):
        tune(name, blocks, dev)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
