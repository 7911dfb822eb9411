"""One MoE layer of a prompt through the grouped slab kernels, by program shape (issue 8).

Usage: python benches/grouped_kernel.py [--scheme int4|int8] [--tokens 512,8192]
       [--experts 128] [--top-k 8] [--hidden 2048] [--inter 768]
       [--blocks BM:BN:BK:W:S[:n][/BN:BK:W:S],...] [--dequant]

A layer of random experts in the .ftw slab layout (30B-A3B geometry by default) and a
random routing of T tokens; ``flint.graphs.grouped.grouped_experts`` over every expert
(what the resident slab backend launches for a prompt), timed with CUDA events (median
of 10 after 2 warm-ups), per program shape given (``flint.graphs.grouped.Tiles``: BM
pairs, BN rows, BK columns, warps, stages; ``n``: the GPU's own rounding; BM 0:
``block_m``'s; after a slash, the down kernel's own BN:BK:warps:stages). Printed per
row: ms per layer, TFLOP/s of the expert math (2 x 3 x H x I per pair), GB/s of expert
bytes (each selected expert's slab read once), and whether its output has the bits of
the first row with the same shape (``n`` must not change a bit, nor bf16 weights
against int4). ``--dequant``: also every expert dequantized to
bf16 once (one launch per projection; the old kernel and ``_tile``'s) then the grouped
kernels on bf16 weights, by shape, the whole ``FLINT_PROMPT_DEQUANT=1`` route per
shape, and the path the grouped kernels replaced, cuBLAS per expert.
"""

from __future__ import annotations

import argparse
import json
import os
from functools import partial

import torch
import torch.nn.functional as F

from flint.format.quant import encode_projection
from flint.graphs import grouped
from flint.graphs.grouped import dequantize_slots, grouped_experts, pair_plan
from flint.graphs.moe_kernel import dequantize, slab_pool, stacked_pool
from prompt_expert_paths import median_ms  # (benches/ is the script's path)


def layer(scheme: str, experts: int, hidden: int, inter: int, group: int) -> tuple:
    """(slabs [E, bytes] on the GPU, projection offsets, shapes)."""
    shapes = ((inter, hidden), (inter, hidden), (hidden, inter))
    parts = [encode_projection(torch.randn(r, c) * 0.02, scheme, group) for r, c in shapes]
    offsets, at = [], 0
    for part in parts:
        at += -at % 64
        offsets.append(at)
        at += part.numel()
    slab = torch.zeros(at + (-at % 64), dtype=torch.uint8)
    for o, part in zip(offsets, parts, strict=True):
        slab[o : o + part.numel()] = part
    # every expert the same bytes: the kernels' time does not depend on the values
    return slab.cuda().expand(experts, -1).contiguous(), tuple(offsets), shapes


def dequant_mm(pool: object, x: torch.Tensor, ids: torch.Tensor, out: torch.Tensor) -> None:
    """The replaced path: every expert dequantized (one launch per projection), then
    cuBLAS per expert on its rows."""
    experts, top_k = pool.experts, ids.shape[1]  # type: ignore[attr-defined]
    index = torch.arange(experts, device="cuda")
    dense = [dequantize(pool, p, index, torch.bfloat16) for p in range(3)]  # type: ignore[arg-type]
    flat = ids.reshape(-1)
    for e in range(experts):
        pairs = (flat == e).nonzero().squeeze(1)
        xs = x[pairs // top_k]
        h = F.silu(F.linear(xs, dense[0][e])) * F.linear(xs, dense[1][e])
        out[pairs] = F.linear(h, dense[2][e]).float()


def shape(spec: str, tokens: int) -> grouped.Tiles:
    """``BM:BN:BK:W:S[:flags][/BN:BK:W:S]`` as program shape (BM 0: the default for
    ``tokens``; after the slash, the down kernel's own)."""
    spec, _, down = spec.partition("/")
    parts = spec.split(":")
    bm, bn, bk, warps, stages = (int(v) for v in parts[:5])
    flags = parts[5] if len(parts) > 5 else ""
    dn = tuple(int(v) for v in down.split(":")) if down else None
    assert dn is None or len(dn) == 4, f"down shape BN:BK:W:S, got {down}"
    return grouped.Tiles(
        bm or grouped.block_m(tokens),
        bn,
        bk,
        warps,
        stages,
        "n" in flags,
        dn,  # type: ignore[arg-type]
    )


def _plain(spec: str) -> str:
    """``spec`` without its flags (bf16 weights have nothing to round)."""
    spec, slash, down = spec.partition("/")
    return ":".join(spec.split(":")[:5]) + slash + down


def bench_tokens(a: argparse.Namespace, pool: object, slab_bytes: int, tokens: int) -> list[dict]:
    x = torch.randn(tokens, a.hidden, device="cuda").bfloat16()
    ids = torch.stack([torch.randperm(a.experts)[: a.top_k] for _ in range(tokens)]).cuda()
    plan = pair_plan(ids, a.experts, x.device)
    every = {e: e for e in range(a.experts)}
    used = len(set(ids.reshape(-1).tolist()))
    flop = 2 * 3 * a.hidden * a.inter * tokens * a.top_k
    rows, seen = [], {}

    def row(path: str, ms: float, same: str = "") -> None:
        rows.append(
            {"tokens": tokens, "path": path, "ms": ms, "tflops": flop / ms / 1e9,
             "gb_s": used * slab_bytes / ms / 1e6, "same_bits": same}
        )  # fmt: skip

    def timed(p: object, spec: str, label: str) -> None:
        t = shape(spec, tokens)
        out = torch.empty(tokens * a.top_k, a.hidden, device="cuda")
        try:
            ms = median_ms(partial(grouped_experts, x, plan, every, p, out, t), reps=10, warm=2)
        except Exception as e:  # a shape Triton cannot build is a row too
            row(f"{label} {spec} BM={t.bm}: {type(e).__name__}", float("nan"))
            return
        key = (t.bm, t.bn, t.bk, t.down)  # bf16 weights: the same key as int4
        same = "" if key not in seen else "yes" if torch.equal(seen[key], out) else "NO"
        seen.setdefault(key, out)
        row(f"{label} {spec} BM={t.bm}", ms, same)

    for spec in a.blocks.split(","):
        timed(pool, spec, "grouped")
    if a.dequant:
        index = torch.arange(a.experts, device="cuda")
        deq = partial(lambda: [dequantize(pool, q, index, torch.bfloat16) for q in range(3)])
        row("dequantize every expert to bf16 (3 launches)", median_ms(deq, reps=10, warm=2))
        raw = stacked_pool(*deq())
        for spec in dict.fromkeys(_plain(s) for s in a.blocks.split(",")):
            timed(raw, spec, "bf16 grouped")
        tile = partial(dequantize_slots, pool, list(range(a.experts)), torch.bfloat16, True)
        row("every expert dequantized by _tile (3 launches)", median_ms(tile, reps=10, warm=2))
        os.environ["FLINT_PROMPT_DEQUANT"] = "1"  # the whole route: dequantize, then bf16
        for spec in a.blocks.split(","):
            timed(pool, spec, "FLINT_PROMPT_DEQUANT=1")
        del os.environ["FLINT_PROMPT_DEQUANT"]
        out = torch.empty(tokens * a.top_k, a.hidden, device="cuda")
        ms = median_ms(partial(dequant_mm, pool, x, ids, out), reps=3, warm=2)
        row("dequantize + cuBLAS per expert", ms)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scheme", default="int4", choices=["int4", "int8"])
    ap.add_argument("--tokens", default="512,8192")
    ap.add_argument("--experts", type=int, default=128)
    ap.add_argument("--top-k", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--inter", type=int, default=768)
    ap.add_argument("--group", type=int, default=32)
    ap.add_argument("--blocks", default="0:64:64:4:3,0:64:64:4:3:n,128:64:64:8:3:n")
    ap.add_argument("--dequant", action="store_true")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    slabs, offsets, shapes = layer(a.scheme, a.experts, a.hidden, a.inter, a.group)
    pool = slab_pool(slabs, a.scheme, a.group, shapes, offsets)
    rows = []
    for tokens in (int(t) for t in a.tokens.split(",")):
        rows += bench_tokens(a, pool, slabs.shape[1], tokens)
    if a.json:
        print(json.dumps(rows, indent=1))
        return
    print(f"{a.scheme}, {a.experts} experts of {a.hidden} x {a.inter}, top-{a.top_k}")
    print("| tokens | path | ms / layer | TFLOP/s | GB/s of expert bytes | same bits |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['tokens']} | {r['path']} | {r['ms']:.3f} | {r['tflops']:.1f} "
            f"| {r['gb_s']:.0f} | {r['same_bits']} |"
        )


if __name__ == "__main__":
    main()
