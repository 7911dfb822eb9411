"""The decode step's small ops fused into one Triton kernel each: RMSNorm, a head's
q/k norm with RoPE (written straight into the KV cache for keys and values), and the
softmax router. Eager decode spends a kernel launch per elementwise op (an RMSNorm is
seven, RoPE five per tensor); in a graph each launch still costs a few microseconds of
GPU time, so the step fuses them. Each follows its torch counterpart's ops and
roundings to the model dtype; only the order of a sum's adds differs (a row's sum of
squares, the router's softmax, and the product with the router's rows where
``norm_linear`` makes the norm and that product in one launch). On Hopper the MoE
block's ranked sum and the next norm are one launch of a thread-block cluster
(``ranked_add_rms_norm``), whose programs add their sums of squares through each
other's shared memory."""

from __future__ import annotations

import functools
import threading
from types import SimpleNamespace
from typing import Any

import torch

from flint.graphs.moe_kernel import _DTYPES, ahead, on_device, pdl
from flint.graphs.triton_kernels import (
    argmax_blocks_kernel,
    argmax_kernel,
    attention_combine_kernel,
    decode_attention_kernel,
    head_rope_kernel,
    linear_kernel,
    norm_linear_kernel,
    norm_route_kernel,
    qkv_rope_kernel,
    ranked_norm_kernel,
    rms_norm_kernel,
    route_kernel,
    triton,
)

# The router in one pass on one warp: one (value, index) reduction per pick, the top-k
# sum added as they are picked, instead of two reductions per pick and a second pass
# across four warps (a reduction across warps goes through shared memory and a
# barrier). The softmax's sum follows the warps, so on a GPU the weights may differ
# from the four-warp kernel's in the last bit (the picks follow the probabilities as
# before); every path of the step uses the same one. False for an A/B in
# benches/step_ab.py.
ROUTE_ONE_PASS = True
# The one-pass router's picks without a chain of TOPK dependent reductions, on
# ROUTE_RANK_WARPS warps (0: the chain above, on one warp): ROUTE_RANKS 2 takes a
# bitonic top-k of (probability, id) keys (``tl.topk``), 1 counts every expert's rank
# with one all-pairs compare and reads the picks out by rank. For the same
# probabilities the same picks, and on one warp the same weights; on more, the
# softmax's sum follows the warps (within a rounding), and every path of the step uses
# the same kernel. On q30, each alone in two processes (gpu170): the bitonic top-k on
# two warps 1,758.2 us a step, on one 1,760.0, on four 1,760.3, rank counting on four
# 2,011.6, the chain 1,777.5; R0 569.2 tok/s against 562.8-562.9.
ROUTE_RANK_WARPS = 2
ROUTE_RANKS = 2

# T = tokens, H = hidden, N = heads, D = head dim, E = experts, K = top-k (and the
# input features of ``linear``, whose output features are N)


def _block(n: int) -> int:
    assert triton is not None
    return int(triton.next_power_of_2(n))


# The norms' warps: 8 against Triton's default 4, one 16-byte load per thread of a
# 2048-wide row (the 30B-A3B step: 1,892.4 against 1,932.9 us, gpu100; 1,898.5 against
# 1,918.7, gpu101; 2 warps 1,978.4, 16 1,900.5). A dict for the benches' A/B.
NORM_LAUNCH: dict[str, int] = {"num_warps": 8}
NORM_LINEAR_WARPS = 4  # ``norm_linear``'s (8: 1,900.2 against 1,898.5 us, gpu101)
# ``qkv_rope``'s and ``head_rope``'s warps: one per head's program (the step 1,891.2
# against 1,898.5 us with four, gpu101); a dict for the benches' A/B
ROPE_LAUNCH: dict[str, int] = {"num_warps": 1}
# Which launch asks the L2 for the attention's earlier keys and values before its wait
# (Hopper's bulk prefetch under dependent launch; a hint, the same bits): "rope" (the
# key and value programs of ``qkv_rope``, the first ``ATTENTION_CHUNK`` rows of their
# head), "attention" (each program its chunk's), or "" (none). The 30B-A3B step alone
# in two processes (gpu176): 1,745.8 us with "rope", 1,748.0 with "attention", 1,753.8
# without; with bf16 o's whole rows also read ahead, 1,808.2.
KV_ASK = "rope"


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    weight_in_fp32: bool = False,
    eighths: torch.Tensor | None = None,
) -> torch.Tensor:
    """x [T, H] -> ``flint.models.norm.rms_norm(x, weight, eps, weight_in_fp32)``; also
    written into ``eighths`` [T, 8 * stride] when given, in the word kernels' layout
    (``moe_kernel.eighths`` of the output, in the same launch)."""
    x = x.contiguous()
    out = torch.empty_like(x)
    n = x.shape[1]
    e_stride = 0 if eighths is None else eighths.shape[1] // 8
    with on_device(x.device):
        rms_norm_kernel[(x.shape[0],)](
            x, x, x, weight, out, n, eps, x if eighths is None else eighths, e_stride,
            BLOCK=_block(n), W32=weight_in_fp32, ADD=False, EIGHTHS=eighths is not None,
            **NORM_LAUNCH, **ahead("norm", x.device), **pdl(x.device, "norm"),
        )  # fmt: skip
    return out


def add_rms_norm(
    x: torch.Tensor,
    delta: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    weight_in_fp32: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The residual sum s = x + delta [T, H] (torch's add) and ``rms_norm(s, ...)``, in
    one kernel: (s, normed)."""
    x, delta = x.contiguous(), delta.contiguous()
    total, out = torch.empty_like(x), torch.empty_like(x)
    n = x.shape[1]
    with on_device(x.device):
        rms_norm_kernel[(x.shape[0],)](
            x, delta, total, weight, out, n, eps, x, 0, BLOCK=_block(n), W32=weight_in_fp32,
            ADD=True, **NORM_LAUNCH, **ahead("norm", x.device), **pdl(x.device, "norm"),
        )  # fmt: skip
    return total, out


# The MoE block's ranked sum made by the next norm's launch (``ranked_add_rms_norm``):
# eight programs launched as one thread-block cluster, each summing the ranks of an
# eighth of the columns and adding the residual, which add their partial sums of squares
# through each other's shared memory (``_cluster_sum``) and norm their columns. One
# launch a layer fewer, without one program reading all eight ranks (a one-program fold
# was slower: docs/benchmarks.md, gpu101). Hopper and later; False: the ranked sum's own
# launch, then the norm's (an A/B in benches). On q30 the step took 1,745.0 us with it
# against 1,745.8 without, and 1,736.2 with the next kernel started late (gpu182;
# ``CLUSTER_NORM_LATE`` below). The router's top-k made the same way by its product's
# launch was 196 us a step slower (gpu181) and was taken out.
CLUSTER_NORM = True
CLUSTER_PROGRAMS = 8  # programs a cluster: ``_cluster_sum`` adds eight parts
CLUSTER_NORM_WARPS = 4  # Triton's default; other counts not measured
# When the cluster's programs let the next kernel's start (``ranked_norm_kernel``'s
# ``LATE``): 0 at their wait, 1 once the ranks' rows are in, 2 once the sums of squares
# are exchanged. q/k/v's programs read their weights before their wait; by inference
# (no timeline was taken with 1), those reads slowed the cluster's own. On q30 (gpu182,
# alone in two processes each) 1,736.2 us a step with 1, 1,745.0 with 0, 1,752.8 with 2
# (1,745.8 without the cluster); R0 583.5 tok/s with 1, 580.7 with 0, 578.2 without.
# With the asynchronous exchange (``CLUSTER_ASYNC``) the order flips: 1,715.2 us with
# 0, 1,723.8 with 1, 1,745.5 with 2 (gpu187), so 0 since the thirty-fourth session.
CLUSTER_NORM_LATE = 0
# How that cluster's programs exchange their sums of squares (``_cluster_sum``): True,
# asynchronous stores counted off each receiver's transaction barrier, on which only
# the receiver waits; False, plain stores into each other's shared memory made visible
# by a cluster barrier (release, acquire; its release compiles to a fence over the
# whole GPU's memory, ``MEMBAR.ALL.GPU``, that waits for the thread's earlier stores).
# A chain of cluster launches (benches/launch_floor.py, gpu184): 0.92 us a launch with
# True against 1.16-1.19 with False (0.62-0.63 for eight programs without a cluster).
# On q30 the step took 1,724.0 us with True against 1,737.9 (gpu184, alone in two
# processes each).
CLUSTER_ASYNC = True
_cluster_lock = threading.Lock()


def ranked_norm_fits(device: torch.device) -> bool:
    """Whether the step leaves a MoE block's ranked sum to the next norm's launch
    (``ranked_add_rms_norm``), with ``CLUSTER_NORM`` on: on a GPU that launches
    thread-block clusters (Hopper and later, a launcher ``_as_cluster`` can set), or in
    the CPU interpreter (one program: the tests of the fold)."""
    if not CLUSTER_NORM:
        return False
    return device.type == "cpu" or (device.type == "cuda" and _launches_clusters(device))


def _launches_clusters(device: torch.device) -> bool:
    index = torch.cuda.current_device() if device.index is None else device.index
    nvidia = torch.version.hip is None  # ROCm reports its GPUs as 9.x too
    return nvidia and _capability(index) >= 9 and _launcher_makes_clusters()


@functools.cache
def _launcher_makes_clusters() -> bool:
    """Whether Triton's CUDA launcher takes the packed metadata ``_as_cluster`` sets:
    (warps, programs a cluster, shared memory), launching grid x programs-a-cluster
    programs in clusters (Triton 3.6 and 3.9 do; older launchers packed cluster
    dimensions of their own, and their kernels launch as before)."""
    try:
        from triton.backends.nvidia.compiler import CUDABackend
    except ImportError:  # pragma: no cover - depends on the environment
        return False
    probe = SimpleNamespace(num_warps=4, num_ctas=8, shared=0, cluster_dims=(1, 1, 1))
    try:
        packed = CUDABackend.pack_metadata(None, probe)  # uses no state of its own
    except (AttributeError, TypeError):
        return False
    return tuple(packed) == (4, 8, 0)


@functools.cache
def _capability(index: int) -> int:
    return int(torch.cuda.get_device_capability(index)[0])


def ranked_add_rms_norm(
    x: torch.Tensor,  # [1, H] the residual
    rows: torch.Tensor,  # [K, H] fp32: each rank's expert output (``moe_pair_outputs``)
    weights: torch.Tensor,  # [1, K] the routing weights
    norm_weight: torch.Tensor,
    eps: float,
    weight_in_fp32: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``add_rms_norm(x, delta, ...)`` where delta is the MoE block's output, the ranks'
    rows times their weights added in rank order (``moe_kernel.ranked_sum``'s bits), in
    one launch: (x + delta, its norm). The norm's sum of squares adds eight partial
    sums on a GPU (``CLUSTER_PROGRAMS``), the row's ``tl.sum`` on the CPU."""
    tokens, n = x.shape
    top_k = weights.shape[1]
    assert tokens == 1 and rows.shape == (top_k, n) and rows.is_contiguous()
    x, weights = x.contiguous(), weights.contiguous()
    total, out = torch.empty_like(x), torch.empty_like(x)
    cpu = x.device.type == "cpu"
    cluster = 1 if cpu else CLUSTER_PROGRAMS
    args = (rows, weights, x, total, norm_weight, out, n, eps)
    meta: dict[str, Any] = dict(
        TOPK=top_k, BS=_block(-(-n // cluster)), W32=weight_in_fp32, CLUSTER=cluster,
        num_warps=CLUSTER_NORM_WARPS, **ahead("norm", x.device), **pdl(x.device, "norm"),
        LATE=CLUSTER_NORM_LATE, ASYNC=CLUSTER_ASYNC,
    )  # fmt: skip
    with on_device(x.device):
        if cpu:
            ranked_norm_kernel[(1,)](*args, **meta)
        else:
            _cluster_launch(ranked_norm_kernel, cluster, args, meta)
    return total, out


def _cluster_launch(kernel: Any, ctas: int, args: tuple[Any, ...], meta: dict[str, Any]) -> None:
    """``kernel`` launched as one thread-block cluster of ``ctas`` programs (program ids
    0..ctas-1). Triton's own clusters (``num_ctas``) spread each tensor over the
    cluster's programs and fail to compile reductions, so the kernel is compiled for
    one program as usual and only its launch changes: Triton's launcher makes
    ``grid * num_ctas`` programs in clusters of ``num_ctas`` from the compiled
    kernel's packed metadata, which is set here. The kernel must be launched no other
    way (its cached compiled form is set for clusters). Under a lock, so that no other
    thread compiles the same kernel again between the setting and the launch; the
    launch must be of the object set."""
    with _cluster_lock:
        compiled = kernel.warmup(*args, grid=(1,), **meta)
        if hasattr(compiled, "result"):  # compiled in the background
            compiled = compiled.result()
        _as_cluster(compiled, ctas)
        launched = kernel[(1,)](*args, **meta)
    if launched is not compiled:
        raise RuntimeError("the cluster kernel launched is not the one set for clusters")


def _as_cluster(compiled: Any, ctas: int) -> None:
    """The compiled kernel's launches made clusters of ``ctas``: its packed metadata
    (warps, ctas, shared memory), as Triton's launcher takes it where
    ``_launcher_makes_clusters``. The launcher sizes its scratch buffers for one
    program a cluster, so a kernel that has any is refused."""
    packed = tuple(compiled.packed_metadata)
    if len(packed) != 3 or packed[1] not in (1, ctas):
        raise RuntimeError(f"Triton's launcher packs {packed}, not (warps, ctas, shared)")
    metadata = getattr(compiled, "metadata", None)
    for scratch in ("global_scratch_size", "profile_scratch_size"):
        if getattr(metadata, scratch, 0):
            raise RuntimeError(f"a cluster kernel with {scratch} {getattr(metadata, scratch)}")
    compiled.packed_metadata = (packed[0], ctas, packed[2])


# (rows per program, columns per step, warps) of the one-token matrix-vector kernel by
# weight scheme, when set (benches/linear_tune.py sets them); else ``linear_block``
LINEAR_BLOCK: dict[str, tuple[int, int, int]] = {}

# Float q/k/v-shaped products read after the wait, four whole rows a program on eight
# warps (True), or two rows on four warps read before it (False, the default). In one
# process (benches/step_ab.py) the first was faster on the 30B-A3B (q30): 1,787.7 us a
# step against 1,796.9 (gpu158), 1,785.1 against 1,792.0 (gpu159), 1,783.9 against
# 1,794.2 and at graph_decode's positions 1,766.4 against 1,773.7 (gpu160); no faster
# on a fourth box (1,795.2 against 1,795.6, gpu161). Greedy decode was slower
# (benches/graph_decode.py R0, two processes a box, both orders): 557.9 tok/s against
# 563.5 (gpu159), 557.8 against 563.4 (gpu160). Three captures of the defaults in one
# process spanned 8.5 us a step (gpu162): the step's gain is of that size, the R0's
# loss (17.8 us a token by tok/s) larger, in two pairs of processes. Off, as the R0
# read; a switch for the A/B (docs/benchmarks.md, "Twenty-eighth session"). Since then
# (gpu167): configurations sharing step_ab's process time apart from each alone, even
# the other way round, so the R0 is the reading to trust here.
QKV_AFTER_WAIT = False


def linear_block(rows: int, cols: int, int8: bool) -> tuple[int, int, int]:
    """The block shape by matrix shape, from benches/linear_tune.py and the step's A/B
    on the H200 (docs/benchmarks.md, issue 10). An LM head (151936 x 2048): 8 or 16
    rows a program. int8 products and small ones such as the router: two rows a
    program, 2048 columns a step, four warps (int8 o 5.69 us against 6.32 with
    (4, 1024, 4), the router 2.08 against 2.96; the int8 step 1,985.5 against 2,022.7
    us, gpu99). bf16 matrices of more rows than columns, at most 2048 of them, such as
    q/k/v (5120 x 2048): two whole rows a program, all read before the wait (the bf16
    step 1,826.8 us against 1,843.7 with four rows and 512 columns a step, gpu130), or
    with ``QKV_AFTER_WAIT`` four whole rows on eight warps read after it.
    bf16 o (2048 x 4096) keeps 4 rows and 1024 columns: its whole rows read before the
    wait, while the attention runs, were slower (1,902.5 us with one row a program,
    gpu130; gpu101's whole rows for both products 2,105.7 against 2,051.3)."""
    if rows > 16384:  # an LM head
        return (16, 512, 8) if int8 else (8, 1024, 8)
    if QKV_AFTER_WAIT and _bf16_qkv(rows, cols, int8):
        return (4, 2048, 8)
    if int8 or rows <= 1024 or (cols < rows and cols <= 2048):
        return (2, 2048, 4)
    return (4, 1024, 8) if cols >= 4096 else (4, 512, 4)


def first_tile_ahead(rows: int, cols: int, int8: bool) -> bool:
    """Whether ``linear_kernel`` reads its first weight tile before its wait: every
    product but bf16 q/k/v with ``QKV_AFTER_WAIT``."""
    return not (QKV_AFTER_WAIT and _bf16_qkv(rows, cols, int8))


def _bf16_qkv(rows: int, cols: int, int8: bool) -> bool:
    """A bf16 (or other float) product shaped like q/k/v: more rows than columns, at most
    2048 columns, not a router (1024 rows or fewer) nor an LM head."""
    return not int8 and 1024 < rows <= 16384 and cols < rows and cols <= 2048


def linear(
    x: torch.Tensor,  # [1, K] in the model dtype
    weight: torch.Tensor,  # [N, K]: the model dtype, or int8 with ``scale``
    bias: torch.Tensor | None = None,  # [N]
    residual: torch.Tensor | None = None,  # [1, N], added after the product's rounding
    scale: torch.Tensor | None = None,  # [N] fp32 row scales of int8 weights
    out: torch.Tensor | None = None,  # [1, N] (any float dtype: the result is rounded
    # to x's dtype first)
) -> torch.Tensor:
    """One token's ``residual + F.linear(x, weight * scale, bias)`` with each op rounded
    as torch rounds it, in one kernel that reads the weights once (at batch 1 a
    matrix-vector product is bound by them). Under ``dependent_launch`` the kernel
    reads its first weight tile before the kernel before it has finished: ``weight``
    must be constant (no kernel of the step writes it)."""
    rows, cols = weight.shape
    assert x.shape == (1, cols) and weight.stride(1) == 1, (x.shape, weight.shape)
    int8 = weight.dtype == torch.int8
    assert int8 == (scale is not None), "int8 weights take row scales (and only they)"
    if out is None:
        out = torch.empty(1, rows, dtype=x.dtype, device=x.device)
    assert out.shape == (1, rows) and out.is_contiguous(), (out.shape, rows)
    bn, bk, warps = LINEAR_BLOCK.get("int8" if int8 else "bf16") or linear_block(rows, cols, int8)
    x = x.contiguous()
    with on_device(x.device):
        linear_kernel[(triton.cdiv(rows, bn),)](
            x, weight, weight.stride(0), x if scale is None else scale,
            x if bias is None else bias, x if residual is None else residual.contiguous(),
            out, rows, cols, ROUND=_DTYPES[x.dtype], SCHEME=int(int8),
            HAS_BIAS=bias is not None, HAS_RES=residual is not None,
            BN=bn, BK=min(bk, _block(cols)), num_warps=warps, **ahead("linear", x.device),
            FIRST_AHEAD=first_tile_ahead(rows, cols, int8),
            **pdl(x.device, "linear"),
        )  # fmt: skip
    return out


NORM_LINEAR_ROWS = 2  # rows per program of ``norm_linear`` (whole rows)
NORM_LINEAR_COLS = 4096  # the widest rows it takes (each program holds two and the norm)


def norm_linear(
    h: torch.Tensor,  # [1, K] in the model dtype
    norm_weight: torch.Tensor,  # [K]
    eps: float,
    weight: torch.Tensor,  # [N, K] in h's dtype
    weight_in_fp32: bool = False,
    eighths: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(``linear(normed, weight)``, normed) for normed = ``rms_norm(h, norm_weight,
    eps, weight_in_fp32)`` (also written into ``eighths`` when given), in one launch:
    every program normalises h itself, so no launch of its own waits for the norm (the
    router after the post-attention norm). The norm's sum and the product's are added
    in this kernel's order, not ``rms_norm``'s and ``linear``'s."""
    rows, cols = weight.shape
    assert h.shape == (1, cols) and weight.dtype == h.dtype and weight.stride(1) == 1
    assert cols <= NORM_LINEAR_COLS, cols
    h = h.contiguous()
    normed = torch.empty_like(h)
    out = torch.empty(1, rows, dtype=h.dtype, device=h.device)
    e_stride = 0 if eighths is None else eighths.shape[1] // 8
    with on_device(h.device):
        norm_linear_kernel[(triton.cdiv(rows, NORM_LINEAR_ROWS),)](
            h, weight, weight.stride(0), norm_weight, out, normed,
            h if eighths is None else eighths, e_stride, rows, cols, eps,
            ROUND=_DTYPES[h.dtype], BN=NORM_LINEAR_ROWS, BLOCK=_block(cols),
            W32=weight_in_fp32, EIGHTHS=eighths is not None, num_warps=NORM_LINEAR_WARPS,
            **ahead("norm", h.device), **pdl(h.device, "norm_linear"),
        )  # fmt: skip
    return out, normed


# The router's top-k made by its product's launch (``norm_route``): the programs of one
# thread-block cluster make the logits and send them into program 0's shared memory by
# asynchronous stores (``_route_gather``), and program 0 picks. One launch a MoE layer
# fewer. The thirty-third session's form (eight programs of 16 rows on four warps, 255
# registers a thread, the logits through global memory and a cluster barrier) was 196
# us a step slower on q30 (gpu181): by inference, programs that large could not start
# beside o's and read their rows after it. Programs a cluster (8 or 16; 16 is beyond
# the portable size, which Triton's launcher allows on Hopper), and warps a program;
# 0: the top-k's own launch. This form (16 programs of 8 rows, 128 registers a thread
# on four warps, compiled) is right on the GPU but still slower on q30: 1,726.4 us a
# step against 1,714.7 with the top-k's own launch, 1,728.3 on eight warps (gpu189,
# alone in two processes each). Off: an A/B (docs/benchmarks.md, "Thirty-fifth
# session").
CLUSTER_ROUTE = 0
CLUSTER_ROUTE_WARPS = 4
CLUSTER_ROUTE_REGS = 16384  # the most weights a program holds (rows x columns, padded)


def norm_route_fits(device: torch.device, experts: int, cols: int) -> bool:
    """Whether ``norm_route`` takes a router of ``experts`` rows of ``cols``: in the CPU
    interpreter (one program) or on a GPU that launches clusters, with ``CLUSTER_ROUTE``
    on and the one-pass router ranking its picks, each program holding at most
    ``CLUSTER_ROUTE_REGS`` weights, at most 256 experts (the exchange area's)."""
    if not CLUSTER_ROUTE or not (ROUTE_ONE_PASS and ROUTE_RANK_WARPS > 0 and ROUTE_RANKS):
        return False
    if device.type == "cpu":
        return True
    rows = -(-experts // CLUSTER_ROUTE)
    fits = experts <= 256 and rows <= 32 and _block(rows) * _block(cols) <= CLUSTER_ROUTE_REGS
    return device.type == "cuda" and _launches_clusters(device) and fits


def norm_route(
    h: torch.Tensor,  # [1, K] in the model dtype
    norm_weight: torch.Tensor,  # [K]
    eps: float,
    weight: torch.Tensor,  # [E, K] the router's rows, in h's dtype
    weight_in_fp32: bool,
    eighths: torch.Tensor | None,
    top_k: int,
    normalize: bool,
    dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(normed, ids [1, K] int64, weights [1, K] in ``dtype``): ``norm_linear`` then
    ``route`` in one launch (``norm_route_fits``). The same logits and picks; the
    softmax's sums follow program 0's warps, so the weights may differ from the two
    launches' within a rounding on a GPU (the same bits in the interpreter)."""
    experts, cols = weight.shape
    assert h.shape == (1, cols) and weight.dtype == h.dtype and weight.stride(1) == 1
    h = h.contiguous()
    normed = torch.empty_like(h)
    ids = torch.empty(1, top_k, dtype=torch.int64, device=h.device)
    weights = torch.empty(1, top_k, dtype=dtype, device=h.device)
    e_stride = 0 if eighths is None else eighths.shape[1] // 8
    cpu = h.device.type == "cpu"
    assert cpu or CLUSTER_ROUTE in (8, 16), "norm_route_fits first"
    cluster = 1 if cpu else CLUSTER_ROUTE
    args = (
        h, weight, weight.stride(0), norm_weight, normed, h if eighths is None else eighths,
        e_stride, ids, weights, experts, cols, eps,
    )  # fmt: skip
    meta: dict[str, Any] = dict(
        ROUND=_DTYPES[h.dtype], BN=_block(-(-experts // cluster)), BLOCK=_block(cols),
        W32=weight_in_fp32, EIGHTHS=eighths is not None, TOPK=top_k, NORM=normalize,
        EB=_block(experts), KP=_block(top_k), RANKS=ROUTE_RANKS, CLUSTER=cluster,
        num_warps=CLUSTER_ROUTE_WARPS, **ahead("norm", h.device), **pdl(h.device, "norm_linear"),
    )  # fmt: skip
    with on_device(h.device):
        if cpu:
            norm_route_kernel[(1,)](*args, **meta)
        else:
            _cluster_launch(norm_route_kernel, cluster, args, meta)
    return normed, ids, weights


def head_rope(
    y: torch.Tensor,  # [N * D], one token's projection
    norm: torch.Tensor | None,  # [D] per-head RMSNorm weight, or None
    cos: torch.Tensor,  # [S, R] table (R rotary dims; R = 0: no rotation)
    sin: torch.Tensor,
    position: torch.Tensor,  # [1] int64
    out: torch.Tensor,  # where head h goes: out + h * out_head + position * out_pos
    out_head: int,
    out_pos: int,
    heads: int,
    dim: int,
    eps: float,
    rotate: bool = True,
) -> None:
    """Normalises each head (when ``norm``), rotates it at ``position`` (when
    ``rotate``) and writes it into ``out``: a query buffer, or a KV cache row."""
    rot = cos.shape[-1] if rotate else 0
    with on_device(y.device):
        head_rope_kernel[(heads,)](
            y, y if norm is None else norm, cos, sin, position, out, out_head, out_pos, dim,
            eps, NORM=norm is not None, ROT=rot, BLOCK=_block(dim), **ROPE_LAUNCH,
            **pdl(y.device, "rope"),
        )  # fmt: skip


def qkv_rope(
    y: torch.Tensor,  # [(Nq + 2 Nkv) * D], one token's stacked projection
    q_norm: torch.Tensor | None,  # [D] per-head RMSNorm weights (both or neither)
    k_norm: torch.Tensor | None,
    cos: torch.Tensor,  # [S, R] tables
    sin: torch.Tensor,
    position: torch.Tensor,  # [1] int64
    q: torch.Tensor,  # [Nq, 1, D] out
    keys: torch.Tensor,  # [Nkv, ctx, D], the layer's cache
    values: torch.Tensor,
    eps: float,
) -> None:
    """``head_rope`` for the query, key and value heads in one launch: the query into
    ``q``, the key and value into the cache row at ``position``."""
    heads, _, dim = q.shape
    kv_heads = keys.shape[0]
    assert (q_norm is None) == (k_norm is None)
    ask = ATTENTION_CHUNK if KV_ASK == "rope" and pdl(y.device) else 0
    with on_device(y.device):
        qkv_rope_kernel[(heads + 2 * kv_heads,)](
            y, y if q_norm is None else q_norm, y if k_norm is None else k_norm, cos, sin,
            position, q, keys, values, keys.stride(0), keys.stride(1), values.stride(0),
            values.stride(1), heads, kv_heads, dim, eps, NORM=q_norm is not None,
            ROT=cos.shape[-1], BLOCK=_block(dim), **ROPE_LAUNCH, **pdl(y.device, "rope"), ASK=ask,
        )  # fmt: skip


ATTENTION_CHUNK = 256  # cache positions per program of decode_attention (a split)
ATTENTION_BLOCK = 64  # positions per step within one
ATTENTION_LAUNCH: dict[str, int] = {}  # num_warps / num_stages when set (an A/B; Triton's defaults)
# The attention letting o's programs start only once its keys and values are in and
# multiplied, not at its wait (o reads its first tile before its wait), as the cluster
# norm starts q/k/v late: measured slower and taken out, 1,779.5 us a step on q30
# against 1,737.9 (gpu184, alone in two processes each).
Parts = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def attention_parts(heads: int, dim: int, context: int, device: torch.device) -> Parts:
    """Scratch for ``decode_attention``'s splits at any span up to ``context``: the
    running max and sum [splits, Nq] and the unnormalised outputs [splits, Nq, D]."""
    splits = max(1, -(-context // ATTENTION_CHUNK))
    f32 = torch.float32
    return (
        torch.empty(splits, heads, dtype=f32, device=device),
        torch.empty(splits, heads, dtype=f32, device=device),
        torch.empty(splits, heads, dim, dtype=f32, device=device),
    )


def decode_attention(
    q: torch.Tensor,  # [Nq, 1, D]
    keys: torch.Tensor,  # [Nkv, ctx, D]
    values: torch.Tensor,
    position: torch.Tensor,  # [1] int64: the token's, whose key is already cached
    span: int,  # positions the step covers (a multiple of ATTENTION_CHUNK or the context)
    out: torch.Tensor,  # [1, Nq * D]
    parts: Parts,  # attention_parts(...)
) -> torch.Tensor:
    """One query token against cache positions 0..position (GQA, scale 1/sqrt(D)):
    ``F.scaled_dot_product_attention``'s result in its own summation order. One program
    per key/value head and chunk of positions; a second launch merges the chunks when
    the span has more than one."""
    heads, _, dim = q.shape
    kv_heads = keys.shape[0]
    group = heads // kv_heads
    splits = -(-span // ATTENTION_CHUNK)
    m, total, acc = parts
    assert splits <= m.shape[0] and keys.stride(2) == 1 and values.stride(2) == 1
    read_ahead = ahead("attention", q.device)
    ask = {"ASK": True} if KV_ASK == "attention" and read_ahead and pdl(q.device) else {}
    with on_device(q.device):
        decode_attention_kernel[(kv_heads, splits)](
            q, keys, values, position, out, m, total, acc, keys.stride(0), keys.stride(1),
            values.stride(0), values.stride(1), heads, dim, dim**-0.5, GROUP=group,
            GP=max(16, _block(group)), DP=max(16, _block(dim)), BS=ATTENTION_BLOCK,
            CHUNK=ATTENTION_CHUNK, SPLIT=splits > 1, F32=q.device.type == "cpu",
            **ATTENTION_LAUNCH, **read_ahead, **pdl(q.device, "attention"), **ask,
        )  # fmt: skip
        if splits > 1:
            attention_combine_kernel[(heads,)](
                m, total, acc, out, heads, dim, splits, DP=_block(dim), **pdl(q.device, "attention")
            )
    return out


def route(
    logits: torch.Tensor, top_k: int, normalize: bool, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """Router logits [T, E] -> (ids [T, K] int64, weights [T, K] in ``dtype``) as
    ``flint.models.moe.route`` for a softmax router without bias."""
    tokens, experts = logits.shape
    ids = torch.empty(tokens, top_k, dtype=torch.int64, device=logits.device)
    weights = torch.empty(tokens, top_k, dtype=dtype, device=logits.device)
    ranks = ROUTE_RANKS if ROUTE_ONE_PASS and ROUTE_RANK_WARPS > 0 else 0
    warps = ROUTE_RANK_WARPS if ranks else 1 if ROUTE_ONE_PASS else 4
    with on_device(logits.device):
        route_kernel[(tokens,)](
            logits.contiguous(), ids, weights, experts, TOPK=top_k, NORM=normalize,
            BLOCK=_block(experts), KP=_block(top_k), ONE_PASS=ROUTE_ONE_PASS,
            RANKS=ranks, num_warps=warps, **pdl(logits.device, "route"),
        )  # fmt: skip
    return ids, weights


ARGMAX_BLOCK = 2048  # entries per program of ``argmax``'s first launch


def argmax_parts(n: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Scratch for ``argmax`` over ``n`` entries: each block's largest key and the first
    entry holding it (int32 each)."""
    blocks = -(-n // ARGMAX_BLOCK)
    return (
        torch.empty(blocks, dtype=torch.int32, device=device),
        torch.empty(blocks, dtype=torch.int32, device=device),
    )


def argmax(
    x: torch.Tensor,
    out: torch.Tensor,
    parts: tuple[torch.Tensor, torch.Tensor],
    host: torch.Tensor | None = None,  # [2] int64, pinned
    position: torch.Tensor | None = None,  # [1] int64
) -> torch.Tensor:
    """``torch.argmax(x)`` of fp32 x [n] into ``out`` [1] (int64) in two launches: the
    first of the largest entries (-0 equal to +0, NaN above everything, the first NaN
    if any), as torch picks. For the greedy step's next token, on the device; with
    ``host``, also into its slot ``position % 2`` (pinned host memory, which the kernel
    writes through its mapping: the host reads it once the step is done, with no copy
    in the stream)."""
    (n,) = x.shape
    assert x.dtype == torch.float32 and x.is_contiguous() and out.dtype == torch.int64
    keys, first = parts
    blocks = keys.shape[0]
    assert blocks == -(-n // ARGMAX_BLOCK), (blocks, n)
    on_host = host is not None and position is not None
    if on_host:
        assert host is not None and host.is_pinned() and host.dtype == torch.int64
    with on_device(x.device):
        argmax_blocks_kernel[(blocks,)](
            x, keys, first, n, BLOCK=ARGMAX_BLOCK, **pdl(x.device, "argmax")
        )
        argmax_kernel[(1,)](
            keys, first, out, host if on_host else out, position if on_host else out, blocks,
            n, BLOCK=_block(blocks), HOST=on_host, **pdl(x.device, "argmax"),
        )  # fmt: skip
    return out
