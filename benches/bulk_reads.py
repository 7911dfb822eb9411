"""How fast a launch can read rows it learns only after its wait (issue 10): gate/up's
case, whose experts come from the top-k launch just before it. A chain of dependent
launches captured in one graph, each of ``--programs`` programs reading one
``--chunk``-byte chunk of a large buffer at an index it computes from the launch
before's output (so no read can start before the wait), summing it, and writing the
sum. ``ldg``: the chunk through ordinary loads into registers (as gate/up reads its
rows today); ``bulk``: one thread of each program asks the copy engine for the whole
chunk into shared memory (``cp.async.bulk`` with a transaction barrier, Hopper's bulk
copy), the program waits on the barrier, then reads shared memory; ``tma``: the chunk
as one block of a tensor descriptor (Triton's own use of the copy engine, a [8, 256]
box of the pool seen as [chunks, 8, 256]).

Usage: python benches/bulk_reads.py [--programs 1536] [--chunk 8192] [--launches 50]
       [--modes ldg,bulk,tma] [--warps 2] [--pool-gib 4] [--no-pdl]

Rows: mode, programs, chunk bytes, microseconds a launch (median of 5 rounds of 20
replays), the launch's bytes over that time, and whether its sums are right (against
torch's sums of the same chunks, modulo 2^32). A mode that faults ends the process:
run ``bulk`` alone.
"""

from __future__ import annotations

import argparse
import json
import statistics
from typing import Any

import torch
import triton
import triton.language as tl

from flint.graphs import moe_kernel
from flint.graphs.triton_kernels import _await_inputs
from step_ab import timed  # benches/ is the script's own folder

CHUNK_WORDS = 2048  # 8 KB: the bulk kernel's shared buffer is this size (in its PTX)


@triton.jit
def _bulk_read(src):
    """The 8 KB at global address ``src`` copied into this program's shared memory by
    one bulk copy (thread 0 sets up a transaction barrier for 8,192 bytes and issues
    it; every thread waits on the barrier): returns the buffer's shared address."""
    return tl.inline_asm_elementwise(
        "{ .shared .align 128 .b8 chunk_buf[8192]; .shared .align 8 .b64 chunk_bar;"
        " .reg .u32 a, m, t; .reg .pred p, done; .reg .b64 s, g;"
        " mov.u32 a, chunk_buf; mov.u32 m, chunk_bar; mov.u32 t, %tid.x;"
        " setp.eq.u32 p, t, 0; cvta.to.global.u64 g, $1;"
        " @p mbarrier.init.shared::cta.b64 [m], 1;"
        " @p fence.mbarrier_init.release.cluster; @p fence.proxy.async.shared::cta;"
        " @p mbarrier.arrive.expect_tx.shared::cta.b64 s, [m], 8192;"
        " @p cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes"
        " [a], [g], 8192, [m];"
        " bar.sync 0;"
        " WAIT_BULK: mbarrier.try_wait.parity.shared::cta.b64 done, [m], 0;"
        " @!done bra WAIT_BULK; mov.u32 $0, a; }",
        "=r,l",
        [src],
        dtype=tl.int32,
        is_pure=False,
        pack=1,
    )


@triton.jit
def _shared_words(at):
    """The int32 word at each shared address of ``at``."""
    return tl.inline_asm_elementwise(
        "ld.shared.b32 $0, [$1];", "=r,r", [at], dtype=tl.int32, is_pure=False, pack=1
    )


@triton.jit
def read_kernel(
    pool_ptr,
    idx_ptr,
    prev_ptr,
    zero_ptr,
    out_ptr,
    WORDS: tl.constexpr,
    BULK: tl.constexpr,
    desc=None,
    TMA: tl.constexpr = False,
    GDC: tl.constexpr = False,
):
    """out[p] = sum of chunk idx[p] (+ 0 times the launch before's first sum: the
    address depends on it, so the read waits for it)."""
    _await_inputs(GDC)
    p = tl.program_id(0)
    dep = tl.load(prev_ptr) & tl.load(zero_ptr)  # 0, known only after the wait
    chunk = (tl.load(idx_ptr + p) + dep).to(tl.int64)
    src = pool_ptr + chunk * WORDS
    if TMA:
        words = tl.reshape(desc.load([chunk.to(tl.int32), 0, 0]), [WORDS])
    elif BULK:
        tl.static_assert(WORDS == 2048, "the bulk buffer is 8 KB")
        base = _bulk_read(src)
        words = _shared_words(base + tl.arange(0, WORDS) * 4)
    else:
        words = tl.load(src + tl.arange(0, WORDS))
    tl.store(out_ptr + p, tl.sum(words, axis=0))


def chain_graph(
    pool: torch.Tensor, launches: int, programs: int, mode: str, warps: int, dependent: bool
) -> tuple[torch.cuda.CUDAGraph, list[torch.Tensor]]:
    """A graph of ``launches`` reads, each at its own random chunks, each depending on
    the one before's output; returns it and the launches' outputs."""
    device = pool.device
    chunks = pool.numel() // CHUNK_WORDS
    gen = torch.Generator(device="cpu").manual_seed(0)
    idx = [
        torch.randint(0, chunks, (programs,), generator=gen, dtype=torch.int32).to(device)
        for _ in range(launches)
    ]
    outs = [torch.zeros(programs, dtype=torch.int32, device=device) for _ in range(launches + 1)]
    zero = torch.zeros(1, dtype=torch.int32, device=device)
    tma: dict[str, Any] = {}
    if mode == "tma":
        from triton.tools.tensor_descriptor import TensorDescriptor

        boxes = pool.view(chunks, 8, CHUNK_WORDS // 8)
        tma = {"desc": TensorDescriptor.from_tensor(boxes, [1, 8, CHUNK_WORDS // 8]), "TMA": True}

    def run() -> None:
        with moe_kernel.dependent_launch():
            kwargs = moe_kernel.pdl(device) if dependent else {}
            for i in range(launches):
                read_kernel[(programs,)](
                    pool, idx[i], outs[i], zero, outs[i + 1], WORDS=CHUNK_WORDS,
                    BULK=mode == "bulk", num_warps=warps, **tma, **kwargs,
                )  # fmt: skip

    run()  # compile
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    return graph, outs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--programs", type=int, default=1536)
    parser.add_argument("--chunk", type=int, default=8192, choices=(8192,))
    parser.add_argument("--launches", type=int, default=50)
    parser.add_argument("--modes", default="ldg,bulk,tma")
    parser.add_argument("--warps", type=int, default=2)
    parser.add_argument("--pool-gib", type=float, default=4.0)
    parser.add_argument(
        "--no-pdl", action="store_true", help="launches one after the other, no dependent launch"
    )
    args = parser.parse_args()
    device = torch.device("cuda", 0)
    words = int(args.pool_gib * 2**30) // 4
    pool = torch.randint(-(2**20), 2**20, (words,), dtype=torch.int32, device=device)
    modes = args.modes.split(",")
    graphs = {
        m: chain_graph(pool, args.launches, args.programs, m, args.warps, not args.no_pdl)
        for m in modes
    }
    times: dict[str, list[float]] = {m: [] for m in modes}
    for _ in range(5):
        for mode, (graph, _) in graphs.items():
            times[mode].append(timed(graph, 20) / args.launches)
    chunks = pool.view(-1, CHUNK_WORDS)
    gen = torch.Generator(device="cpu").manual_seed(0)  # chain_graph's chunks again
    reference = torch.stack(
        [
            chunks[
                torch.randint(0, len(chunks), (args.programs,), generator=gen, dtype=torch.int32)
                .to(device)
                .long()
            ]
            .long()
            .sum(1)
            for _ in range(args.launches)
        ]
    ).cpu()
    for mode in modes:
        graph, outs = graphs[mode]
        graph.replay()
        torch.cuda.synchronize()
        sums = torch.stack(outs[1:]).cpu()
        us = statistics.median(times[mode])
        row = {
            "mode": mode,
            "programs": args.programs,
            "chunk": args.chunk,
            "warps": args.warps,
            "us_per_launch": round(us, 3),
            "gb_s": round(args.programs * args.chunk / us / 1e3, 1),
            "right_sums": bool(((sums.long() - reference) % 2**32 == 0).all()),
        }
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
