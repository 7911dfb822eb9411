"""The Triton kernels of ``flint.graphs.grouped`` (which documents them); untyped, as
Triton kernels are, so mypy's strict checks are relaxed for this module only."""

from __future__ import annotations

from flint.graphs.triton_kernels import triton

__all__ = ["grouped_down_kernel", "grouped_gate_up_kernel", "tile_dequant_kernel"]

if triton is not None:
    import triton.language as tl

    from flint.graphs.slot_kernels import _activate
    from flint.graphs.triton_kernels import _round

    @triton.jit
    def _tile(
        w_ptr,
        s_ptr,
        w_row,
        s_row,
        rows,
        row_ok,
        k0,
        n_cols,
        OUT: tl.constexpr,
        SCHEME: tl.constexpr,
        GROUP: tl.constexpr,
        BN: tl.constexpr,
        BK: tl.constexpr,
        NATIVE: tl.constexpr = False,
    ):
        """[BN, BK] in ``OUT``: rows ``rows``, columns k0.. of one expert's projection,
        dequantized by the file's rule (the int8 value or int4 nibble - 8, times its row
        or group scale in fp32, rounded once: ``dequant_kernel``'s values). ``NATIVE``:
        rounded by the GPU's own conversion (to nearest, ties to even: ``_round``'s
        values for every finite value; 17% faster on an 8k prompt's layer,
        docs/benchmarks.md), not by the bit arithmetic Triton's CPU interpreter needs.
        (Int4 tiles kept as their two nibble halves against the even and odd activation
        columns, without the interleave below, measured slower and were dropped.)"""
        if SCHEME == 2:
            j = k0 // 2 + tl.arange(0, BK // 2)
            mask = row_ok[:, None] & (j[None, :] < n_cols // 2)
            byte = tl.load(w_ptr + rows[:, None] * w_row + j[None, :], mask=mask, other=0)
            lo = (byte & 15).to(tl.float32) - 8.0
            hi = (byte >> 4).to(tl.float32) - 8.0
            q = tl.reshape(tl.join(lo, hi), (BN, BK // GROUP, GROUP))  # even, odd, ...
            g = k0 // GROUP + tl.arange(0, BK // GROUP)
            g_mask = row_ok[:, None] & (g[None, :] < n_cols // GROUP)
            s = tl.load(s_ptr + rows[:, None] * s_row + g[None, :], mask=g_mask, other=0.0)
            w = tl.reshape(q * s.to(tl.float32)[:, :, None], (BN, BK))
            if NATIVE:
                return w.to(OUT)
            else:
                return _round(w, OUT).to(OUT)
        else:
            cols = k0 + tl.arange(0, BK)
            mask = row_ok[:, None] & (cols[None, :] < n_cols)
            w = tl.load(w_ptr + rows[:, None] * w_row + cols[None, :], mask=mask, other=0)
            if SCHEME == 1:
                s = tl.load(s_ptr + rows * s_row, mask=row_ok, other=0.0)
                w = w.to(tl.float32) * s[:, None]
                if NATIVE:
                    return w.to(OUT)
                else:
                    return _round(w, OUT).to(OUT)
            else:
                return w.to(OUT)

    @triton.jit
    def _dot(a, w, acc, OUT: tl.constexpr, F32: tl.constexpr):
        """acc + a @ w^T in fp32: fp32 inputs exactly (not through TF32); with ``F32``
        half-precision inputs widened first (Triton's CPU interpreter multiplies bf16
        tiles wrongly; a bf16 product is exact in fp32, so only the summation order
        can differ from the tensor cores')."""
        if OUT == tl.float32 or F32:  # noqa: SIM300 - a compile-time dtype test
            a32, w32 = a.to(tl.float32), w.to(tl.float32)
            return tl.dot(a32, tl.trans(w32), acc, input_precision="ieee")
        else:
            return tl.dot(a, tl.trans(w), acc)

    @triton.jit
    def _block_rows(order_ptr, blk_ptr, start_ptr, count_ptr, first_ptr, BM: tl.constexpr):
        """(slot, pairs [BM], pairs valid [BM], rows [BM]) of this program's block: up to
        BM of the (token, rank) pairs routed to one slot, from the slot-sorted pair
        order; ``rows``: the block's rows of the launch's hidden buffer ([blocks x BM])."""
        block = tl.program_id(0)
        slot = tl.load(blk_ptr + block)
        m = (block - tl.load(first_ptr + slot)) * BM + tl.arange(0, BM)
        m_ok = m < tl.load(count_ptr + slot)
        pair = tl.load(order_ptr + tl.load(start_ptr + slot) + m, mask=m_ok, other=0)
        rows = block.to(tl.int64) * BM + tl.arange(0, BM)
        return slot.to(tl.int64), pair.to(tl.int64), m_ok, rows

    @triton.jit
    def grouped_gate_up_kernel(
        x_ptr, order_ptr, blk_ptr, start_ptr, count_ptr, first_ptr, eid_ptr, h_ptr,
        g_ptr, g_we, g_wr, gs_ptr, gs_e, gs_r,
        u_ptr, u_we, u_wr, us_ptr, us_e, us_r,
        gb_ptr, ub_ptr, hid, inter, alpha, limit,
        TOPK: tl.constexpr, SCHEME: tl.constexpr, GROUP: tl.constexpr, BM: tl.constexpr,
        BN: tl.constexpr, BK: tl.constexpr, HAS_BIAS: tl.constexpr, ACT: tl.constexpr,
        F32: tl.constexpr, NATIVE: tl.constexpr = False,
    ):  # fmt: skip
        """h[pair, rows] = act(gate(x) (+ bias), up(x) (+ bias)) for a block of pairs of
        one slot: [BM, BK] token tiles against the slot's [BN, BK] weight tiles."""
        blocks = _block_rows(order_ptr, blk_ptr, start_ptr, count_ptr, first_ptr, BM)
        slot, pair, m_ok, h_rows = blocks
        token = pair // TOPK
        rows = tl.program_id(1) * BN + tl.arange(0, BN)
        row_ok = rows < inter
        out_type = h_ptr.dtype.element_ty
        acc_g = tl.zeros([BM, BN], dtype=tl.float32)
        acc_u = tl.zeros([BM, BN], dtype=tl.float32)
        gw, gs = g_ptr + slot * g_we, gs_ptr + slot * gs_e
        uw, us = u_ptr + slot * u_we, us_ptr + slot * us_e
        for k0 in range(0, hid, BK):
            kk = k0 + tl.arange(0, BK)
            a_mask = m_ok[:, None] & (kk[None, :] < hid)
            a = tl.load(x_ptr + token[:, None] * hid + kk[None, :], mask=a_mask, other=0.0)
            w = _tile(gw, gs, g_wr, gs_r, rows, row_ok, k0, hid, out_type, SCHEME, GROUP, BN, BK,
                      NATIVE)  # fmt: skip
            acc_g = _dot(a, w, acc_g, out_type, F32)
            w = _tile(uw, us, u_wr, us_r, rows, row_ok, k0, hid, out_type, SCHEME, GROUP, BN, BK,
                      NATIVE)  # fmt: skip
            acc_u = _dot(a, w, acc_u, out_type, F32)
        gate = _round(acc_g, out_type)  # F.linear's output dtype
        up = _round(acc_u, out_type)
        if HAS_BIAS:
            at = tl.load(eid_ptr + slot).to(tl.int64) * inter + rows
            gb = tl.load(gb_ptr + at, mask=row_ok, other=0.0).to(tl.float32)
            ub = tl.load(ub_ptr + at, mask=row_ok, other=0.0).to(tl.float32)
            gate = _round(gate + gb[None, :], out_type)
            up = _round(up + ub[None, :], out_type)
        h = _activate(gate, up, alpha, limit, out_type, ACT)
        at = h_ptr + h_rows[:, None] * inter + rows[None, :]
        tl.store(at, h.to(out_type), mask=m_ok[:, None] & row_ok[None, :])

    @triton.jit
    def grouped_down_kernel(
        h_ptr, order_ptr, blk_ptr, start_ptr, count_ptr, first_ptr, eid_ptr, y_ptr,
        d_ptr, d_we, d_wr, ds_ptr, ds_e, ds_r, db_ptr, hid, inter,
        OUT: tl.constexpr, SCHEME: tl.constexpr, GROUP: tl.constexpr, BM: tl.constexpr,
        BN: tl.constexpr, BK: tl.constexpr, HAS_BIAS: tl.constexpr, F32: tl.constexpr,
        NATIVE: tl.constexpr = False,
    ):  # fmt: skip
        """y[pair, rows] (fp32 holding ``OUT`` values) = down(h[pair]) (+ bias) for a
        block of pairs of one slot."""
        blocks = _block_rows(order_ptr, blk_ptr, start_ptr, count_ptr, first_ptr, BM)
        slot, pair, m_ok, h_rows = blocks
        rows = tl.program_id(1) * BN + tl.arange(0, BN)
        row_ok = rows < hid
        acc = tl.zeros([BM, BN], dtype=tl.float32)
        dw, dsc = d_ptr + slot * d_we, ds_ptr + slot * ds_e
        for k0 in range(0, inter, BK):
            kk = k0 + tl.arange(0, BK)
            a_mask = m_ok[:, None] & (kk[None, :] < inter)
            a = tl.load(h_ptr + h_rows[:, None] * inter + kk[None, :], mask=a_mask, other=0.0)
            w = _tile(dw, dsc, d_wr, ds_r, rows, row_ok, k0, inter, OUT, SCHEME, GROUP, BN, BK,
                      NATIVE)  # fmt: skip
            acc = _dot(a, w, acc, OUT, F32)
        y = _round(acc, OUT)
        if HAS_BIAS:
            at = tl.load(eid_ptr + slot).to(tl.int64) * hid + rows
            bias = tl.load(db_ptr + at, mask=row_ok, other=0.0).to(tl.float32)
            y = _round(y + bias[None, :], OUT)
        at = y_ptr + pair[:, None] * hid + rows[None, :]
        tl.store(at, y, mask=m_ok[:, None] & row_ok[None, :])

    @triton.jit
    def tile_dequant_kernel(
        w_ptr, w_expert, w_row, s_ptr, s_expert, s_row, slots_ptr, out_ptr, rows, cols,
        SCHEME: tl.constexpr, GROUP: tl.constexpr, BR: tl.constexpr, BC: tl.constexpr,
        NATIVE: tl.constexpr,
    ):  # fmt: skip
        """out[i] ([rows, cols], the model dtype) = the projection of slot ``slots[i]``
        dequantized by ``_tile``, the grouped kernels' own tile: the values their
        products use, so the bf16 kernels on ``out`` give their bits."""
        i = tl.program_id(0)
        slot = tl.load(slots_ptr + i).to(tl.int64)
        r = tl.program_id(1) * BR + tl.arange(0, BR)
        c0 = tl.program_id(2) * BC
        c = c0 + tl.arange(0, BC)
        r_ok = r < rows
        out_type = out_ptr.dtype.element_ty
        w = _tile(w_ptr + slot * w_expert, s_ptr + slot * s_expert, w_row, s_row, r, r_ok, c0,
                  cols, out_type, SCHEME, GROUP, BR, BC, NATIVE)  # fmt: skip
        at = out_ptr + i.to(tl.int64) * rows * cols + r[:, None] * cols + c[None, :]
        tl.store(at, w, mask=r_ok[:, None] & (c[None, :] < cols))

else:  # pragma: no cover - depends on the environment
    grouped_gate_up_kernel = grouped_down_kernel = tile_dequant_kernel = None
