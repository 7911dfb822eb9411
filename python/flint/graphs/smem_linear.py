"""One token's product with a bf16 matrix whose rows are staged in shared memory before
the kernel's wait (Gluon, Hopper; issue 10's A/B, ``fused.SMEM_QKV``).

``fused.linear`` reads a product's rows into registers before its wait, as many as the
programs that fit at once hold: for q/k/v (5120 x 2048 bf16) 1,584 of its 2,560
programs, the rest after the wait. Here each program takes the rows of one SM (40 of
them, 160 KiB) and copies all of them into shared memory with ``cp.async`` as soon as it
starts, beside the kernel before (the norm); after the wait it reads the vector, then
each chunk of rows as its copies land. One warp a row: the row's sum is the warp's own
(shuffles, no barrier). The sums' order differs from ``linear_kernel``'s (every path of
a step uses the same kernel, so the captured and uncaptured steps agree bit for bit).
CUDA only: Gluon has no CPU interpreter."""

from __future__ import annotations

from typing import Any

import torch

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy
except ImportError:  # pragma: no cover - depends on the environment
    gluon = None

ROWS = 8  # rows a chunk: one a warp
SMEM_BYTES = 200 * 1024  # the most a program stages
PROGRAMS_PER_SM = 1  # programs (of rows staged) an SM holds at once


def fits(rows: int, cols: int, dtype: torch.dtype, sms: int) -> bool:
    """Whether ``smem_linear`` takes this product: bf16, columns a power of two from 256
    to 2048 (a lane holds cols / 32 of them), every SM's rows within SMEM_BYTES."""
    if gluon is None or dtype != torch.bfloat16 or cols & (cols - 1) or not 256 <= cols <= 2048:
        return False
    return _chunks(rows, sms) * ROWS * cols * 2 * PROGRAMS_PER_SM <= SMEM_BYTES


def _chunks(rows: int, sms: int) -> int:
    return -(-rows // (ROWS * sms * PROGRAMS_PER_SM))


if gluon is not None:

    @gluon.jit
    def _gdc_wait():
        gl.inline_asm_elementwise(
            "griddepcontrol.wait; // dummy $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1
        )

    @gluon.jit
    def _gdc_launch_dependents():
        gl.inline_asm_elementwise(
            "griddepcontrol.launch_dependents; // dummy $0",
            "=r",
            [],
            dtype=gl.int32,
            is_pure=False,
            pack=1,
        )

    @gluon.jit
    def smem_linear_kernel(
        x_ptr,
        w_ptr,
        w_row,
        out_ptr,
        n_rows,
        K: gl.constexpr,
        CHUNKS: gl.constexpr,
        GDC: gl.constexpr,
    ):
        """out[rows] = x . w[rows] (fp32 sums, rounded to bf16) for the program's
        CHUNKS x ROWS rows."""
        L: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [8, 1], [1, 0])
        S: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
        smem = gl.allocate_shared_memory(gl.bfloat16, [CHUNKS, 8, K], S)
        r = gl.arange(0, 8, layout=gl.SliceLayout(1, L))
        c = gl.arange(0, K, layout=gl.SliceLayout(0, L))
        first = gl.program_id(0) * (CHUNKS * 8)
        for i in gl.static_range(CHUNKS):
            rows = first + i * 8 + r
            at = w_ptr + rows[:, None].to(gl.int64) * w_row + c[None, :]
            async_copy.async_copy_global_to_shared(smem.index(i), at, mask=rows[:, None] < n_rows)
            async_copy.commit_group()
        if GDC == 2:  # moe_kernel.EARLY: the next kernel may start before this wait
            _gdc_launch_dependents()
            _gdc_wait()
        elif GDC:
            _gdc_wait()
            _gdc_launch_dependents()
        x = gl.load(x_ptr + c).to(gl.float32)
        for i in gl.static_range(CHUNKS):
            async_copy.wait_group(CHUNKS - 1 - i)  # this thread's copies of chunk i
            w = smem.index(i).load(L).to(gl.float32)  # as this thread copied them
            acc = gl.sum(w * x[None, :], axis=1)
            rows = first + i * 8 + r
            gl.store(out_ptr + rows, acc.to(gl.bfloat16), mask=rows < n_rows)


def smem_linear(
    x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor, launch: dict[str, Any]
) -> torch.Tensor:
    """out [1, N] = ``F.linear(x [1, K], weight [N, K])`` in bf16 (``fits``); ``launch``:
    ``moe_kernel.pdl``'s arguments."""
    rows, cols = weight.shape
    sms = torch.cuda.get_device_properties(x.device).multi_processor_count
    chunks = _chunks(rows, sms)
    grid = (-(-rows // (ROWS * chunks)),)
    gdc = int(launch.get("GDC", 0))
    extra = {"launch_pdl": True} if launch.get("launch_pdl") else {}
    smem_linear_kernel[grid](
        x, weight, weight.stride(0), out, rows, K=cols, CHUNKS=chunks, GDC=gdc,
        num_warps=ROWS, **extra,
    )  # fmt: skip
    return out
