"""The fixed cost of one kernel launch inside a CUDA graph (issue 10): chains of N
launches of a kernel that does almost nothing, each reading what the one before wrote,
captured in one graph, replayed and timed with CUDA events; with and without
programmatic dependent launch.

Usage: python benches/launch_floor.py [--launches 100,500] [--programs 1,132,1024]

The graph decode step of the 30B-A3B geometry is ~530 launches a token (docs/benchmarks.md):
the microseconds per launch here, times 530, is the part of a token no kernel's bytes
explain. Rows: programs per launch (1, one per multiprocessor, several waves), launches
per graph, PDL on or off, microseconds per launch (median of 5 rounds of 20 replays).
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch
import triton
import triton.language as tl

from flint.graphs import moe_kernel
from flint.graphs.triton_kernels import _await_inputs
from step_ab import timed  # benches/ is the script's own folder


@triton.jit
def step_kernel(src_ptr, dst_ptr, BLOCK: tl.constexpr, GDC: tl.constexpr = False):
    """dst[program's block] = src[...] + 1: one dependent step of the chain."""
    _await_inputs(GDC)
    at = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(dst_ptr + at, tl.load(src_ptr + at) + 1.0)


def chain_graph(launches: int, programs: int, pdl: bool, device: torch.device) -> tuple:
    """A graph of ``launches`` step launches ping-ponging between two buffers."""
    block = 128
    bufs = [torch.zeros(programs * block, device=device) for _ in range(2)]
    saved = moe_kernel.PDL
    moe_kernel.PDL = pdl
    try:

        def run() -> None:
            with moe_kernel.dependent_launch():
                kwargs = moe_kernel.pdl(device)
                for i in range(launches):
                    step_kernel[(programs,)](bufs[i % 2], bufs[(i + 1) % 2], BLOCK=block, **kwargs)

        run()  # compile
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            run()
    finally:
        moe_kernel.PDL = saved
    return graph, bufs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--launches", default="100,500")
    parser.add_argument("--programs", default="1,132,1024")
    args = parser.parse_args()
    device = torch.device("cuda", 0)
    for programs in (int(p) for p in args.programs.split(",")):
        for launches in (int(n) for n in args.launches.split(",")):
            graphs = {pdl: chain_graph(launches, programs, pdl, device) for pdl in (False, True)}
            times: dict[bool, list[float]] = {False: [], True: []}
            for _ in range(5):
                for pdl, (graph, _) in graphs.items():
                    times[pdl].append(timed(graph, 20) / launches)
            for pdl in (False, True):
                row = {"programs": programs, "launches": launches, "pdl": pdl}
                row["us_per_launch"] = round(statistics.median(times[pdl]), 3)
                print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
