"""A/B of the resident graph step's GPU time per token (issue 10): one model loaded
once, one ``GraphDecoder`` per configuration captured under its switches (or
``--captures N`` each), their graphs replayed back to back and timed with CUDA events,
in rounds, each round's order rotated one place from the round before.

Usage: python benches/step_ab.py MODEL [--configs base,no-pdl]
       [--rounds 5] [--replays 100] [--position 128] [--profile CONFIG[,CONFIG]]
       [--timeline LAYER] [--sweep FIRST-LAST [--sweep-random]] [--captures N]
       [--processes N]

Configurations sharing one process can time apart from each alone, by tens of us a
step and even the other way round. gpu167: the defaults alone took 1,774.2 and 1,774.5
us in two processes, the ranked sum and norm starting the next kernel early 1,795.1 and
1,795.3, as greedy decode had them (slower); in one process together 1,791.8 and
1,761.2. So an A/B takes ``--processes N``: each configuration alone in N processes of
its own, alternating. Without it, every configuration is captured in this process and
the rounds alternate (the sixteenth session had found separate processes several
percent apart; gpu167's agreed within 0.3 us). Two captures of one configuration in
one process can differ too (8.5 us a step in gpu162): ``--captures`` measures that
spread. Only the step is
timed (its argmax included, no host loop): tok/s is 1e6 / microseconds per step.
``--sweep FIRST-LAST`` also times each graph replayed at those positions, the position
filled before each replay, as graph_decode's ``replay_us`` (gpu159-160: q/k/v after the
wait was faster here and slower there, in two processes). Configurations: ``base`` (the
defaults; ``base-2`` and ``base-3`` the same again, each its own decoder: three
captures spanned 8.5 us a step in gpu162, so compare an A/B with that), ``no-pdl``
(moe_kernel.PDL off), ``no-int8`` (a ``--dense-quant int8`` file's attention through its
dequantized matrices, as files without int8 run), ``bytes`` (int4 experts read as byte
tiles, moe_kernel.WORDS off), ``route-two-pass`` (the router's top-k by two reductions
per pick across four warps, fused.ROUTE_ONE_PASS off), ``no-pdl-two-pass``, ``attn-*``
(the attention's positions per step and warps), ``blocks-before``, ``blocks-tuned`` and
``blocks-whole`` (the one-token products' block shapes), ``norm-launch``
(decode.NORM_IN_ROUTER off), ``norm-w*``, ``nl-w*`` and ``rope-w*`` (the norms', the
router-with-norm's and q/k/v RoPE's warps), ``no-ahead`` and ``no-ahead-KERNEL`` (no
kernel, or every kernel but one, reading ahead of its wait: moe_kernel.AHEAD),
``down-b*`` (int4 down's blocks), ``gu-*`` (int4 gate/up's blocks, and the loop
instead of its rows loaded at once: moe_kernel.WHOLE_GATE_UP), ``lin8-b4*`` (the int8
products four rows a program), ``qkv-tiles`` (bf16 q/k/v in tiles of 512 columns, as
before gpu130), ``f-*`` (bf16 expert pools' blocks), ``gu-*w1`` (int4 gate/up on one warp a
program; ``gu-k1024-w1`` was the default from 677654f), ``gu-k2048-w2`` (two warps,
whole rows: the default since the twenty-sixth session) and ``gu-w4`` (the four warps
before), ``early-*`` (kernels that let the next one's programs start before their
own wait: moe_kernel.EARLY), ``o-late`` (bf16 o's first tile read after the wait, not
before: what those reads cost the attention), ``qkv-after`` (bf16 q/k/v four rows a
program read after the wait: fused.QKV_AFTER_WAIT), ``o-whole2`` (bf16 o's whole rows, two
a program, read before the wait), ``o-k2048`` and ``o-b2-k2048`` (bf16 o in two tiles
of 2048 columns), ``attn-w1``, ``attn-w2`` and ``attn-w*-b128`` (the attention on one
or two warps), ``early-rn`` (the ranked sum and the norm letting the next kernel start
before their wait), ``route-count-w*`` and ``route-sort-w*`` (the router's picks by
counting ranks or by a bitonic top-k, on 1, 2, 4 or 8 warps: fused.ROUTE_RANKS;
``route-sort-w2`` is the default since gpu170), ``route-chain`` (by eight dependent
reductions on one warp, as before), ``early-route`` (the router's top-k letting
gate/up start before its wait) and ``no-early`` (no kernel doing so; gpu155 had it while
the small kernels started the next early by default), ``kv-ask-*`` and ``no-kv-ask``
(the attention's keys and values asked of the L2 before the wait, or not:
fused.KV_ASK, "rope" by default since gpu176), ``rows-every-step``
(decode.ROWS_EVERY_STEP: the three ops the thirty-second session made lazy),
``no-cluster-norm`` (the ranked sum's own launch before the norm's, as before the
thirty-third session: fused.CLUSTER_NORM), ``cluster-norm-w*`` (that cluster's programs
on 1, 2 or 8 warps, 4 by default), ``cluster-norm-late0``, ``-late1`` and ``-late2``
(q/k/v's programs started at the cluster's wait, once it has the ranks' rows, or once
it has exchanged its sums of squares: fused.CLUSTER_NORM_LATE, 1 by default from
gpu182, 0 again since gpu187), ``cluster-barrier`` (the cluster norm's sums of squares
exchanged through plain stores and a cluster barrier, as before gpu184:
fused.CLUSTER_ASYNC), ``no-cluster-route`` (the router's top-k in its own launch after
its product's: fused.CLUSTER_ROUTE, = base since 3e35be6) and
``cluster-route{8,16}-w{4,8}`` (the router's top-k made by its product's launch, in
one cluster of 8 or 16 programs on 4 or 8 warps: off by default, slower in gpu189).
The thirty-fourth session's ``gu-late`` and ``attn-late``
(down's programs started once gate/up's rows are in, o's once the attention's keys and
values are: gpu184) were taken out with the code. The thirty-first
session's ``gu-guess`` and ``guess`` (gate/up reading guessed experts' rows before its
wait), the thirty-second's ``embed-op`` (the token's embedding by a torch op, while
the first norm read it: gpu177) and the thirty-third's ``no-cluster-folds`` were taken
out with the code.
``--profile
CONFIG[,CONFIG]`` then prints each kernel's time per step, and its share of the stream's time
(under dependent launch, kernels overlap: a kernel's share is its end less the later
of its start and the end of the kernel before), and with ``--timeline LAYER`` that
layer's kernels one by one. (The sixteenth session's ``no-fold``
and ``serial`` rows, the eighteenth's ``linear-ahead`` and ``ranked-in-norm``, the
twenty-third's ``lin-*`` and ``attn-kv*``, the twenty-fourth's ``qkv-whole`` (now
the default), ``o-whole*``, ``evict-w``, ``keep``, ``evict-keep``, ``pick-s8`` (and
``no-ahead-pick``), ``route-asks*``, ``o-behind`` and ``lin-behind``, the
twenty-fifth's ``pf-*`` (L2 asks from a second stream), ``gu-st*``, ``lin-st*`` and
``st-both`` (software-pipelined loops), ``gu-r*``, ``gu-b8-r64``, ``down-r*``,
``lin-r32`` and ``r-all`` (registers capped), the twenty-seventh's ``o-at-once``
(bf16 o's tiles at once), ``late-*`` (kernels launched without programmatic
serialization), ``attn-s*`` (the attention's pipeline stages), ``rope-attn*`` (RoPE
and the attention in one launch), the twenty-eighth's ``qkv-late`` (bf16 q/k/v's
first tile after the wait, two rows a program), ``qkv-late-b4`` (now ``qkv-after``)
and ``qkv-before`` (gpu159-160, while ``qkv-after`` was the default), the
twenty-ninth's ``input-norm-launch`` (while q/k/v's product made the input norm,
gpu163) and ``smem-qkv``, ``smem-qkv-3``, ``smem-qkv-early`` (q/k/v through shared
memory, gpu164-165), measured switches since taken out; gpu125's
``f-gu-b4*`` set the block that is now the float pools' default: docs/benchmarks.md.)
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import torch

import flint
from flint.graphs import decode, fused, moe_kernel
from flint.graphs.decode import GraphDecoder, expert_pools

_LINEAR_BLOCK = fused.linear_block
# name -> moe_kernel switches; "no-int8" builds the decoder without the file's int8
# attention matrices (the dequantized ones instead)
CONFIGS: dict[str, dict[str, Any]] = {
    "base": {},
    # the defaults again, each its own decoder (buffers, graph): how far two captures of
    # one configuration differ in one process
    "base-2": {},
    "base-3": {},
    "no-pdl": {"PDL": False},
    "no-int8": {},
    "bytes": {"WORDS": False},  # int4 experts as byte tiles, not words (issue 10)
    "eighths-launch": {"decode.EIGHTHS_IN_NORM": False},  # the experts' input: own launch
    "route-two-pass": {"fused.ROUTE_ONE_PASS": False},  # the router's top-k as before
    "no-pdl-two-pass": {"PDL": False, "fused.ROUTE_ONE_PASS": False},
    "attn-b128": {"fused.ATTENTION_BLOCK": 128},  # attention: 128 positions per step
    "attn-b128-w8": {"fused.ATTENTION_BLOCK": 128, "fused.ATTENTION_LAUNCH": {"num_warps": 8}},
    "attn-w8": {"fused.ATTENTION_LAUNCH": {"num_warps": 8}},
    "attn-b32": {"fused.ATTENTION_BLOCK": 32},
    # the one-token products' block shapes before the eighteenth session
    "blocks-before": {"fused.linear_block": lambda r, c, i8: _blocks_before(r, c, i8)},
    # each shape's best of linear_tune (gpu99) instead of (2, 2048, 4) for all
    "blocks-tuned": {"fused.linear_block": lambda r, c, i8: _blocks_tuned(r, c, i8)},
    # (2, 2048, 4) for every product but the LM head, bf16 too (gpu100's default)
    "blocks-whole": {"fused.linear_block": lambda r, c, i8: _blocks_whole(r, c, i8)},
    "norm-launch": {"decode.NORM_IN_ROUTER": False},  # the post-attention norm: own launch
    "norm-w4": {"fused.NORM_LAUNCH": {"num_warps": 4}},  # the norms' warps (default 8)
    "norm-w16": {"fused.NORM_LAUNCH": {"num_warps": 16}},
    "norm-w2": {"fused.NORM_LAUNCH": {"num_warps": 2}},
    "nl-w8": {"fused.NORM_LINEAR_WARPS": 8},  # the router's launch with the norm
    "nl-w2": {"fused.NORM_LINEAR_WARPS": 2},
    "nl-w1": {"fused.NORM_LINEAR_WARPS": 1},
    "rope-w4": {"fused.ROPE_LAUNCH": {"num_warps": 4}},  # q/k/v RoPE's warps (default 1)
    "rope-w1": {"fused.ROPE_LAUNCH": {"num_warps": 1}},
    "rope-w2": {"fused.ROPE_LAUNCH": {"num_warps": 2}},
    # what the kernels read before their wait (moe_kernel.AHEAD): none, or all but one
    "no-ahead": {"AHEAD": frozenset()},
    "bf16-head": {"decode.INT8_HEAD": False},  # a --dense-quant int8 file's head as bf16
    "no-argmax": {"decode.ARGMAX_IN_STEP": False},  # the greedy argmax out of the step
    # the attention's cache positions per program (a second launch merges the chunks)
    "attn-chunk64": {"fused.ATTENTION_CHUNK": 64},
    "attn-chunk128": {"fused.ATTENTION_CHUNK": 128},
    "attn-chunk64-b32": {"fused.ATTENTION_CHUNK": 64, "fused.ATTENTION_BLOCK": 32},
    **{f"no-ahead-{k}": {"AHEAD": moe_kernel.AHEAD - {k}} for k in sorted(moe_kernel.AHEAD)},
    # int4 down's blocks (rows, columns, warps; default (16, 256, 4)): reading its rows
    # ahead takes registers, so fewer programs fit an SM
    "down-b8": {"WORDS_DOWN_BLOCK": (8, 256, 4)},
    "down-b32-w8": {"WORDS_DOWN_BLOCK": (32, 256, 8)},
    "down-w8": {"WORDS_DOWN_BLOCK": (16, 256, 8)},
    "down-k512": {"WORDS_DOWN_BLOCK": (16, 512, 4)},
    "down-w2": {"WORDS_DOWN_BLOCK": (16, 256, 2)},
    "down-b8-w2": {"WORDS_DOWN_BLOCK": (8, 256, 2)},
    # int4 gate/up: the loop of tiles instead of every tile of a program's rows loaded
    # at once (WHOLE_GATE_UP), and its blocks (rows, columns, warps; default (4, 2048, 2))
    "gu-loop": {"WHOLE_GATE_UP": False},
    # the router's top-k letting the next kernel start before its wait (gpu174)
    "early-route": {"EARLY": frozenset({"route"})},
    "no-early": {"EARLY": frozenset()},  # no kernel starting the next before its wait
    "gu-loop-b8": {"WHOLE_GATE_UP": False, "WORDS_GATE_UP_BLOCK": (8, 512, 4)},
    "gu-b8": {"WORDS_GATE_UP_BLOCK": (8, 512, 4)},
    "gu-b2-w2": {"WORDS_GATE_UP_BLOCK": (2, 512, 2)},
    "gu-b2": {"WORDS_GATE_UP_BLOCK": (2, 512, 4)},
    "gu-w8": {"WORDS_GATE_UP_BLOCK": (4, 512, 8)},
    "gu-k1024": {"WORDS_GATE_UP_BLOCK": (4, 1024, 4)},
    "gu-loop-b8-k1024": {"WHOLE_GATE_UP": False, "WORDS_GATE_UP_BLOCK": (8, 1024, 4)},
    # int8 one-token products (q/k/v, o) four rows a program: all in one wave
    "lin8-b4": {"fused.linear_block": lambda r, c, i8: _lin8(r, c, i8, (4, 2048, 4))},
    "lin8-b4-w8": {"fused.linear_block": lambda r, c, i8: _lin8(r, c, i8, (4, 2048, 8))},
    # bf16 q/k/v's rows in tiles of 512 columns, as before gpu130 (whole rows now)
    "qkv-tiles": {  # read before the wait, as then, whatever QKV_AFTER_WAIT's default
        "fused.QKV_AFTER_WAIT": False,
        "fused.linear_block": lambda r, c, i8: _qkv_tiles(r, c, i8),
    },
    # int4 gate/up on one warp a program (the vector read once a program, not a warp)
    "gu-w4": {"WORDS_GATE_UP_BLOCK": (4, 512, 4)},  # the block before gpu139
    "gu-w1": {"WORDS_GATE_UP_BLOCK": (4, 512, 1)},
    "gu-k1024-w1": {"WORDS_GATE_UP_BLOCK": (4, 1024, 1)},
    "gu-k2048-w1": {"WORDS_GATE_UP_BLOCK": (4, 2048, 1)},
    "gu-b2-k1024-w1": {"WORDS_GATE_UP_BLOCK": (2, 1024, 1)},
    "gu-b8-k1024-w1": {"WORDS_GATE_UP_BLOCK": (8, 1024, 1)},
    # whole rows on two and four warps: half the instructions a warp of (4, 1024, 1);
    # gu-k2048-w2 the default since the twenty-sixth session (gpu149)
    "gu-k2048-w2": {"WORDS_GATE_UP_BLOCK": (4, 2048, 2)},
    "gu-b8-k2048-w4": {"WORDS_GATE_UP_BLOCK": (8, 2048, 4)},
    "down-b32": {"WORDS_DOWN_BLOCK": (32, 256, 4)},
    # kernels letting the next start before their wait (moe_kernel.EARLY, off by
    # default): the small ones, all but gate/up, the products and down, the small ones
    # with down or the products (early-linear not run yet)
    "early-small": {"EARLY": moe_kernel.SMALL_KERNELS},
    "early-all": {"EARLY": moe_kernel.EARLY_NAMES},
    "early-bw": {"EARLY": frozenset({"linear", "down"})},
    "early-down": {"EARLY": moe_kernel.SMALL_KERNELS | {"down"}},
    "early-linear": {"EARLY": moe_kernel.SMALL_KERNELS | {"linear"}},
    # float (bf16) expert pools' blocks (FLOAT_GATE_UP_BLOCK (4, 1024, 4), and
    # DOWN_BLOCK (16, 256, 4), tuned on int4 byte tiles): gate/up's eight rows a program
    # of before, down's rows
    "f-gu-b8": {"FLOAT_GATE_UP_BLOCK": (8, 1024, 4)},
    "f-down-b32-w8": {"DOWN_BLOCK": (32, 256, 8)},
    "f-down-b8": {"DOWN_BLOCK": (8, 256, 4)},
    # what the products' reads before their wait cost the kernel before: bf16 o's or
    # q/k/v's first tile read after the wait, or o's whole rows before it (two a program)
    "o-late": {"fused.first_tile_ahead": lambda r, c, i8: not _bf16_o(r, c, i8)},
    # bf16 q/k/v four whole rows a program on eight warps, read after the wait
    "qkv-after": {"fused.QKV_AFTER_WAIT": True},
    # the ranked sum and the norm letting the next kernel start before their wait
    "early-rn": {"EARLY": frozenset({"ranked_sum", "norm"})},
    "o-whole2": {"fused.linear_block": lambda r, c, i8: _o_block(r, c, i8, (2, 4096, 4))},
    # bf16 o's rows in two tiles of 2048 columns (half before the wait), four or two rows
    "o-k2048": {"fused.linear_block": lambda r, c, i8: _o_block(r, c, i8, (4, 2048, 8))},
    "o-b2-k2048": {"fused.linear_block": lambda r, c, i8: _o_block(r, c, i8, (2, 2048, 4))},
    # the attention on one or two warps a program (Triton's default 4), 64 or 128
    # positions a step
    "attn-w1": {"fused.ATTENTION_LAUNCH": {"num_warps": 1}},
    "attn-w2": {"fused.ATTENTION_LAUNCH": {"num_warps": 2}},
    "attn-w2-b128": {"fused.ATTENTION_LAUNCH": {"num_warps": 2}, "fused.ATTENTION_BLOCK": 128},
    "attn-w1-b128": {"fused.ATTENTION_LAUNCH": {"num_warps": 1}, "fused.ATTENTION_BLOCK": 128},
    # the router's picks by counting ranks (1) or a bitonic top-k (2) on w warps, or by
    # the chain of reductions on one warp (the default before gpu170)
    "route-chain": {"fused.ROUTE_RANK_WARPS": 0},
    # the attention's earlier keys and values asked of the L2 before the wait: by the
    # key and value programs of RoPE's launch, or by the attention's own programs; and
    # with bf16 o's whole rows read before its wait (its reads had slowed the attention)
    "kv-ask-rope": {"fused.KV_ASK": "rope"},  # the default since gpu176
    "no-kv-ask": {"fused.KV_ASK": ""},
    "kv-ask-attn": {"fused.KV_ASK": "attention"},
    "kv-ask-rope-o-whole2": {
        "fused.KV_ASK": "rope",
        "fused.linear_block": lambda r, c, i8: _o_block(r, c, i8, (2, 4096, 4)),
    },
    # the RoPE rows and the mask made at every step's start, used or not (as before)
    "rows-every-step": {"decode.ROWS_EVERY_STEP": True},
    # the MoE block's ranked sum in its own launch, then the next norm's (no cluster)
    "no-cluster-norm": {"fused.CLUSTER_NORM": False},
    **{f"cluster-norm-w{w}": {"fused.CLUSTER_NORM_WARPS": w} for w in (1, 2, 8)},
    **{f"cluster-norm-late{k}": {"fused.CLUSTER_NORM_LATE": k} for k in (0, 1, 2)},
    # that cluster's sums of squares exchanged through plain stores and a cluster
    # barrier (asynchronous stores and a transaction barrier by default since gpu184)
    "cluster-barrier": {"fused.CLUSTER_ASYNC": False},
    # the router's top-k in its own launch, or its cluster's programs and warps
    "no-cluster-route": {"fused.CLUSTER_ROUTE": 0},  # = base since 3e35be6 (after gpu189)
    **{
        f"cluster-route{c}-w{w}": {"fused.CLUSTER_ROUTE": c, "fused.CLUSTER_ROUTE_WARPS": w}
        for c in (8, 16)
        for w in (4, 8)
    },
    **{
        f"route-{name}-w{w}": {"fused.ROUTE_RANKS": mode, "fused.ROUTE_RANK_WARPS": w}
        for name, mode in (("count", 1), ("sort", 2))
        for w in (1, 2, 4, 8)
    },
}


def _o_block(rows: int, cols: int, int8: bool, block: tuple[int, int, int]) -> tuple[int, int, int]:
    """``block`` for bf16 o, the default block for the others."""
    return block if _bf16_o(rows, cols, int8) else _LINEAR_BLOCK(rows, cols, int8)


def _bf16_o(rows: int, cols: int, int8: bool) -> bool:
    """An attention output's shape in bf16 (more columns than rows, at least 4096)."""
    return not int8 and rows <= 16384 and cols >= 4096 and cols > rows


_bf16_qkv = fused._bf16_qkv


def _lin8(rows: int, cols: int, int8: bool, block: tuple[int, int, int]) -> tuple[int, int, int]:
    """``block`` for the int8 products of more than 1,024 rows but the LM head."""
    if int8 and 1024 < rows <= 16384:
        return block
    return _LINEAR_BLOCK(rows, cols, int8)


def _qkv_tiles(rows: int, cols: int, int8: bool) -> tuple[int, int, int]:
    """The block before gpu130 (four rows a program, 512 columns a step) for bf16
    q/k/v-shaped products (``fused.linear_block`` now gives them two whole rows); the
    others as by default."""
    return (4, 512, 4) if _bf16_qkv(rows, cols, int8) else _LINEAR_BLOCK(rows, cols, int8)


def _blocks_before(rows: int, cols: int, int8: bool) -> tuple[int, int, int]:
    """``fused.linear_block`` of the seventeenth session."""
    if rows > 16384:
        return (16, 512, 8) if int8 else (8, 1024, 8)
    if cols >= 4096 or rows <= 1024:
        return (4, 1024, 4 if int8 and rows > 1024 else 8)
    return (8, 512, 8) if int8 else (4, 512, 4)


def _blocks_whole(rows: int, cols: int, int8: bool) -> tuple[int, int, int]:
    """Two rows a program, 2048 columns a step, for every product but the LM head."""
    return _LINEAR_BLOCK(rows, cols, int8) if rows > 16384 else (2, 2048, 4)


def _blocks_tuned(rows: int, cols: int, int8: bool) -> tuple[int, int, int]:
    """linear_tune's best per shape on gpu99 (q/k/v, o, router of the 30B-A3B)."""
    if rows > 16384 or rows <= 1024:
        return _LINEAR_BLOCK(rows, cols, int8)
    if cols >= 4096:  # o
        return (1, 2048, 2) if int8 else (2, 2048, 8)
    return (2, 2048, 4) if int8 else (1, 2048, 4)


def captured(
    model: Any, pools: dict[int, Any], source: Any, switches: dict[str, Any], position: int
) -> tuple[GraphDecoder, Any]:
    """A decoder and its graph for ``position``, captured with ``switches`` set (on
    moe_kernel, or on fused or decode for names "fused.X", "decode.X"; the decoder owns
    the buffers the graph reads: keep it)."""
    saved = {name: getattr(*_target(name)) for name in switches}
    for name, value in switches.items():
        setattr(*_target(name), value)
    try:
        decoder = GraphDecoder(model, pools, capture=True, source=source)
        decoder.token.fill_(5)
        decoder.position.fill_(position)
        return decoder, decoder._record(decoder.span(position))
    finally:
        for name, value in saved.items():
            setattr(*_target(name), value)


def _target(name: str) -> tuple[Any, str]:
    """(module, attribute) a switch's name sets."""
    module, _, attr = name.rpartition(".")
    return {"": moe_kernel, "fused": fused, "decode": decode}[module], attr


def swept(
    decoder: GraphDecoder, graph: Any, positions: range, tokens: torch.Tensor | None
) -> float:
    """Microseconds per replay of ``graph`` (a span's) at each of ``positions`` in turn,
    the position filled before each replay as ``GraphDecoder._replay`` does (what
    graph_decode's ``replay_us`` times). Each replay's input is the step before's argmax
    (greedy, the step writes it), or with ``tokens`` [len(positions)] on the device, the
    next of those, copied in before it."""

    def one(i: int) -> None:
        decoder.position.fill_(positions[i])
        if tokens is not None:
            decoder.token.copy_(tokens[i : i + 1])
        graph.replay()

    return _us_per_call(one, len(positions))


def greedy_tokens(decoder: GraphDecoder, graph: Any, positions: range) -> int:
    """How many distinct tokens a greedy sweep feeds the step: one more, untimed pass
    after the timed ones, each replay's token read back. (A random model's greedy text
    can repeat, and with it the experts it routes.)"""
    seen = set()
    for position in positions:
        decoder.position.fill_(position)
        graph.replay()
        seen.add(int(decoder.token.item()))
    return len(seen)


def timed(graph: Any, replays: int) -> float:
    """Microseconds per replay of ``graph``, ``replays`` back to back."""
    return _us_per_call(lambda i: graph.replay(), replays)


def _us_per_call(one: Callable[[int], None], count: int) -> float:
    """Microseconds per call of ``one(i)`` for i in 0..count-1, timed with CUDA events
    after one untimed call of ``one(0)``, the calls queued back to back."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    one(0)
    torch.cuda.synchronize()
    start.record()
    for i in range(count):
        one(i)
    end.record()
    end.synchronize()
    return float(start.elapsed_time(end)) * 1e3 / count


def kernels(graph: Any, replays: int, layer: int | None = None) -> None:
    """Each kernel's GPU time per replay of ``graph`` (CUPTI traces a graph's kernels one
    by one), largest first: name, us per step, launches per step; then each kernel's
    share of the stream's time (``critical_shares``), largest first; with ``layer``, that
    layer's kernels one by one (``timeline``)."""
    from torch.profiler import DeviceType, ProfilerActivity, profile

    graph.replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            graph.replay()
        torch.cuda.synchronize()
    rows = [
        (e.key, e.device_time_total / replays, e.count / replays)
        for e in prof.key_averages()
        if e.device_time_total > 0 and e.count >= replays
    ]
    total = sum(us for _, us, _ in rows)
    print(json.dumps({"profile_us_per_step": round(total, 1)}))
    for name, us, count in sorted(rows, key=lambda r: -r[1])[:16]:
        print(json.dumps({"kernel": name[:60], "us": round(us, 1), "launches": round(count, 1)}))
    spans = [
        (e.name, e.time_range.start, e.time_range.end)
        for e in prof.events()
        if e.device_type == DeviceType.CUDA and e.time_range.end > e.time_range.start
    ]
    shares = critical_shares(spans)
    busy = sum(share for share, _, _ in shares.values())
    print(json.dumps({"stream_busy_us_per_step": round(busy / replays, 1)}))
    for name, (share, beside, count) in sorted(shares.items(), key=lambda r: -r[1][0])[:16]:
        row = {"kernel": name[:60], "share_us": round(share / replays, 1)}
        row |= {"beside_us": round(beside / replays, 1), "launches": round(count / replays, 1)}
        print(json.dumps(row))
    if layer is not None:
        for row in timeline(spans, replays, layer):
            print(json.dumps(row))


def timeline(
    spans: list[tuple[str, float, float]], replays: int, layer: int
) -> list[dict[str, Any]]:
    """The kernels of decoder layer ``layer`` (from its input norm, the layer-th
    ``rms_norm_kernel`` or ``ranked_norm_kernel`` of a replay, to the next one; with
    ``norm-launch`` the post-attention norms count too), each as its start and end in
    us after the layer's first kernel starts, and what it adds to the stream (its end
    less the later of its start and the latest end before it), averaged over the
    replays. Every replay must launch the same kernels."""
    ordered = sorted(spans, key=lambda s: (s[1], s[2]))
    per, extra = divmod(len(ordered), replays)
    pattern = [s[0] for s in ordered[:per]]
    if extra or any(
        [s[0] for s in ordered[r * per : (r + 1) * per]] != pattern for r in range(replays)
    ):
        raise SystemExit(f"--timeline: the {replays} replays did not launch the same kernels")
    starts = ("rms_norm_kernel", "ranked_norm_kernel")  # the second with fused.CLUSTER_NORM
    norms = [i for i, name in enumerate(pattern) if name.startswith(starts)]
    if layer + 1 >= len(norms):
        raise SystemExit(f"--timeline {layer}: the step has {len(norms) - 1} layers")
    first, stop = norms[layer], norms[layer + 1]
    sums = [[0.0, 0.0, 0.0] for _ in range(first, stop)]
    for r in range(replays):
        one = ordered[r * per : (r + 1) * per]
        t0 = one[first][1]
        last_end = max((s[2] for s in one[:first]), default=float("-inf"))
        for row, (_, start, end) in zip(sums, one[first:stop], strict=True):
            row[0] += start - t0
            row[1] += end - t0
            row[2] += max(0.0, end - max(start, last_end))
            last_end = max(last_end, end)
    keys = ("start_us", "end_us", "adds_us")
    return [
        {"layer": layer, "kernel": pattern[first + i][:40]}
        | {k: round(v / replays, 2) for k, v in zip(keys, row, strict=True)}
        for i, row in enumerate(sums)
    ]


def critical_shares(
    spans: list[tuple[str, float, float]],
) -> dict[str, tuple[float, float, int]]:
    """Kernels of one stream as (name, start, end) -> by name: (share, beside, count).
    Under dependent launch a kernel starts before the one before it has ended, so its
    own time overlaps that one's. Its *share* is what it adds to the stream: its end
    less the later of its start and the end before it (idle time between kernels is
    nobody's). *beside*: how long it ran while the one before had not ended (started
    early, mostly waiting). The shares sum to the stream's busy time."""
    out: dict[str, tuple[float, float, int]] = {}
    last_end = float("-inf")
    for name, start, end in sorted(spans, key=lambda s: (s[1], s[2])):
        share = max(0.0, end - max(start, last_end))
        beside = max(0.0, min(end, last_end) - start)
        old = out.get(name, (0.0, 0.0, 0))
        out[name] = (old[0] + share, old[1] + beside, old[2] + 1)
        last_end = max(last_end, end)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--configs", default="base,no-pdl")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--replays", type=int, default=100)
    parser.add_argument("--position", type=int, default=128)
    parser.add_argument(
        "--profile",
        metavar="CONFIG",
        help="then each kernel's GPU time per step of this configuration (torch.profiler; "
        "with PDL on, kernels overlap and each one's time includes its wait), and each "
        "kernel's share of the stream's time (what it adds after the kernel before ends)",
    )
    parser.add_argument(
        "--timeline",
        type=int,
        metavar="LAYER",
        help="with --profile: each kernel of this decoder layer, its start and end after "
        "the layer's first kernel starts and what it adds to the stream (us, averaged)",
    )
    parser.add_argument(
        "--sweep",
        metavar="FIRST-LAST",
        help="each round also replays each configuration's graph at positions FIRST to "
        "LAST, the position filled before each replay, as graph_decode's replay_us "
        "(within one span of decode.SPAN_STEP positions as --position)",
    )
    parser.add_argument(
        "--sweep-random",
        action="store_true",
        help="the sweep's input tokens drawn at random (seeded), not the step's argmax, "
        "each copied in before its replay (a copy the greedy sweep does not make)",
    )
    parser.add_argument(
        "--captures",
        type=int,
        default=1,
        metavar="N",
        help="capture each configuration N times (each its own decoder, buffers and "
        "graph), the order within a round rotated each round; a configuration's figure "
        "is the median of its captures' medians, printed with their spread (three "
        "captures of one configuration spanned 8.5 us a step in gpu162)",
    )
    parser.add_argument(
        "--processes",
        type=int,
        default=0,
        metavar="N",
        help="time each configuration alone, in a process of its own, N times (the "
        "processes alternating, each round's order rotated); a configuration's figure is "
        "the median of its processes' medians, printed with their spread. Configurations "
        "sharing a process can time tens of us apart from each alone, even the other way "
        "round (gpu167): use this for an A/B",
    )
    args = parser.parse_args()
    if args.captures < 1:
        raise SystemExit("--captures: at least 1")
    names = args.configs.split(",")
    profiled = set(args.profile.split(",")) if args.profile else set()
    unknown = (set(names) | profiled) - set(CONFIGS)
    if unknown:
        raise SystemExit(f"unknown configurations {sorted(unknown)}; known: {list(CONFIGS)}")
    if args.processes:
        separate(args, names)
        return
    if len(names) > 1:
        print(
            "note: the configurations share one process, where each can time apart from "
            "itself alone (gpu167); --processes N times each alone",
            file=sys.stderr,
        )
    sweep = None
    if args.sweep:
        ends = args.sweep.split("-")
        if len(ends) != 2 or not all(e.isdigit() for e in ends) or int(ends[0]) > int(ends[1]):
            raise SystemExit(f"--sweep {args.sweep}: expected FIRST-LAST, FIRST <= LAST")
        first, last = int(ends[0]), int(ends[1])
        sweep = range(first, last + 1)
        if (first // decode.SPAN_STEP, last // decode.SPAN_STEP) != (
            args.position // decode.SPAN_STEP,
        ) * 2:
            raise SystemExit(f"--sweep {args.sweep}: not in --position's graph span")
    if args.sweep_random and sweep is None:
        raise SystemExit("--sweep-random needs --sweep")
    with flint.LLM(args.model, device="cuda:0", graphs="on", context_length=4096) as llm:
        model = llm.model
        pools = expert_pools(model.experts)
        if pools is None:
            raise SystemExit("the model's experts are not resident in slot pools")
        if model.decoder is not None:
            model.decoder.close()  # its graphs' memory: each configuration has its own
        graphs = {
            (n, k): captured(
                model, pools, None if n == "no-int8" else llm.source, CONFIGS[n], args.position
            )
            for n in names + sorted(profiled - set(names))
            for k in range(args.captures if n in names else 1)
        }
        keys = [(n, k) for n in names for k in range(args.captures)]
        times: dict[tuple[str, int], list[float]] = {key: [] for key in keys}
        swept_times: dict[tuple[str, int], list[float]] = {key: [] for key in keys}
        tokens = None
        if args.sweep_random and sweep is not None:
            vocab = model.config.vocab_size
            gen = torch.Generator().manual_seed(0)
            tokens = torch.randint(2, vocab, (len(sweep),), generator=gen).to("cuda:0")
        for r in range(args.rounds):
            for key in rotated(keys, r):
                graphs[key][0].position.fill_(args.position)  # a sweep moves it
                times[key].append(timed(graphs[key][1], args.replays))
                if sweep is not None:
                    swept_times[key].append(swept(*graphs[key], sweep, tokens))
        distinct = {}
        if sweep is not None and tokens is None:
            distinct = {n: greedy_tokens(*graphs[n, 0], sweep) for n in names}
        if args.profile:
            for name in args.profile.split(","):
                print(json.dumps({"profile": name}))
                graphs[name, 0][0].position.fill_(args.position)
                kernels(graphs[name, 0][1], 20, args.timeline)
    for name in names:
        row: dict[str, Any] = {"config": name} | summary(
            [times[name, k] for k in range(args.captures)]
        )
        if sweep is not None:
            swept_row = summary([swept_times[name, k] for k in range(args.captures)])
            row |= {f"sweep_{k}": v for k, v in swept_row.items() if k != "tok_s"}
            row["sweep_tokens"] = "random" if tokens is not None else "greedy"
            if name in distinct:
                row["sweep_distinct_tokens"] = distinct[name]
        print(json.dumps(row))


def separate(args: argparse.Namespace, names: list[str]) -> None:
    """``--processes N``: each configuration timed alone in a process of its own (this
    script with that one configuration), N processes each, each round's order rotated;
    one JSON row a process as it ends, then one a configuration."""
    if args.processes < 1:
        raise SystemExit("--processes: at least 1")
    if args.profile or args.timeline is not None or args.sweep or args.captures > 1:
        raise SystemExit(
            "--processes times the step only: no --profile, --timeline, --sweep or --captures"
        )
    medians: dict[str, list[float]] = {name: [] for name in names}
    for r in range(args.processes):
        for name in rotated(names, r):
            command = [
                sys.executable, __file__, args.model, "--configs", name,
                "--rounds", str(args.rounds), "--replays", str(args.replays),
                "--position", str(args.position),
            ]  # fmt: skip
            done = subprocess.run(command, capture_output=True, text=True, check=False)
            rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
            row = next((row for row in rows if row.get("config") == name), None)
            if done.returncode or row is None:
                raise SystemExit(f"{name}: the process failed ({done.returncode})\n{done.stderr}")
            medians[name].append(row["us_per_step"])
            print(json.dumps({"process": r, "config": name, "us_per_step": row["us_per_step"]}))
    for name in names:
        print(json.dumps({"config": name} | _spread(medians[name], "processes", "process")))


def rotated(keys: list[Any], r: int) -> list[Any]:
    """``keys`` in round ``r``'s order: rotated by ``r``, so that over the rounds each
    capture is timed at each place in the round (where ``--rounds`` allows)."""
    shift = r % len(keys)
    return keys[shift:] + keys[:shift]


def summary(rounds: list[list[float]]) -> dict[str, Any]:
    """A configuration's figures from each capture's rounds (us a step): the median of
    the captures' medians, its tok/s, the rounds (one capture) or each capture's median
    and their spread (several)."""
    medians = [statistics.median(r) for r in rounds]
    if len(rounds) > 1:
        return _spread(medians, "captures", "capture")
    us = medians[0]
    out: dict[str, Any] = {"us_per_step": round(us, 1), "tok_s": round(1e6 / us, 1)}
    return out | {"rounds_us": [round(t, 1) for t in rounds[0]]}


def _spread(medians: list[float], each: str, one: str) -> dict[str, Any]:
    """The median of several captures' or processes' medians (us a step), its tok/s,
    each median and their spread."""
    us = statistics.median(medians)
    return {
        "us_per_step": round(us, 1), "tok_s": round(1e6 / us, 1),
        f"{each}_us": [round(m, 1) for m in medians],
        f"{one}_spread_us": round(max(medians) - min(medians), 1),
    }  # fmt: skip


if __name__ == "__main__":
    main()
