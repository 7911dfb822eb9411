"""Block shapes of the slot-indexed expert kernels (flint.graphs.moe_kernel) at one
token, 30B-A3B geometry: each shape's bandwidth over the experts' bytes.

Usage: python benches/moe_kernel_tune.py [--scheme int4|int8|raw] [--layers 16]
       [--defaults-only | --variants [--rounds 3]]

``--layers`` pools of random experts (more bytes than the L2 holds, so every call
reads HBM), one call per pool captured in a CUDA graph; the graph is replayed 20
times and timed with events (launch cost excluded, as in the decode step's graphs).
Rows: gate/up and down shapes tried one at a time around the defaults; bytes per
second of expert weights and scales the call reads. ``--variants``: instead of block
shapes, the kernels' switches in ``VARIANTS`` (moe_kernel's module settings), each
timed in ``--rounds`` alternating rounds in this one process.
"""

from __future__ import annotations

import argparse
import itertools
import json
from typing import Any

import torch

from flint.format.quant import encode_projection
from flint.graphs import moe_kernel as mk
from graph_decode import pool_bytes  # benches/ is the script's own folder
from step_ab import timed

HIDDEN, INTER, EXPERTS, TOP_K, GROUP = 2048, 768, 128, 8, 32


def pools(
    scheme: str, layers: int, device: torch.device, experts: int = EXPERTS
) -> list[mk.ExpertPool]:
    """``layers`` pools of ``experts`` random experts (every expert the same bytes)."""
    shapes = ((INTER, HIDDEN), (INTER, HIDDEN), (HIDDEN, INTER))
    out = []
    for _ in range(layers):
        if scheme == "raw":
            g, u, d = (torch.randn(experts, *s, device=device).bfloat16() for s in shapes)
            out.append(mk.stacked_pool(g, u, d))
            continue
        parts = [encode_projection(torch.randn(r, c), scheme, GROUP) for r, c in shapes]
        offsets, at, chunks = [], 0, []
        for part in parts:
            pad = -at % 4096
            chunks += [torch.zeros(pad, dtype=torch.uint8), part]
            offsets.append(at + pad)
            at += pad + part.numel()
        chunks.append(torch.zeros(-at % 4096, dtype=torch.uint8))
        slab = torch.cat(chunks).to(device)
        slabs = slab[None].repeat(experts, 1)  # the same bytes in every expert: a bandwidth test
        out.append(mk.slab_pool(slabs, scheme, GROUP, shapes, tuple(offsets)))
    return out


def measure(layers: list[mk.ExpertPool], device: torch.device) -> float:
    x = torch.randn(1, HIDDEN, device=device).bfloat16()
    ids = torch.randperm(EXPERTS, device=device)[:TOP_K][None]
    w = torch.rand(1, TOP_K, device=device).bfloat16()
    for pool in layers:  # compile
        mk.moe_experts(x, ids, w, pool)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for pool in layers:
            mk.moe_experts(x, ids, w, pool)
    seconds = timed(graph, 20) / 1e6
    return len(layers) * TOP_K * pool_bytes(layers[0]) / seconds


# name -> moe_kernel settings (the others at their defaults)
VARIANTS: dict[str, dict[str, Any]] = {
    "bytes-masked": {"WORDS": False, "EVEN_TILES": False},  # before the sixteenth session
    "bytes": {"WORDS": False},
    "words": {},
}


def variants(layers: list[mk.ExpertPool], device: torch.device, rounds: int) -> None:
    """Each of ``VARIANTS`` timed in alternating rounds; one line per variant."""
    defaults = {k: getattr(mk, k) for v in VARIANTS.values() for k in v}
    rates: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for _ in range(rounds):
        for name, settings in VARIANTS.items():
            for key, value in {**defaults, **settings}.items():
                setattr(mk, key, value)
            rates[name].append(measure(layers, device) / 1e9)
    for key, value in defaults.items():
        setattr(mk, key, value)
    for name, got in rates.items():
        row = {"variant": name, "gb_s": round(max(got), 1), "rounds": [round(r, 1) for r in got]}
        print(json.dumps(row))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scheme", default="int4")
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument(
        "--defaults-only",
        action="store_true",
        help="time the default blocks only (e.g. under a profiler such as ncu)",
    )
    parser.add_argument("--variants", action="store_true", help="time VARIANTS instead")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    device = torch.device("cuda", 0)
    layers = pools(args.scheme, args.layers, device)
    if args.variants:
        variants(layers, device, args.rounds)
        return
    # the blocks the pools' kernels use: the word kernels' own for int4 (moe_kernel.WORDS),
    # float pools' own gate/up
    words = mk._words(layers[0])
    gate_up = "FLOAT_GATE_UP_BLOCK" if layers[0].scheme == mk.RAW else "GATE_UP_BLOCK"
    names = ("WORDS_GATE_UP_BLOCK", "WORDS_DOWN_BLOCK") if words else (gate_up, "DOWN_BLOCK")
    base_gu, base_d = (getattr(mk, n) for n in names)
    rows = []
    tried = [(base_gu, base_d)]
    if not args.defaults_only:
        for bn, bk, warps in itertools.product((4, 8, 16), (512, 1024, 2048), (4, 8)):
            tried.append(((bn, bk, warps), base_d))
        for bn, bk, warps in itertools.product((4, 8, 16, 32), (256, 512, 1024), (4, 8)):
            tried.append((base_gu, (bn, bk, warps)))
    for gu, d in tried:
        setattr(mk, names[0], gu)
        setattr(mk, names[1], d)
        try:
            rate = measure(layers, device)
        except Exception as err:  # a shape the compiler refuses: skip it, say so
            rows.append({"gate_up": gu, "down": d, "error": str(err).splitlines()[0][:80]})
            continue
        rows.append({"gate_up": gu, "down": d, "gb_s": round(rate / 1e9, 1)})
        print(json.dumps(rows[-1]), flush=True)
    best = max((r for r in rows if "gb_s" in r), key=lambda r: r["gb_s"])
    print("best", json.dumps(best))


if __name__ == "__main__":
    main()
