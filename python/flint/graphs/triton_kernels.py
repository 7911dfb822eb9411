"""The Triton kernels of ``flint.graphs.fused`` (which documents them) and the helpers
the slot kernels share with them (``flint.graphs.slot_kernels``); untyped, as Triton
kernels are, so mypy's strict checks are relaxed for this module."""

from __future__ import annotations

try:  # Triton ships with torch's CUDA wheels; without it there are no graphs
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the environment
    triton = None

__all__ = [
    "_await_inputs",
    "_cluster_arrive",
    "_cluster_sum",
    "_eighth_exp",
    "_eighths_index",
    "_l2_ask",
    "_round",
    "_start_next",
    "_times_2_to",
    "_w_steps",
    "_w_tile",
    "_x_cols",
    "argmax_blocks_kernel",
    "argmax_kernel",
    "attention_combine_kernel",
    "decode_attention_kernel",
    "head_rope_kernel",
    "linear_kernel",
    "norm_linear_kernel",
    "norm_route_kernel",
    "qkv_rope_kernel",
    "ranked_norm_kernel",
    "rms_norm_kernel",
    "route_kernel",
    "triton",
]

if triton is not None:

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
    def _await_inputs(GDC: tl.constexpr, LATE: tl.constexpr = False):
        """Programmatic dependent launch (``GDC``; Hopper and later, launched with
        ``launch_pdl``): the kernel's programs may start while the kernel before it in
        the stream still runs; here they wait until it has finished and its writes are
        visible, then let the next kernel's programs start. Every read of data an
        earlier kernel writes, and every store, comes after this; only constant weights
        may be read before it. Each kernel waiting keeps the order transitive.

        So when a kernel's programs run, the kernel two before it has finished (the one
        before lets them start only after its own wait; not so when that one is in
        ``moe_kernel.EARLY``, below): what that kernel and every
        earlier one wrote (the router's ids for ``down``, the KV cache's earlier rows,
        the step's position, copied in before the replay) may be read before the wait
        too, with ``AHEAD`` (``moe_kernel.ahead``); only the kernel just before's
        output, and every store, must come after it.

        ``GDC`` = 2 (``moe_kernel.EARLY``): the next kernel's programs may start before
        this wait, once this kernel's programs have all started. The kernels before may
        then still run, back to the nearest one not in EARLY, so the next kernel may read
        before its own wait only what was written before the replay or before that one.
        Each kernel still waits, so the order of the stores stays transitive.

        ``LATE`` (with ``GDC`` True): the wait only; the kernel lets the next one's
        programs start later itself, with ``_start_next`` (once its own reads are in,
        so that the next kernel's reads ahead of its wait do not slow them)."""
        if GDC == 2:
            tl.extra.cuda.gdc_launch_dependents()
            tl.extra.cuda.gdc_wait()
        elif GDC:
            tl.extra.cuda.gdc_wait()
            if not LATE:
                tl.extra.cuda.gdc_launch_dependents()

    @triton.jit
    def _start_next(GDC: tl.constexpr):
        """The next kernel's programs may start from here: the late point of a kernel
        whose ``_await_inputs`` had ``LATE`` (nothing where ``GDC`` is off, or 2, whose
        wait let them start already)."""
        if GDC and GDC != 2:
            tl.extra.cuda.gdc_launch_dependents()

    @triton.jit
    def _l2_ask(at, size):
        """Asks the L2 cache for ``size`` bytes at the byte address ``at`` (scalars), from
        one thread of the program (Hopper's bulk prefetch, ``cp.async.bulk.prefetch.L2``:
        issued and not waited for; a hint that changes no result, since the L2 is where
        the GPU's global memory is coherent). ``at`` 16-byte aligned, ``size`` a
        multiple of 16 (0 or less: nothing asked). CUDA sm_90 and later only (inline
        PTX): the interpreter has no such instruction."""
        return tl.inline_asm_elementwise(
            "{ .reg .pred p; .reg .u32 t; mov.u32 t, %tid.x; setp.eq.u32 p, t, 0;"
            " setp.gt.and.s32 p, $2, 0, p;"
            " @p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }",
            "=r,l,r",
            [at, size],
            dtype=tl.int32,
            is_pure=False,
            pack=1,
        )

    @triton.jit
    def _ask_rows(ptr, at, count):
        """``_l2_ask`` for the ``count`` elements at ``ptr + at``: KV cache rows, which
        are contiguous in a head (``decode_attention`` asserts it)."""
        size = ptr.dtype.element_ty.primitive_bitwidth // 8
        _l2_ask(ptr + at, (count * size).to(tl.int32) // 16 * 16)

    @triton.jit
    def _eighth_exp(k):
        """E of column 8m + k in ``_nibble``: 23 - 4k, or 35 - 4k from k = 5."""
        return tl.where(k < 5, 23 - 4 * k, 35 - 4 * k)

    @triton.jit
    def _eighths_index(cols, stride):
        """Where column ``cols`` of a vector goes in its eighths layout: row ``cols % 8``
        (of ``stride`` entries), entry ``cols // 8``."""
        return (cols % 8) * stride + cols // 8

    @triton.jit
    def _times_2_to(x, e):
        """x * 2^e (fp32, e an integer tensor in the normal range): exact."""
        return x * ((e + 127) << 23).to(tl.float32, bitcast=True)

    @triton.jit
    def _w_tile(w_ptr, w_row, rows, row_ok, k0, n_cols, BK: tl.constexpr):
        """The float or int8 weights [BN, BK] of columns k0.. (0 past the edges)."""
        cols = k0 + tl.arange(0, BK)
        mask = row_ok[:, None] & (cols[None, :] < n_cols)
        return tl.load(w_ptr + rows[:, None] * w_row + cols[None, :], mask=mask, other=0)

    @triton.jit
    def _x_cols(v_ptr, k0, n_cols, BK: tl.constexpr):
        """The vector's columns k0.. [BK] (fp32, 0 past the edge)."""
        cols = k0 + tl.arange(0, BK)
        return tl.load(v_ptr + cols, mask=cols < n_cols, other=0.0).to(tl.float32)

    @triton.jit
    def _w_steps(w_ptr, w_row, v_ptr, rows, row_ok, k_first, n_cols, acc, BK: tl.constexpr):
        """``acc`` plus the float or int8 rows' dots with the vector over columns
        k_first.., one tile of ``BK`` columns per step (``_rows_dot``'s order)."""
        for k0 in range(k_first, n_cols, BK):
            w = _w_tile(w_ptr, w_row, rows, row_ok, k0, n_cols, BK)
            acc += tl.sum(w.to(tl.float32) * _x_cols(v_ptr, k0, n_cols, BK)[None, :], axis=1)
        return acc

    @triton.jit
    def _read_if(ptr, at, ok, READ: tl.constexpr):
        """The values at ``ptr + at`` (fp32; 0 where not ``ok``) where ``READ``, else the
        scalar 0, which the caller does not use: a value read after the wait instead of
        before it, or a row scale, bias or residual the kernel does not have."""
        if READ:
            return tl.load(ptr + at, mask=ok, other=0.0).to(tl.float32)
        else:
            return 0.0

    @triton.jit
    def linear_kernel(
        x_ptr,
        w_ptr,
        w_row,
        s_ptr,
        b_ptr,
        r_ptr,
        out_ptr,
        n_rows,
        n_cols,
        ROUND: tl.constexpr,
        SCHEME: tl.constexpr,
        HAS_BIAS: tl.constexpr,
        HAS_RES: tl.constexpr,
        BN: tl.constexpr,
        BK: tl.constexpr,
        AHEAD: tl.constexpr = False,
        GDC: tl.constexpr = False,
        FIRST_AHEAD: tl.constexpr = True,
    ):
        """out[rows] = x . w[rows] (+ bias, in fp32) rounded to ``ROUND`` (F.linear's
        output), then (+ residual) rounded again (torch's add): one token, rows ``BN``
        at a time; bf16 weights (``SCHEME`` 0) or int8 with fp32 row scales (1). The
        first step's weights are constant, so they are read before ``_await_inputs``:
        they arrive while the kernel before finishes; with ``AHEAD`` the row scales and
        biases too, and the residual as soon as the wait ends, not after the loop. The
        sum is ``_rows_dot``'s. ``FIRST_AHEAD`` off: the first tile after the wait (the
        benches' A/B)."""
        rows = tl.program_id(0) * BN + tl.arange(0, BN)
        row_ok = rows < n_rows
        if FIRST_AHEAD:
            w = _w_tile(w_ptr, w_row, rows, row_ok, 0, n_cols, BK)
        if AHEAD:
            scale = _read_if(s_ptr, rows, row_ok, SCHEME == 1)
            bias = _read_if(b_ptr, rows, row_ok, HAS_BIAS)
        _await_inputs(GDC)
        if not FIRST_AHEAD:
            w = _w_tile(w_ptr, w_row, rows, row_ok, 0, n_cols, BK)
        if AHEAD:
            res = _read_if(r_ptr, rows, row_ok, HAS_RES)
        acc = tl.sum(w.to(tl.float32) * _x_cols(x_ptr, 0, n_cols, BK)[None, :], axis=1)
        acc = _w_steps(w_ptr, w_row, x_ptr, rows, row_ok, BK, n_cols, acc, BK)
        if not AHEAD:
            scale = _read_if(s_ptr, rows, row_ok, SCHEME == 1)
        if SCHEME == 1:
            acc = acc * scale
        if HAS_BIAS:
            if not AHEAD:
                bias = _read_if(b_ptr, rows, row_ok, True)
            acc = acc + bias
        acc = _round(acc, ROUND)
        if HAS_RES:
            if not AHEAD:
                res = _read_if(r_ptr, rows, row_ok, True)
            acc = _round(acc + res, ROUND)
        out_type = out_ptr.dtype.element_ty
        tl.store(out_ptr + rows, acc.to(out_type), mask=row_ok)

    @triton.jit
    def rms_norm_kernel(
        x_ptr,
        d_ptr,
        sum_ptr,
        w_ptr,
        out_ptr,
        n,
        eps,
        e_ptr,
        e_stride,
        BLOCK: tl.constexpr,
        W32: tl.constexpr,
        ADD: tl.constexpr,
        EIGHTHS: tl.constexpr = False,
        AHEAD: tl.constexpr = False,
        GDC: tl.constexpr = False,
    ):
        """One row as ``flint.models.norm.rms_norm``: ``w * (x / rms(x)).to(dtype)``, or
        with ``W32`` (GPT-OSS) the weight multiplied in fp32 before the one cast. With
        ``ADD``, x is first the residual sum ``x + d`` rounded to the dtype (torch's
        add), also written to ``sum_ptr``. With ``EIGHTHS``, the output is also written
        in the word kernels' eighths layout at ``e_ptr`` (``eighths_kernel``'s bits).
        ``AHEAD``: the weight read before ``_await_inputs``, not after the row's sum."""
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        ok = cols < n
        w = _read_if(w_ptr, cols, ok, AHEAD)  # the weight ahead of the wait
        _await_inputs(GDC)
        x = tl.load(x_ptr + row * n + cols, mask=ok, other=0.0).to(tl.float32)
        out_type = out_ptr.dtype.element_ty
        if ADD:
            d = tl.load(d_ptr + row * n + cols, mask=ok, other=0.0).to(tl.float32)
            x = _round(x + d, out_type)
            tl.store(sum_ptr + row * n + cols, x.to(out_type), mask=ok)
        squares = tl.sum(x * x, axis=0)
        y = _rms_normed(x, squares, w, w_ptr, cols, ok, n, eps, W32, out_type, AHEAD)
        _store_normed(y, out_ptr + row * n, cols, ok, e_ptr + row * 8 * e_stride, e_stride, EIGHTHS)

    @triton.jit
    def _cluster_sum(part, at, ASYNC: tl.constexpr = False):
        """The sum of ``part`` (an fp32 scalar, one per program) over the eight programs
        of a thread-block cluster, added in cluster rank order, so every program gets
        the same bits. ``at``: what this program's ``_cluster_arrive(ASYNC)`` returned,
        called first. Its wait here makes sure every program of the cluster has started
        (and, with ``ASYNC``, set up its barrier) before any writes into another's
        shared memory (the CUDA programming guide's rule for distributed shared memory).
        Threads 0-7 of each program then write its part into program t's shared memory
        (``mapa``), each program adds the eight in its own shared memory once all have
        arrived, and no program touches another's memory after that, so none can exit
        while another still writes to it. How the parts arrive: ``ASYNC`` False, plain
        stores (``st.shared::cluster``) made visible by a second cluster barrier
        (release, acquire: the release waits for every earlier store of the thread);
        True, asynchronous stores (``st.async``) that count their bytes off the
        receiving program's transaction barrier (``mbarrier``), on which it waits alone.
        Launched as one cluster of eight (``fused._cluster_launch``); CUDA sm_90 and
        later only (inline PTX)."""
        if ASYNC:
            return tl.inline_asm_elementwise(
                "{ .reg .u32 t, r, p0, b, rb, rbar; .reg .pred p, done;"
                " .reg .f32 s0, s1, s2, s3, s4, s5, s6, s7;"
                " barrier.cluster.wait.aligned;"
                " mov.u32 t, %tid.x; mov.u32 r, %cluster_ctarank; add.u32 p0, $2, 16;"
                " mad.lo.u32 b, r, 4, p0; setp.lt.u32 p, t, 8;"
                " @p mapa.shared::cluster.u32 rb, b, t; @p mapa.shared::cluster.u32 rbar, $2, t;"
                " @p st.async.shared::cluster.mbarrier::complete_tx::bytes.f32 [rb], $1, [rbar];"
                " WAIT_PARTS:"
                " mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 done, [$2], 0;"
                " @!done bra WAIT_PARTS;"
                " ld.shared.v4.f32 {s0, s1, s2, s3}, [p0];"
                " ld.shared.v4.f32 {s4, s5, s6, s7}, [p0+16];"
                " add.f32 s0, s0, s1; add.f32 s0, s0, s2; add.f32 s0, s0, s3; add.f32 s0, s0, s4;"
                " add.f32 s0, s0, s5; add.f32 s0, s0, s6; add.f32 $0, s0, s7; }",
                "=f,f,r",
                [part, at],
                dtype=tl.float32,
                is_pure=False,
                pack=1,
            )
        return tl.inline_asm_elementwise(
            "{ .reg .u32 t, r, b; .reg .pred p;"
            " .reg .f32 s0, s1, s2, s3, s4, s5, s6, s7;"
            " barrier.cluster.wait.aligned;"
            " mov.u32 t, %tid.x; mov.u32 r, %cluster_ctarank;"
            " mad.lo.u32 b, r, 4, $2; setp.lt.u32 p, t, 8;"
            " @p mapa.shared::cluster.u32 b, b, t; @p st.shared::cluster.f32 [b], $1;"
            " barrier.cluster.arrive.release.aligned; barrier.cluster.wait.acquire.aligned;"
            " ld.shared.v4.f32 {s0, s1, s2, s3}, [$2]; ld.shared.v4.f32 {s4, s5, s6, s7}, [$2+16];"
            " add.f32 s0, s0, s1; add.f32 s0, s0, s2; add.f32 s0, s0, s3; add.f32 s0, s0, s4;"
            " add.f32 s0, s0, s5; add.f32 s0, s0, s6; add.f32 $0, s0, s7; }",
            "=f,f,r",
            [part, at],
            dtype=tl.float32,
            is_pure=False,
            pack=1,
        )

    @triton.jit
    def _cluster_arrive(ASYNC: tl.constexpr = False):
        """This thread's arrival at the cluster barrier that ``_cluster_sum`` first waits
        on, as the program starts, so that the wait there costs nothing once every
        program of the cluster is running. Returns the shared-memory address of the
        program's exchange area for ``_cluster_sum``: eight fp32 parts (``ASYNC``
        False), or a transaction barrier and the parts at +16 (True: thread 0 sets the
        barrier up to complete once 32 bytes have arrived, and makes that visible to
        the cluster with the arrival, ``fence.mbarrier_init``; otherwise the arrival is
        relaxed, ordering no memory)."""
        if ASYNC:
            return tl.inline_asm_elementwise(
                "{ .shared .align 16 .b8 xchg[48]; .reg .u32 a, t; .reg .pred p; .reg .b64 s;"
                " mov.u32 a, xchg; mov.u32 t, %tid.x; setp.eq.u32 p, t, 0;"
                " @p mbarrier.init.shared::cta.b64 [a], 1;"
                " @p mbarrier.arrive.expect_tx.shared::cta.b64 s, [a], 32;"
                " @p fence.mbarrier_init.release.cluster;"
                " barrier.cluster.arrive.relaxed.aligned; mov.u32 $0, a; }",
                "=r,r",
                [tl.program_id(0)],
                dtype=tl.int32,
                is_pure=False,
                pack=1,
            )
        return tl.inline_asm_elementwise(
            "{ .shared .align 16 .f32 parts[8]; barrier.cluster.arrive.relaxed.aligned;"
            " mov.u32 $0, parts; }",
            "=r,r",
            [tl.program_id(0)],
            dtype=tl.int32,
            is_pure=False,
            pack=1,
        )

    @triton.jit
    def ranked_norm_kernel(
        rows_ptr,
        rw_ptr,
        x_ptr,
        sum_ptr,
        w_ptr,
        out_ptr,
        n,
        eps,
        TOPK: tl.constexpr,
        BS: tl.constexpr,
        W32: tl.constexpr,
        CLUSTER: tl.constexpr,
        AHEAD: tl.constexpr = False,
        GDC: tl.constexpr = False,
        LATE: tl.constexpr = 0,
        ASYNC: tl.constexpr = False,
    ):
        """One token's MoE output and the next norm in one launch: ``ranked_sum_kernel``
        (the K ranks' rows [K, n] fp32 times their weights, added in rank order in
        fp32, cast once), then ``rms_norm_kernel`` with ``ADD`` on the residual x plus
        that sum (the same ops, so the same bits but for the sum of squares' order).
        Program c takes columns [c * BS, + BS). ``CLUSTER`` 8: eight programs launched
        as one thread-block cluster, which add their rows' partial sums of squares in
        rank order (``_cluster_sum``); 1: one program (BS >= n), the CPU interpreter's
        form, ``tl.sum``'s order as ``rms_norm_kernel``'s. ``LATE`` (with ``GDC`` True,
        ``fused.CLUSTER_NORM_LATE``): the next kernel's programs start at the wait (0),
        once the ranks' rows are in (1) or once the sums of squares are exchanged (2):
        they read their weights before their own wait, beside this kernel's reads.
        ``ASYNC``: the exchange through asynchronous stores (``_cluster_sum``;
        ``fused.CLUSTER_ASYNC``)."""
        tl.static_assert(CLUSTER == 1 or CLUSTER == 8, "_cluster_sum adds eight parts")
        xchg = 0
        if CLUSTER > 1:
            xchg = _cluster_arrive(ASYNC)
        cols = tl.program_id(0) * BS + tl.arange(0, BS)
        ok = cols < n
        w = _read_if(w_ptr, cols, ok, AHEAD)  # the weight ahead of the wait
        _await_inputs(GDC, LATE > 0)
        out_type = out_ptr.dtype.element_ty
        total = tl.zeros([BS], dtype=tl.float32)
        for rank in tl.static_range(TOPK):
            row = tl.load(rows_ptr + rank * n + cols, mask=ok, other=0.0)
            total = total + row * tl.load(rw_ptr + rank).to(tl.float32)
        delta = _round(total, out_type)
        x = tl.load(x_ptr + cols, mask=ok, other=0.0).to(tl.float32)
        x = _round(x + delta, out_type)
        if LATE == 1:
            _start_next(GDC)
        squares = tl.sum(x * x, axis=0)
        if CLUSTER > 1:  # the store below after the barrier, whose release need not wait for it
            squares = _cluster_sum(squares, xchg, ASYNC)
        if LATE == 2:
            _start_next(GDC)
        tl.store(sum_ptr + cols, x.to(out_type), mask=ok)
        normed = _rms_normed(x, squares, w, w_ptr, cols, ok, n, eps, W32, out_type, AHEAD)
        tl.store(out_ptr + cols, normed.to(out_type), mask=ok)

    @triton.jit
    def _rms_normed(
        x,
        squares,
        w,
        w_ptr,
        cols,
        ok,
        n,
        eps,
        W32: tl.constexpr,
        OUT: tl.constexpr,
        AHEAD: tl.constexpr,
    ):
        """``w * (x / rms(row)).to(OUT)`` of x [BLOCK] (fp32, 0 past n), all or part of a
        row whose sum of squares is ``squares``, rounded to ``OUT``; with ``W32`` the
        weight multiplied in fp32 before the one cast. The weight ``w``: read already
        with ``AHEAD`` (``_read_if``), else here."""
        normed = x * tl.rsqrt(squares / n + eps)
        if not W32:
            normed = _round(normed, OUT)
        if not AHEAD:
            w = _read_if(w_ptr, cols, ok, True)
        return _round(w * normed, OUT)

    @triton.jit
    def _store_normed(y, out_ptr, cols, ok, e_ptr, e_stride, EIGHTHS: tl.constexpr):
        """A normed row y into ``out_ptr`` and, with ``EIGHTHS``, in the word kernels'
        eighths layout at ``e_ptr`` (``eighths_kernel``'s bits)."""
        out_type = out_ptr.dtype.element_ty
        tl.store(out_ptr + cols, y.to(out_type), mask=ok)
        if EIGHTHS:
            at = e_ptr + _eighths_index(cols, e_stride)
            tl.store(at, _times_2_to(y, _eighth_exp(cols % 8)), mask=ok)

    @triton.jit
    def norm_linear_kernel(
        h_ptr,
        w_ptr,
        w_row,
        nw_ptr,
        out_ptr,
        normed_ptr,
        e_ptr,
        e_stride,
        n_rows,
        n_cols,
        eps,
        ROUND: tl.constexpr,
        BN: tl.constexpr,
        BLOCK: tl.constexpr,
        W32: tl.constexpr,
        EIGHTHS: tl.constexpr = False,
        AHEAD: tl.constexpr = False,
        GDC: tl.constexpr = False,
    ):
        """One token's RMSNorm of h (``rms_norm_kernel``'s ops) and the product of w's
        rows ``BN`` at a time with it (``linear_kernel``'s roundings, weights in h's
        dtype, no bias), in one launch: each program computes the norm itself (the
        same bits in each: the same code on the same row), program 0 also writes it
        to ``normed_ptr`` (and the eighths). Whole rows (``BLOCK`` >= n_cols) in one
        step, read before ``_await_inputs``; with ``AHEAD`` the norm's weight too."""
        rows = tl.program_id(0) * BN + tl.arange(0, BN)
        row_ok = rows < n_rows
        cols = tl.arange(0, BLOCK)
        ok = cols < n_cols
        w_at = w_ptr + rows[:, None] * w_row + cols[None, :]
        w = tl.load(w_at, mask=row_ok[:, None] & ok[None, :], other=0.0)
        nw = _read_if(nw_ptr, cols, ok, AHEAD)
        _await_inputs(GDC)
        acc = _normed_rows(h_ptr, w, nw, nw_ptr, normed_ptr, e_ptr, e_stride, cols, ok, n_cols,
                           eps, ROUND, W32, EIGHTHS, AHEAD)  # fmt: skip
        tl.store(out_ptr + rows, acc.to(out_ptr.dtype.element_ty), mask=row_ok)

    @triton.jit
    def _normed_rows(
        h_ptr, w, nw, nw_ptr, normed_ptr, e_ptr, e_stride, cols, ok, n_cols, eps,
        ROUND: tl.constexpr, W32: tl.constexpr, EIGHTHS: tl.constexpr, AHEAD: tl.constexpr,
    ):  # fmt: skip
        """``norm_linear_kernel`` after its wait: h's norm (program 0 writes it) and the
        rows w [BN, BLOCK] dotted with it, rounded to ``ROUND`` (fp32 values)."""
        x = tl.load(h_ptr + cols, mask=ok, other=0.0).to(tl.float32)
        out_type = normed_ptr.dtype.element_ty
        squares = tl.sum(x * x, axis=0)
        y = _rms_normed(x, squares, nw, nw_ptr, cols, ok, n_cols, eps, W32, out_type, AHEAD)
        if tl.program_id(0) == 0:
            _store_normed(y, normed_ptr, cols, ok, e_ptr, e_stride, EIGHTHS)
        return _round(tl.sum(w.to(tl.float32) * y[None, :], axis=1), ROUND)

    @triton.jit
    def norm_route_kernel(
        h_ptr,
        w_ptr,
        w_row,
        nw_ptr,
        normed_ptr,
        e_ptr,
        e_stride,
        ids_ptr,
        rw_ptr,
        n_rows,
        n_cols,
        eps,
        ROUND: tl.constexpr,
        BN: tl.constexpr,
        BLOCK: tl.constexpr,
        W32: tl.constexpr,
        EIGHTHS: tl.constexpr,
        TOPK: tl.constexpr,
        NORM: tl.constexpr,
        EB: tl.constexpr,
        KP: tl.constexpr,
        RANKS: tl.constexpr,
        CLUSTER: tl.constexpr,
        AHEAD: tl.constexpr = False,
        GDC: tl.constexpr = False,
    ):
        """``norm_linear_kernel`` on the router's rows, then ``route_kernel``'s picks
        (``_rank_picks``), in one launch. Program c makes the logits of rows [c * BN, +
        BN). ``CLUSTER`` 8 or 16: the programs of one thread-block cluster send their
        logits into program 0's shared memory (``_route_gather``), which picks once
        all n_rows have arrived; 1: one program of every row (BN >= n_rows: the CPU
        interpreter's form)."""
        xchg = 0
        if CLUSTER > 1:
            xchg = _route_arrive(n_rows)
        rows = tl.program_id(0) * BN + tl.arange(0, BN)
        row_ok = rows < n_rows
        cols = tl.arange(0, BLOCK)
        ok = cols < n_cols
        w_at = w_ptr + rows[:, None] * w_row + cols[None, :]
        w = tl.load(w_at, mask=row_ok[:, None] & ok[None, :], other=0.0)
        nw = _read_if(nw_ptr, cols, ok, AHEAD)
        _await_inputs(GDC)
        acc = _normed_rows(h_ptr, w, nw, nw_ptr, normed_ptr, e_ptr, e_stride, cols, ok, n_cols,
                           eps, ROUND, W32, EIGHTHS, AHEAD)  # fmt: skip
        if CLUSTER > 1:
            tl.static_assert(BN <= 32 and EB <= 256, "_route_arrive's area: 32 rows, 256 logits")
            _route_stage(acc, tl.arange(0, BN), xchg)  # both have side effects: in order
            _route_gather(xchg, n_rows, BN)
            if tl.program_id(0) == 0:
                e = tl.arange(0, EB)
                e_ok = e < n_rows
                logits = tl.where(e_ok, _route_logit(e, xchg), float("-inf"))
                p, e = _softmax_lanes(logits, e, e_ok)
                _rank_picks(p, e, ids_ptr, rw_ptr, TOPK, NORM, KP, EB, RANKS)
        else:
            tl.static_assert(BN == EB, "one program: every row")
            p, e = _softmax_lanes(tl.where(row_ok, acc, float("-inf")), rows, row_ok)
            _rank_picks(p, e, ids_ptr, rw_ptr, TOPK, NORM, KP, EB, RANKS)

    # The router's exchange area in each program's shared memory (bytes): a transaction
    # barrier at 0, the cluster's logits (at most 256) at 16, this program's (at most 32)
    # staged at 1040.
    @triton.jit
    def _route_arrive(n_rows):
        """As the program starts: thread 0 sets up the program's transaction barrier to
        complete once ``n_rows`` fp32 logits (4 bytes each) have arrived (only program
        0's is waited on) and makes that visible to the cluster; every thread then
        arrives at the cluster barrier (relaxed) that ``_route_gather`` waits on. Returns
        the exchange area's shared-memory address. CUDA sm_90 and later (inline PTX)."""
        return tl.inline_asm_elementwise(
            "{ .shared .align 16 .b8 xroute[1168]; .reg .u32 a, t, n; .reg .pred p; .reg .b64 s;"
            " mov.u32 a, xroute; mov.u32 t, %tid.x; setp.eq.u32 p, t, 0; shl.b32 n, $1, 2;"
            " @p mbarrier.init.shared::cta.b64 [a], 1;"
            " @p mbarrier.arrive.expect_tx.shared::cta.b64 s, [a], n;"
            " @p fence.mbarrier_init.release.cluster;"
            " barrier.cluster.arrive.relaxed.aligned; mov.u32 $0, a; }",
            "=r,r",
            [n_rows],
            dtype=tl.int32,
            is_pure=False,
            pack=1,
        )

    @triton.jit
    def _route_stage(acc, r, at):
        """This program's logits acc [BN] staged in its own exchange area (element r at
        +1040 + 4r; threads holding the same element store the same value)."""
        return tl.inline_asm_elementwise(
            "{ .reg .u32 a; mad.lo.u32 a, $2, 4, $3; st.shared.f32 [a+1040], $1; mov.u32 $0, 0; }",
            "=r,f,r,r",
            [acc, r, at],
            dtype=tl.int32,
            is_pure=False,
            pack=1,
        )

    @triton.jit
    def _route_gather(at, n_rows, BN: tl.constexpr):
        """Every program's staged logits sent into program 0's exchange area, in row
        order. After a barrier of the program's threads (the staged values visible to
        all), and the cluster barrier's wait (every program started, program 0's
        transaction barrier set up: the rule for distributed shared memory), thread t <
        BN sends logit t (row rank * BN + t, if below ``n_rows``) by an asynchronous
        store that counts its 4 bytes off program 0's barrier; program 0 then waits on
        that barrier alone (acquire) until all n_rows have arrived. The other programs
        touch no shared memory after their sends and may exit; program 0 stays until its
        own has arrived."""
        return tl.inline_asm_elementwise(
            "{ .reg .u32 t, r, row, src, dst, bar, r0; .reg .pred p, zero, done; .reg .f32 v;"
            " bar.sync 0; barrier.cluster.wait.aligned; mov.u32 r0, 0;"
            " mov.u32 t, %tid.x; mov.u32 r, %cluster_ctarank; mad.lo.u32 row, r, $3, t;"
            " setp.lt.u32 p, t, $3; setp.lt.and.u32 p, row, $2, p;"
            " mad.lo.u32 src, t, 4, $1; mad.lo.u32 dst, row, 4, $1; add.u32 dst, dst, 16;"
            " @p ld.shared.f32 v, [src+1040];"
            " @p mapa.shared::cluster.u32 dst, dst, r0; @p mapa.shared::cluster.u32 bar, $1, r0;"
            " @p st.async.shared::cluster.mbarrier::complete_tx::bytes.f32 [dst], v, [bar];"
            " setp.eq.u32 zero, r, 0; @!zero bra GATHERED;"
            " WAIT_LOGITS:"
            " mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 done, [$1], 0;"
            " @!done bra WAIT_LOGITS;"
            " GATHERED: mov.u32 $0, 0; }",
            "=r,r,r,r",
            [at, n_rows, n_rows * 0 + BN],
            dtype=tl.int32,
            is_pure=False,
            pack=1,
        )

    @triton.jit
    def _route_logit(e, at):
        """Program 0's gathered logit of row e (after ``_route_gather``'s wait)."""
        return tl.inline_asm_elementwise(
            "{ .reg .u32 a; mad.lo.u32 a, $1, 4, $2; ld.shared.f32 $0, [a+16]; }",
            "=f,r,r",
            [e, at],
            dtype=tl.float32,
            is_pure=False,
            pack=1,
        )

    @triton.jit
    def _head_rope(
        y_ptr,
        w_ptr,
        cos_ptr,
        sin_ptr,
        pos,
        out_ptr,
        dim,
        eps,
        NORM: tl.constexpr,
        ROT: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        """One head at ``y_ptr``: per-head RMSNorm (``NORM``), then RoPE on the first
        ``ROT`` dims at ``pos`` (the rest pass through), written at ``out_ptr``:
        ``rms_norm`` and ``apply_rope``'s ops and roundings."""
        d = tl.arange(0, BLOCK)
        ok = d < dim
        out_type = out_ptr.dtype.element_ty
        x = tl.load(y_ptr + d, mask=ok, other=0.0).to(tl.float32)
        inv = 1.0
        if NORM:
            inv = tl.rsqrt(tl.sum(x * x, axis=0) / dim + eps)
            w = tl.load(w_ptr + d, mask=ok, other=0.0).to(tl.float32)
            x = _round(w * _round(x * inv, out_type), out_type)
        if ROT > 0:
            half = ROT // 2
            rot = d < ROT
            partner = tl.where(d < half, d + half, d - half)
            px = tl.load(y_ptr + partner, mask=rot, other=0.0).to(tl.float32)
            if NORM:
                wp = tl.load(w_ptr + partner, mask=rot, other=0.0).to(tl.float32)
                px = _round(wp * _round(px * inv, out_type), out_type)
            cos = tl.load(cos_ptr + pos * ROT + d, mask=rot, other=1.0).to(tl.float32)
            sin = tl.load(sin_ptr + pos * ROT + d, mask=rot, other=0.0).to(tl.float32)
            rotated = tl.where(d < half, -px, px)
            y = _round(_round(x * cos, out_type) + _round(rotated * sin, out_type), out_type)
            x = tl.where(rot, y, x)
        tl.store(out_ptr + d, x.to(out_type), mask=ok)

    @triton.jit
    def head_rope_kernel(
        y_ptr,
        w_ptr,
        cos_ptr,
        sin_ptr,
        pos_ptr,
        out_ptr,
        out_head,
        out_pos,
        dim,
        eps,
        NORM: tl.constexpr,
        ROT: tl.constexpr,
        BLOCK: tl.constexpr,
        GDC: tl.constexpr = False,
    ):
        """One head of a projection [N, D] (``_head_rope``), written to ``out_ptr + head
        * out_head + position * out_pos`` (a KV cache row, or a buffer with ``out_pos``
        0)."""
        _await_inputs(GDC)
        head = tl.program_id(0)
        pos = tl.load(pos_ptr)
        out = out_ptr + head * out_head + pos * out_pos
        y = y_ptr + head * dim
        _head_rope(y, w_ptr, cos_ptr, sin_ptr, pos, out, dim, eps, NORM, ROT, BLOCK)

    @triton.jit
    def qkv_rope_kernel(
        y_ptr,
        qn_ptr,
        kn_ptr,
        cos_ptr,
        sin_ptr,
        pos_ptr,
        q_ptr,
        k_ptr,
        v_ptr,
        k_head,
        k_pos,
        v_head,
        v_pos,
        heads,
        kv_heads,
        dim,
        eps,
        NORM: tl.constexpr,
        ROT: tl.constexpr,
        BLOCK: tl.constexpr,
        GDC: tl.constexpr = False,
        ASK: tl.constexpr = 0,
    ):
        """One launch for a token's stacked q, k, v projection [(Nq + 2 Nkv) D]: program
        h < Nq normalises and rotates query head h into ``q_ptr`` [Nq, D]; the next Nkv
        the key heads into the cache row; the last Nkv copy the value heads into theirs.
        ``ASK`` > 0 (``fused.KV_ASK``): before its wait, each key and value program asks
        the L2 for its head's earlier cache rows, at most ``ASK`` of them (the position
        was copied in before the replay), for the attention that follows."""
        h = tl.program_id(0)
        if ASK > 0:
            pos = tl.minimum(tl.load(pos_ptr), ASK)
            if h >= heads + kv_heads:
                _ask_rows(v_ptr, (h - heads - kv_heads) * v_head, pos * v_pos)
            elif h >= heads:
                _ask_rows(k_ptr, (h - heads) * k_head, pos * k_pos)
        _await_inputs(GDC)
        pos = tl.load(pos_ptr)
        y = y_ptr + h * dim
        if h < heads:
            out = q_ptr + h * dim
            _head_rope(y, qn_ptr, cos_ptr, sin_ptr, pos, out, dim, eps, NORM, ROT, BLOCK)
        elif h < heads + kv_heads:
            out = k_ptr + (h - heads) * k_head + pos * k_pos
            _head_rope(y, kn_ptr, cos_ptr, sin_ptr, pos, out, dim, eps, NORM, ROT, BLOCK)
        else:
            out = v_ptr + (h - heads - kv_heads) * v_head + pos * v_pos
            _head_rope(y, kn_ptr, cos_ptr, sin_ptr, pos, out, dim, eps, False, 0, BLOCK)

    @triton.jit
    def decode_attention_kernel(
        q_ptr,
        k_ptr,
        v_ptr,
        pos_ptr,
        o_ptr,
        m_ptr,
        l_ptr,
        acc_ptr,
        k_head,
        k_pos,
        v_head,
        v_pos,
        heads,
        dim,
        scale,
        GROUP: tl.constexpr,
        GP: tl.constexpr,
        DP: tl.constexpr,
        BS: tl.constexpr,
        CHUNK: tl.constexpr,
        SPLIT: tl.constexpr,
        F32: tl.constexpr,
        AHEAD: tl.constexpr = False,
        GDC: tl.constexpr = False,
        ASK: tl.constexpr = False,
    ):
        """One query token's attention for the ``GROUP`` query heads of key/value head
        ``program_id(0)`` over cache positions [split * CHUNK, + CHUNK) up to the token's
        position: scores in fp32, an online softmax, probabilities cast to the cache's
        dtype for the product with the values (as flash attention does). ``SPLIT``
        False: the one chunk's result, normalised, into ``o_ptr`` [Nq * D]; True: the
        running max, sum and unnormalised output into ``m``, ``l`` [splits, Nq] and
        ``acc`` [splits, Nq, D] for ``attention_combine_kernel``. ``F32``: the products
        on fp32 copies (Triton's CPU interpreter multiplies bf16 tiles wrongly).
        ``AHEAD``: the position read before ``_await_inputs``, so that the loop's first
        loads of keys and values are issued as soon as the wait ends. ``ASK`` (with
        ``AHEAD``; ``fused.KV_ASK``): the L2 asked there for the chunk's earlier keys and
        values (every row but the token's)."""
        kv = tl.program_id(0)
        split = tl.program_id(1)
        g = tl.arange(0, GP)
        d = tl.arange(0, DP)
        g_ok = g < GROUP
        d_ok = d < dim
        if AHEAD:
            pos = tl.load(pos_ptr).to(tl.int32)
            if ASK:
                first = split * CHUNK
                rows = tl.maximum(tl.minimum(first + CHUNK, pos) - first, 0)
                _ask_rows(k_ptr, kv * k_head + first * k_pos, rows * k_pos)
                _ask_rows(v_ptr, kv * v_head + first * v_pos, rows * v_pos)
        _await_inputs(GDC)
        head = kv * GROUP + g
        q_at = q_ptr + head[:, None] * dim + d[None, :]
        q = tl.load(q_at, mask=g_ok[:, None] & d_ok[None, :], other=0.0)
        if F32:
            q = q.to(tl.float32)
        if not AHEAD:
            pos = tl.load(pos_ptr).to(tl.int32)
        m = tl.full([GP], float("-inf"), dtype=tl.float32)
        total = tl.zeros([GP], dtype=tl.float32)
        acc = tl.zeros([GP, DP], dtype=tl.float32)
        start = split * CHUNK
        end = tl.minimum(start + CHUNK, pos + 1)
        for s0 in range(start, end, BS):
            s = s0 + tl.arange(0, BS)
            ok = s < end
            kv_mask = ok[:, None] & d_ok[None, :]
            k_at = k_ptr + kv * k_head + s[:, None] * k_pos + d[None, :]
            k = tl.load(k_at, mask=kv_mask, other=0.0)
            if F32:
                k = k.to(tl.float32)
            scores = tl.dot(q, tl.trans(k)) * scale  # [GP, BS]
            scores = tl.where(ok[None, :], scores, float("-inf"))
            m_new = tl.maximum(m, tl.max(scores, axis=1))
            alpha = tl.exp(m - m_new)
            p = tl.exp(scores - m_new[:, None])
            total = total * alpha + tl.sum(p, axis=1)
            v_at = v_ptr + kv * v_head + s[:, None] * v_pos + d[None, :]
            v = tl.load(v_at, mask=kv_mask, other=0.0)
            if F32:
                pv = tl.dot(_round(p, v_ptr.dtype.element_ty), v.to(tl.float32))
            else:
                pv = tl.dot(p.to(v.dtype), v)
            acc = acc * alpha[:, None] + pv
            m = m_new
        out_mask = g_ok[:, None] & d_ok[None, :]
        if SPLIT:
            at = split * heads + head
            tl.store(m_ptr + at, m, mask=g_ok)
            tl.store(l_ptr + at, total, mask=g_ok)
            tl.store(acc_ptr + at[:, None] * dim + d[None, :], acc, mask=out_mask)
        else:
            out_type = o_ptr.dtype.element_ty
            out = acc / total[:, None]
            tl.store(o_ptr + head[:, None] * dim + d[None, :], out.to(out_type), mask=out_mask)

    @triton.jit
    def attention_combine_kernel(
        m_ptr,
        l_ptr,
        acc_ptr,
        o_ptr,
        heads,
        dim,
        splits,
        DP: tl.constexpr,
        GDC: tl.constexpr = False,
    ):
        """Query head ``program_id(0)``: the splits' partial softmax results merged in
        split order, normalised, cast into ``o_ptr`` [Nq * D]. Split 0 always holds
        position 0, so the merged max is finite; splits past the position hold l = 0."""
        _await_inputs(GDC)
        head = tl.program_id(0)
        d = tl.arange(0, DP)
        d_ok = d < dim
        big = tl.load(m_ptr + head)
        for i in range(1, splits):
            big = tl.maximum(big, tl.load(m_ptr + i * heads + head))
        total = 0.0
        acc = tl.zeros([DP], dtype=tl.float32)
        for i in range(0, splits):
            w = tl.exp(tl.load(m_ptr + i * heads + head) - big)
            total += w * tl.load(l_ptr + i * heads + head)
            part = tl.load(acc_ptr + (i * heads + head) * dim + d, mask=d_ok, other=0.0)
            acc += w * part
        out_type = o_ptr.dtype.element_ty
        tl.store(o_ptr + head * dim + d, (acc / total).to(out_type), mask=d_ok)

    @triton.jit
    def _router_softmax(logits_ptr, n, BLOCK: tl.constexpr):
        """(p, e): the fp32 softmax of ``n`` logits over ``BLOCK`` lanes (lanes past n:
        p = -1, below every probability) and the lanes' indices."""
        e = tl.arange(0, BLOCK)
        ok = e < n
        logits = tl.load(logits_ptr + e, mask=ok, other=float("-inf")).to(tl.float32)
        return _softmax_lanes(logits, e, ok)

    @triton.jit
    def _softmax_lanes(logits, e, ok):
        """``_router_softmax`` of logits [BLOCK] already read (-inf past n)."""
        p = tl.exp(logits - tl.max(logits, axis=0))
        p = p / tl.sum(p, axis=0)
        return tl.where(ok, p, -1.0), e

    @triton.jit
    def _rank_picks(
        p, e, ids_ptr, w_ptr, TOPK: tl.constexpr, NORM: tl.constexpr, KP: tl.constexpr,
        BLOCK: tl.constexpr, RANKS: tl.constexpr,
    ):  # fmt: skip
        """``route_kernel``'s picks without a chain (``RANKS`` 1 or 2) from the
        probabilities p [BLOCK] of lanes e: the top-k ids into ``ids_ptr`` and their
        weights (renormalised with ``NORM``, the sum added in pick order) into
        ``w_ptr``, in its dtype."""
        k = tl.arange(0, KP)
        if RANKS == 2:
            picks, best = _sorted_picks(p, e, KP, BLOCK)
        else:
            picks, best = _ranked_picks(p, e, k)
        total = 0.0
        for i in tl.static_range(TOPK):  # in pick order, as the picks come below
            total += tl.sum(tl.where(k == i, best, 0.0), axis=0)
        if NORM:
            best = best / total
        w_type = w_ptr.dtype.element_ty
        tl.store(ids_ptr + k, picks.to(tl.int64), mask=k < TOPK)
        tl.store(w_ptr + k, _round(best, w_type).to(w_type), mask=k < TOPK)

    @triton.jit
    def _ranked_picks(p, e, k):
        """(ids, values) [KP] of the ``k``-th largest of ``p`` [BLOCK] (ties: the lower
        index ``e``), for k in 0..KP-1: as the repeated max picks them. Each entry's
        rank is the number of entries above it, compared as int32 bits (``p`` is a
        probability, >= +0, or -1 past n: the bits order them as the values do, and a
        NaN's above every number, so the ranks are always 0..BLOCK-1 once each); one
        entry has each rank, so the sums read it out exactly."""
        key = p.to(tl.int32, bitcast=True)
        above = (key[None, :] > key[:, None]) | (
            (key[None, :] == key[:, None]) & (e[None, :] < e[:, None])
        )
        rank = tl.sum(above.to(tl.int32), axis=1)
        hit = rank[None, :] == k[:, None]  # [KP, BLOCK]
        ids = tl.sum(tl.where(hit, e[None, :], 0), axis=1)
        return ids, tl.sum(tl.where(hit, p[None, :], 0.0), axis=1)

    @triton.jit
    def _sorted_picks(p, e, KP: tl.constexpr, BLOCK: tl.constexpr):
        """The same by a bitonic top-KP of int64 keys: p's bits above, BLOCK - 1 - e
        below (a larger p first, then the lower index; every key differs)."""
        key = (p.to(tl.int32, bitcast=True).to(tl.int64) << 32) | (BLOCK - 1 - e).to(tl.int64)
        top = tl.topk(key, KP)
        ids = (BLOCK - 1 - (top & 0xFFFFFFFF)).to(tl.int32)
        return ids, (top >> 32).to(tl.int32).to(tl.float32, bitcast=True)

    @triton.jit
    def route_kernel(
        logits_ptr,
        ids_ptr,
        w_ptr,
        n,
        TOPK: tl.constexpr,
        NORM: tl.constexpr,
        BLOCK: tl.constexpr,
        KP: tl.constexpr = 1,
        ONE_PASS: tl.constexpr = False,
        RANKS: tl.constexpr = 0,
        GDC: tl.constexpr = False,
    ):
        """One token's softmax router (``flint.models.moe.route``): fp32 softmax over the
        n experts, the top-k in descending order (ties: the lower id), renormalised when
        ``NORM`` (by their sum in fp32, added in pick order), weights written in
        ``w_ptr``'s dtype. ``ONE_PASS``: one (value, index) reduction per pick and the
        sum added as they are picked (KP = TOPK rounded up to a power of two holds the
        picks); else two reductions per pick and a second pass for the sum. ``RANKS``
        (with ``ONE_PASS``), no chain of TOPK dependent reductions: 1, every expert's
        rank counted at once and the picks and their values read out by rank
        (``_ranked_picks``); 2, a bitonic top-k of (probability, id) keys
        (``_sorted_picks``). Each way the same picks and weights for the same
        probabilities."""
        _await_inputs(GDC)
        token = tl.program_id(0)
        p, e = _router_softmax(logits_ptr + token * n, n, BLOCK)
        w_type = w_ptr.dtype.element_ty
        if ONE_PASS and RANKS:
            at = token * TOPK
            _rank_picks(p, e, ids_ptr + at, w_ptr + at, TOPK, NORM, KP, BLOCK, RANKS)
        elif ONE_PASS:
            k = tl.arange(0, KP)
            picks = tl.zeros([KP], dtype=tl.int32)
            best = tl.zeros([KP], dtype=tl.float32)
            total = 0.0
            for i in tl.static_range(TOPK):
                value, pick = tl.max(
                    p, axis=0, return_indices=True, return_indices_tie_break_left=True
                )
                picks = tl.where(k == i, pick, picks)
                best = tl.where(k == i, value, best)
                total += value
                p = tl.where(e == pick, -1.0, p)
            if NORM:
                best = best / total
            tl.store(ids_ptr + token * TOPK + k, picks.to(tl.int64), mask=k < TOPK)
            tl.store(w_ptr + token * TOPK + k, _round(best, w_type).to(w_type), mask=k < TOPK)
        else:
            total = 1.0
            if NORM:  # the sum of the top-k probabilities, in fp32
                total = 0.0
                q = p
                for _ in tl.static_range(TOPK):
                    best = tl.max(q, axis=0)
                    total += best
                    q = tl.where(e == tl.min(tl.where(q == best, e, BLOCK), axis=0), -1.0, q)
            for k in tl.static_range(TOPK):
                best = tl.max(p, axis=0)
                pick = tl.min(tl.where(p == best, e, BLOCK), axis=0)
                tl.store(ids_ptr + token * TOPK + k, pick.to(tl.int64))
                weight = best / total if NORM else best
                tl.store(w_ptr + token * TOPK + k, _round(weight, w_type).to(w_type))
                p = tl.where(e == pick, -1.0, p)

    @triton.jit
    def _argmax_key(v):
        """fp32 -> int32 keys in the order ``torch.argmax`` compares: -0 and +0 equal,
        NaN above everything (every NaN alike)."""
        bits = v.to(tl.int32, bitcast=True)
        key = tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)  # negatives: larger below
        key = tl.where((bits & 0x7FFFFFFF) == 0, 0, key)  # -0 as +0
        return tl.where(v != v, 0x7FFFFFFF, key)

    @triton.jit
    def _first_max(key, index, none):
        """(the largest key, the lowest index holding it; ``none`` above every index)."""
        best = tl.max(key, axis=0)
        return best, tl.min(tl.where(key == best, index, none), axis=0)

    @triton.jit
    def argmax_blocks_kernel(
        x_ptr, keys_ptr, first_ptr, n, BLOCK: tl.constexpr, GDC: tl.constexpr = False
    ):
        """Each program: the largest key of its ``BLOCK`` entries of x and the first
        entry holding it (lanes past n: below every key, -inf's included)."""
        _await_inputs(GDC)
        block = tl.program_id(0)
        i = block * BLOCK + tl.arange(0, BLOCK)
        ok = i < n
        key = tl.where(ok, _argmax_key(tl.load(x_ptr + i, mask=ok, other=0.0)), -0x7FFFFFFF)
        best, first = _first_max(key, i, n)
        tl.store(keys_ptr + block, best)
        tl.store(first_ptr + block, first)

    @triton.jit
    def argmax_kernel(
        keys_ptr,
        first_ptr,
        out_ptr,
        host_ptr,
        pos_ptr,
        blocks,
        n,
        BLOCK: tl.constexpr,
        GDC: tl.constexpr = False,
        HOST: tl.constexpr = False,
    ):
        """One program: the blocks' largest key and, of the blocks holding it, the
        first one's entry (blocks are in entry order), written as int64. ``HOST``: also
        into slot ``position % 2`` of ``host_ptr`` (pinned host memory, mapped)."""
        _await_inputs(GDC)
        b = tl.arange(0, BLOCK)
        ok = b < blocks
        key = tl.load(keys_ptr + b, mask=ok, other=-0x7FFFFFFF)
        first = tl.load(first_ptr + b, mask=ok, other=n)
        _, token = _first_max(key, first, n)
        tl.store(out_ptr, token.to(tl.int64))
        if HOST:
            tl.store(host_ptr + tl.load(pos_ptr) % 2, token.to(tl.int64))
