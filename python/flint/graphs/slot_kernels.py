"""The routed experts' slot kernels of ``flint.graphs.moe_kernel`` (which documents
them): gate/up, down and the ranked sum by slot index over float, int8 or int4 pools
(int4 as byte tiles or as 32-bit words against the vector's eighths), the eighths
layout, and the dequantizing copy. Untyped, as Triton kernels are, so mypy's strict
checks are relaxed for this module."""

from __future__ import annotations

from flint.graphs.triton_kernels import triton

__all__ = [
    "_activate",
    "dequant_kernel",
    "down_kernel",
    "eighths_kernel",
    "gate_up_kernel",
    "ranked_sum_kernel",
]

if triton is not None:
    import triton.language as tl

    from flint.graphs.triton_kernels import (
        _await_inputs,
        _eighth_exp,
        _eighths_index,
        _round,
        _times_2_to,
        _w_steps,
        _w_tile,
        _x_cols,
    )

    @triton.jit
    def _activate(gate, up, alpha, limit, out_type: tl.constexpr, ACT: tl.constexpr):
        """The expert activation on gate and up (fp32 holding model-dtype values):
        ``ACT`` 0 is SwiGLU, ``silu(gate) * up``; 1 is GPT-OSS's, gate clamped above at
        ``limit``, up to [-limit, limit], ``(up + 1) * gate * sigmoid(alpha * gate)``;
        each op rounded as ``flint.models.mlp.activate`` rounds it."""
        if ACT == 0:
            silu = _round(gate / (1.0 + tl.exp(-gate)), out_type)
            h = _round(silu * up, out_type)
        else:
            gate = tl.minimum(gate, limit)
            up = tl.minimum(tl.maximum(up, -limit), limit)
            scaled = _round(gate * alpha, out_type)
            glu = _round(gate * _round(1.0 / (1.0 + tl.exp(-scaled)), out_type), out_type)
            h = _round(_round(up + 1.0, out_type) * glu, out_type)
        return h

    @triton.jit
    def _i4_tile(w_ptr, s_ptr, w_row, s_row, rows, row_ok, k0, n_cols, GROUP, BK, EVEN):
        """The int4 bytes [BN, BK/2] of columns k0.. and their group scales
        [BN, BK/GROUP] (fp32), both loads issued before either is used. ``EVEN``: the
        row is a whole number of tiles, so no column mask (a mask on ``n_cols // 2``
        bytes, a multiple of 8 to the compiler, would cut the loads to 8 bytes)."""
        j = k0 // 2 + tl.arange(0, BK // 2)
        if EVEN:  # noqa: SIM108 - a compile-time branch
            mask = row_ok[:, None]
        else:
            mask = row_ok[:, None] & (j[None, :] < n_cols // 2)
        byte = tl.load(w_ptr + rows[:, None] * w_row + j[None, :], mask=mask, other=0)
        g = k0 // GROUP + tl.arange(0, BK // GROUP)
        g_mask = row_ok[:, None] & (g[None, :] < n_cols // GROUP)
        s = tl.load(s_ptr + rows[:, None] * s_row + g[None, :], mask=g_mask, other=0.0)
        return byte, s

    @triton.jit
    def _i4_dot(byte, s, xe, xo, BN: tl.constexpr, BK: tl.constexpr, GROUP: tl.constexpr):
        """[BN] fp32: a tile from ``_i4_tile`` dotted with the even and odd entries of
        its columns, low and high nibbles, each group's sum scaled once."""
        lo = (byte & 15).to(tl.float32) - 8.0
        hi = (byte >> 4).to(tl.float32) - 8.0
        part = lo * xe[None, :] + hi * xo[None, :]  # [BN, BK/2]
        part = tl.sum(tl.reshape(part, (BN, BK // GROUP, GROUP // 2)), axis=2)
        return tl.sum(part * s.to(tl.float32), axis=1)

    @triton.jit
    def _i4_words(w_ptr, s_ptr, w_row, s_row, rows, row_ok, k0, n_cols, GROUP, BK, EVEN):
        """``_i4_tile`` read as 32-bit words [BN, BK/8] (eight nibbles each: columns
        8m .. 8m + 7, low nibble first) and the group scales [BN, BK/GROUP]."""
        m = k0 // 8 + tl.arange(0, BK // 8)
        if EVEN:  # noqa: SIM108 - a compile-time branch
            mask = row_ok[:, None]
        else:
            mask = row_ok[:, None] & (m[None, :] < n_cols // 8)
        w32 = w_ptr.to(tl.pointer_type(tl.int32))
        words = tl.load(w32 + rows[:, None] * (w_row // 4) + m[None, :], mask=mask, other=0)
        g = k0 // GROUP + tl.arange(0, BK // GROUP)
        g_mask = row_ok[:, None] & (g[None, :] < n_cols // GROUP)
        s = tl.load(s_ptr + rows[:, None] * s_row + g[None, :], mask=g_mask, other=0.0)
        return words, s

    @triton.jit
    def _nibble(words, one, K: tl.constexpr):
        """Nibble ``K`` (0..7) of each word as the fp32 (q - 8) * 2^-E exactly, E from
        ``_eighth_exp``: its four bits or-ed into ``one`` (the bits of 1.0, in a
        register: with the mask as the immediate, the and and the or are one LOP3) at
        mantissa bit 23 - E (after a 12-bit shift for nibbles 5..7, which would reach
        the exponent), then 1 + 8 * 2^-E subtracted. A logic op and an add per weight,
        no conversion instruction (I2F issues at a quarter of their rate)."""
        if K < 5:
            bits = (words & (15 << (4 * K))) | one
            return bits.to(tl.float32, bitcast=True) - (1.0 + 8.0 * 2.0 ** (4 * K - 23))
        else:
            bits = ((words >> 12) & (15 << (4 * K - 12))) | one
            return bits.to(tl.float32, bitcast=True) - (1.0 + 8.0 * 2.0 ** (4 * K - 35))

    @triton.jit
    def eighths_kernel(
        x_ptr, out_ptr, n_cols, stride, BLOCK: tl.constexpr, GDC: tl.constexpr = False
    ):
        """A vector per program in the word kernels' layout: out[k, m] = x[8m + k] * 2^E
        (fp32, exact), eight rows of ``stride`` entries, so ``_words_dot`` reads each
        nibble's factors as one contiguous run."""
        _await_inputs(GDC)
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        ok = cols < n_cols
        x = tl.load(x_ptr + row * n_cols + cols, mask=ok, other=0.0).to(tl.float32)
        y = _times_2_to(x, _eighth_exp(cols % 8))
        tl.store(out_ptr + row * 8 * stride + _eighths_index(cols, stride), y, mask=ok)

    @triton.jit
    def _words_dot(words, s, v_ptr, stride, k0, n_cols, BN: tl.constexpr, BK: tl.constexpr,
                   GROUP: tl.constexpr, EVEN: tl.constexpr):  # fmt: skip
        """[BN, BK/GROUP] fp32: a word tile from ``_i4_words`` dotted with columns k0..
        of a vector in the eighths layout at ``v_ptr`` (``eighths_kernel``), group by
        group: every product exact, each word's eight summed in nibble order, then each
        group's words, times its scale. (The caller adds the groups across steps and
        sums them once at the end: one cross-thread sum per dot, not one per step.)"""
        m = k0 // 8 + tl.arange(0, BK // 8)
        # 0x3F800000 (stride >= 0), from a run-time value so that it stays in a register
        one = tl.minimum(stride, 0) | 0x3F800000
        part = tl.zeros([BN, BK // 8], dtype=tl.float32)
        for k in tl.static_range(8):
            if EVEN:
                x = tl.load(v_ptr + k * stride + m)
            else:
                x = tl.load(v_ptr + k * stride + m, mask=m < n_cols // 8, other=0.0)
            part += _nibble(words, one, k) * x[None, :]
        part = tl.sum(tl.reshape(part, (BN, BK // GROUP, GROUP // 8)), axis=2)
        return part * s.to(tl.float32)

    @triton.jit
    def _words_ahead(w_ptr, s_ptr, w_row, s_row, rows, row_ok, n_cols, GROUP: tl.constexpr,
                     BK: tl.constexpr, EVEN: tl.constexpr, NT: tl.constexpr):  # fmt: skip
        """The ``NT`` (1 to 4) word tiles and scales of whole rows at once
        (``_i4_words`` at columns 0, BK, ...; past NT, tile 0 again, unused), for
        ``_words_ahead_dot``: all their loads issued before any is used."""
        w0, s0 = _i4_words(w_ptr, s_ptr, w_row, s_row, rows, row_ok, 0, n_cols, GROUP, BK, EVEN)
        w1, s1, w2, s2, w3, s3 = w0, s0, w0, s0, w0, s0
        if NT > 1:
            w1, s1 = _i4_words(w_ptr, s_ptr, w_row, s_row, rows, row_ok, BK, n_cols, GROUP, BK,
                               EVEN)  # fmt: skip
        if NT > 2:
            w2, s2 = _i4_words(w_ptr, s_ptr, w_row, s_row, rows, row_ok, 2 * BK, n_cols, GROUP,
                               BK, EVEN)  # fmt: skip
        if NT > 3:
            w3, s3 = _i4_words(w_ptr, s_ptr, w_row, s_row, rows, row_ok, 3 * BK, n_cols, GROUP,
                               BK, EVEN)  # fmt: skip
        return w0, s0, w1, s1, w2, s2, w3, s3

    @triton.jit
    def _words_ahead_dot(w0, s0, w1, s1, w2, s2, w3, s3, v_ptr, stride, n_cols,
                         BN: tl.constexpr, BK: tl.constexpr, GROUP: tl.constexpr,
                         EVEN: tl.constexpr, NT: tl.constexpr):  # fmt: skip
        """[BN] fp32: ``_rows_dot``'s word dot of the tiles from ``_words_ahead``, in its
        order (tile by tile, the groups summed once at the end): the same bits."""
        groups = tl.zeros([BN, BK // GROUP], dtype=tl.float32)
        groups += _words_dot(w0, s0, v_ptr, stride, 0, n_cols, BN, BK, GROUP, EVEN)
        if NT > 1:
            groups += _words_dot(w1, s1, v_ptr, stride, BK, n_cols, BN, BK, GROUP, EVEN)
        if NT > 2:
            groups += _words_dot(w2, s2, v_ptr, stride, 2 * BK, n_cols, BN, BK, GROUP, EVEN)
        if NT > 3:
            groups += _words_dot(w3, s3, v_ptr, stride, 3 * BK, n_cols, BN, BK, GROUP, EVEN)
        return tl.sum(groups, axis=1)

    @triton.jit
    def _x_pairs(v_ptr, k0, n_cols, BK: tl.constexpr):
        """The even and odd entries [BK/2] (fp32) of the vector's columns k0.."""
        j = k0 // 2 + tl.arange(0, BK // 2)
        j_ok = j < n_cols // 2
        xe = tl.load(v_ptr + 2 * j, mask=j_ok, other=0.0).to(tl.float32)
        xo = tl.load(v_ptr + 2 * j + 1, mask=j_ok, other=0.0).to(tl.float32)
        return xe, xo

    @triton.jit
    def _rows_dot(
        w_ptr,
        s_ptr,
        w_row,
        s_row,
        v_ptr,
        v_stride,
        rows,
        row_ok,
        n_cols,
        SCHEME: tl.constexpr,
        GROUP: tl.constexpr,
        BN: tl.constexpr,
        BK: tl.constexpr,
        EVEN: tl.constexpr,
        WORDS: tl.constexpr,
    ):
        """[BN] fp32: rows ``rows`` of one expert's projection dotted with the vector at
        ``v_ptr`` (n_cols long). int4: the packed bytes read once as a [BN, BK/2] tile,
        low and high nibbles against the even and odd entries, each group's sum scaled
        once; with ``WORDS``, as 32-bit words against the vector in the eighths layout
        (rows of ``v_stride``: ``_words_dot``). int8: the row scale applied to the whole
        dot."""
        acc = tl.zeros([BN], dtype=tl.float32)
        if SCHEME == 2 and WORDS:
            groups = tl.zeros([BN, BK // GROUP], dtype=tl.float32)
            for k0 in range(0, n_cols, BK):
                words, s = _i4_words(
                    w_ptr, s_ptr, w_row, s_row, rows, row_ok, k0, n_cols, GROUP, BK, EVEN
                )
                groups += _words_dot(words, s, v_ptr, v_stride, k0, n_cols, BN, BK, GROUP, EVEN)
            acc = tl.sum(groups, axis=1)
        elif SCHEME == 2:
            for k0 in range(0, n_cols, BK):
                byte, s = _i4_tile(
                    w_ptr, s_ptr, w_row, s_row, rows, row_ok, k0, n_cols, GROUP, BK, EVEN
                )
                xe, xo = _x_pairs(v_ptr, k0, n_cols, BK)
                acc += _i4_dot(byte, s, xe, xo, BN, BK, GROUP)
        else:
            acc = _w_steps(w_ptr, w_row, v_ptr, rows, row_ok, 0, n_cols, acc, BK)
            if SCHEME == 1:
                acc = acc * tl.load(s_ptr + rows * s_row, mask=row_ok, other=0.0)
        return acc

    @triton.jit
    def _rows_dot2(
        a_ptr,
        as_ptr,
        a_row,
        as_row,
        b_ptr,
        bs_ptr,
        b_row,
        bs_row,
        v_ptr,
        v_stride,
        rows,
        row_ok,
        n_cols,
        SCHEME: tl.constexpr,
        GROUP: tl.constexpr,
        BN: tl.constexpr,
        BK: tl.constexpr,
        EVEN: tl.constexpr,
        WORDS: tl.constexpr,
    ):
        """``_rows_dot`` of two projections (gate and up) in one loop: each step issues
        both tiles' loads before computing either (one memory round trip per step for
        the two, not two), and reads the vector once for both. Each dot's operations
        and order are ``_rows_dot``'s."""
        acc_a = tl.zeros([BN], dtype=tl.float32)
        acc_b = tl.zeros([BN], dtype=tl.float32)
        if SCHEME == 2 and WORDS:
            ga = tl.zeros([BN, BK // GROUP], dtype=tl.float32)
            gb = tl.zeros([BN, BK // GROUP], dtype=tl.float32)
            for k0 in range(0, n_cols, BK):
                a, sa = _i4_words(
                    a_ptr, as_ptr, a_row, as_row, rows, row_ok, k0, n_cols, GROUP, BK, EVEN
                )
                b, sb = _i4_words(
                    b_ptr, bs_ptr, b_row, bs_row, rows, row_ok, k0, n_cols, GROUP, BK, EVEN
                )
                ga += _words_dot(a, sa, v_ptr, v_stride, k0, n_cols, BN, BK, GROUP, EVEN)
                gb += _words_dot(b, sb, v_ptr, v_stride, k0, n_cols, BN, BK, GROUP, EVEN)
            acc_a = tl.sum(ga, axis=1)
            acc_b = tl.sum(gb, axis=1)
        elif SCHEME == 2:
            for k0 in range(0, n_cols, BK):
                a, sa = _i4_tile(
                    a_ptr, as_ptr, a_row, as_row, rows, row_ok, k0, n_cols, GROUP, BK, EVEN
                )
                b, sb = _i4_tile(
                    b_ptr, bs_ptr, b_row, bs_row, rows, row_ok, k0, n_cols, GROUP, BK, EVEN
                )
                xe, xo = _x_pairs(v_ptr, k0, n_cols, BK)
                acc_a += _i4_dot(a, sa, xe, xo, BN, BK, GROUP)
                acc_b += _i4_dot(b, sb, xe, xo, BN, BK, GROUP)
        else:
            for k0 in range(0, n_cols, BK):
                a = _w_tile(a_ptr, a_row, rows, row_ok, k0, n_cols, BK)
                b = _w_tile(b_ptr, b_row, rows, row_ok, k0, n_cols, BK)
                v = _x_cols(v_ptr, k0, n_cols, BK)
                acc_a += tl.sum(a.to(tl.float32) * v[None, :], axis=1)
                acc_b += tl.sum(b.to(tl.float32) * v[None, :], axis=1)
            if SCHEME == 1:
                acc_a = acc_a * tl.load(as_ptr + rows * as_row, mask=row_ok, other=0.0)
                acc_b = acc_b * tl.load(bs_ptr + rows * bs_row, mask=row_ok, other=0.0)
        return acc_a, acc_b

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
        gb_ptr,
        ub_ptr,
        hid,
        inter,
        x_stride,
        h_stride,
        alpha,
        limit,
        OUT: tl.constexpr,
        TOPK: tl.constexpr,
        SCHEME: tl.constexpr,
        GROUP: tl.constexpr,
        BN: tl.constexpr,
        BK: tl.constexpr,
        HAS_BIAS: tl.constexpr,
        ACT: tl.constexpr,
        EVEN: tl.constexpr = False,
        WORDS: tl.constexpr = False,
        WHOLE: tl.constexpr = 0,
        GDC: tl.constexpr = False,
    ):
        """h[pair, rows] = act(gate(x) (+ bias), up(x) (+ bias)) for one (token, rank)
        pair (``_activate``), each op rounded to ``OUT``. With ``WORDS`` (int4): x and h
        in the eighths layout (rows of ``x_stride`` and ``h_stride``), h as ``down``
        reads it. ``WHOLE`` (int4 words whose rows are 1 to 4 tiles, ``WHOLE`` of them):
        every tile of the program's gate and up rows loaded at once, then dotted in
        ``_rows_dot2``'s order (one memory round trip, not one per tile)."""
        _await_inputs(GDC)
        pair = tl.program_id(0)
        token = pair // TOPK
        expert = tl.load(ids_ptr + pair).to(tl.int64)
        rows = tl.program_id(1) * BN + tl.arange(0, BN)
        row_ok = rows < inter
        x = x_ptr + token * (8 * x_stride if WORDS else hid)
        if WHOLE > 0:
            tl.static_assert(WORDS and SCHEME == 2 and WHOLE <= 4, "WHOLE: int4 words, 1-4 tiles")
            a0, as0, a1, as1, a2, as2, a3, as3 = _words_ahead(
                g_ptr + expert * g_we, gs_ptr + expert * gs_e, g_wr, gs_r, rows, row_ok, hid,
                GROUP, BK, EVEN, WHOLE,
            )  # fmt: skip
            b0, bs0, b1, bs1, b2, bs2, b3, bs3 = _words_ahead(
                u_ptr + expert * u_we, us_ptr + expert * us_e, u_wr, us_r, rows, row_ok, hid,
                GROUP, BK, EVEN, WHOLE,
            )  # fmt: skip
            gate = _words_ahead_dot(
                a0, as0, a1, as1, a2, as2, a3, as3, x, x_stride, hid, BN, BK, GROUP, EVEN, WHOLE
            )
            up = _words_ahead_dot(
                b0, bs0, b1, bs1, b2, bs2, b3, bs3, x, x_stride, hid, BN, BK, GROUP, EVEN, WHOLE
            )
        else:
            gate, up = _rows_dot2(
                g_ptr + expert * g_we, gs_ptr + expert * gs_e, g_wr, gs_r,
                u_ptr + expert * u_we, us_ptr + expert * us_e, u_wr, us_r, x, x_stride, rows,
                row_ok, hid, SCHEME, GROUP, BN, BK, EVEN, WORDS,
            )  # fmt: skip
        out_type: tl.constexpr = OUT
        gate = _round(gate, out_type)  # F.linear's output dtype
        up = _round(up, out_type)
        if HAS_BIAS:
            at = expert * inter + rows
            gate = _round(
                gate + tl.load(gb_ptr + at, mask=row_ok, other=0.0).to(tl.float32), out_type
            )
            up = _round(up + tl.load(ub_ptr + at, mask=row_ok, other=0.0).to(tl.float32), out_type)
        h = _activate(gate, up, alpha, limit, out_type, ACT)
        if WORDS:
            at = h_ptr + pair * 8 * h_stride + _eighths_index(rows, h_stride)
            tl.store(at, _times_2_to(h, _eighth_exp(rows % 8)), mask=row_ok)
        else:
            tl.store(h_ptr + pair * inter + rows, h.to(h_ptr.dtype.element_ty), mask=row_ok)

    @triton.jit
    def down_kernel(
        h_ptr,
        ids_ptr,
        y_ptr,
        d_ptr,
        d_we,
        d_wr,
        ds_ptr,
        ds_e,
        ds_r,
        db_ptr,
        hid,
        inter,
        h_stride,
        OUT: tl.constexpr,
        SCHEME: tl.constexpr,
        GROUP: tl.constexpr,
        BN: tl.constexpr,
        BK: tl.constexpr,
        HAS_BIAS: tl.constexpr,
        EVEN: tl.constexpr = False,
        WORDS: tl.constexpr = False,
        AHEAD: tl.constexpr = 0,
        GDC: tl.constexpr = False,
    ):
        """y[pair, rows] (fp32, rounded to the model dtype) = down(h[pair]) (+ bias); h
        in the eighths layout with ``WORDS`` (``gate_up_kernel``). ``AHEAD`` (int4
        words whose rows are 1 to 4 tiles, ``AHEAD`` of them): the pair's expert id
        (the router's, two kernels back) and the program's whole rows read before
        ``_await_inputs``, so that after it only h is read."""
        pair = tl.program_id(0)
        rows = tl.program_id(1) * BN + tl.arange(0, BN)
        row_ok = rows < hid
        h = h_ptr + pair * (8 * h_stride if WORDS else inter)
        if AHEAD > 0:
            tl.static_assert(WORDS and SCHEME == 2 and AHEAD <= 4, "AHEAD: int4 words, 1-4 tiles")
            expert = tl.load(ids_ptr + pair).to(tl.int64)
            w0, s0, w1, s1, w2, s2, w3, s3 = _words_ahead(
                d_ptr + expert * d_we, ds_ptr + expert * ds_e, d_wr, ds_r, rows, row_ok, inter,
                GROUP, BK, EVEN, AHEAD,
            )  # fmt: skip
            _await_inputs(GDC)
            y = _words_ahead_dot(
                w0, s0, w1, s1, w2, s2, w3, s3, h, h_stride, inter, BN, BK, GROUP, EVEN, AHEAD
            )
        else:
            _await_inputs(GDC)
            expert = tl.load(ids_ptr + pair).to(tl.int64)
            y = _rows_dot(
                d_ptr + expert * d_we, ds_ptr + expert * ds_e, d_wr, ds_r, h, h_stride,
                rows, row_ok, inter, SCHEME, GROUP, BN, BK, EVEN, WORDS,
            )  # fmt: skip
        y = _round(y, OUT)
        if HAS_BIAS:
            bias = tl.load(db_ptr + expert * hid + rows, mask=row_ok, other=0.0)
            y = _round(y + bias.to(tl.float32), OUT)
        tl.store(y_ptr + pair * hid + rows, y, mask=row_ok)

    @triton.jit
    def ranked_sum_kernel(
        y_ptr, rw_ptr, out_ptr, hid, TOPK: tl.constexpr, BS: tl.constexpr, GDC: tl.constexpr = False
    ):
        """out[token] = sum over ranks, in rank order, of weight * y (fp32), cast once."""
        _await_inputs(GDC)
        token = tl.program_id(0)
        cols = tl.program_id(1) * BS + tl.arange(0, BS)
        ok = cols < hid
        total = tl.zeros([BS], dtype=tl.float32)
        for rank in tl.static_range(TOPK):
            pair = token * TOPK + rank
            y = tl.load(y_ptr + pair * hid + cols, mask=ok, other=0.0)
            total = total + y * tl.load(rw_ptr + pair).to(tl.float32)
        out_type = out_ptr.dtype.element_ty
        tl.store(out_ptr + token * hid + cols, _round(total, out_type).to(out_type), mask=ok)

    @triton.jit
    def dequant_kernel(
        w_ptr, w_expert, w_row, s_ptr, s_expert, s_row, experts_ptr, out_ptr, rows, cols,
        SCHEME: tl.constexpr, GROUP: tl.constexpr, BR: tl.constexpr, BC: tl.constexpr,
    ):  # fmt: skip
        """out[i] ([rows, cols], the model dtype) = projection weights of expert
        ``experts[i]`` by the file's rule: the int8 value or int4 nibble - 8, times its
        row or group scale in fp32, rounded once (``ExpertLayout.weight``)."""
        i = tl.program_id(0)
        e = tl.load(experts_ptr + i).to(tl.int64)
        r = tl.program_id(1) * BR + tl.arange(0, BR)
        c = tl.program_id(2) * BC + tl.arange(0, BC)
        ok = (r[:, None] < rows) & (c[None, :] < cols)
        out_type = out_ptr.dtype.element_ty
        w_base = w_ptr + e * w_expert + r[:, None] * w_row
        s_base = s_ptr + e * s_expert + r[:, None] * s_row
        if SCHEME == 2:
            byte = tl.load(w_base + c[None, :] // 2, mask=ok, other=0).to(tl.int32)
            q = ((byte >> ((c[None, :] % 2) * 4)) & 15).to(tl.float32) - 8.0
            s = tl.load(s_base + c[None, :] // GROUP, mask=ok, other=0.0).to(tl.float32)
        else:
            q = tl.load(w_base + c[None, :], mask=ok, other=0).to(tl.float32)
            s = tl.load(s_base, mask=r[:, None] < rows, other=0.0).to(tl.float32)
        at = out_ptr + i.to(tl.int64) * rows * cols + r[:, None] * cols + c[None, :]
        tl.store(at, _round(q * s, out_type).to(out_type), mask=ok)

else:  # pragma: no cover - depends on the environment
    gate_up_kernel = down_kernel = ranked_sum_kernel = None
    dequant_kernel = None
    rms_norm_kernel = head_rope_kernel = route_kernel = linear_kernel = None
    qkv_rope_kernel = decode_attention_kernel = attention_combine_kernel = None
