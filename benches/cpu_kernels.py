"""Effective bandwidth of the fused CPU expert kernels against a plain memory read.

Usage: python benches/cpu_kernels.py [--threads 1,2] [--experts 64] [--calls 40]
       [--schemes bf16,int8,int4] [--hidden 2048] [--inter 768] [--top-k 8]
       [--isa auto,avx512] [--x-bf16] [--gap-ms 0,2] [--pin] [--round-hidden off,on] [--core]

One synthetic MoE layer of ``--experts`` experts with Qwen3-30B-A3B's expert geometry
(H=2048, I=768) per scheme, far larger than the L3 cache; each call routes one token to
``--top-k`` random experts (a decode step) and is timed; effective bandwidth = expert
bytes the call read / its time. The yardstick, measured interleaved in the same run on
the same threads: a plain streaming read of a 512 MiB buffer by the kernels' own pool
(``_core.CpuKernels.plain_read``: u64 words summed, chunks claimed from a counter as
the call's tasks are), the best of 5 runs right before and 5 right after each
configuration's calls (``memory_read_gb_s``); ``ratio_median`` divides by the best of
those over the whole run at the same thread count (``best_read_gb_s``). torch's ``sum``
of the same buffer, the yardstick before (it moved from 53 to 129 GB/s between rows of
one run at 16 threads on the GPU box, and the bf16 call beat it), is reported beside it
(``torch_sum_gb_s``). Rows are printed at the end, one JSON line each. Every call's
output is checked against the scalar reference kernel on the first call of each
configuration (a fast wrong answer is a bug). ``--isa`` compares
instruction sets in one run; ``--x-bf16`` rounds the hidden state to bf16 values (what a
bf16 model hands the gate/up projections; the default, random f32, is the worst case of
the AVX-512 BF16 kernel: three bf16 planes per activation). ``--gap-ms`` waits that long
(sleeping) between calls, as a decode step does between its layers' calls (the pool's
threads park in between); ``--pin`` page-locks the weights with ``cudaHostRegister``
first, as the streamed RAM cache is on CUDA. ``--round-hidden on`` rounds each expert's
hidden row to bf16 before down, as the CPU side of a bf16 model on CUDA does.
``--core`` times the binding's call (``_core.CpuKernels.moe_layer`` on addresses made
once) instead of ``FusedKernel.moe_layer``, to tell the Python wrapper's share.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

import torch

from flint.models.cpu_kernels import FusedKernel

SCHEMES = {"bf16": ("raw", "bf16", 0), "int8": ("int8", "i8", 0), "int4": ("int4", "u8", 32)}


def _layer(scheme: str, experts: int, inter: int, hidden: int) -> tuple[FusedKernel, torch.Tensor]:
    """A kernel and an int64 [E, 3] table over random weights of every expert."""
    name, dtype, group = SCHEMES[scheme]
    shapes = ((inter, hidden), (inter, hidden), (hidden, inter))
    probe = FusedKernel(name, dtype, group, shapes, experts)
    sizes = probe.proj_bytes
    gen = torch.Generator().manual_seed(0)
    blobs = []
    for (rows, cols), size in zip(shapes, sizes, strict=True):
        if name == "raw":
            w = (torch.randn(experts, rows * cols, generator=gen) * 0.02).to(torch.bfloat16)
            blobs.append(w.view(torch.uint8))
            continue
        b = torch.randint(0, 256, (experts, size), dtype=torch.uint8, generator=gen)
        nq = rows * cols if name == "int8" else rows * cols // 2
        start = -(-nq // 64) * 64
        scale = torch.tensor(1e-3, dtype=torch.float32 if name == "int8" else torch.bfloat16)
        n_scales = (size - start) // scale.element_size()
        b[:, start:] = scale.repeat(n_scales).view(torch.uint8)
        blobs.append(b)
    table = torch.stack(
        [torch.tensor([b.data_ptr() + e * b.stride(0) for e in range(experts)]) for b in blobs], 1
    )
    _layer.keep = blobs  # type: ignore[attr-defined]  # the table's memory
    return probe, table


def _best_gbs(read: Callable[[], object], nbytes: int, reps: int = 5) -> float:
    """GB/s of the fastest of ``reps`` calls of ``read``, each reading ``nbytes``."""
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        read()
        best = min(best, time.perf_counter() - t0)
    return nbytes / best / 1e9


def _read_gbs(buf: torch.Tensor, kernel: FusedKernel) -> float:
    """Plain reads of ``buf`` by ``kernel``'s threads."""
    nbytes = buf.numel() * 4
    return _best_gbs(lambda: kernel.core.plain_read(buf.data_ptr(), nbytes), nbytes)


def _sum_gbs(buf: torch.Tensor, threads: int) -> float:
    """torch sums of ``buf`` on ``threads`` threads."""
    torch.set_num_threads(threads)
    return _best_gbs(buf.sum, buf.numel() * 4)


def _fused_gbs(
    args: argparse.Namespace,
    scheme: str,
    threads: int,
    layer: tuple[FusedKernel, torch.Tensor],
    kernel: FusedKernel,
) -> tuple[float, float]:
    probe, table = layer
    name, dtype, group = SCHEMES[scheme]
    shapes = ((args.inter, args.hidden), (args.inter, args.hidden), (args.hidden, args.inter))
    gen = torch.Generator().manual_seed(threads)
    x = torch.randn(1, args.hidden, generator=gen)
    if args.x_bf16:
        x = x.to(torch.bfloat16).to(torch.float32)
    w = torch.full((1, args.top_k), 1.0 / args.top_k)
    ids = [
        torch.randperm(args.experts, generator=gen)[: args.top_k][None] for _ in range(args.calls)
    ]
    scalar = FusedKernel(
        name, dtype, group, shapes, args.experts, threads=1, isa="scalar", round_hidden=args.round
    )
    want, got = scalar.moe_layer(x, ids[0], w, table), kernel.moe_layer(x, ids[0], w, table)
    # the VNNI kernels round the activation to 8 bits (docs/cpu-kernels.md)
    tol = 3e-2 if "vnni" in kernel.core.variants else 1e-4
    if not (got - want).abs().max() <= tol * want.abs().max():
        raise SystemExit(f"{scheme}: the fused kernel disagrees with the scalar reference")
    times = []
    out = torch.empty(1, args.hidden)
    for sel in ids:
        if args.gap:
            time.sleep(args.gap / 1000)
        t0 = time.perf_counter()
        if args.core:
            kernel.core.moe_layer(
                x.data_ptr(), sel.data_ptr(), w.data_ptr(), 1, args.top_k, table.data_ptr(),
                out.data_ptr(),
            )  # fmt: skip
        else:
            kernel.moe_layer(x, sel, w, table)
        times.append(time.perf_counter() - t0)
    bytes_per_call = args.top_k * sum(probe.proj_bytes)
    return bytes_per_call / statistics.median(times) / 1e9, bytes_per_call / min(times) / 1e9


def _pin(blobs: list[torch.Tensor]) -> None:
    """Page-locks each tensor's memory for CUDA (as ``flint.stream.pinned`` does)."""
    rt = torch.cuda.cudart()  # type: ignore[no-untyped-call]
    for b in blobs:
        err = rt.cudaHostRegister(b.data_ptr(), b.numel() * b.element_size(), 1)
        if int(getattr(err, "value", err)) != 0:
            raise SystemExit(f"cudaHostRegister failed: {err}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--schemes", default="bf16,int8,int4")
    parser.add_argument("--experts", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--inter", type=int, default=768)
    parser.add_argument("--top-k", type=int, default=8)
    parser.add_argument("--calls", type=int, default=40)
    parser.add_argument("--isa", default="auto")
    parser.add_argument("--x-bf16", action="store_true")
    parser.add_argument("--gap-ms", default="0")
    parser.add_argument("--pin", action="store_true")
    parser.add_argument("--round-hidden", default="off")  # off, on or off,on
    parser.add_argument("--core", action="store_true")
    args = parser.parse_args()
    buf = torch.ones(512 << 18)  # 512 MiB of f32
    rows: list[dict[str, object]] = []
    best_read: dict[int, float] = {}
    for scheme in args.schemes.split(","):
        layer = _layer(scheme, args.experts, args.inter, args.hidden)
        if args.pin:
            _pin(_layer.keep)  # type: ignore[attr-defined]
        name, dtype, group = SCHEMES[scheme]
        shapes = ((args.inter, args.hidden), (args.inter, args.hidden), (args.hidden, args.inter))
        for threads, isa, gap, rnd in (
            (int(t), i, float(g), r == "on")
            for t in args.threads.split(",")
            for i in args.isa.split(",")
            for g in args.gap_ms.split(",")
            for r in args.round_hidden.split(",")
        ):
            args.gap, args.round = gap, rnd
            kernel = FusedKernel(
                name, dtype, group, shapes, args.experts, threads=threads, isa=isa, round_hidden=rnd
            )
            read = _read_gbs(buf, kernel)
            median, best = _fused_gbs(args, scheme, threads, layer, kernel)
            read = max(read, _read_gbs(buf, kernel))
            torch_sum = _sum_gbs(buf, threads)
            best_read[threads] = max(best_read.get(threads, 0.0), read)
            rows.append({
                "scheme": scheme, "isa": kernel.core.isa, "threads": threads,
                "x_bf16": args.x_bf16, "round_hidden": rnd, "gap_ms": gap, "pinned": args.pin,
                "core": args.core,
                "fused_gb_s_median": round(median, 2), "fused_gb_s_best": round(best, 2),
                "memory_read_gb_s": round(read, 2), "torch_sum_gb_s": round(torch_sum, 2),
                "median": median,
            })  # fmt: skip
        del layer
    for row in rows:
        read = best_read[int(row["threads"])]  # type: ignore[call-overload]
        median = float(row.pop("median"))  # type: ignore[arg-type]
        row.update(best_read_gb_s=round(read, 2), ratio_median=round(median / read, 3))
        row["date"] = time.strftime("%Y-%m-%d")
        print(json.dumps(row))


if __name__ == "__main__":
    main()
