"""Routed experts of a few tokens computed by slot index, in two Triton kernels.

A layer's experts sit in a pool at fixed addresses: the resident model's stacked
float weights ([E, I, H] gate and up, [E, H, I] down), or one .ftw slab per expert
(``[E, slab_bytes]`` uint8, the file's bytes: int8 rows with f32 row scales, or int4
nibbles with bf16 group scales). The router's ids index that pool on the GPU, so a
decode step needs no host synchronisation and no gather copy of weights, and can be
captured in a CUDA graph (``flint.graphs.decode``).

``gate_up``: one program per (token, rank) pair and block of intermediate rows; both
projections dotted with the token in fp32, each rounded to the model dtype (as
``F.linear`` returns them), then ``silu(gate) * up`` with torch's roundings.
``down``: one program per (token, rank) pair and block of hidden rows, each rank's
expert output rounded to the model dtype; ``ranked_sum``: per token and block of
hidden rows, the ranks summed in fp32 in router-rank order with their routing weights
(``flint.models.moe.weighted_sum``'s order), cast once at the end.
The dot products' summation order is the kernels' own: they agree with the per-expert
torch path within rounding, and with themselves bit for bit (graph or eager launch).
int4 with groups of 8 or more is read as 32-bit words against the vector in an
"eighths" layout (``WORDS``, ``eighths``; slot_kernels.py's ``_words_dot`` has the
arithmetic): a logic op, an add and a multiply-add per weight, no conversion
instruction. The kernels themselves are in ``flint.graphs.slot_kernels``.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import torch

from flint.format.constants import SCALE_ALIGN
from flint.graphs.slot_kernels import (
    dequant_kernel,
    down_kernel,
    eighths_kernel,
    gate_up_kernel,
    ranked_sum_kernel,
)
from flint.graphs.triton_kernels import triton
from flint.models.moe import ExpertMath

# T = tokens, H = hidden, I = expert intermediate, E = experts, K = top-k

RAW, INT8, INT4 = 0, 1, 2
SCHEMES = {"raw": RAW, "int8": INT8, "int4": INT4}
ACTIVATIONS = {"swiglu": 0, "gpt_oss": 1}  # flint.models.config.ExpertActivation kinds


_DTYPES: dict[torch.dtype, Any] = (
    {}
    if triton is None
    else {
        torch.bfloat16: triton.language.bfloat16,
        torch.float16: triton.language.float16,
        torch.float32: triton.language.float32,
    }
)


# Programmatic dependent launch of these kernels and ``flint.graphs.fused``'s on Hopper
# and later (``_await_inputs`` in triton_kernels.py): each kernel's programs start, and
# read their constant weights, while the kernel before it finishes. Only inside
# ``dependent_launch`` blocks: the resident graph step, whose kernels follow one another
# on one stream with no host work, copies or other streams' events between them. The
# streamed step's hops have all three, and its CUDA test failed twice on wheels with
# dependent launch everywhere (cause not established; docs/cuda-graphs.md), so it and
# every other caller launch as before. False: an A/B in benches.
PDL = True
_pdl_scope = threading.local()


@contextlib.contextmanager
def dependent_launch() -> Iterator[None]:
    """Kernels launched in this block, on this thread, use programmatic dependent launch
    where ``pdl`` allows it."""
    before = getattr(_pdl_scope, "on", False)
    _pdl_scope.on = True
    try:
        yield
    finally:
        _pdl_scope.on = before


@functools.cache
def _pdl_capable(index: int) -> bool:
    major, _ = torch.cuda.get_device_capability(index)
    extra = getattr(getattr(triton.language, "extra", None), "cuda", None)
    return major >= 9 and hasattr(extra, "gdc_wait")


# Kernels of the step that let the next kernel's programs start as soon as their own
# have started, before their wait (``_await_inputs`` with GDC = 2), instead of after
# it. The next kernel may then run while the kernels before it still run, back to the
# nearest one not in EARLY: before its wait it may read only what was written before
# the replay or before that kernel. Of the reads ahead (``AHEAD``), only down's reads
# what the step wrote (the router's ids, two kernels back), so "gate_up" is never in
# EARLY; a read ahead added later needs this set checked again. Names: "norm", "linear",
# "norm_linear", "rope", "attention", "route", "down", "ranked_sum", "argmax",
# "eighths" (``EARLY_NAMES``). Off: the small kernels (``SMALL_KERNELS``) early made
# the 30B-A3B step (q30) 1,786.6 us against 1,793.1 in benches/step_ab.py (gpu154;
# 1,790.6 against 1,795.2, gpu155), but greedy decode slower (benches/graph_decode.py,
# gpu156: 538.2 tok/s against 563.3, the replay 1,846.4 us against 1,769.1; why is not
# known). Every kernel but gate/up: 1,850.2 in step_ab. The router's top-k alone
# ("route"; gate/up's programs then start while it runs), each configuration alone in
# two processes: faster on q30 with 8 experts a layer (1,734.6 us against 1,741.4,
# gpu174), slower on q30 (1,771.7 against 1,759.6; R0 565.4 tok/s twice against 568.4
# and 569.1, gpu175; docs/benchmarks.md, "Thirty-first session"). A switch for the
# benches' A/B.
EARLY: frozenset[str] = frozenset()
SMALL_KERNELS = frozenset({"norm", "rope", "attention", "route", "ranked_sum", "norm_linear"})
EARLY_NAMES = SMALL_KERNELS | {"linear", "down", "argmax", "eighths"}


def pdl(device: torch.device, kernel: str = "") -> dict[str, Any]:
    """The launch arguments for programmatic dependent launch on ``device`` (none where
    it does not apply: outside ``dependent_launch``, the CPU's interpreter, GPUs before
    Hopper, ``PDL`` off) of ``kernel`` (named as ``EARLY`` names it)."""
    assert "gate_up" not in EARLY, "down reads the router's ids before its wait"
    if not PDL or not getattr(_pdl_scope, "on", False):
        return {}
    if device.type != "cuda" or triton is None:
        return {}
    index = torch.cuda.current_device() if device.index is None else device.index
    if not _pdl_capable(index):
        return {}
    return {"GDC": 2 if kernel in EARLY else True, "launch_pdl": True}


# What each kernel of the resident step reads before its wait under dependent launch,
# besides the constant weights it always reads there (``_await_inputs``: the kernel two
# back has finished by then, unless the kernel before is in ``EARLY``): "down" its
# expert id and whole rows (int4 words, rows of at most four tiles), "attention" the
# position, "norm" the norms' weights, "linear" row scales and biases (and the residual
# as soon as the wait ends). The same bits either way (the CUDA test of dependent
# launch compares the step with and without it). On the H200, 30B-A3B with int8
# attention, one process (benches/step_ab.py, gpu109): all 1,756.0 us a step against
# 1,883.5 with none; without down's 1,875.1, without the products' 1,791.7, without the
# norms' 1,776.6. Measured and taken out: the attention's first block of keys and
# values read ahead as well (1,697.9 us without it: its loop's pipelined loads then
# started only after that block; its position alone 1,695.9 against 1,699.3, gpu110),
# q/k/v RoPE's position, norm weights, cos and sin (1,749.2 without). A set for the
# benches' A/B.
AHEAD = frozenset({"down", "attention", "norm", "linear"})
# Read ahead without dependent launch too: the interpreter tests' A/B of the order.
AHEAD_WITHOUT_PDL = False


def ahead(kernel: str, device: torch.device) -> dict[str, bool]:
    """``AHEAD=True`` for ``kernel``'s launch where it reads ahead (``AHEAD`` names it,
    under dependent launch, or ``AHEAD_WITHOUT_PDL``), else nothing."""
    on = kernel in AHEAD and (AHEAD_WITHOUT_PDL or bool(pdl(device)))
    return {"AHEAD": True} if on else {}


def available() -> str | None:
    """None when the kernels can run, else why not."""
    return None if triton is not None else "Triton is not installed"


def slab_unsupported(scheme: str, group: int) -> str | None:
    """Why the kernels cannot read experts of ``scheme`` (None: they can): an int4
    tile holds whole groups in power-of-two shapes."""
    if scheme == "int4" and (group < 2 or group & (group - 1) or group > GATE_UP_BLOCK[1]):
        return f"int4 groups of {group} (the kernels take powers of two up to 1024)"
    return None


def on_device(device: torch.device) -> contextlib.AbstractContextManager[Any]:
    """Makes ``device`` current where it is a GPU: Triton launches (and graph
    replays) go to the current device's stream, not to their tensors' device."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


@dataclass(slots=True, frozen=True)
class Projection:
    """One projection of every expert of a layer: ``weights`` indexed by
    ``expert * w_expert + row * w_row + col`` (int4: ``col // 2``, two per byte,
    element 2j in the low nibble, stored as q + 8), ``scales`` by
    ``expert * s_expert + row * s_row (+ col // group)``; raw weights have none (the
    weights tensor stands in)."""

    weights: torch.Tensor
    w_expert: int
    w_row: int
    scales: torch.Tensor
    s_expert: int
    s_row: int


@dataclass(slots=True, frozen=True)
class ExpertPool:
    """A layer's experts in one of the layouts above: gate and up [I, H], down [H, I];
    with ``biases`` (gate and up [E, I], down [E, H]) and an activation: SwiGLU, or
    GPT-OSS's clamped one (``act`` 1, with ``alpha`` and ``limit``)."""

    scheme: int
    group: int  # int4 group size (1 otherwise)
    hidden: int
    inter: int
    gate: Projection
    up: Projection
    down: Projection
    biases: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
    act: int = 0
    alpha: float = 0.0
    limit: float = 0.0

    def with_math(self, math: ExpertMath, layer: int) -> ExpertPool:
        """This pool with ``math``'s biases for ``layer`` and its activation."""
        b = math.biases.get(layer)
        biases = None if b is None else (b.gate, b.up, b.down)
        act = ACTIVATIONS[math.act.kind]
        return replace(self, biases=biases, act=act, alpha=math.act.alpha, limit=math.act.limit)

    @property
    def experts(self) -> int:
        return self.gate.weights.shape[0]


def stacked_pool(gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor) -> ExpertPool:
    """Stacked float weights: gate, up [E, I, H], down [E, H, I] (no copy)."""
    _, inter, hidden = gate.shape

    def proj(w: torch.Tensor) -> Projection:
        w = w.contiguous()
        return Projection(w, w.stride(0), w.stride(1), w, 0, 0)

    return ExpertPool(RAW, 1, hidden, inter, proj(gate), proj(up), proj(down))


def slab_pool(
    slabs: torch.Tensor,  # [E, slab_bytes] uint8
    scheme: str,
    group: int,
    shapes: tuple[tuple[int, int], ...],  # (rows, cols) of gate, up, down
    offsets: tuple[int, ...],  # byte offset of each projection inside a slab
) -> ExpertPool:
    """.ftw slabs of int8 or int4 experts (views into ``slabs``, no copy): each
    projection's weights, padded to ``SCALE_ALIGN``, then its scales."""
    code = SCHEMES[scheme]
    stride = slabs.stride(0)
    s_type, s_size = (torch.float32, 4) if code == INT8 else (torch.bfloat16, 2)
    if stride % s_size:
        raise ValueError(f"slab stride {stride} is not a multiple of {s_size}")

    def proj(p: int) -> Projection:
        rows, cols = shapes[p]
        w_row = cols if code == INT8 else cols // 2
        n = rows * w_row
        weights = slabs[:, offsets[p] : offsets[p] + n]
        if code == INT8:
            weights = weights.view(torch.int8)
        s_row = 1 if code == INT8 else cols // group
        at = offsets[p] + n + (-n % SCALE_ALIGN)
        scales = slabs[:, at : at + rows * s_row * s_size].view(s_type)
        return Projection(weights, stride, w_row, scales, stride // s_size, s_row)

    (inter, hidden) = shapes[0]
    gate, up, down = (proj(p) for p in range(3))
    return ExpertPool(code, group if code == INT4 else 1, hidden, inter, gate, up, down)


# Block shapes (rows x columns of a weight tile), one program per tile row block: at
# one token the kernels are matrix-vector products. (rows, columns, warps) of the byte
# and float tiles (raw, int8, int4 groups under 8 or with WORDS off);
# benches/moe_kernel_tune.py measures the alternatives: on the H200, int4 byte tiles at
# one token, gate/up (8, 1024, 4) 979 GB/s against 857 for (16, 512, 4); down's shapes
# all within 818-856 (docs/benchmarks.md, issue 10). The word kernels have their own
# (``WORDS_GATE_UP_BLOCK``, ``WORDS_DOWN_BLOCK``, seventeenth session).
GATE_UP_BLOCK = (8, 1024, 4)
DOWN_BLOCK = (16, 256, 4)
# Float (bf16) pools' gate/up: four rows a program (1,536 programs of 40 registers, 12
# an SM, on the 30B-A3B, compiled by benches/kernel_asm.py; eight rows take 68 and 7):
# the bf16-expert step 2,373.2 us against 2,421.0 (gpu125; int8 and int4 byte tiles keep
# GATE_UP_BLOCK, unmeasured). The same bits at any rows a program (tests, CUDA too).
FLOAT_GATE_UP_BLOCK = (4, 1024, 4)
SUM_BLOCK = 256
# Whole tiles read without a column mask where the row is a whole number of them: int4
# bytes then load 16 at a time, not 8 (False: an A/B in benches/moe_kernel_tune.py).
EVEN_TILES = True
# int4 with groups of 8 or more read as 32-bit words against the vector in the eighths
# layout (``_words_dot``: a logic op, an add and a multiply-add per weight), with their
# own block shapes; False: the byte tiles (``_i4_dot``), for the A/B.
WORDS = True
# gate/up of rows up to ``NARROW_COLS`` wide: four rows a program on two warps, each
# row whole in one tile of 2,048 columns (71 registers, 14 programs an SM, one wave of
# the 30B-A3B's 1,536; 1,160 instructions a warp against 2,080 on one warp; compiled by
# benches/kernel_asm.py). gpu148's stalls had a one-warp program spend over a third of
# its time issuing, mostly after its bytes arrive (by inference); two warps halve that
# work a warp. On the H200, 30B-A3B, the step 1,795.9 us against 1,815.6 with (4, 1024,
# 1), and 1,911.8 with (8, 2048, 4) (gpu149); the kernel alone took the same 7.05 us
# against 7.00. The twenty-fifth session's (4, 1024, 1), from four warps a program:
# the vector is read once a program (on four warps each warp read all of it, four
# times the program's weight bytes), 4.47 M instructions a layer against 3.19 M
# (compiled; that gate/up was bound by its instructions was an inference, put in doubt
# by a tensor-core prototype with ~30% fewer that took as long: docs/benchmarks.md,
# twenty-sixth session); the step 1,809.6 us against 1,836.8 with (4, 512, 4), int8
# attention 1,588.5 against 1,609.8 (gpu139); (4, 512, 1) 1,999.3, (4, 2048, 1)
# 1,841.8, (2, 1024, 1) 1,939.2. The group sums add in an order that follows the
# block: the same bf16 output in the CUDA test, fp32 within a rounding. Wider rows keep
# ``WORDS_GATE_UP_WIDE`` (unmeasured against the others there).
WORDS_GATE_UP_BLOCK = (4, 2048, 2)
WORDS_GATE_UP_WIDE = (4, 512, 4)
NARROW_COLS = 2048
WORDS_DOWN_BLOCK = (16, 256, 4)
# int4 words: each gate/up program loads every tile of its gate and up rows at once
# (rows of at most four tiles), then dots them in the loop's order: the same bits, one
# memory round trip instead of one per tile (the ids it needs come from the kernel just
# before, so unlike down's rows these cannot be read ahead of the wait). Compiled for
# sm_90 on one warp, ptxas issues the second tile's loads after the first tile's
# products; pinning most of them first was slower (8.44 us a launch against 6.99,
# gpu147). With four rows a program on four warps (the block before the twenty-fifth
# session; 68 registers, 7 programs an SM; eight rows take 125 and 4): on the H200,
# 30B-A3B, the step 1,616.2 us against 1,662.7 with the loop of (8, 512, 4) (int8
# attention; bf16 attention 1,843.7 against 1,886.2); (8, 512, 4) loaded at once
# 1,657.0, the loop of (4, 512, 4) 1,691.5 (gpu119, docs/benchmarks.md).
WHOLE_GATE_UP = True
# gate/up letting down's programs start once its own rows are in and dotted, instead of
# at its wait (down reads its whole rows before its wait, and those reads share the
# memory with gate/up's), as the cluster norm starts q/k/v late
# (``fused.CLUSTER_NORM_LATE``): measured slower and taken out, 1,813.2 us a step on q30
# against 1,737.9 (gpu184, alone in two processes each). Down's rows read before its
# wait save more than they cost gate/up.
# gate/up reading guessed experts' rows before its wait (the guess checked after it,
# so the same bits) was built and measured slower, even with every guess right: on
# the H200, 30B-A3B with 8 experts a layer, 1,825.9 us a step against 1,740.7 (gpu173;
# docs/benchmarks.md, "Thirty-first session"). Taken out.


def _even(cols: int, block: int) -> bool:
    return EVEN_TILES and cols % block == 0


def _words(pool: ExpertPool) -> bool:
    return WORDS and pool.scheme == INT4 and pool.group >= 8


def eighths_buffer(pool: ExpertPool, tokens: int, device: torch.device) -> torch.Tensor | None:
    """A buffer for ``tokens`` inputs of ``pool``'s experts in the eighths layout, or
    None where its kernels do not read that layout."""
    if not _words(pool):
        return None
    return _eighths_empty(tokens, pool.hidden, device)


def _eighths_empty(rows: int, cols: int, device: torch.device) -> torch.Tensor:
    """``rows`` vectors of ``cols`` in the eighths layout, unwritten: fp32 [rows, 8 *
    stride]. Each row's entries past cols / 8 are padding no kernel reads (tests fill
    them with NaN through this function)."""
    return torch.empty(rows, 8 * _eighths_stride(cols), dtype=torch.float32, device=device)


def words_gate_up_block(hidden: int) -> tuple[int, int, int]:
    """The int4 word kernel's gate/up block for rows of ``hidden`` columns."""
    return WORDS_GATE_UP_BLOCK if hidden <= NARROW_COLS else WORDS_GATE_UP_WIDE


def _blocks(
    words: bool, scheme: int, hidden: int
) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """(gate/up, down) block shapes of a pool of ``scheme`` and ``hidden`` columns."""
    if words:
        return words_gate_up_block(hidden), WORDS_DOWN_BLOCK
    return (FLOAT_GATE_UP_BLOCK if scheme == RAW else GATE_UP_BLOCK), DOWN_BLOCK


def _eighths_stride(cols: int) -> int:
    """Entries per row of a vector's eighths layout: cols / 8 rounded up to 16, so every
    row starts 64-byte aligned (the word kernels' loads are 16 bytes wide)."""
    return -(-cols // 128) * 16


def eighths(x: torch.Tensor) -> torch.Tensor:
    """x [T, C] (C a multiple of 8) in the word kernels' layout, fp32 [T, 8 * stride]:
    row k of token t holds x[t, 8m + k] * 2^E (``eighths_kernel``); one launch."""
    tokens, cols = x.shape
    stride = _eighths_stride(cols)
    out = _eighths_empty(tokens, cols, x.device)
    block = triton.next_power_of_2(cols)
    eighths_kernel[(tokens,)](
        x, out, cols, stride, BLOCK=block, num_warps=max(1, min(8, block // 256)),
        **pdl(x.device, "eighths"),
    )  # fmt: skip
    return out


def _args(p: Projection) -> tuple[Any, ...]:
    return (p.weights, p.w_expert, p.w_row, p.scales, p.s_expert, p.s_row)


def _cols(block: int, group: int) -> int:
    return max(block, group)  # an int4 tile holds whole groups


def moe_experts(
    x: torch.Tensor,  # [T, H] in the model dtype
    ids: torch.Tensor,  # [T, K] int64, router-rank order
    weights: torch.Tensor,  # [T, K] routing weights
    pool: ExpertPool,
    scratch: tuple[torch.Tensor, torch.Tensor] | None = None,  # [T*K, I], [T*K, H] f32
    out: torch.Tensor | None = None,  # [T, H] result (fixed address for graphs)
    x_eighths: torch.Tensor | None = None,  # ``eighths(x)``, where the caller has it
) -> torch.Tensor:
    """sum over k of weights[t, k] * expert_{ids[t, k]}(x[t]) -> [T, H] in x's dtype.
    ``scratch``: the activations and per-rank outputs (given: fixed addresses; the word
    kernels keep their activations in the eighths layout, in a buffer of their own)."""
    assert triton is not None, "check available() first"
    with on_device(x.device):
        return _launch(x, ids, weights, pool, scratch, out, x_eighths)


def _launch(
    x: torch.Tensor,
    ids: torch.Tensor,
    weights: torch.Tensor,
    pool: ExpertPool,
    scratch: tuple[torch.Tensor, torch.Tensor] | None,
    out: torch.Tensor | None,
    x_eighths: torch.Tensor | None = None,
) -> torch.Tensor:
    tokens, top_k = ids.shape
    h_dim, i_dim = pool.hidden, pool.inter
    if scratch is None:
        scratch = (
            torch.empty(tokens * top_k, i_dim, dtype=x.dtype, device=x.device),
            torch.empty(tokens * top_k, h_dim, dtype=torch.float32, device=x.device),
        )
    hidden, per_rank = scratch
    if out is None:
        out = torch.empty(tokens, h_dim, dtype=x.dtype, device=x.device)
    x, ids, weights = x.contiguous(), ids.contiguous(), weights.contiguous()
    _pair_outputs(x, ids, pool, hidden, per_rank, x_eighths)
    return _ranked_sum(per_rank, weights, out)


def moe_pair_outputs(
    x: torch.Tensor,  # [T, H] in the model dtype
    ids: torch.Tensor,  # [T, K] int64, router-rank order
    pool: ExpertPool,
    scratch: tuple[torch.Tensor, torch.Tensor],  # [T*K, I], [T*K, H] f32
    x_eighths: torch.Tensor | None = None,
) -> torch.Tensor:
    """``moe_experts`` without its ranked sum: each (token, rank) pair's expert output
    [T*K, H] fp32 (in ``scratch``), for a caller that adds them itself
    (``fused.ranked_add_rms_norm``)."""
    assert triton is not None, "check available() first"
    hidden, per_rank = scratch
    with on_device(x.device):
        _pair_outputs(x.contiguous(), ids.contiguous(), pool, hidden, per_rank, x_eighths)
    return per_rank


def _pair_outputs(
    x: torch.Tensor,  # [T, H] in the model dtype
    ids: torch.Tensor,  # [T, K] int64 pool slots
    pool: ExpertPool,
    hidden: torch.Tensor | None,  # [T*K, I] in x's dtype: the activations (None: made)
    y: torch.Tensor,  # [T*K, H] fp32: each pair's expert output, rounded to x's dtype
    x_eighths: torch.Tensor | None = None,  # ``eighths(x)``, where the caller has it
) -> None:
    """gate/up, then down, of every (token, rank) pair: two launches. The word kernels
    keep x and the activations in the eighths layout (a buffer of their own, not
    ``hidden``)."""
    tokens, top_k = ids.shape
    h_dim, i_dim = pool.hidden, pool.inter
    pairs, code, group = tokens * top_k, pool.scheme, pool.group
    gate_b, up_b, down_b = pool.biases or (x, x, x)  # x: never read without biases
    has_bias = pool.biases is not None
    words = _words(pool)
    xs = hs = 0
    vector = x
    if words:
        xs, hs = _eighths_stride(h_dim), _eighths_stride(i_dim)
        if x_eighths is None:
            x_eighths = eighths(x)
        assert x_eighths.shape == (tokens, 8 * xs) and x_eighths.is_contiguous()
        vector = x_eighths
        hidden = _eighths_empty(pairs, i_dim, x.device)
    elif hidden is None:
        hidden = torch.empty(pairs, i_dim, dtype=x.dtype, device=x.device)
    (bn, bk, warps), down_block = _blocks(words, code, h_dim)
    bk = _cols(bk, group)
    tiles = triton.cdiv(h_dim, bk)  # gate/up's rows loaded at once: int4 words, <= 4 tiles
    whole = tiles if words and tiles <= 4 and WHOLE_GATE_UP else 0
    gate_up_kernel[(pairs, triton.cdiv(i_dim, bn))](
        vector, ids, hidden, *_args(pool.gate), *_args(pool.up), gate_b, up_b, h_dim,
        i_dim, xs, hs, pool.alpha, pool.limit, OUT=_DTYPES[x.dtype], TOPK=top_k,
        SCHEME=code, GROUP=group, BN=bn, BK=bk, HAS_BIAS=has_bias,
        ACT=pool.act, EVEN=_even(h_dim, bk), WORDS=words, WHOLE=whole,
        num_warps=warps, **pdl(x.device, "gate_up"),
    )  # fmt: skip
    bn, bk, warps = down_block
    bk = _cols(bk, group)
    tiles = triton.cdiv(i_dim, bk)  # down's rows read ahead whole: int4 words, <= 4 tiles
    read_ahead = tiles if words and tiles <= 4 and ahead("down", x.device) else 0
    down_kernel[(pairs, triton.cdiv(h_dim, bn))](
        hidden, ids, y, *_args(pool.down), down_b, h_dim, i_dim, hs,
        OUT=_DTYPES[x.dtype], SCHEME=code, GROUP=group, BN=bn, BK=bk,
        HAS_BIAS=has_bias, EVEN=_even(i_dim, bk), WORDS=words, AHEAD=read_ahead,
        num_warps=warps, **pdl(x.device, "down"),
    )  # fmt: skip


def _ranked_sum(
    per_rank: torch.Tensor,  # [T*K, H] fp32, pair t*K + k
    weights: torch.Tensor,  # [T, K] contiguous
    out: torch.Tensor,  # [T, H]
) -> torch.Tensor:
    tokens, top_k = weights.shape
    h_dim = out.shape[1]
    ranked_sum_kernel[(tokens, triton.cdiv(h_dim, SUM_BLOCK))](
        per_rank, weights, out, h_dim, TOPK=top_k, BS=SUM_BLOCK, **pdl(out.device, "ranked_sum")
    )
    return out


def ranked_sum(per_rank: torch.Tensor, weights: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[T, H] in ``dtype``: each token's K per-rank outputs ``per_rank`` [T*K, H] fp32
    times ``weights`` [T, K], added in rank order in fp32 and cast once, in one launch
    (``flint.models.moe.weighted_sum(...).to(dtype)`` in ~15 small ops; the kernel may
    fuse a multiply and its add, so the two agree within rounding)."""
    assert triton is not None, "check available() first"
    out = torch.empty(weights.shape[0], per_rank.shape[1], dtype=dtype, device=per_rank.device)
    with on_device(per_rank.device):
        return _ranked_sum(per_rank.contiguous(), weights.contiguous(), out)


def aligned_views(
    parts: list[list[int]], dtype: torch.dtype, device: torch.device
) -> list[torch.Tensor]:
    """``parts`` as tensors on ``device`` in one copy, each view starting 16-byte aligned:
    Triton compiles a kernel per pointer alignment (16 bytes or not), so views at
    offsets that vary from call to call would compile it again mid-run."""
    per = 16 // torch.empty((), dtype=dtype).element_size()
    flat: list[int] = []
    at = []
    for part in parts:
        at.append(len(flat))
        flat += part + [0] * (-len(part) % per)
    whole = torch.tensor(flat, dtype=dtype)
    if device.type == "cuda":  # page-locked: no wait for the stream (a pageable copy waits)
        whole = whole.pin_memory().to(device, non_blocking=True)
    return [whole[a : a + len(part)] for a, part in zip(at, parts, strict=True)]


def slot_outputs(
    x: torch.Tensor,  # [T, H] in the model dtype
    pairs: list[int],  # (token, rank) pairs to compute: t * K + k
    slots: list[int],  # the pool slot of each
    top_k: int,
    pool: ExpertPool,
    out: torch.Tensor,  # [T*K, H] fp32: the pairs' rows written, others untouched
) -> None:
    """Each listed pair's expert output (rounded to the model dtype, in fp32) by the slot
    kernels, as ``moe_experts`` computes it before its ranked sum (no biases: the
    kernels look them up by slot)."""
    assert triton is not None and pool.biases is None
    if not pairs:
        return
    tokens = [p // top_k for p in pairs]
    rows, ids, at = aligned_views([pairs, slots, tokens], torch.int64, x.device)
    ids = ids[:, None]
    xs = x.index_select(0, at).contiguous()
    n = len(pairs)
    y = torch.empty(n, pool.hidden, dtype=torch.float32, device=x.device)
    with on_device(x.device):
        _pair_outputs(xs, ids, pool, None, y)
    out.index_copy_(0, rows, y)


DEQUANT_BLOCK = (32, 128)  # rows x columns of the weights one program dequantizes


def dequantize(pool: ExpertPool, p: int, experts: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Projection ``p`` (0 gate, 1 up, 2 down) of each of ``experts`` (int64 slot
    indices on the pool's device) in ``dtype``, [N, rows, cols], by the file's rule
    (the value or nibble - 8, times its scale in fp32, rounded once): one launch."""
    assert triton is not None and pool.scheme != RAW, "int8/int4 slab pools only"
    proj = (pool.gate, pool.up, pool.down)[p]
    rows, cols = (pool.inter, pool.hidden) if p < 2 else (pool.hidden, pool.inter)
    out = torch.empty(len(experts), rows, cols, dtype=dtype, device=experts.device)
    br, bc = DEQUANT_BLOCK
    grid = (len(experts), triton.cdiv(rows, br), triton.cdiv(cols, bc))
    with on_device(experts.device):
        dequant_kernel[grid](
            *_args(proj), experts, out, rows, cols, SCHEME=pool.scheme, GROUP=pool.group,
            BR=br, BC=bc,
        )  # fmt: skip
    return out
