"""A prototype, not flint's kernel: int4 gate/up on tensor cores in Gluon (Triton 3.6's
explicit-layout language), for benches/mma_gate_up.py. Each lane loads four words of a
row (one group), an inline-PTX decode makes exact bf16 (q - 8) pairs straight in the
A-operand registers of mma.sync.m16n8k16 (the k order follows the words, so the layout
change is free), and the vector is the B operand, block-diagonal over a warp's eight
groups: the [16, 8] accumulator holds each (row, group) sum, scaled by its group's
scale. Eight warps a program take 256 columns each (rows of 2,048). Measured as fast as
the word kernel, not faster (docs/benchmarks.md, "Twenty-sixth session")."""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2

from flint.graphs.slot_kernels import _activate
from flint.graphs.triton_kernels import _eighth_exp, _eighths_index, _round, _times_2_to


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
