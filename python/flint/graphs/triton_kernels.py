"""The Triton kernels of ``flint.graphs.moe_kernel`` (which documents them); untyped,
as Triton kernels are, so mypy's strict checks are relaxed for this module only."""

from __future__ import annotations

try:  # Triton ships with torch's CUDA wheels; without it there are no graphs
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the environment
    triton = None

__all__ = ["down_sum_kernel", "gate_up_kernel", "triton"]

if triton is not None:

    @triton.jit
    def _tile(
        w_ptr,
        s_ptr,
        w_row,
        s_row,
        rows,
        cols,
        mask,
        SCHEME: tl.constexpr,
        GROUP: tl.constexpr,
    ):
        """A [BN, BK] tile of one expert's projection, dequantized to fp32."""
        if SCHEME == 0:
            w = tl.load(w_ptr + rows[:, None] * w_row + cols[None, :], mask=mask, other=0.0)
            return w.to(tl.float32)
        elif SCHEME == 1:
            q = tl.load(w_ptr + rows[:, None] * w_row + cols[None, :], mask=mask, other=0)
            s = tl.load(s_ptr + rows * s_row, mask=rows >= 0, other=0.0)
            return q.to(tl.float32) * s[:, None]
        else:
            byte = tl.load(w_ptr + rows[:, None] * w_row + cols[None, :] // 2, mask=mask, other=0)
            nibble = tl.where(cols[None, :] % 2 == 0, byte & 15, byte >> 4)
            s = tl.load(
                s_ptr + rows[:, None] * s_row + cols[None, :] // GROUP, mask=mask, other=0.0
            )
            return (nibble.to(tl.float32) - 8.0) * s.to(tl.float32)

    @triton.jit
    def _round(x, OUT: tl.constexpr):
        """fp32 x rounded to the dtype ``OUT`` (nearest, ties to even), kept in fp32. bf16
        by bit arithmetic: the same on every backend (Triton's CPU interpreter truncates
        its own bf16 casts)."""
        if OUT == tl.bfloat16:  # noqa: SIM300 - a compile-time dtype test
            bits = x.to(tl.uint32, bitcast=True)
            bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
            return bits.to(tl.float32, bitcast=True)
        else:
            return x.to(OUT).to(tl.float32)

    @triton.jit
    def gate_up_kernel(
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
        TOPK: tl.constexpr,
        SCHEME: tl.constexpr,
        GROUP: tl.constexpr,
        BN: tl.constexpr,
        BK: tl.constexpr,
    ):
        pair = tl.program_id(0)
        token = pair // TOPK
        expert = tl.load(ids_ptr + pair).to(tl.int64)
        rows = tl.program_id(1) * BN + tl.arange(0, BN)
        row_ok = rows < inter
        rows_c = tl.where(row_ok, rows, 0)
        acc_g = tl.zeros([BN], dtype=tl.float32)
        acc_u = tl.zeros([BN], dtype=tl.float32)
        g_base, gs_base = g_ptr + expert * g_we, gs_ptr + expert * gs_e
        u_base, us_base = u_ptr + expert * u_we, us_ptr + expert * us_e
        for k0 in range(0, hid, BK):
            cols = k0 + tl.arange(0, BK)
            col_ok = cols < hid
            x = tl.load(x_ptr + token * hid + cols, mask=col_ok, other=0.0).to(tl.float32)
            mask = row_ok[:, None] & col_ok[None, :]
            wg = _tile(g_base, gs_base, g_wr, gs_r, rows_c, cols, mask, SCHEME, GROUP)
            acc_g += tl.sum(wg * x[None, :], axis=1)
            wu = _tile(u_base, us_base, u_wr, us_r, rows_c, cols, mask, SCHEME, GROUP)
            acc_u += tl.sum(wu * x[None, :], axis=1)
        out_type = h_ptr.dtype.element_ty
        gate = _round(acc_g, out_type)  # F.linear's output dtype
        up = _round(acc_u, out_type)
        silu = _round(gate / (1.0 + tl.exp(-gate)), out_type)
        tl.store(h_ptr + pair * inter + rows, _round(silu * up, out_type).to(out_type), mask=row_ok)

    @triton.jit
    def down_sum_kernel(
        h_ptr,
        ids_ptr,
        rw_ptr,
        out_ptr,
        d_ptr,
        d_we,
        d_wr,
        ds_ptr,
        ds_e,
        ds_r,
        hid,
        inter,
        TOPK: tl.constexpr,
        SCHEME: tl.constexpr,
        GROUP: tl.constexpr,
        BN: tl.constexpr,
        BK: tl.constexpr,
    ):
        token = tl.program_id(0)
        rows = tl.program_id(1) * BN + tl.arange(0, BN)
        row_ok = rows < hid
        rows_c = tl.where(row_ok, rows, 0)
        out_type = out_ptr.dtype.element_ty
        total = tl.zeros([BN], dtype=tl.float32)
        for rank in tl.static_range(TOPK):
            pair = token * TOPK + rank
            expert = tl.load(ids_ptr + pair).to(tl.int64)
            base, s_base = d_ptr + expert * d_we, ds_ptr + expert * ds_e
            acc = tl.zeros([BN], dtype=tl.float32)
            for k0 in range(0, inter, BK):
                cols = k0 + tl.arange(0, BK)
                col_ok = cols < inter
                h = tl.load(h_ptr + pair * inter + cols, mask=col_ok, other=0.0).to(tl.float32)
                mask = row_ok[:, None] & col_ok[None, :]
                w = _tile(base, s_base, d_wr, ds_r, rows_c, cols, mask, SCHEME, GROUP)
                acc += tl.sum(w * h[None, :], axis=1)
            y = _round(acc, out_type)  # the expert's output as F.linear gives it
            weight = tl.load(rw_ptr + pair).to(tl.float32)
            total = total + y * weight  # rank order, as weighted_sum
        tl.store(out_ptr + token * hid + rows, _round(total, out_type).to(out_type), mask=row_ok)

else:  # pragma: no cover - depends on the environment
    gate_up_kernel = down_sum_kernel = None
