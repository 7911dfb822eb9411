"""int4 gate/up, the 30B-A3B's shapes, one token, each launch reading from HBM (issue
10): 12.6 MB of words and 1.6 MB of group scales. flint's word kernel against a
tensor-core prototype (Gluon, below), and against the word kernel's bare reads
(``_floor_kernel``: its words xor-ed, the expert from the router's ids; then without
the ids, with the group scales, with the scales and the vector's eighths).

First the h of layer 0 from the word kernel and from both forms of the prototype
(printed, not asserted: the fraction of equal values). Then microseconds a launch:
the best of five replays of a CUDA graph of ``--reps`` launches per layer, back to
back, without dependent launch, each kernel twice in turn.

Usage: python benches/mma_gate_up.py [--layers 8] [--reps 25] [--once]
(CUDA, Triton with Gluon: the GPU box's 3.6)
"""

from __future__ import annotations

import argparse
import json

import torch
import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2

from flint.format.quant import unpack_int4
from flint.graphs import moe_kernel as mk
from flint.graphs.slot_kernels import _activate, gate_up_kernel
from flint.graphs.triton_kernels import _eighth_exp, _eighths_index, _round, _times_2_to
from moe_kernel_tune import pools
from step_ab import timed as replay_us

HIDDEN, INTER, TOP_K = 2048, 768, 8


# The tensor-core prototype (Gluon, Triton 3.6's explicit-layout language): each lane
# loads four words of a row (one group), an inline-PTX decode makes exact bf16 (q - 8)
# pairs straight in the A-operand registers of mma.sync.m16n8k16 (the k order follows
# the words, so the layout change is free), and the vector is the B operand,
# block-diagonal over a warp's eight groups: the [16, 8] accumulator holds each (row,
# group) sum, scaled by its group's scale. Eight warps a program take 256 columns each
# (rows of 2,048). Measured as fast as the word kernel, not faster (docs/benchmarks.md,
# "Twenty-sixth session").


@gluon.jit
def _nibbles(wd):
    """Eight bf16 tensors: nibble k of each int32 word, as (q - 8) (exact)."""
    return gl.inline_asm_elementwise(
        asm="""{
        .reg .b32 p0, p1, p2, p3, s1, s2, s3, one, off;
        mov.b32 one, 0x3F803F80;
        mov.b32 off, 0xC308C308;
        shr.b32 s1, $8, 4;
        shr.b32 s2, $8, 8;
        shr.b32 s3, $8, 12;
        lop3.b32 p0, $8, 0x000F000F, 0x43004300, 0xEA;
        lop3.b32 p1, s1, 0x000F000F, 0x43004300, 0xEA;
        lop3.b32 p2, s2, 0x000F000F, 0x43004300, 0xEA;
        lop3.b32 p3, s3, 0x000F000F, 0x43004300, 0xEA;
        fma.rn.bf16x2 p0, p0, one, off;
        fma.rn.bf16x2 p1, p1, one, off;
        fma.rn.bf16x2 p2, p2, one, off;
        fma.rn.bf16x2 p3, p3, one, off;
        mov.b32 {$0, $4}, p0;
        mov.b32 {$1, $5}, p1;
        mov.b32 {$2, $6}, p2;
        mov.b32 {$3, $7}, p3;
        }""",
        constraints="=h,=h,=h,=h,=h,=h,=h,=h,r",
        args=[wd],
        dtype=(gl.bfloat16,) * 8,
        is_pure=True,
        pack=1,
    )


@gluon.jit
def _a_tiles(w_ptr, w_row4, u_off, row0, W: gl.constexpr, VOL: gl.constexpr):
    """Both projections' words in one load: [W, 16, 2(a), 4(t), 2(m), 4(i)], warp w's
    rows row0.. and columns w*256.., word 16a + 4t + i (lane t reads one group's four
    words, twice), m 0 the gate (at ``w_ptr``) and 1 the up (``u_off`` words on)."""
    WL: gl.constexpr = gl.BlockedLayout(
        [1, 1, 1, 1, 1, 4], [1, 8, 1, 4, 1, 1], [W, 1, 1, 1, 1, 1], [5, 4, 3, 2, 1, 0]
    )
    L5: gl.constexpr = gl.SliceLayout(5, WL)
    L4: gl.constexpr = gl.SliceLayout(4, L5)
    L3: gl.constexpr = gl.SliceLayout(3, L4)
    wi = gl.arange(0, W, layout=gl.SliceLayout(1, gl.SliceLayout(2, L3)))
    ri = gl.arange(0, 16, layout=gl.SliceLayout(0, gl.SliceLayout(2, L3)))
    ai = gl.arange(0, 2, layout=gl.SliceLayout(0, gl.SliceLayout(1, L3)))
    ti = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(2, L4))))
    mi = gl.arange(
        0, 2, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(2, gl.SliceLayout(3, L5))))
    )
    ii = gl.arange(
        0,
        4,
        layout=gl.SliceLayout(
            0, gl.SliceLayout(1, gl.SliceLayout(2, gl.SliceLayout(3, gl.SliceLayout(4, WL))))
        ),
    )
    word = (
        wi[:, None, None, None, None, None] * 32
        + ai[None, None, :, None, None, None] * 16
        + ti[None, None, None, :, None, None] * 4
        + ii[None, None, None, None, None, :]
    )
    at = (row0 + ri[None, :, None, None, None, None]) * w_row4 + word
    at = at + mi[None, None, None, None, :, None].to(gl.int64) * u_off
    return gl.load(w_ptr + at, volatile=VOL)


@gluon.jit
def _a_operand(wd, W: gl.constexpr, A_L: gl.constexpr):
    """[W, 16, 256] bf16 A operand, k = 128a + 32i + 16ib + 8ic + 2t + ia."""
    n0, n1, n2, n3, n4, n5, n6, n7 = _nibbles(wd)
    q = gl.join(
        gl.join(gl.join(n0, n4), gl.join(n2, n6)), gl.join(gl.join(n1, n5), gl.join(n3, n7))
    )  # [W,16,a,t,i,ia,ib,ic]
    q = gl.permute(q, (0, 1, 2, 4, 6, 7, 3, 5))  # (W, r, a, i, ib, ic, t, ia)
    q = gl.reshape(q, (W, 16, 256))
    return gl.convert_layout(q, A_L, assert_trivial=True)


@gluon.jit
def _scales(s_ptr, s_row, row0, W: gl.constexpr, MMA: gl.constexpr, VOL: gl.constexpr):
    """[W, 16, 8] fp32 in the accumulator layout: row row0 + r, group 8w + n."""
    wi = gl.arange(0, W, layout=gl.SliceLayout(1, gl.SliceLayout(2, MMA)))
    ri = gl.arange(0, 16, layout=gl.SliceLayout(0, gl.SliceLayout(2, MMA)))
    ni = gl.arange(0, 8, layout=gl.SliceLayout(0, gl.SliceLayout(1, MMA)))
    at = (row0 + ri[None, :, None]) * s_row + wi[:, None, None] * 8 + ni[None, None, :]
    return gl.load(s_ptr + at, volatile=VOL).to(gl.float32)


@gluon.jit
def _b_operand(x_ptr, W: gl.constexpr, B_L: gl.constexpr):
    """[W, 256, 8] bf16: B[k, n] = x[col(k)] where col(k)'s group is 8w + n, else 0."""
    XL: gl.constexpr = gl.BlockedLayout(
        [1, 1, 1, 1, 8], [1, 1, 8, 4, 1], [W, 1, 1, 1, 1], [4, 3, 2, 1, 0]
    )
    wi = gl.arange(
        0, W, layout=gl.SliceLayout(1, gl.SliceLayout(2, gl.SliceLayout(3, gl.SliceLayout(4, XL))))
    )
    ai = gl.arange(
        0, 2, layout=gl.SliceLayout(0, gl.SliceLayout(2, gl.SliceLayout(3, gl.SliceLayout(4, XL))))
    )
    ni = gl.arange(
        0, 8, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(3, gl.SliceLayout(4, XL))))
    )
    ti = gl.arange(
        0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(2, gl.SliceLayout(4, XL))))
    )
    ci = gl.arange(
        0, 32, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(2, gl.SliceLayout(3, XL))))
    )
    grp = ai[None, :, None, None, None] * 4 + ti[None, None, None, :, None]  # [W, a, n, t, c]
    at = (
        wi[:, None, None, None, None] * 256
        + grp * 32
        + ci[None, None, None, None, :]
        + 0 * ni[None, None, :, None, None]
    )
    own = (grp == ni[None, None, :, None, None]) & (ci[None, None, None, None, :] >= 0)
    v = gl.load(x_ptr + at, mask=own, other=0.0)
    v = gl.reshape(v, (W, 2, 8, 4, 4, 2, 2, 2))  # c -> (i, ia, ib, ic)
    v = gl.permute(v, (0, 1, 4, 6, 7, 3, 5, 2))  # (W, a, i, ib, ic, t, ia, n)
    v = gl.reshape(v, (W, 256, 8))
    return gl.convert_layout(v, B_L, assert_trivial=True)


@gluon.jit
def gate_up_mma_kernel(
    x_ptr,
    ids_ptr,
    h_ptr,
    g_ptr,
    g_we,
    g_wr,
    gs_ptr,
    gs_e,
    gs_r,
    u_ptr,
    u_we,
    u_wr,
    us_ptr,
    us_e,
    us_r,
    hid,
    inter,
    h_stride,
    u_off,
    OUT: gl.constexpr,
    TOPK: gl.constexpr,
    W: gl.constexpr,
    VOL: gl.constexpr = True,
):
    MMA: gl.constexpr = gl.NVMMADistributedLayout(
        version=[2, 0], warps_per_cta=[W, 1, 1], instr_shape=[1, 16, 8]
    )
    A_L: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=2)
    B_L: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=MMA, k_width=2)
    pair = gl.program_id(0)
    token = pair // TOPK
    expert = gl.load(ids_ptr + pair).to(gl.int64)
    row0 = gl.program_id(1) * 16
    g32 = (g_ptr + expert * g_we).to(gl.pointer_type(gl.int32))
    wd = _a_tiles(g32, g_wr // 4, u_off, row0, W, VOL)
    wg, wu = gl.split(gl.permute(wd, (0, 1, 2, 3, 5, 4)))
    sg = _scales(gs_ptr + expert * gs_e, gs_r, row0, W, MMA, VOL)
    su = _scales(us_ptr + expert * us_e, us_r, row0, W, MMA, VOL)
    b = _b_operand(x_ptr + token * hid, W, B_L)
    zero = gl.zeros([W, 16, 8], gl.float32, MMA)
    cg = mma_v2(_a_operand(wg, W, A_L), b, zero)
    cu = mma_v2(_a_operand(wu, W, A_L), b, zero)
    gate = gl.sum(gl.sum(cg * sg, axis=2), axis=0)
    up = gl.sum(gl.sum(cu * su, axis=2), axis=0)
    OL: gl.constexpr = gl.BlockedLayout([1], [32], [W], [0])
    gate = gl.convert_layout(gate, OL)
    up = gl.convert_layout(up, OL)
    rows = row0 + gl.arange(0, 16, layout=OL)
    out_type: gl.constexpr = OUT
    gate = _round(gate, out_type)
    up = _round(up, out_type)
    h = _activate(gate, up, 0.0, 0.0, out_type, 0)
    at = h_ptr + pair * 8 * h_stride + _eighths_index(rows, h_stride)
    gl.store(at, _times_2_to(h, _eighth_exp(rows % 8)))


def h_values(h8: torch.Tensor) -> torch.Tensor:
    """[pairs, 8 * stride] eighths (h * 2^E) -> [pairs, I] fp32 h."""
    stride = h8.shape[1] // 8
    cols = torch.arange(INTER, device=h8.device)
    k = cols % 8
    e = torch.where(k < 5, 23 - 4 * k, 35 - 4 * k).float()
    at = k * stride + cols // 8
    return h8[:, at] * torch.pow(2.0, -e)


def word_launch(x8, ids, h8, pool, block=None):
    """flint's word gate/up at its default block, or at ``block`` (rows, cols, warps)."""
    xs, hs = mk._eighths_stride(HIDDEN), mk._eighths_stride(INTER)
    (bn, bk, warps), _ = mk._blocks(True, mk.INT4, HIDDEN)
    if block is not None:
        bn, bk, warps = block
    whole = HIDDEN // bk
    gate_up_kernel[(TOP_K, INTER // bn)](
        x8, ids, h8, *mk._args(pool.gate), *mk._args(pool.up), x8, x8, HIDDEN, INTER,
        xs, hs, 0.0, 0.0, OUT=mk._DTYPES[torch.bfloat16], TOPK=TOP_K, SCHEME=mk.INT4,
        GROUP=32, BN=bn, BK=bk, HAS_BIAS=False, ACT=0, EVEN=True, WORDS=True, WHOLE=whole,
        num_warps=warps,
    )  # fmt: skip


def mma_launch(x, ids, h8, pool, vol=True):
    warps = HIDDEN // 256  # the kernel's warps take 256 columns each
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
    """Microseconds of ``reps`` calls of ``fn`` captured in one CUDA graph: the best of
    five replays (``step_ab.timed``)."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(reps):
            fn()
    return min(replay_us(graph, 1) for _ in range(5)) / reps


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--reps", type=int, default=25)
    p.add_argument(
        "--once", action="store_true",
        help="after the check, launch each kernel once on layer 1 and stop (for ncu)",
    )  # fmt: skip
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
    mma_launch(x, ids[0], h_mma, layers[0])
    h_plain = torch.zeros_like(h_mma)
    mma_launch(x, ids[0], h_plain, layers[0], vol=False)
    torch.cuda.synchronize()
    a, b, c = h_values(h_word), h_values(h_mma), h_values(h_plain)
    ref = reference(x, ids[0], layers[0])
    diff = (a - b).abs()
    same = (a == b).float().mean().item()
    report = {
        "h_same_fraction": round(same, 4),
        "h_same_fraction_plain_loads": round((a == c).float().mean().item(), 4),
        "h_max_abs_diff": diff.max().item(),
        "h_max_abs": a.abs().max().item(),
        "h_rel_diff_over_1ulp": ((diff > a.abs() * 2**-7 + 1e-30).float().mean().item()),
        "word_vs_ref_max": (a - ref).abs().max().item(),
        "mma_vs_ref_max": (b - ref).abs().max().item(),
    }
    for block in ((4, 2048, 2), (8, 2048, 4)):
        h_block = torch.zeros_like(h_word)
        word_launch(x8, ids[0], h_block, layers[0], block)
        report[f"h_same_fraction_word_{block}"] = round(
            (h_values(h_block) == a).float().mean().item(), 4
        )
    print(json.dumps(report))

    def run_word():
        for n, pool in enumerate(layers):
            word_launch(x8, ids[n], h_word, pool)

    def word_at(block):
        def run():
            for n, pool in enumerate(layers):
                word_launch(x8, ids[n], h_word, pool, block)

        return run

    def run_mma():
        for n, pool in enumerate(layers):
            mma_launch(x, ids[n], h_mma, pool)

    def run_mma_plain():
        for n, pool in enumerate(layers):
            mma_launch(x, ids[n], h_mma, pool, vol=False)

    sink = torch.zeros(TOP_K * 4096, dtype=torch.int32, device=dev)

    def floor(**kw):
        def run():
            for n, pool in enumerate(layers):
                floor_launch(ids[n], sink, pool, x8, 4, **kw)

        return run

    words = 2 * TOP_K * INTER * HIDDEN // 2
    scales = 2 * TOP_K * INTER * HIDDEN // 32 * 2
    runs = (  # (name, launches, bytes a launch)
        ("word", run_word, words + scales),
        ("word-4-2048-2", word_at((4, 2048, 2)), words + scales),  # half the work a warp
        ("word-8-2048-4", word_at((8, 2048, 4)), words + scales),
        ("mma-plain-loads", run_mma_plain, words + scales),
        ("mma-all-loads-first", run_mma, words + scales),  # volatile: LDG.E.128.STRONG.SYS
        ("floor", floor(), words),
        ("floor-no-ids", floor(ids_on=False), words),
        ("floor-scales", floor(scales=True), words + scales),
        ("floor-scales-x", floor(scales=True, xv=True), words + scales),
    )
    if args.once:
        one = layers[1 % len(layers)], ids[1 % len(layers)]
        word_launch(x8, one[1], h_word, one[0])
        mma_launch(x, one[1], h_mma, one[0], vol=False)
        floor_launch(one[1], sink, one[0], x8, 4)
        floor_launch(one[1], sink, one[0], x8, 4, scales=True, xv=True)
        torch.cuda.synchronize()
        return
    for name, fn, nbytes in runs + runs:
        us = timed(fn, args.reps) / len(layers)
        gb = nbytes / us / 1e3
        print(json.dumps({"kernel": name, "us_per_launch": round(us, 2), "gb_s": round(gb, 1)}))


if __name__ == "__main__":
    main()
