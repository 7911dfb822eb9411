"""The routed experts of one decode step in one launch (issue 10): gate/up, down and the
ranked sum of every (token, rank) pair, as ``moe_kernel``'s three launches compute
them, by a grid of programs that all run at once and wait on counters instead of on
launch boundaries.

Each program takes work items in one order: its gate/up blocks, then its down blocks,
then its ranked-sum blocks (item ``pid``, ``pid + G``, ...). Finishing an item, it
adds one to a counter (release): a pair's count of gate/up blocks, a (token, column
block)'s count of down blocks. A down block loads its expert's rows first, then waits
until its pair's h is complete (acquire), so its weights arrive while the pair's last
gate/up blocks finish; a ranked-sum block waits for the down blocks of its columns.
Every item computes with the three kernels' own code and block shapes on four warps
(``_gate_up_item``, ``_down_rows`` and ``_down_finish``, ``_ranked_block``): the same
bits (tests compare them).

Waiting on other programs is safe only if they all run at once: the grid is at most
the programs that fit the GPU, less one a multiprocessor (``programs``), so a waiting
program never holds a place a program it waits for needs. The last program to finish
puts the counters back to zero for the next launch. A wait gives up after ~2^26 polls
(seconds) and marks the launch (``counters[-1]``) instead of hanging the GPU; the tests
check the mark.

In Triton's interpreter programs run one after another: there the grid is one program,
which reaches every counter after the items it counts."""

from __future__ import annotations

import functools
from typing import Any

import torch

from flint.graphs.triton_kernels import triton

__all__ = ["counters", "experts_kernel", "programs", "stuck"]

if triton is not None:
    import triton.language as tl

    from flint.graphs.slot_kernels import (
        _down_finish,
        _down_rows,
        _gate_up_item,
        _ranked_block,
    )
    from flint.graphs.triton_kernels import _await_inputs

    @triton.jit
    def _done(counter):
        """Adds one to ``counter`` once the program's stores are made (release)."""
        tl.debug_barrier()
        tl.atomic_add(counter, 1, sem="release", scope="gpu")

    @triton.jit
    def _wait_for(counter, target, stuck):
        """Polls ``counter`` until it reaches ``target``, then orders the program's
        later loads after the stores it counts (acquire). After 2^26 polls gives up and
        adds one to ``stuck``."""
        polls = 0
        while (tl.load(counter, volatile=True) < target) & (polls < 67108864):
            polls += 1
        if polls >= 67108864:
            tl.atomic_add(stuck, 1)
        tl.atomic_add(counter, 0, sem="acquire", scope="gpu")

    @triton.jit
    def experts_kernel(
        x_ptr, ids_ptr, rw_ptr, h_ptr, y_ptr, out_ptr, cnt_ptr,
        g_ptr, g_we, g_wr, gs_ptr, gs_e, gs_r,
        u_ptr, u_we, u_wr, us_ptr, us_e, us_r,
        d_ptr, d_we, d_wr, ds_ptr, ds_e, ds_r,
        gb_ptr, ub_ptr, db_ptr, hid, inter, x_stride, h_stride, alpha, limit, pairs,
        OUT: tl.constexpr, TOPK: tl.constexpr, GROUP: tl.constexpr,
        GU_BN: tl.constexpr, GU_BK: tl.constexpr, GU_TILES: tl.constexpr,
        GU_EVEN: tl.constexpr, D_BN: tl.constexpr, D_BK: tl.constexpr,
        D_TILES: tl.constexpr, D_EVEN: tl.constexpr, BS: tl.constexpr,
        HAS_BIAS: tl.constexpr, ACT: tl.constexpr, GDC: tl.constexpr = False,
    ):  # fmt: skip
        """int4 words (``WHOLE`` gate/up, down's rows in ``D_TILES`` tiles). Counters
        at ``cnt_ptr``: one per pair, one per (token, column block of ``BS``), the
        programs done, the stuck mark; all zero at the launch (and left so)."""
        pid = tl.program_id(0)
        programs = tl.num_programs(0)
        tokens = pairs // TOPK
        gu_blocks = tl.cdiv(inter, GU_BN)
        d_blocks = tl.cdiv(hid, D_BN)
        s_blocks = tl.cdiv(hid, BS)
        s_cnt = cnt_ptr + pairs
        done = s_cnt + tokens * s_blocks
        stuck = done + 1
        _await_inputs(GDC)
        for item in range(pid, pairs * gu_blocks, programs):
            pair = item // gu_blocks
            _gate_up_item(
                x_ptr, ids_ptr, h_ptr, g_ptr, g_we, g_wr, gs_ptr, gs_e, gs_r, u_ptr, u_we,
                u_wr, us_ptr, us_e, us_r, gb_ptr, ub_ptr, hid, inter, x_stride, h_stride,
                alpha, limit, pair, item % gu_blocks, OUT, TOPK, 2, GROUP, GU_BN, GU_BK,
                HAS_BIAS, ACT, GU_EVEN, True, GU_TILES,
            )  # fmt: skip
            _done(cnt_ptr + pair)
        # down blocks column block by column block, so that the ranked sums' columns
        # complete in order
        for item in range(pid, pairs * d_blocks, programs):
            pair = item % pairs
            rows = (item // pairs) * D_BN + tl.arange(0, D_BN)
            row_ok = rows < hid
            expert, w0, s0, w1, s1, w2, s2, w3, s3 = _down_rows(
                ids_ptr, d_ptr, d_we, d_wr, ds_ptr, ds_e, ds_r, inter, pair, rows, row_ok,
                GROUP, D_BK, D_EVEN, D_TILES,
            )  # fmt: skip
            _wait_for(cnt_ptr + pair, gu_blocks, stuck)
            _down_finish(
                h_ptr, y_ptr, db_ptr, hid, inter, h_stride, pair, expert, rows, row_ok,
                w0, s0, w1, s1, w2, s2, w3, s3, OUT, GROUP, D_BN, D_BK, HAS_BIAS, D_EVEN,
                D_TILES,
            )  # fmt: skip
            _done(s_cnt + (pair // TOPK) * s_blocks + (item // pairs) * D_BN // BS)
        for item in range(pid, tokens * s_blocks, programs):
            token = item // s_blocks
            block = item % s_blocks
            # down blocks of these columns, of each of the token's ranks
            need = TOPK * tl.cdiv(tl.minimum(BS, hid - block * BS), D_BN)
            _wait_for(s_cnt + item, need, stuck)
            _ranked_block(y_ptr, rw_ptr, out_ptr, hid, token, block, TOPK, BS)
        tl.debug_barrier()
        if tl.atomic_add(done, 1, sem="acq_rel", scope="gpu") == programs - 1:
            for at in range(0, pairs + tokens * s_blocks + 1):  # the last one out
                tl.store(cnt_ptr + at, 0)

else:  # pragma: no cover - depends on the environment
    experts_kernel = None


def counters(pairs: int, tokens: int, hid: int, block: int, device: torch.device) -> torch.Tensor:
    """Zeroed counters for ``experts_kernel`` (the last entry is the stuck mark)."""
    return torch.zeros(pairs + tokens * -(-hid // block) + 2, dtype=torch.int32, device=device)


def stuck(cnt: torch.Tensor) -> int:
    """How many waits of the launches on ``cnt`` gave up (0: none)."""
    return int(cnt[-1].item())


@functools.cache
def _fit(device_index: int, regs: int, warps: int, shared: int) -> int:
    """Programs of (regs, warps, shared bytes) a multiprocessor holds at once: registers
    are given per warp in units of 256 from each of four quarters of 16K, threads at
    most 2,048, blocks at most 32, shared memory with 1 KiB reserved a block."""
    props = torch.cuda.get_device_properties(device_index)
    per_warp = -(-regs * 32 // 256) * 256
    quarter = getattr(props, "regs_per_multiprocessor", 65536) // 4
    by_regs = 4 * (quarter // max(per_warp, 1)) // warps
    by_threads = props.max_threads_per_multi_processor // (32 * warps)
    smem = getattr(props, "shared_memory_per_multiprocessor", 233472)
    by_smem = smem // (shared + 1024)
    return min(by_regs, by_threads, by_smem, 32)


def programs(kernel: Any, device: torch.device, items: int) -> int:
    """The grid for ``kernel`` (compiled): every program resident at once with one place
    a multiprocessor to spare, and no more than ``items``; 0 where one a multiprocessor
    would not leave that spare place."""
    index = torch.cuda.current_device() if device.index is None else device.index
    kernel._init_handles()
    fit = _fit(index, kernel.n_regs, kernel.metadata.num_warps, kernel.metadata.shared)
    sms = torch.cuda.get_device_properties(index).multi_processor_count
    return max(0, min(items, sms * (fit - 1)))
