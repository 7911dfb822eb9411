"""What the compiler makes of the decode step's Triton kernels for a GPU, without one:
registers, shared memory, blocks per SM, load widths and instruction mix of each kernel
as flint launches it (issue 10).

Usage: python benches/kernel_asm.py [--arch 90] [--scheme int4] [--sass DIR] [--ahead]

The launches are flint's own (``moe_kernel.moe_experts`` on a 30B-A3B-shaped pool of
random experts, ``fused.linear`` on q/k/v-, o- and router-shaped matrices, the norm in
the router's launch, the norms, q/k/v RoPE, the attention, the ranked sum and the
router's top-k both ways), made on CPU
tensors under a stand-in Triton driver whose target is the GPU asked for: each kernel
compiles as it would there (same arguments, same specialisation), then the launch is
stopped. Rows print the cubin's resources (``cuobjdump -res-usage``) and counts from its
SASS: global loads by width, shared-memory loads/stores and barriers (layout changes
through shared memory), integer-to-float conversions, the instruction total, and the
largest loop's body (one step of the K loop: divide by the weights a thread handles in
a step for instructions per weight).
``--ahead`` compiles the kernels that read ahead of their wait (``moe_kernel.AHEAD``) in
that form, as the resident step launches them. Nothing runs, so nothing is timed: this
answers "does this change reach the kernel the way it should" before device time is
spent measuring it. The Triton version here should be the GPU box's (``pip install
--target DIR triton==X`` and ``PYTHONPATH=DIR``): other versions choose other layouts
and registers.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import torch

HIDDEN, INTER, TOP_K, GROUP = 2048, 768, 8, 32  # the 30B-A3B geometry
QKV_ROWS, O_COLS, EXPERTS = 5120, 4096, 128


def stand_in_driver(arch: int) -> Any:
    """A Triton driver that compiles for CUDA ``arch`` and launches nothing."""
    from triton.backends.compiler import GPUTarget
    from triton.runtime.driver import driver

    class Driver:
        def get_current_target(self) -> Any:
            return GPUTarget("cuda", arch, 32)

        def get_current_device(self) -> int:
            return 0

        def get_current_stream(self, device: int | None = None) -> int:
            return 0

        def get_active_torch_device(self) -> torch.device:
            return torch.device("cpu")

        def __getattr__(self, name: str) -> Any:
            raise AttributeError(f"stand-in driver has no {name}")

    driver.set_active(Driver())
    return driver


def compile_only() -> None:
    """Every Triton launch from here on compiles its kernel and stops there."""
    from triton.runtime.jit import JITFunction

    run = JITFunction.run

    def warm(self: Any, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> Any:
        return run(self, *args, grid=grid, warmup=True, **kwargs)

    JITFunction.run = warm  # type: ignore[method-assign]


def compiled() -> dict[int, tuple[str, Any]]:
    """id -> (name, compiled kernel) of every kernel compiled so far."""
    from flint.graphs import slot_kernels, triton_kernels

    got = {}
    for module in (slot_kernels, triton_kernels):
        for name in module.__all__:
            fn = getattr(module, name, None)
            for caches in getattr(fn, "device_caches", {}).values():
                for kernel in caches[0].values():
                    got[id(kernel)] = (name, kernel)
    return got


def tool(name: str) -> str:
    import triton

    return str(Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name)


def constants(kernel: Any) -> dict[str, Any]:
    """The compile-time arguments (block shapes, schemes) by name."""
    names = kernel.src.fn.arg_names
    out = {}
    for key, value in kernel.src.constants.items():
        name = names[key[0]] if isinstance(key, tuple) else str(key)
        if isinstance(value, int | bool) and name.isupper():
            out[name] = value
    return out


def loop(listing: list[tuple[str, str, str]]) -> dict[str, Any] | None:
    """The largest loop's body (a backward branch's span): its instruction count and
    most frequent opcodes, the work of one step of a kernel's K loop. None: no loop."""
    spans = []
    for at, op, rest in listing:
        target = re.search(r"0x([0-9a-f]+)", rest) if op == "BRA" else None
        if target is not None and int(target.group(1), 16) < int(at, 16):
            spans.append((int(target.group(1), 16), int(at, 16)))
    if not spans:
        return None
    start, end = max(spans, key=lambda span: span[1] - span[0])
    body = [op.split(".")[0] for at, op, _ in listing if start <= int(at, 16) <= end]
    return {"instructions": len(body), "top": collections.Counter(body).most_common(6)}


def describe(name: str, kernel: Any, sass_dir: Path | None) -> dict[str, Any]:
    """Resources and SASS counts of one compiled kernel."""
    cubin = Path(f"/tmp/flint_kernel_asm_{os.getpid()}.cubin")
    cubin.write_bytes(kernel.asm["cubin"])
    usage = subprocess.run(
        [tool("cuobjdump"), "-res-usage", str(cubin)], capture_output=True, text=True
    ).stdout
    sass = subprocess.run(
        [tool("cuobjdump"), "-sass", str(cubin)], capture_output=True, text=True
    ).stdout
    cubin.unlink()
    regs = int(re.search(r"REG:(\d+)", usage).group(1))  # type: ignore[union-attr]
    shared = int(re.search(r"SHARED:(\d+)", usage).group(1))  # type: ignore[union-attr]
    spilled = int(re.search(r"LOCAL:(\d+)", usage).group(1))  # type: ignore[union-attr]
    listing = re.findall(
        r"^\s+/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)([^;]*)", sass, re.M
    )
    ops = [op for _, op, _ in listing]
    mix = collections.Counter(op.split(".")[0] for op in ops)
    loads = collections.Counter(op for op in ops if op.startswith("LDG"))
    warps = kernel.metadata.num_warps
    threads = 32 * warps
    dynamic = int(kernel.metadata.shared)  # bytes of shared memory Triton allocates
    # 64K registers (a thread's taken in 8s) and 2,048 threads per SM (sm_80 and
    # later), at most 32 blocks; 228 KiB of shared memory, 1 KiB of it reserved a block
    allocated = -(-max(regs, 1) // 8) * 8
    blocks = min(65536 // (allocated * threads), 2048 // threads, 32, 233472 // (dynamic + 1024))
    if sass_dir is not None:
        sass_dir.mkdir(parents=True, exist_ok=True)
        (sass_dir / f"{name}.sass").write_text(sass)
    return {
        "kernel": name,
        "consts": constants(kernel),
        "warps": warps,
        "regs": regs,
        "shared": shared,
        "dynamic_shared": dynamic,
        "local": spilled,
        "blocks_per_sm": blocks,
        "loads": dict(loads),
        "lds_sts_bar": [mix["LDS"], mix["STS"], mix["BAR"]],
        "i2f": mix["I2F"],
        "instructions": len(ops),
        "loop": loop(listing),
    }


def launches(scheme: str) -> list[tuple[str, Any]]:
    """(label, launch) of each kernel, on CPU tensors of the 30B-A3B shapes."""
    sys_path = Path(__file__).parent
    import sys

    sys.path.insert(0, str(sys_path))
    from flint.graphs import fused
    from flint.graphs import moe_kernel as mk
    from moe_kernel_tune import pools

    cpu = torch.device("cpu")
    pool = pools(scheme, 1, cpu, experts=TOP_K)[0]
    x = torch.randn(1, HIDDEN).bfloat16()
    ids = torch.arange(TOP_K)[None]
    w = torch.rand(1, TOP_K).bfloat16()
    out = []
    out.append(("experts", lambda: mk.moe_experts(x, ids, w, pool)))
    for label, rows, cols in (("qkv", QKV_ROWS, HIDDEN), ("o", HIDDEN, O_COLS)):
        xv = torch.randn(1, cols).bfloat16()
        bf = torch.randn(rows, cols).bfloat16()
        q8 = torch.randint(-127, 127, (rows, cols), dtype=torch.int8)
        s8 = torch.rand(rows)
        out.append((f"{label} bf16", lambda xv=xv, bf=bf: fused.linear(xv, bf)))
        out.append((f"{label} int8", lambda xv=xv, q8=q8, s8=s8: fused.linear(xv, q8, scale=s8)))
    router = torch.randn(EXPERTS, HIDDEN).bfloat16()
    out.append(("router", lambda: fused.linear(x, router)))
    nw = torch.randn(HIDDEN).bfloat16()
    e8 = mk._eighths_empty(1, HIDDEN, cpu)
    out.append(("norm + router", lambda: fused.norm_linear(x, nw, 1e-6, router, eighths=e8)))
    out.append(("norm eighths", lambda: fused.rms_norm(x, nw, 1e-6, eighths=e8)))
    out.append(("add norm", lambda: fused.add_rms_norm(x, x, nw, 1e-6)))
    heads, kv, dim, ctx = 32, 4, 128, 256
    y = torch.randn((heads + 2 * kv) * dim).bfloat16()
    cos, sin = torch.randn(ctx, dim).bfloat16(), torch.randn(ctx, dim).bfloat16()
    q, cache = torch.empty(heads, 1, dim).bfloat16(), torch.zeros(kv, ctx, dim).bfloat16()
    hn = torch.randn(dim).bfloat16()
    out.append((
        "qkv rope",
        lambda: fused.qkv_rope(y, hn, hn, cos, sin, torch.tensor([5]), q, cache, cache, 1e-6),
    ))  # fmt: skip
    out.append(("qkv rope ask", lambda: _rope_ask(y, hn, cos, sin, q, cache, ctx)))
    out.append(("attention", lambda: _attention(fused, q, cache, heads, dim)))
    out.append(("attention ask", lambda: _attention(fused, q, cache, heads, dim, True)))
    per_rank = torch.randn(TOP_K, HIDDEN)
    out.append(("ranked sum", lambda: mk.ranked_sum(per_rank, w, torch.bfloat16)))
    out.append(("ranked sum in the norm", lambda: _ranked_norm(per_rank, w, x, nw)))
    logits = torch.randn(1, EXPERTS).bfloat16()
    # two passes on four warps, one on one (fused.ROUTE_ONE_PASS), then a bitonic top-k
    # (fused.ROUTE_RANKS 2) and rank counting (1) on 1, 2, 4 and 8 warps (ROUTE_RANK_WARPS)
    out.append(("route two passes", lambda: _route(fused, logits, False, 0, 0)))
    out.append(("route chain", lambda: _route(fused, logits, True, 0, 0)))
    for mode, name in ((2, "sort"), (1, "count")):
        for warps in (1, 2, 4, 8):  # (not ``w``: the launches above close over it)
            launch = f"route {name} w{warps}"
            out.append((launch, lambda m=mode, n=warps: _route(fused, logits, True, n, m)))
    return out


def _rope_ask(
    y: torch.Tensor,
    hn: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    q: torch.Tensor,
    cache: torch.Tensor,
    ask: int,
) -> None:
    """``fused.qkv_rope``'s kernel asking the L2 for the cache rows (``fused.KV_ASK``
    "rope", which its wrapper sets only under dependent launch on a GPU)."""
    from flint.graphs.triton_kernels import qkv_rope_kernel

    heads, kv, dim = q.shape[0], cache.shape[0], q.shape[2]
    qkv_rope_kernel[(heads + 2 * kv,)](
        y, hn, hn, cos, sin, torch.tensor([5]), q, cache, cache, cache.stride(0),
        cache.stride(1), cache.stride(0), cache.stride(1), heads, kv, dim, 1e-6, NORM=True,
        ROT=dim, BLOCK=dim, num_warps=1, ASK=ask,
    )  # fmt: skip


def _attention(
    fused: Any, q: torch.Tensor, cache: torch.Tensor, heads: int, dim: int, ask: bool = False
) -> None:
    """``fused.decode_attention``'s kernel as the GPU runs it (bf16 products: on CPU
    tensors the wrapper takes the interpreter's fp32 path), one chunk; ``ask``: asking
    the L2 for its keys and values (``fused.KV_ASK`` "attention", with ``--ahead``)."""
    from flint.graphs import moe_kernel as mk
    from flint.graphs.triton_kernels import decode_attention_kernel

    kv = cache.shape[0]
    m, total, acc = fused.attention_parts(heads, dim, cache.shape[1], cache.device)
    o = torch.empty(1, heads * dim).bfloat16()
    decode_attention_kernel[(kv, 1)](
        q, cache, cache, torch.tensor([5]), o, m, total, acc, cache.stride(0),
        cache.stride(1), cache.stride(0), cache.stride(1), heads, dim, dim**-0.5,
        GROUP=heads // kv, GP=max(16, heads // kv), DP=dim, BS=fused.ATTENTION_BLOCK,
        CHUNK=fused.ATTENTION_CHUNK, SPLIT=False, F32=False, **mk.ahead("attention", q.device),
        ASK=ask,
    )  # fmt: skip


def _ranked_norm(rows: torch.Tensor, w: torch.Tensor, x: torch.Tensor, nw: torch.Tensor) -> None:
    """``fused.ranked_add_rms_norm``'s kernel as a GPU launches it, one program of a
    cluster of eight (on CPU tensors the wrapper takes the interpreter's one program)."""
    from flint.graphs import fused
    from flint.graphs import moe_kernel as mk
    from flint.graphs.triton_kernels import ranked_norm_kernel

    total, out = torch.empty_like(x), torch.empty_like(x)
    ranked_norm_kernel[(1,)](
        rows, w, x, total, nw, out, HIDDEN, 1e-6, TOPK=TOP_K, BS=HIDDEN // 8, W32=False,
        CLUSTER=8, num_warps=fused.CLUSTER_NORM_WARPS, **mk.ahead("norm", x.device),
    )  # fmt: skip


def _route(fused: Any, logits: torch.Tensor, one_pass: bool, warps: int, ranks: int) -> None:
    saved = fused.ROUTE_ONE_PASS, fused.ROUTE_RANK_WARPS, fused.ROUTE_RANKS
    fused.ROUTE_ONE_PASS, fused.ROUTE_RANK_WARPS, fused.ROUTE_RANKS = one_pass, warps, ranks
    try:
        fused.route(logits, TOP_K, True, torch.bfloat16)
    finally:
        fused.ROUTE_ONE_PASS, fused.ROUTE_RANK_WARPS, fused.ROUTE_RANKS = saved


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", type=int, default=90, help="compute capability x10")
    parser.add_argument("--scheme", default="int4", choices=("int4", "int8", "raw"))
    parser.add_argument("--sass", type=Path, help="also write each kernel's SASS here")
    parser.add_argument("--ahead", action="store_true", help="the kernels reading ahead")
    args = parser.parse_args()
    if args.ahead:
        from flint.graphs import moe_kernel

        moe_kernel.AHEAD_WITHOUT_PDL = True
    os.environ.pop("TRITON_INTERPRET", None)  # compile for the GPU, not the interpreter
    stand_in_driver(args.arch)
    compile_only()
    import triton

    print(json.dumps({"triton": triton.__version__, "arch": args.arch}))
    seen: set[int] = set()
    for label, launch in launches(args.scheme):
        launch()
        for key, (name, kernel) in compiled().items():
            if key in seen:
                continue
            seen.add(key)
            row = describe(name, kernel, args.sass)
            print(json.dumps({"launch": label, **row}), flush=True)


if __name__ == "__main__":
    main()
