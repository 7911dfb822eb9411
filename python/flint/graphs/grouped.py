"""Routed experts of a prompt computed as grouped matrix products, in two Triton launches.

A prompt sends tens to thousands of (token, rank) pairs to each expert, so its experts
are matrix-matrix products, not the matrix-vector products of ``moe_kernel``'s slot
kernels. ``grouped_experts`` sorts the pairs by the pool slot of their expert and cuts
each slot's pairs into blocks of ``BM``; one program computes a block against a
``BN``-row slice of the slot's projection, loading ``BK``-column weight tiles straight
from the pool (bf16 weights, or int8/int4 slab bytes dequantized in registers by the
file's rule) and multiplying on the tensor cores with fp32 accumulation:

- ``grouped_gate_up_kernel``: gate and up of the block's tokens, each rounded to the
  model dtype (as ``F.linear`` returns them), biases, then the activation with
  ``gate_up_kernel``'s roundings -> ``hidden`` (a row per block lane: the launch's
  pairs plus its blocks' padding, not every pair of the layer);
- ``grouped_down_kernel``: down of the block's hidden rows, rounded to the model dtype,
  bias -> the pair's output [P, H] in fp32, which the caller sums in router-rank order
  (``flint.graphs.moe_kernel.ranked_sum``, one launch).

Each output row is computed from its own token and its expert's weights alone, in a
fixed order (the ``BK`` loop; the program shape comes from the token count,
``tiles_for``), so a pair gives the same bits whichever other pairs share its launch:
the streaming backend computes a wave's experts in one launch and the resident backend
a layer's in one, and they agree bit for bit. Against dequantize-then-cuBLAS they
agree within rounding. One launch replaces a layer's per-expert dequantizations and
products; on the H200 the dequantizing path prefilled 30B-A3B int4 at 298 tok/s
(docs/benchmarks.md).

A long prompt (``dequant_route``: from ``DEQUANT_TOKENS`` on a GPU, 16-bit models)
dequantizes its launch's slots first with the kernels' own tile (``_tile``, one
``tile_dequant_kernel`` launch per projection and pool) and runs the same kernels on
the bf16 copies: in place, every 128-pair block dequantizes its expert's tiles again.
With the same program shape the bits are the same; ``grouped_over`` puts the slots of
several pools of one layer (its VRAM cache, the experts copied ahead) into one launch.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from functools import cache
from itertools import accumulate

import torch

from flint.graphs.grouped_kernels import (
    grouped_down_kernel,
    grouped_gate_up_kernel,
    tile_dequant_kernel,
)
from flint.graphs.moe_kernel import (
    _DTYPES,
    RAW,
    ExpertPool,
    _args,
    aligned_views,
    on_device,
    ranked_sum,
    stacked_pool,
)
from flint.graphs.triton_kernels import triton
from flint.models.moe import weighted_sum

# Triton's CPU interpreter (the tests without a GPU) gets bf16 tile products wrong:
# there the kernels widen the tiles to fp32 first.
_INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
# int4 groups the tiles hold whole (BK = max(64, group)); larger ones would need more
# shared memory than a multi-stage tile pipeline has: those prompts take torch's path.
MAX_GROUP = 128


@dataclass(slots=True, frozen=True)
class Tiles:
    """A launch's program shape: ``bm`` pairs of one slot, ``bn`` rows of a projection,
    ``bk`` columns per step, warps, pipeline stages; ``native``: the GPU's own rounding
    conversion (``_tile``; never under the interpreter); ``down``: the down kernel's
    (BN, BK, warps, stages) where it differs from gate/up's (its BM is theirs: it reads
    their hidden rows by block)."""

    bm: int
    bn: int = 64
    bk: int = 64
    warps: int = 4
    stages: int = 3
    native: bool = False
    down: tuple[int, int, int, int] | None = None


def block_m(tokens: int) -> int:
    """Pairs per program: a prompt of a few hundred tokens sends ~30 pairs to each of
    128 experts, an 8k one ~500; blocks a fraction empty cost their weight tiles."""
    return 16 if tokens < 128 else 32 if tokens < 1024 else 64


# From this many tokens (~256 pairs per expert at 128 experts, top-8) a program takes
# 128 pairs with 8 warps: on the H200, an 8k prompt's 30B-A3B int4 layer 3.44 against
# 3.99 ms at 64 pairs; at 2k tokens 64 pairs stay faster (docs/benchmarks.md, gpu40).
BIG_BLOCK_TOKENS = 4096
# The shared memory a 128-pair program's 3-stage pipeline needs at BK 64 (~96 KiB),
# with room: GPUs with less keep 64-pair programs.
BIG_BLOCK_SMEM = 160 * 1024
# ... and with 128 rows of gate and up per program (bf16 weights: ~144 KiB at 3 stages)
WIDE_BLOCK_SMEM = 200 * 1024


def tiles_for(tokens: int, group: int, device: torch.device, dequantized: bool = False) -> Tiles:
    """The program shape of a launch for a ``tokens``-token call: a function of the
    token count (and of the model and the GPU, fixed for a run), so a wave's launch and
    the resident layer's launch of the same call compute each pair the same way (the
    module docs). The GPU's own rounding conversion gives ``_round``'s bits (checked
    by ``benches/grouped_kernel.py``: 4.78 -> 3.99 ms on the layer above). Weights
    ``dequantized`` first (``dequant_route``) take 128-row programs where the GPU has
    the shared memory: bf16 tiles at 128 x 128 took 1.80 ms against 2.39 at 128 x 64
    on the H200 (gpu46)."""
    native = not _INTERPRETED
    if tokens >= BIG_BLOCK_TOKENS and group <= 64 and _smem(device) >= BIG_BLOCK_SMEM:
        wide = dequantized and _smem(device) >= WIDE_BLOCK_SMEM
        return Tiles(128, bn=128 if wide else 64, warps=8, native=native)
    return Tiles(block_m(tokens), native=native)


@cache
def _smem(device: torch.device) -> int:
    """Opt-in shared memory per block of ``device`` in bytes (0 off CUDA)."""
    if device.type != "cuda":
        return 0
    props = torch.cuda.get_device_properties(device)
    return int(getattr(props, "shared_memory_per_block_optin", 0))


@dataclass(slots=True, frozen=True)
class PairPlan:
    """A layer call's (token, rank) pairs sorted by expert id, made once per call:
    expert e's pairs are ``order[start[e] : start[e] + count[e]]`` (``order`` on the
    device for the grouped kernels; a decode-sized call, which takes the slot kernels
    from ``host_ids``, may keep it on the host). Each grouped launch over some of the
    experts reads its segments."""

    tokens: int
    order: torch.Tensor  # [T*K] int32 or int64
    start: list[int]
    count: list[int]
    host_ids: list[int] | None = None  # [T*K] the expert of each pair, when the host has it


def pair_plan(ids: torch.Tensor, n_experts: int, device: torch.device) -> PairPlan:
    """The plan of ``ids`` [T, K] (on the CPU: made there and sent in one copy; on the
    GPU: sorted there, its counts read back once)."""
    flat = ids.reshape(-1)
    order = torch.argsort(flat, stable=True).to(torch.int32).to(device)
    count = torch.bincount(flat, minlength=n_experts).tolist()
    return PairPlan(ids.shape[0], order, starts_of(count), count)


def starts_of(counts: list[int]) -> list[int]:
    """Where each expert's pairs start in the expert-sorted order (exclusive sums)."""
    return list(accumulate(counts[:-1], initial=0)) if counts else []


def prompt_sum(outputs: torch.Tensor, weights: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A grouped call's per-pair outputs [T*K, H] fp32 summed per token in rank order
    and cast to ``dtype``: on a GPU one launch (``ranked_sum``; an 8k prompt's layer
    reads 0.5 GB of outputs once instead of through ~15 ops), elsewhere (Triton's
    interpreter) ``weighted_sum``. The resident and streamed backends both end a
    prompt call here, so they agree bit for bit."""
    if outputs.device.type == "cuda":
        return ranked_sum(outputs, weights, dtype)
    tokens, k = weights.shape
    return weighted_sum(outputs.view(tokens, k, -1), weights).to(dtype)


# rows x columns of a projection one dequantizing program writes (columns: at least a group)
DEQUANT_TILE = (64, 128)


# From this many tokens a grouped launch over int8/int4 slabs dequantizes its slots
# first (``dequant_route``). On the H200, one 30B-A3B int4 layer at 8k tokens: 2.23 ms
# dequantized first against 3.30 in place (``benches/grouped_kernel.py --dequant``,
# gpu46); dequantizing costs ~0.8 ms a layer whatever the token count, so short
# prompts keep the in-place kernels.
DEQUANT_TOKENS = 4096
# The dequantized copies of one launch take at most this share of the GPU's memory: a
# launch over more slots dequantizes and computes them in parts.
DEQUANT_SHARE = 1 / 16


def dequant_route(tokens: int, device: torch.device) -> bool:
    """Whether a grouped launch of a ``tokens``-token call over int8/int4 slabs first
    dequantizes its slots to the model dtype (``tile_dequant_kernel``: ``_tile``'s
    values, the tile the kernels dequantize in place) and runs the kernels on those
    weights, the same products on the same values: with the same program shape the
    same bits as in place (checked by ``benches/grouped_kernel.py`` and the tests).
    A long prompt reads each expert's tiles once per 128-pair block in place (four
    times per expert at 8k tokens), once dequantized. ``FLINT_PROMPT_DEQUANT`` = ``1``
    always, ``0`` never; by default from ``DEQUANT_TOKENS`` on a GPU (for 16-bit
    models: ``grouped_over`` keeps fp32 ones in place). A function of the token count,
    as the shape is: every launch of one call takes the same route."""
    mode = os.environ.get("FLINT_PROMPT_DEQUANT", "auto")
    if mode in ("0", "1"):
        return mode == "1"
    return device.type == "cuda" and not _INTERPRETED and tokens >= DEQUANT_TOKENS


def dequant_slots_per_launch(pool: ExpertPool, device: torch.device, itemsize: int) -> int:
    """Slots one dequantized part holds: ``DEQUANT_SHARE`` of the GPU's memory (all
    128 experts of a 30B-A3B layer, 1.2 GB, on an H200), and no more than half of what
    is free now (the driver's free bytes and what torch's allocator keeps unused)."""
    if device.type != "cuda":
        return pool.experts
    from flint.stream.elastic import usable_vram  # (the streaming layer imports this one)

    per_slot = 3 * pool.inter * pool.hidden * itemsize
    total = torch.cuda.get_device_properties(device).total_memory
    return max(1, min(int(total * DEQUANT_SHARE), usable_vram(device) // 2) // per_slot)


def dequantize_slots(
    pool: ExpertPool, slots: list[int], dtype: torch.dtype, native: bool
) -> ExpertPool:
    """A bf16 (``dtype``) pool of ``pool``'s ``slots``, in that order: each projection
    dequantized by the grouped kernels' ``_tile`` in one launch; biases and activation
    kept (looked up by expert id, as before)."""
    return _dequantized([(pool, slots)], dtype, native)


def _dequantized(
    parts: list[tuple[ExpertPool, list[int]]], dtype: torch.dtype, native: bool
) -> ExpertPool:
    """One bf16 pool of every part's slots, in order (the parts: int8/int4 pools of one
    layer, e.g. its VRAM cache's and the experts copied ahead): per part and
    projection one ``tile_dequant_kernel`` launch into its rows."""
    assert triton is not None
    first = parts[0][0]
    assert all(p.scheme != RAW and p.group == first.group for p, _ in parts)
    dev, total = first.gate.weights.device, sum(len(s) for _, s in parts)
    shapes = ((first.inter, first.hidden), (first.inter, first.hidden), (first.hidden, first.inter))
    outs = [torch.empty(total, r, c, dtype=dtype, device=dev) for r, c in shapes]
    indexes = aligned_views([s for _, s in parts], torch.int32, dev)
    br, bc = DEQUANT_TILE[0], max(DEQUANT_TILE[1], first.group)
    at = 0
    with on_device(dev):
        for (pool, slots), index in zip(parts, indexes, strict=True):
            projs = (pool.gate, pool.up, pool.down)
            for proj, out, (rows, cols) in zip(projs, outs, shapes, strict=True):
                grid = (len(slots), triton.cdiv(rows, br), triton.cdiv(cols, bc))
                tile_dequant_kernel[grid](
                    *_args(proj), index, out[at : at + len(slots)], rows, cols,
                    SCHEME=pool.scheme, GROUP=pool.group, BR=br, BC=bc,
                    NATIVE=native and not _INTERPRETED,
                )  # fmt: skip
            at += len(slots)
    raw = stacked_pool(*outs)
    return replace(raw, biases=first.biases, act=first.act, alpha=first.alpha, limit=first.limit)


def grouped_experts(
    x: torch.Tensor,  # [T, H] in the model dtype
    plan: PairPlan,
    slot_of: dict[int, int],  # expert -> its pool slot: the experts computed
    pool: ExpertPool,
    out: torch.Tensor,  # [T*K, H] fp32: each computed pair's output, others untouched
    tiles: Tiles | None = None,  # benchmarks only: the program shape (else ``tiles_for``)
) -> None:
    """Computes the pairs routed to ``slot_of``'s experts into ``out`` (see the module
    docs); biases are looked up by expert id."""
    grouped_over(x, plan, [(pool, slot_of)], out, tiles)


def grouped_over(
    x: torch.Tensor,  # [T, H] in the model dtype
    plan: PairPlan,
    parts: list[tuple[ExpertPool, dict[int, int]]],  # pools of one layer, their experts
    out: torch.Tensor,  # [T*K, H] fp32
    tiles: Tiles | None = None,
) -> None:
    """``grouped_experts`` over the experts of several pools of one layer (e.g. its
    VRAM cache and the experts copied ahead): dequantized first (``dequant_route``),
    they go into one bf16 pool and one launch. Each pair's output depends on its token,
    its expert and the program shape alone, so one launch, one per pool, and the parts
    of a large launch (``dequant_slots_per_launch``) give the same bits."""
    assert triton is not None, "check moe_kernel.available() first"
    # experts no pair selected have nothing to compute (nor to dequantize)
    parts = [(p, {e: s for e, s in so.items() if plan.count[e]}) for p, so in parts]
    parts = [(p, so) for p, so in parts if so]
    if not parts:
        return
    dev, group = x.device, parts[0][0].group
    # (16-bit models: fp32 copies would not fit the wide tiles' shared memory)
    route = parts[0][0].scheme != RAW and x.element_size() == 2 and dequant_route(x.shape[0], dev)
    t = tiles or tiles_for(x.shape[0], group, dev, dequantized=route)
    if not route:
        for pool, slot_of in parts:
            _launch(x, plan, slot_of, pool, out, t, pool.group)
        return
    native = t.native and not _INTERPRETED
    # every (part, slot) used, in order; a launch takes at most ``step`` of them
    used = [(i, s) for i, (_, so) in enumerate(parts) for s in sorted(set(so.values()))]
    step = dequant_slots_per_launch(parts[0][0], dev, x.element_size())
    c = 0
    while c < len(used):
        chunk = used[c : c + step]
        row = {u: r for r, u in enumerate(chunk)}
        slots: dict[int, list[int]] = {}
        for i, s in chunk:
            slots.setdefault(i, []).append(s)
        try:
            raw = _dequantized([(parts[i][0], ss) for i, ss in slots.items()], x.dtype, native)
        except torch.OutOfMemoryError:
            if step > 1:  # smaller parts: the same bits
                step //= 2
                continue
            raw = None  # not even one slot's copy fits: this one in place (same shape)
        if raw is None:
            for i, (pool, so) in enumerate(parts):
                inside = {e: s for e, s in so.items() if (i, s) in row}
                if inside:  # (a part with no slot in this chunk launches nothing)
                    _launch(x, plan, inside, pool, out, t, group)
        else:
            sub = {
                e: row[i, s]
                for i, (_, so) in enumerate(parts)
                for e, s in so.items()
                if (i, s) in row
            }
            _launch(x, plan, sub, raw, out, t, group)  # the slabs' group: the same BK
        c += len(chunk)


def _launch(
    x: torch.Tensor,
    plan: PairPlan,
    slot_of: dict[int, int],
    pool: ExpertPool,
    out: torch.Tensor,
    t: Tiles,
    group: int,  # the slabs' (kept when they were dequantized first)
) -> None:
    """The two grouped launches over ``slot_of``'s slots of ``pool``."""
    tokens, h_dim = x.shape
    top_k = plan.order.numel() // tokens
    n, i_dim, dev = pool.experts, pool.inter, x.device
    bm, bn, warps, stages = t.bm, t.bn, t.warps, t.stages
    bk = max(t.bk, group)  # an int4 tile holds whole groups
    native = t.native and not _INTERPRETED
    start, count, experts = [0] * n, [0] * n, [0] * n
    for e, s in slot_of.items():
        start[s], count[s], experts[s] = plan.start[e], plan.count[e], e
    blk: list[int] = []
    first: list[int] = []
    for s in range(n):
        first.append(len(blk))
        blk += [s] * -(-count[s] // bm)
    if not blk:
        return
    nb = len(blk)
    blk_t, start_t, count_t, first_t, eids = aligned_views(
        [blk, start, count, first, experts], torch.int32, dev
    )
    hidden = torch.empty(nb * bm, i_dim, dtype=x.dtype, device=dev)  # a row per block lane
    gate_b, up_b, down_b = pool.biases or (x, x, x)  # x: never read without biases
    has_bias = pool.biases is not None
    x = x.contiguous()
    rows = (plan.order, blk_t, start_t, count_t, first_t, eids)
    with on_device(dev):
        grouped_gate_up_kernel[(nb, triton.cdiv(i_dim, bn))](
            x, *rows, hidden, *_args(pool.gate), *_args(pool.up), gate_b, up_b, h_dim, i_dim,
            pool.alpha, pool.limit, TOPK=top_k, SCHEME=pool.scheme, GROUP=pool.group, BM=bm,
            BN=bn, BK=bk, HAS_BIAS=has_bias, ACT=pool.act, F32=_INTERPRETED, NATIVE=native,
            num_warps=warps, num_stages=stages,
        )  # fmt: skip
        dn, dk, dw, ds = t.down or (bn, t.bk, warps, stages)
        dk = max(dk, group)
        grouped_down_kernel[(nb, triton.cdiv(h_dim, dn))](
            hidden, *rows, out, *_args(pool.down), down_b, h_dim, i_dim, OUT=_DTYPES[x.dtype],
            SCHEME=pool.scheme, GROUP=pool.group, BM=bm, BN=dn, BK=dk, HAS_BIAS=has_bias,
            F32=_INTERPRETED, NATIVE=native, num_warps=dw, num_stages=ds,
        )  # fmt: skip
