"""The fixed cost of one kernel launch inside a CUDA graph (issue 10): chains of N
launches of a kernel that does almost nothing, each reading what the one before wrote,
captured in one graph, replayed and timed with CUDA events: launched one after the
other (``serial``), with programmatic dependent launch (``pdl``: each kernel's programs
start early and wait in ``griddepcontrol.wait`` until the kernel before has finished),
or with dependent launch and a counter instead of that wait (``flag``: each program
adds one to its kernel's counter, release, once its stores are done; the next
kernel's programs poll that counter, acquire, until every program has added).
``cluster`` (eight programs only): dependent launch of one thread-block cluster of
eight, whose programs add one partial sum each through each other's shared memory
(``_cluster_sum``, ``fused.CLUSTER_NORM``'s exchange) before their stores: a launch
with that exchange against ``pdl`` at eight programs without it; ``cluster-async`` the
same through asynchronous stores and a transaction barrier (``fused.CLUSTER_ASYNC``).

Usage: python benches/launch_floor.py [--launches 100,500] [--programs 1,132,1024]
       [--syncs serial,pdl,flag,cluster,cluster-async]

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

from flint.graphs import fused, moe_kernel
from flint.graphs.triton_kernels import _await_inputs, _cluster_arrive, _cluster_sum
from step_ab import timed  # benches/ is the script's own folder


@triton.jit
def step_kernel(src_ptr, dst_ptr, BLOCK: tl.constexpr, GDC: tl.constexpr = False):
    """dst[program's block] = src[...] + 1: one dependent step of the chain."""
    _await_inputs(GDC)
    at = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(dst_ptr + at, tl.load(src_ptr + at) + 1.0)


@triton.jit
def cluster_step_kernel(
    src_ptr, dst_ptr, BLOCK: tl.constexpr, ASYNC: tl.constexpr = False, GDC: tl.constexpr = False
):
    """``step_kernel`` whose eight programs, one cluster, first add their blocks' sums
    through each other's shared memory (added back as 0 * sum: the same values);
    ``ASYNC``: through asynchronous stores (``_cluster_sum``)."""
    xchg = _cluster_arrive(ASYNC)
    _await_inputs(GDC)
    at = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(src_ptr + at)
    total = _cluster_sum(tl.sum(x, axis=0), xchg, ASYNC)
    tl.store(dst_ptr + at, x + 1.0 + 0.0 * total)


@triton.jit
def flag_step_kernel(
    src_ptr,
    dst_ptr,
    wait_ptr,
    done_ptr,
    need,
    BLOCK: tl.constexpr,
    WAIT: tl.constexpr,
    GDC: tl.constexpr = False,
):
    """``step_kernel`` ordered by counters: poll ``wait_ptr`` (acquire) until ``need``
    programs of the kernel before have added to it, let the next kernel's programs
    start, step, then add one to ``done_ptr`` (release) once every thread's store is
    done."""
    if WAIT:
        seen = tl.atomic_add(wait_ptr, 0, sem="acquire", scope="gpu")
        while seen < need:
            seen = tl.atomic_add(wait_ptr, 0, sem="acquire", scope="gpu")
        if GDC:
            tl.extra.cuda.gdc_launch_dependents()
    at = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(dst_ptr + at, tl.load(src_ptr + at) + 1.0)
    tl.debug_barrier()
    tl.atomic_add(done_ptr, 1, sem="release", scope="gpu")


def chain_graph(launches: int, programs: int, sync: str, device: torch.device) -> tuple:
    """A graph of ``launches`` step launches ping-ponging between two buffers, each
    waiting for the one before as ``sync`` says ("flag": the graph first zeroes the
    counters, one memset node more a replay)."""
    block = 128
    bufs = [torch.zeros(programs * block, device=device) for _ in range(2)]
    counters = torch.zeros(launches if sync == "flag" else 1, dtype=torch.int32, device=device)
    saved = moe_kernel.PDL
    moe_kernel.PDL = sync != "serial"
    try:

        def run() -> None:
            with moe_kernel.dependent_launch():
                kwargs = moe_kernel.pdl(device)
                if sync == "flag":
                    counters.zero_()
                for i in range(launches):
                    src, dst = bufs[i % 2], bufs[(i + 1) % 2]
                    if sync.startswith("cluster"):
                        assert programs == 8, "a cluster of eight programs"
                        meta = {"BLOCK": block, "ASYNC": sync == "cluster-async", **kwargs}
                        fused._cluster_launch(cluster_step_kernel, 8, (src, dst), meta)
                        continue
                    if sync != "flag":
                        step_kernel[(programs,)](src, dst, BLOCK=block, **kwargs)
                        continue
                    # the first launch follows the counters' reset: no early start
                    early = kwargs if i else {}
                    wait = counters[max(i - 1, 0)]
                    flag_step_kernel[(programs,)](
                        src, dst, wait, counters[i], programs, BLOCK=block, WAIT=i > 0, **early
                    )

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
    parser.add_argument("--syncs", default="serial,pdl,flag")
    args = parser.parse_args()
    device = torch.device("cuda", 0)
    syncs = args.syncs.split(",")
    for programs in (int(p) for p in args.programs.split(",")):
        for launches in (int(n) for n in args.launches.split(",")):
            graphs = {sync: chain_graph(launches, programs, sync, device) for sync in syncs}
            times: dict[str, list[float]] = {sync: [] for sync in syncs}
            for _ in range(5):
                for sync, (graph, _) in graphs.items():
                    times[sync].append(timed(graph, 20) / launches)
            for sync in syncs:
                graph, bufs = graphs[sync]
                before = float(bufs[0][0])
                graph.replay()
                torch.cuda.synchronize()
                # the chain starts from bufs[0] and ends in bufs[launches % 2], each
                # launch adding one to every entry after reading the one before's: a
                # launch that read early shows here
                last = bufs[launches % 2]
                ok = bool((last == before + launches).all())
                row = {"programs": programs, "launches": launches, "sync": sync, "ok": ok}
                row["us_per_launch"] = round(statistics.median(times[sync]), 3)
                print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
