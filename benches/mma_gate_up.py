"""int4 gate/up, the 30B-A3B's shapes, one token, each launch's 12.6 MB from HBM (issue
10): flint's word kernel against a tensor-core prototype (Gluon,
benches/mma_gate_up_kernel.py; the same h checked first), and against the word kernel's
bare reads (``_floor_kernel``: its words xor-ed, then with the router's ids, the group
scales and the vector's eighths read too). Microseconds a launch, back to back in a
CUDA graph without dependent launch, two rounds.

Usage: python benches/mma_gate_up.py [--layers 8] [--reps 25] [--warps 8]
(CUDA, Triton with Gluon: the GPU box's 3.6)
"""

from __future__ import annotations

import argparse
import json

import torch
import triton
import triton.language as tl

from flint.format.quant import unpack_int4
from flint.graphs import moe_kernel as mk
from flint.graphs.slot_kernels import gate_up_kernel
from mma_gate_up_kernel import gate_up_mma_kernel  # benches/ is the script's own folder
from moe_kernel_tune import pools

HIDDEN, INTER, TOP_K = 2048, 768, 8


def h_values(h8: torch.Tensor) -> torch.Tensor:
    """[pairs, 8 * stride] eighths (h * 2^E) -> [pairs, I] fp32 h."""
    stride = h8.shape[1] // 8
    cols = torch.arange(INTER, device=h8.device)
    k = cols % 8
    e = torch.where(k < 5, 23 - 4 * k, 35 - 4 * k).float()
    at = k * stride + cols // 8
    return h8[:, at] * torch.pow(2.0, -e)


def word_launch(x8, ids, h8, pool):
    xs, hs = mk._eighths_stride(HIDDEN), mk._eighths_stride(INTER)
    (bn, bk, warps), _ = mk._blocks(True, mk.INT4, HIDDEN)
    whole = HIDDEN // bk
    gate_up_kernel[(TOP_K, INTER // bn)](
        x8, ids, h8, *mk._args(pool.gate), *mk._args(pool.up), x8, x8, HIDDEN, INTER,
        xs, hs, 0.0, 0.0, OUT=mk._DTYPES[torch.bfloat16], TOPK=TOP_K, SCHEME=mk.INT4,
        GROUP=32, BN=bn, BK=bk, HAS_BIAS=False, ACT=0, EVEN=True, WORDS=True, WHOLE=whole,
        num_warps=warps,
    )  # fmt: skip


def mma_launch(x, ids, h8, pool, warps, vol=True):
    hs = mk._eighths_stride(INTER)
    g, u = pool.gate, pool.up
    assert (g.w_expert, g.w_row) == (u.w_expert, u.w_row)
    u_off = (u.weights.data_ptr() - g.weights.data_ptr()) // 4
    gate_up_mma_kernel[(TOP_K, INTER // 16)](
        x, ids, h8, g.weights, g.w_expert, g.w_row, g.scales, g.s_expert, g.s_row,
        u.weights, u.w_expert, u.w_row, u.scales, u.s_expert, u.s_row, HIDDEN, INTER, hs, u_off,
        OUT=mk._DTYPES[torch.bfloat16], TOPK=TOP_K, W=warps, VOL=vol, num_warps=warps,
    )  # fmt: skip


def reference(x, ids, pool):
    """fp32 h of each pair: dequantised gate and up, silu(gate) * up (no roundings)."""
    out = []
    for e in ids[0].tolist():
        parts = []
        for p in (pool.gate, pool.up):
            w = p.weights[e, : INTER * HIDDEN // 2].reshape(INTER, HIDDEN // 2)
            s = p.scales[e, : INTER * HIDDEN // 32].reshape(INTER, HIDDEN // 32).float()
            q = unpack_int4(w).float() * s.repeat_interleave(32, 1)
            parts.append(q @ x[0].float())
        g, u = parts
        out.append(torch.nn.functional.silu(g) * u)
    return torch.stack(out)


@triton.jit
def _floor_kernel(ids_ptr, out_ptr, g_ptr, g_we, u_ptr, u_we, w_row4, gs_ptr, us_ptr, s_e,
                  s_row, x_ptr, ROWS: tl.constexpr, COLS: tl.constexpr, G: tl.constexpr,
                  IDS: tl.constexpr, SCALES: tl.constexpr, XV: tl.constexpr):  # fmt: skip
    """The word kernel's reads (a pair's ROWS gate and up rows of COLS words, all at once)
    with no arithmetic but an xor: the floor of its memory traffic. ``IDS``: the expert
    from the router's ids (else the pair's own index); ``SCALES``: the rows' group
    scales read too; ``XV``: the vector's eighths (8 KiB) read too."""
    pair = tl.program_id(0)
    expert = pair.to(tl.int64)
    if IDS:
        expert = tl.load(ids_ptr + pair).to(tl.int64)
    rows = tl.program_id(1) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, COLS)
    at = rows[:, None] * w_row4 + cols[None, :]
    g = tl.load((g_ptr + expert * g_we).to(tl.pointer_type(tl.int32)) + at)
    u = tl.load((u_ptr + expert * u_we).to(tl.pointer_type(tl.int32)) + at)
    v = tl.reduce(g ^ u, 1, _xor)
    if SCALES:
        sat = expert * s_e + rows[:, None] * s_row + tl.arange(0, G)[None, :]
        sg = tl.load(gs_ptr + sat).to(tl.int16, bitcast=True).to(tl.int32)
        su = tl.load(us_ptr + sat).to(tl.int16, bitcast=True).to(tl.int32)
        v = v ^ tl.reduce(sg ^ su, 1, _xor)
    if XV:
        xv = tl.load(x_ptr + tl.arange(0, 8 * COLS)).to(tl.int32, bitcast=True)
        v = v ^ tl.reduce(xv, 0, _xor)
    tl.store(out_ptr + pair * 4096 + rows, v)


@triton.jit
def _xor(a, b):
    return a ^ b


def floor_launch(ids, out, pool, x8, rows, ids_on=True, scales=False, xv=False):
    g, u = pool.gate, pool.up
    assert g.s_expert == u.s_expert
    _floor_kernel[(TOP_K, INTER // rows)](
        ids, out, g.weights, g.w_expert, u.weights, u.w_expert, g.w_row // 4, g.scales,
        u.scales, g.s_expert, g.s_row, x8, ROWS=rows, COLS=HIDDEN // 8, G=HIDDEN // 32,
        IDS=ids_on, SCALES=scales, XV=xv, num_warps=1,
    )  # fmt: skip


def timed(fn, reps: int) -> float:
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(reps):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        best = min(best, start.elapsed_time(end) * 1000 / reps)
    return best


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--reps", type=int, default=25)
    p.add_argument("--warps", type=int, default=8)
    args = p.parse_args()
    dev = torch.device("cuda")
    torch.manual_seed(0)
    layers = pools("int4", args.layers, dev, experts=32)
    # different bytes in each expert: the pools repeat one slab, so perturb them
    for pool in layers:
        pool.gate.weights.random_(0, 256)
        pool.up.weights.random_(0, 256)
    x = torch.randn(1, HIDDEN, device=dev).bfloat16()
    x8 = mk.eighths(x)
    hs = mk._eighths_stride(INTER)
    ids = [torch.randperm(32, device=dev)[:TOP_K][None].contiguous() for _ in layers]
    h_word = torch.zeros(TOP_K, 8 * hs, device=dev)
    h_mma = torch.zeros(TOP_K, 8 * hs, device=dev)
    word_launch(x8, ids[0], h_word, layers[0])
    mma_launch(x, ids[0], h_mma, layers[0], args.warps)
    torch.cuda.synchronize()
    a, b = h_values(h_word), h_values(h_mma)
    ref = reference(x, ids[0], layers[0])
    diff = (a - b).abs()
    same = (a == b).float().mean().item()
    report = {
        "h_same_fraction": round(same, 4),
        "h_max_abs_diff": diff.max().item(),
        "h_max_abs": a.abs().max().item(),
        "h_rel_diff_over_1ulp": ((diff > a.abs() * 2**-7 + 1e-30).float().mean().item()),
        "word_vs_ref_max": (a - ref).abs().max().item(),
        "mma_vs_ref_max": (b - ref).abs().max().item(),
    }
    print(json.dumps(report))

    def run_word():
        for n, pool in enumerate(layers):
            word_launch(x8, ids[n], h_word, pool)

    def run_mma():
        for n, pool in enumerate(layers):
            mma_launch(x, ids[n], h_mma, pool, args.warps)

    def run_mma_plain():
        for n, pool in enumerate(layers):
            mma_launch(x, ids[n], h_mma, pool, args.warps, vol=False)

    sink = torch.zeros(TOP_K * 4096, dtype=torch.int32, device=dev)

    def floor(**kw):
        def run():
            for n, pool in enumerate(layers):
                floor_launch(ids[n], sink, pool, x8, 4, **kw)

        return run

    runs = (
        ("word", run_word),
        ("mma-plain-loads", run_mma_plain),
        ("mma-all-loads-first", run_mma),  # volatile loads: LDG.E.128.STRONG.SYS
        ("floor", floor()),
        ("floor-no-ids", floor(ids_on=False)),
        ("floor-scales", floor(scales=True)),
        ("floor-scales-x", floor(scales=True, xv=True)),
    )
    for name, fn in runs + runs:
        us = timed(fn, args.reps) / len(layers)
        gb = 2 * TOP_K * (INTER * HIDDEN // 2 + INTER * HIDDEN // 32 * 2) / us / 1e3
        print(json.dumps({"kernel": name, "us_per_launch": round(us, 2), "gb_s": round(gb, 1)}))


if __name__ == "__main__":
    main()
