"""The CUDA graph decode step (issue 10): slot-indexed expert kernels and the
fixed-address step. Without a GPU the Triton kernels run in Triton's CPU interpreter
(tests/conftest.py) and the step runs uncaptured; the gpu-marked tests capture it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from tiny import assert_follows, greedy_decode, save_wide_qwen3

import flint
from flint.format.quant import decode_projection, encode_projection
from flint.graphs import decode as decode_module
from flint.graphs import fused, moe_kernel
from flint.graphs.decode import SPAN_STEP, GraphDecoder, expert_pools, int8_head
from flint.graphs.moe_kernel import moe_experts, slab_pool, stacked_pool
from flint.graphs.setup import family_unsupported
from flint.models.ftw_source import FtwSource
from flint.models.moe import MoEBlock, dispatch, weighted_sum
from flint.models.transformer import MoEModel

COVERED = ["qwen3_moe", "qwen2_moe", "mixtral", "olmoe", "glm4_moe", "gpt_oss", "deepseek_v3"]


def _reference(
    x: torch.Tensor, ids: torch.Tensor, w: torch.Tensor, dense: list[tuple[torch.Tensor, ...]]
) -> torch.Tensor:
    """The per-expert torch path on dequantized weights cast to x's dtype."""
    tokens, k = ids.shape
    outs = torch.empty(tokens, k, x.shape[1])
    for t in range(tokens):
        for r in range(k):
            g, u, d = (m.to(x.dtype) for m in dense[int(ids[t, r])])
            h = F.silu(F.linear(x[t : t + 1], g)) * F.linear(x[t : t + 1], u)
            outs[t, r] = F.linear(h, d).float()[0]
    return weighted_sum(outs, w).to(x.dtype)


def _slabs(scheme: str, experts: int, shapes: tuple[tuple[int, int], ...], group: int) -> tuple:
    """Random experts in the .ftw slab layout: (slabs [E, bytes], offsets, dense f32)."""
    slabs, dense = [], []
    offsets: list[int] = []
    for _ in range(experts):
        parts = [encode_projection(torch.randn(r, c), scheme, group) for r, c in shapes]
        buf, offsets, at = [], [], 0
        for part in parts:
            pad = -at % 64
            buf += [torch.zeros(pad, dtype=torch.uint8), part]
            offsets.append(at + pad)
            at += pad + part.numel()
        buf.append(torch.zeros(-at % 64, dtype=torch.uint8))
        slab = torch.cat(buf)
        slabs.append(slab)
        dense.append(
            tuple(
                decode_projection(slab[o : o + p.numel()], scheme, "u8", *s, group)
                for o, p, s in zip(offsets, parts, shapes, strict=True)
            )
        )
    return torch.stack(slabs), tuple(offsets), dense


@pytest.mark.interpreter
@pytest.mark.parametrize("scheme", ["raw", "int8", "int4"])
@pytest.mark.parametrize("tokens", [1, 3])
def test_slot_kernels_follow_the_per_expert_path(scheme: str, tokens: int) -> None:
    """Odd shapes (rows and columns not multiples of the blocks or the int4 group
    count): the kernels agree with the per-expert torch path within bf16 rounding
    (raw bf16: the same roundings, in practice the same bits), and the result does
    not depend on which buffers it is written to."""
    torch.manual_seed(tokens)
    experts, inter, hidden, k = 7, 24, 200, 3
    shapes = ((inter, hidden), (inter, hidden), (hidden, inter))
    if scheme == "raw":
        g, u, d = (torch.randn(experts, *s).bfloat16() for s in shapes)
        pool = stacked_pool(g, u, d)
        dense = [(g[e].float(), u[e].float(), d[e].float()) for e in range(experts)]
    else:
        slabs, offsets, dense = _slabs(scheme, experts, shapes, 8)
        pool = slab_pool(slabs, scheme, 8, shapes, offsets)
    x = torch.randn(tokens, hidden).bfloat16()
    ids = torch.stack([torch.randperm(experts)[:k] for _ in range(tokens)])
    w = torch.rand(tokens, k).bfloat16()
    got = moe_experts(x, ids, w, pool)
    want = _reference(x, ids, w, dense)
    err = ((got.float() - want.float()).norm() / want.float().norm()).item()
    assert err <= (2e-3 if scheme == "raw" else 1.5e-2), err
    scratch = (
        torch.full((tokens * k, inter), float("nan"), dtype=torch.bfloat16),
        torch.full((tokens * k, hidden), float("nan")),
    )
    out = torch.full((tokens, hidden), float("nan"), dtype=torch.bfloat16)
    again = moe_experts(x, ids, w, pool, scratch, out)
    assert again.data_ptr() == out.data_ptr() and torch.equal(again, got)


@pytest.mark.interpreter
@pytest.mark.parametrize(("hidden", "inter", "group"), [(1024, 256, 32), (200, 24, 8)])
def test_int4_words_and_bytes_agree(
    hidden: int, inter: int, group: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """int4 read as 32-bit words against the vector's eighths (``moe_kernel.WORDS``) and
    as bytes against its even and odd entries: the same exact products summed in
    another order, so the two agree within rounding of the model dtype and both follow
    the per-expert torch path. Whole tiles (no column masks) and odd shapes; the eighths
    buffers' padding is NaN, so a masked load that strayed into it would show."""
    monkeypatch.setattr(moe_kernel, "_eighths_empty", _nan_eighths)
    torch.manual_seed(hidden)
    experts, k = 6, 3
    shapes = ((inter, hidden), (inter, hidden), (hidden, inter))
    slabs, offsets, dense = _slabs("int4", experts, shapes, group)
    pool = slab_pool(slabs, "int4", group, shapes, offsets)
    x = (torch.randn(2, hidden) / hidden**0.5).bfloat16()  # gate in silu's range
    ids = torch.stack([torch.randperm(experts)[:k] for _ in range(2)])
    w = torch.rand(2, k).bfloat16()
    runs = {}
    for words in (True, False):
        monkeypatch.setattr(moe_kernel, "WORDS", words)
        assert moe_kernel._words(pool) == words
        runs[words] = moe_experts(x, ids, w, pool).float()
    want = _reference(x, ids, w, dense).float()
    for got in runs.values():
        assert torch.isfinite(got).all()
        assert ((got - want).norm() / want.norm()).item() <= 1.5e-2
    # apart by a rounding of the model dtype at most, entry by entry (norm-relative:
    # 0 to 1.5e-4 in the interpreter, 1.6e-5 on the H200)
    scale = runs[False].abs().max().item()
    torch.testing.assert_close(runs[True], runs[False], rtol=2**-7, atol=2**-8 * scale)


@pytest.mark.interpreter
@pytest.mark.parametrize("scheme", ["raw", "int8", "int4"])
def test_slot_outputs_are_moe_experts_rank_rows(scheme: str) -> None:
    """The streamed path's ``slot_outputs`` on a subset of pairs writes, bit for bit, the
    per-rank rows ``moe_experts`` computes before its ranked sum (the same kernels on
    the same slots), and leaves the other rows alone."""
    from flint.graphs.moe_kernel import slot_outputs

    torch.manual_seed(11)
    experts, inter, hidden, k = 5, 24, 200, 3
    shapes = ((inter, hidden), (inter, hidden), (hidden, inter))
    if scheme == "raw":
        pool = stacked_pool(*(torch.randn(experts, *sh).bfloat16() for sh in shapes))
    else:
        slabs, offsets, _ = _slabs(scheme, experts, shapes, 8)
        pool = slab_pool(slabs, scheme, 8, shapes, offsets)
    x = torch.randn(2, hidden).bfloat16()
    ids = torch.stack([torch.randperm(experts)[:k] for _ in range(2)])
    scratch = (torch.empty(2 * k, inter, dtype=torch.bfloat16), torch.empty(2 * k, hidden))
    moe_experts(x, ids, torch.rand(2, k).bfloat16(), pool, scratch)
    pairs = [0, 2, 4, 5]
    out = torch.full((2 * k, hidden), float("nan"))
    slot_outputs(x, pairs, [int(ids.view(-1)[p]) for p in pairs], k, pool, out)
    assert torch.equal(out[pairs], scratch[1][pairs])
    assert out[[1, 3]].isnan().all()


def _float_rows_agree(
    experts: int, inter: int, hidden: int, cols: int, dtype: torch.dtype,
    device: torch.device, monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """Float pools' gate/up at 4, 8 and 16 rows a program (``FLOAT_GATE_UP_BLOCK``,
    ``cols`` columns a step, four warps): the same bits."""
    torch.manual_seed(12)
    k = 2
    shapes = ((inter, hidden), (inter, hidden), (hidden, inter))
    weights = (torch.randn(experts, *sh) / sh[1] ** 0.5 for sh in shapes)
    pool = stacked_pool(*(t.to(dtype).to(device) for t in weights))
    x = torch.randn(2, hidden).to(dtype).to(device)
    ids = torch.stack([torch.randperm(experts)[:k] for _ in range(2)]).to(device)
    w = torch.rand(2, k).to(dtype).to(device)
    got = []
    for rows in (4, 8, 16):
        monkeypatch.setattr(moe_kernel, "FLOAT_GATE_UP_BLOCK", (rows, cols, 4))
        got.append(moe_experts(x, ids, w, pool))
    assert torch.isfinite(got[0]).all()
    for other in got[1:]:
        assert torch.equal(got[0].view(torch.uint8), other.view(torch.uint8))


@pytest.mark.interpreter
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_float_pools_rows_a_program_keep_the_bits(
    dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Float pools' gate/up (four rows a program since gpu125): the rows a program do
    not change a row's sum, with masked rows and a masked last tile (fp32: nothing
    rounded away)."""
    _float_rows_agree(4, 40, 200, 64, dtype, torch.device("cpu"), monkeypatch)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_float_pools_rows_a_program_keep_the_bits_on_cuda(
    dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same compiled, in the 30B-A3B's shapes and block columns: a tile's layout
    along its columns, and so a row's order of sums, must not follow the rows."""
    _float_rows_agree(8, 768, 2048, 1024, dtype, torch.device("cuda"), monkeypatch)


def _nan_eighths(rows: int, cols: int, device: torch.device) -> torch.Tensor:
    stride = moe_kernel._eighths_stride(cols)
    return torch.full((rows, 8 * stride), float("nan"), device=device)


@pytest.mark.interpreter
@pytest.mark.parametrize("w32", [False, True])
def test_the_norm_writes_the_eighths_of_its_output(w32: bool) -> None:
    """``fused.rms_norm(eighths=)``: the normed rows as returned, and the same rows in
    the word kernels' layout with ``moe_kernel.eighths``' bits (random norm weights,
    three rows, a width that is not a whole number of blocks)."""
    from flint.graphs import fused

    torch.manual_seed(5)
    x = torch.randn(3, 200).bfloat16()
    weight = (torch.rand(200) + 0.5).bfloat16()
    plain = fused.rms_norm(x, weight, 1e-6, w32)
    buffer = _nan_eighths(3, 200, x.device)
    got = fused.rms_norm(x, weight, 1e-6, w32, buffer)
    assert torch.equal(got, plain)
    stride = moe_kernel._eighths_stride(200)
    want = moe_kernel.eighths(plain).view(3, 8, stride)[:, :, :25]
    assert torch.equal(buffer.view(3, 8, stride)[:, :, :25], want)


@pytest.mark.interpreter
def test_eighths_layout_holds_the_vector_exactly() -> None:
    """Row k of a vector's eighths holds its columns 8m + k times 2^E exactly
    (E = 23 - 4k, or 35 - 4k from k = 5): what the word kernels multiply each nibble by."""
    torch.manual_seed(3)
    x = torch.randn(2, 200).bfloat16()
    got = moe_kernel.eighths(x)
    stride = moe_kernel._eighths_stride(200)
    assert got.shape == (2, 8 * stride) and stride % 16 == 0 and stride >= 25
    rows = got.view(2, 8, stride)[:, :, :25]  # [T, k, m]
    for k in range(8):
        e = 23 - 4 * k if k < 5 else 35 - 4 * k
        assert torch.equal(rows[:, k] / 2.0**e, x[:, k::8].float())


@pytest.mark.interpreter
@pytest.mark.parametrize("scheme", ["int8", "int4"])
def test_dequantize_kernel_gives_the_files_weights(scheme: str) -> None:
    """Odd shapes (rows and columns not multiples of the blocks, 200 columns in groups
    of 8): each listed expert's projection, bit for bit the file's rule in bf16."""
    from flint.graphs.moe_kernel import dequantize

    torch.manual_seed(9)
    experts, inter, hidden = 5, 40, 200
    shapes = ((inter, hidden), (inter, hidden), (hidden, inter))
    slabs, offsets, dense = _slabs(scheme, experts, shapes, 8)
    pool = slab_pool(slabs, scheme, 8, shapes, offsets)
    picked = [3, 0, 3]
    for p in range(3):
        got = dequantize(pool, p, torch.tensor(picked), torch.bfloat16)
        want = torch.stack([dense[e][p].bfloat16() for e in picked])
        assert torch.equal(got, want), (scheme, p)


@pytest.mark.interpreter
class GptOssExperts:
    """``experts`` random bf16 experts with biases and GPT-OSS's clamped activation
    (layer 0's ``ExpertMath``), and their output through torch's matmuls."""

    def __init__(self, experts: int, inter: int, hidden: int) -> None:
        from flint.models.config import ExpertActivation
        from flint.models.moe import ExpertBiases, ExpertMath

        self.experts = experts
        self.g, self.u = (torch.randn(experts, inter, hidden).bfloat16() * 0.3 for _ in range(2))
        self.d = torch.randn(experts, hidden, inter).bfloat16() * 0.3
        shapes = (inter, inter, hidden)
        b = ExpertBiases(*(torch.randn(experts, n).bfloat16() for n in shapes))
        self.math = ExpertMath(ExpertActivation("gpt_oss", 1.702, 7.0), {0: b})

    def reference(self, x: torch.Tensor, ids: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        m, g, u, d = self.math, self.g, self.u, self.d

        def run(e: int, xs: torch.Tensor) -> torch.Tensor:
            h = m.hidden(0, e, F.linear(xs, g[e]), F.linear(xs, u[e]))
            return m.output(0, e, F.linear(h, d[e]))

        return dispatch(x, ids, w, self.experts, run)


def test_slot_kernels_add_biases_and_clamp_as_gpt_oss() -> None:
    """Expert biases and GPT-OSS's clamped activation: the kernels against
    ``ExpertMath`` around torch's matmuls (bf16 stacks: the same roundings)."""
    torch.manual_seed(4)
    k, tokens = 2, 3
    ex = GptOssExperts(5, 24, 72)
    pool = stacked_pool(ex.g, ex.u, ex.d).with_math(ex.math, 0)
    x = torch.randn(tokens, 72).bfloat16() * 4  # some gates past the clamp
    ids = torch.stack([torch.randperm(ex.experts)[:k] for _ in range(tokens)])
    w = torch.rand(tokens, k).bfloat16()
    got = moe_experts(x, ids, w, pool)
    want = ex.reference(x, ids, w)
    err = ((got.float() - want.float()).norm() / want.float().norm()).item()
    assert err <= 2e-3, err


@pytest.mark.interpreter
def test_fused_norm_rope_and_router_follow_torch() -> None:
    """The fused small ops against their torch counterparts: RMSNorm, per-head norm and
    (partial) RoPE written at a cache position, the softmax router (ids identical)."""
    from flint.graphs import fused
    from flint.models.moe import route
    from flint.models.norm import rms_norm
    from flint.models.rope import apply_rope

    torch.manual_seed(3)
    x = torch.randn(3, 200).bfloat16()
    w = torch.randn(200).bfloat16()
    for w32 in (False, True):
        got, want = fused.rms_norm(x, w, 1e-6, w32), rms_norm(x, w, 1e-6, w32)
        assert (got.float() - want.float()).abs().max() <= 0.02 * want.float().abs().max()
    heads, dim, ctx, at = 3, 48, 10, 7
    for rot, norm in ((48, torch.randn(dim).bfloat16()), (24, None)):
        y = torch.randn(heads * dim).bfloat16()
        cos, sin = torch.randn(ctx, rot).bfloat16(), torch.randn(ctx, rot).bfloat16()
        cache = torch.zeros(heads, ctx, dim, dtype=torch.bfloat16)
        pos = torch.tensor([at])
        fused.head_rope(
            y, norm, cos, sin, pos, cache, cache.stride(0), cache.stride(1), heads, dim, 1e-6
        )
        ref = y.view(1, heads, dim)
        if norm is not None:
            ref = rms_norm(ref, norm, 1e-6)
        ref = apply_rope(ref.transpose(0, 1), cos[at : at + 1], sin[at : at + 1])  # [N, 1, D]
        assert (cache[:, at].float() - ref[:, 0].float()).abs().max() <= 0.05
        assert cache[:, :at].abs().sum() == 0 and cache[:, at + 1 :].abs().sum() == 0
    for normalize, fp32 in ((True, False), (False, True)):
        logits = torch.randn(2, 40).bfloat16()
        config = SimpleNamespace(
            router_topk_first=False, top_k=6, norm_topk_prob=normalize, router_weights_fp32=fp32
        )
        want_ids, want_w = route(logits, torch.eye(40).bfloat16(), config)  # type: ignore[arg-type]
        dtype = torch.float32 if fp32 else torch.bfloat16
        ids, weights = fused.route(logits, 6, normalize, dtype)
        assert torch.equal(ids, want_ids)
        assert weights.dtype == want_w.dtype
        assert (weights.float() - want_w.float()).abs().max() <= 1e-2


@pytest.mark.interpreter
def test_the_one_pass_router_picks_and_weighs_as_the_two_pass_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``fused.ROUTE_ONE_PASS`` on and off, and the picks by counting ranks or by a
    bitonic top-k on one and four warps, and the default (a bitonic top-k on two:
    ``ROUTE_RANKS``, ``ROUTE_RANK_WARPS``): the same ids and the same weight bits in the
    interpreter, with tied logits (ties go to the lower id), a top-k that is not a
    power of two, expert counts that are not, with and without renormalisation, bf16
    and fp32 weights."""
    _router_passes_agree(monkeypatch, torch.device("cpu"))


@pytest.mark.gpu
def test_the_one_pass_router_agrees_on_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same on the GPU, where the compiled reductions break ties (the interpreter's
    argmax takes the first index whatever the flag says). There the one-warp softmax
    adds its sum in another order than the four-warp one: the weights agree within
    that rounding, not bit for bit."""
    _router_passes_agree(monkeypatch, torch.device("cuda"))


# (fused.ROUTE_ONE_PASS, ROUTE_RANK_WARPS, ROUTE_RANKS): two passes, one, then the picks
# by counting ranks and by a bitonic top-k, each on one warp and on four, and the
# default (a bitonic top-k on two warps)
ROUTER_WAYS = (
    (False, 0, 0),
    (True, 0, 0),
    (True, 1, 1),
    (True, 4, 1),
    (True, 1, 2),
    (True, 4, 2),
    (True, 2, 2),
)


def _router_passes_agree(monkeypatch: pytest.MonkeyPatch, device: torch.device) -> None:
    from flint.graphs import fused

    torch.manual_seed(5)
    for experts, top_k, normalize, dtype in (
        (40, 6, True, torch.bfloat16),
        (128, 8, True, torch.bfloat16),
        (64, 4, False, torch.float32),
        (60, 8, True, torch.float32),
    ):
        for ties in ("none", "columns", "coarse"):
            logits = torch.randn(3, experts).bfloat16().to(device)
            if ties == "columns":  # every third expert ties with expert 0
                logits[:, ::3] = logits[:, :1]
            elif ties == "coarse":
                logits = (logits * 2).round() / 2
            got = []
            for one_pass, rank_warps, ranks in ROUTER_WAYS:
                monkeypatch.setattr(fused, "ROUTE_ONE_PASS", one_pass)
                monkeypatch.setattr(fused, "ROUTE_RANK_WARPS", rank_warps)
                monkeypatch.setattr(fused, "ROUTE_RANKS", ranks)
                got.append(fused.route(logits, top_k, normalize, dtype))
            ids0, w0 = got[0]
            for i, (ids1, w1) in enumerate(got[1:]):
                where = (experts, top_k, ties, i)
                assert torch.equal(ids0, ids1), where
                if device.type == "cpu":  # the interpreter sums in one order
                    assert torch.equal(w0.view(torch.uint8), w1.view(torch.uint8)), where
                else:  # one rounding of the softmax's sum, then of the weights' dtype
                    tol = 1e-6 if dtype == torch.float32 else 8e-3
                    assert torch.allclose(w0.float(), w1.float(), rtol=tol, atol=0), where
            if device.type == "cuda":  # the same softmax on one warp: the same bits
                for i in (2, 4):
                    assert torch.equal(got[1][1].view(torch.uint8), got[i][1].view(torch.uint8))
            picked = logits.float().gather(1, ids0)
            assert (picked[:, :-1] >= picked[:, 1:]).all()  # descending


@pytest.mark.interpreter
@pytest.mark.parametrize("rows,cols", [(128, 2048), (61, 200)])
def test_the_norm_in_the_routers_launch(rows: int, cols: int) -> None:
    """``fused.norm_linear``: the norm as ``fused.rms_norm`` writes it (bit for bit in
    the interpreter, which sums in one order; eighths too), the product as
    ``fused.linear`` of it within a bf16 rounding, W32 on and off."""
    from flint.graphs import fused
    from flint.graphs import moe_kernel as mk

    torch.manual_seed(rows)
    h, nw = torch.randn(1, cols).bfloat16(), torch.randn(cols).bfloat16()
    w = torch.randn(rows, cols).bfloat16()
    for w32 in (False, True):
        got_e8 = mk._eighths_empty(1, cols, h.device).fill_(float("nan"))
        logits, normed = fused.norm_linear(h, nw, 1e-6, w, w32, got_e8)
        want_e8 = mk._eighths_empty(1, cols, h.device).fill_(float("nan"))
        want = fused.rms_norm(h, nw, 1e-6, w32, want_e8)
        assert torch.equal(normed.view(torch.int16), want.view(torch.int16))
        assert torch.equal(got_e8.isnan(), want_e8.isnan())
        real = ~want_e8.isnan()
        assert torch.equal(got_e8[real], want_e8[real])
        ref = fused.linear(want, w).float()
        assert (logits.float() - ref).abs().max() <= 8e-3 * ref.abs().max()


def _ranked_norm_case(cols: int, device: str) -> tuple[torch.Tensor, ...]:
    """A MoE block's eight ranks' rows (each rounded to bf16, as down writes them), its
    routing weights, a residual and a norm weight, of ``cols`` columns."""
    torch.manual_seed(cols)
    rows = torch.randn(8, cols).bfloat16().float().to(device)
    weights = torch.softmax(torch.randn(1, 8), dim=1).bfloat16().to(device)
    x = torch.randn(1, cols).bfloat16().to(device)
    return rows, weights, x, torch.randn(cols).bfloat16().to(device)


@pytest.mark.interpreter
@pytest.mark.parametrize("cols", [200, 2048])
def test_the_ranked_sum_in_the_norms_launch(cols: int) -> None:
    """``fused.ranked_add_rms_norm`` (one program in the interpreter) gives the bits of
    ``ranked_sum`` then ``add_rms_norm``, W32 on and off."""
    rows, weights, x, nw = _ranked_norm_case(cols, "cpu")
    delta = moe_kernel.ranked_sum(rows, weights, torch.bfloat16)
    for w32 in (False, True):
        got = fused.ranked_add_rms_norm(x, rows, weights, nw, 1e-6, w32)
        want = fused.add_rms_norm(x, delta, nw, 1e-6, w32)
        for g, w in zip(got, want, strict=True):
            assert torch.equal(g.view(torch.int16), w.view(torch.int16))


def test_a_cluster_launch_sets_the_packed_metadata_or_refuses() -> None:
    """``fused._as_cluster`` turns a kernel compiled for one program into clusters of
    eight through Triton's packed (warps, ctas, shared memory); a launcher that packs
    anything else is refused, not launched with one program."""
    compiled = SimpleNamespace(packed_metadata=(4, 1, 1056))
    fused._as_cluster(compiled, 8)
    assert compiled.packed_metadata == (4, 8, 1056)
    fused._as_cluster(compiled, 8)  # again: the kernel is cached patched
    assert compiled.packed_metadata == (4, 8, 1056)
    for packed in ((4, 1, 1056, 1, 1, 1), (4, 2, 1056)):
        with pytest.raises(RuntimeError, match="packs"):
            fused._as_cluster(SimpleNamespace(packed_metadata=packed), 8)


@pytest.mark.gpu
@pytest.mark.parametrize("cols", [64, 2048, 2880, 7168])
def test_the_ranked_sum_in_a_cluster_norm_on_cuda(
    cols: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a GPU the fold is a cluster of eight programs, each an eighth of the columns,
    which add their sums of squares in rank order: the residual sum bit for bit as the
    two launches make it, the norm within two bf16 roundings of theirs (only the order
    of the squares' sum differs; the norm is rounded, then its product with the
    weight), the same bits every launch, and the same bits whether the sums are
    exchanged through plain or asynchronous stores (``fused.CLUSTER_ASYNC``)."""
    if not fused.ranked_norm_fits(torch.device("cuda", 0)):
        pytest.skip("thread-block clusters need Hopper or later")
    rows, weights, x, nw = _ranked_norm_case(cols, "cuda")
    delta = moe_kernel.ranked_sum(rows, weights, torch.bfloat16)
    for w32 in (False, True):
        want_total, want = fused.add_rms_norm(x, delta, nw, 1e-6, w32)
        made = {}
        for exchange in (False, True):
            monkeypatch.setattr(fused, "CLUSTER_ASYNC", exchange)
            total, normed = fused.ranked_add_rms_norm(x, rows, weights, nw, 1e-6, w32)
            assert torch.equal(total.view(torch.int16), want_total.view(torch.int16))
            step = want.float().abs() * 2**-6  # a bf16 rounding of the norm, then of w * it
            assert ((normed.float() - want.float()).abs() <= step).all()
            again = fused.ranked_add_rms_norm(x, rows, weights, nw, 1e-6, w32)[1]
            assert torch.equal(again.view(torch.int16), normed.view(torch.int16))
            made[exchange] = normed
        assert torch.equal(made[True].view(torch.int16), made[False].view(torch.int16))


# Each cluster fold: its switch, its value when on, the fused call it makes
CLUSTER_FOLDS = {
    "CLUSTER_NORM": (True, "ranked_add_rms_norm"),
    "CLUSTER_ROUTE": (16, "norm_route"),
}


@pytest.mark.interpreter
@pytest.mark.parametrize("fold", list(CLUSTER_FOLDS))
def test_the_step_with_a_cluster_fold_keeps_the_bits(
    fold: str, tiny_ftw: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``fused.CLUSTER_NORM``: the step leaving each MoE block's ranked sum to the next
    norm's launch, ``CLUSTER_ROUTE``: its router's top-k to its product's (one program
    in the interpreter each), decodes the same tokens and logits as with the launches
    they fold."""
    prompt = [(11 * i + 5) % 300 + 2 for i in range(6)]
    on_value, name = CLUSTER_FOLDS[fold]
    folds = []
    call = getattr(fused, name)

    def counted(*args: object) -> tuple[torch.Tensor, ...]:
        folds.append(1)
        return call(*args)  # type: ignore[no-any-return]

    monkeypatch.setattr(fused, name, counted)
    runs, launches = {}, {}
    for on in (True, False):
        monkeypatch.setattr(fused, fold, on_value if on else 0)
        folds.clear()
        with _uncaptured_step(tiny_ftw["qwen3_moe"]) as llm:
            runs[on] = _decode(llm.model, prompt, 4)
        launches[on] = len(folds)
    assert launches[True] > 0 and launches[False] == 0
    assert runs[True][0] == runs[False][0]
    assert torch.equal(runs[True][1], runs[False][1])


@pytest.mark.gpu
@pytest.mark.parametrize("fold", list(CLUSTER_FOLDS))
def test_the_step_with_a_cluster_fold_follows_the_launches_it_folds(
    fold: str, tiny_ftw: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a GPU, captured: the same greedy tokens over 40 steps with each cluster fold
    as without it, but for a flipped near-tie (``assert_follows``: the norm's sums of
    squares, the router's softmax, add in another order)."""
    if not fused.ranked_norm_fits(torch.device("cuda", 0)):
        pytest.skip("thread-block clusters need Hopper or later")
    prompt = [(11 * i + 5) % 300 + 2 for i in range(24)]
    on_value = CLUSTER_FOLDS[fold][0]
    runs = {}
    for on in (True, False):
        monkeypatch.setattr(fused, fold, on_value if on else 0)
        path = tiny_ftw["qwen3_moe"]
        with flint.LLM(path, device="cuda:0", context_length=128, graphs="on") as llm:
            runs[on] = _decode(llm.model, prompt, 40)
    assert_follows(runs[True][0], runs[True][1], runs[False][0], runs[False][1], min_same=8)


def _norm_route_case(experts: int, cols: int, device: str) -> tuple[torch.Tensor, ...]:
    """h, a norm weight and a router's rows (bf16) of ``experts`` x ``cols``."""
    torch.manual_seed(experts + cols)
    h, nw = torch.randn(1, cols).bfloat16(), torch.randn(cols).bfloat16()
    return h.to(device), nw.to(device), torch.randn(experts, cols).bfloat16().to(device)


NORM_ROUTE_CASES = [(128, 2048, 8, True, False), (60, 200, 4, False, True), (8, 64, 2, True, True)]


@pytest.mark.interpreter
@pytest.mark.parametrize(("experts", "cols", "top_k", "normalize", "fp32"), NORM_ROUTE_CASES)
def test_the_routers_top_k_in_its_products_launch(
    experts: int, cols: int, top_k: int, normalize: bool, fp32: bool
) -> None:
    """``fused.norm_route`` (one program in the interpreter) gives the bits of
    ``norm_linear`` then ``route``: the norm and its eighths, the ids, the weights."""
    h, nw, router = _norm_route_case(experts, cols, "cpu")
    dtype = torch.float32 if fp32 else torch.bfloat16
    e8 = moe_kernel._eighths_empty(1, cols, h.device).fill_(float("nan"))
    normed, ids, weights = fused.norm_route(h, nw, 1e-6, router, fp32, e8, top_k, normalize, dtype)
    want_e8 = moe_kernel._eighths_empty(1, cols, h.device).fill_(float("nan"))
    logits, want = fused.norm_linear(h, nw, 1e-6, router, fp32, want_e8)
    want_ids, want_weights = fused.route(logits, top_k, normalize, dtype)
    assert torch.equal(normed.view(torch.int16), want.view(torch.int16))
    assert torch.equal(e8.isnan(), want_e8.isnan())
    assert torch.equal(e8[~e8.isnan()], want_e8[~want_e8.isnan()])
    assert torch.equal(ids, want_ids)
    assert torch.equal(weights, want_weights)


@pytest.mark.gpu
@pytest.mark.parametrize("cluster,warps", [(16, 4), (8, 8), (16, 8)])
@pytest.mark.parametrize(("experts", "cols", "top_k", "normalize", "fp32"), NORM_ROUTE_CASES)
def test_the_routers_top_k_in_a_cluster_on_cuda(
    experts: int,
    cols: int,
    top_k: int,
    normalize: bool,
    fp32: bool,
    cluster: int,
    warps: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On a GPU, the programs of one cluster make the logits and send them to program
    0, which picks: the norm bit for bit as ``norm_linear``'s, the same ids, the
    weights within a rounding of ``route``'s (its softmax on other warps), the same
    bits every launch."""
    monkeypatch.setattr(fused, "CLUSTER_ROUTE", cluster)
    monkeypatch.setattr(fused, "CLUSTER_ROUTE_WARPS", warps)
    if not fused.norm_route_fits(torch.device("cuda", 0), experts, cols):
        pytest.skip("thread-block clusters need Hopper or later")
    h, nw, router = _norm_route_case(experts, cols, "cuda")
    dtype = torch.float32 if fp32 else torch.bfloat16
    got = fused.norm_route(h, nw, 1e-6, router, fp32, None, top_k, normalize, dtype)
    logits, want = fused.norm_linear(h, nw, 1e-6, router, fp32)
    want_ids, want_weights = fused.route(logits, top_k, normalize, dtype)
    assert torch.equal(got[0].view(torch.int16), want.view(torch.int16))
    assert torch.equal(got[1], want_ids)
    assert torch.allclose(got[2].float(), want_weights.float(), rtol=2**-7, atol=0)
    for _ in range(3):
        again = fused.norm_route(h, nw, 1e-6, router, fp32, None, top_k, normalize, dtype)
        assert torch.equal(again[1], got[1]) and torch.equal(again[2], got[2])


@pytest.mark.interpreter
@pytest.mark.parametrize("rows,cols", [(37, 100), (64, 256), (130, 1030)])
def test_fused_linear_follows_torch(rows: int, cols: int) -> None:
    """The one-token matrix-vector kernel on odd shapes: bf16 with bias and residual
    against ``residual + F.linear`` (within a bf16 rounding of the product), int8 with
    row scales against the dequantized product, an fp32 output holding the product
    rounded to bf16 (the LM head's logits), and the residual sum and norm fused."""
    from flint.graphs import fused
    from flint.models.norm import rms_norm

    torch.manual_seed(rows)
    x = torch.randn(1, cols).bfloat16()
    w, b = torch.randn(rows, cols).bfloat16(), torch.randn(rows).bfloat16()
    res = torch.randn(1, rows).bfloat16()
    want = F.linear(x.float(), w.float(), b.float())
    got = fused.linear(x, w, b, res) - res
    assert (got.float() - want).abs().max() <= 0.02 * want.abs().max()
    assert torch.equal(fused.linear(x, w, b, res), fused.linear(x, w, b) + res)
    q = torch.randint(-127, 128, (rows, cols), dtype=torch.int8)
    scale = torch.rand(rows) / 100
    want = F.linear(x.float(), q.float() * scale[:, None])
    got = fused.linear(x, q, scale=scale)
    assert got.dtype == torch.bfloat16
    assert (got.float() - want).abs().max() <= 0.01 * want.abs().max()
    logits = torch.empty(1, rows)
    fused.linear(x, w, out=logits)
    assert torch.equal(logits, fused.linear(x, w).float())
    delta = torch.randn(1, rows).bfloat16()
    total, normed = fused.add_rms_norm(res, delta, b, 1e-6)
    assert torch.equal(total, res + delta)
    assert torch.equal(normed, fused.rms_norm(res + delta, b, 1e-6))
    assert (normed.float() - rms_norm(res + delta, b, 1e-6).float()).abs().max() <= 0.05
    with pytest.raises(AssertionError):
        fused.linear(x, q)  # int8 weights without their scales
    with pytest.raises(AssertionError):
        fused.linear(x, w, out=torch.empty(1, rows - 1))  # an output too short


def _argmax_picks_as_torch(device: torch.device) -> None:
    """``fused.argmax`` against ``torch.argmax`` on the same device: one block and
    several, ties across and within blocks, -0 against +0, NaN (of either sign),
    infinities, every entry -inf."""
    from flint.graphs import fused

    torch.manual_seed(0)
    for n in (1, 7, fused.ARGMAX_BLOCK, fused.ARGMAX_BLOCK + 1, 3 * fused.ARGMAX_BLOCK + 5):
        cases = [torch.randn(n), torch.zeros(n), torch.full((n,), float("-inf"))]
        if n > 3:
            for at, value in (((n - 1, n // 2), 9.0), ((n - 1, 2), float("nan"))):
                x = torch.randn(n)
                x[list(at)] = value
                cases.append(x)
            x = -torch.rand(n) - 1
            x[[1, n - 2]] = torch.tensor([-0.0, 0.0])
            cases += [x, -x.flip(0).abs()]
            x = torch.randn(n)
            x[[3, n - 1]] = torch.tensor([float("inf"), -float("nan")])
            cases.append(x)
        parts = fused.argmax_parts(n, device)
        out = torch.empty(1, dtype=torch.int64, device=device)
        for x in cases:
            x = x.to(device)
            assert fused.argmax(x, out, parts).item() == torch.argmax(x).item(), (n, x)


@pytest.mark.interpreter
def test_fused_argmax_picks_as_torch() -> None:
    _argmax_picks_as_torch(torch.device("cpu"))


@pytest.mark.gpu
def test_fused_argmax_picks_as_torch_on_cuda() -> None:
    _argmax_picks_as_torch(torch.device("cuda:0"))


@pytest.mark.interpreter
@pytest.mark.parametrize(
    "heads,kv_heads,dim,position,span",
    [(8, 2, 32, 5, 256), (8, 2, 32, 300, 512), (4, 4, 24, 511, 512), (6, 2, 16, 700, 768)],
)
def test_fused_attention_follows_sdpa(
    heads: int, kv_heads: int, dim: int, position: int, span: int
) -> None:
    """One query against cache positions 0..position: ``decode_attention`` (one chunk
    of positions, or several merged) against SDPA over the span with the step's mask,
    GQA and head dims that are not powers of two included, fp32 and bf16; then
    ``qkv_rope`` writes what three ``head_rope`` launches write, bit for bit."""
    from flint.graphs import fused

    torch.manual_seed(position)
    ctx = 1000
    for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 2e-2)):
        q = torch.randn(heads, 1, dim).to(dtype)
        keys, values = (torch.randn(kv_heads, ctx, dim).to(dtype) for _ in range(2))
        out = torch.full((1, heads * dim), float("nan"), dtype=dtype)
        parts = fused.attention_parts(heads, dim, ctx, torch.device("cpu"))
        fused.decode_attention(q, keys, values, torch.tensor([position]), span, out, parts)
        mask = (torch.arange(span) <= position)[None, :]
        want = F.scaled_dot_product_attention(
            q[None], keys[None, :, :span], values[None, :, :span], attn_mask=mask,
            enable_gqa=heads != kv_heads,
        )[0].transpose(0, 1).reshape(1, -1)  # fmt: skip
        assert (out.float() - want.float()).abs().max() <= tol * want.float().abs().max()
    rot, eps, at = dim // 2 * 2, 1e-6, torch.tensor([7])
    y = torch.randn((heads + 2 * kv_heads) * dim).bfloat16()
    q_norm, k_norm = torch.randn(dim).bfloat16(), torch.randn(dim).bfloat16()
    cos, sin = torch.randn(10, rot).bfloat16(), torch.randn(10, rot).bfloat16()
    got = [torch.zeros(heads, 1, dim).bfloat16(), *torch.zeros(2, kv_heads, 10, dim).bfloat16()]
    fused.qkv_rope(y, q_norm, k_norm, cos, sin, at, *got, eps)
    want = [torch.zeros_like(t) for t in got]
    q_end, k_end = heads * dim, (heads + kv_heads) * dim
    cache = want[1].stride(0), want[1].stride(1)
    fused.head_rope(y[:q_end], q_norm, cos, sin, at, want[0], dim, 0, heads, dim, eps)
    fused.head_rope(y[q_end:k_end], k_norm, cos, sin, at, want[1], *cache, kv_heads, dim, eps)
    fused.head_rope(y[k_end:], None, cos, sin, at, want[2], *cache, kv_heads, dim, eps, False)
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g, w)


def test_dependent_launch_only_inside_its_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Programmatic dependent launch is asked for only inside ``dependent_launch`` (the
    resident step), on CUDA, with ``PDL`` on; a nested block leaves it on."""
    monkeypatch.setattr(moe_kernel, "_pdl_capable", lambda index: True)
    gpu, on = torch.device("cuda", 0), {"GDC": True, "launch_pdl": True}
    assert moe_kernel.pdl(gpu) == {}
    with moe_kernel.dependent_launch():
        assert moe_kernel.pdl(gpu) == on
        with moe_kernel.dependent_launch():
            assert moe_kernel.pdl(gpu) == on
        assert moe_kernel.pdl(gpu) == on
        assert moe_kernel.pdl(torch.device("cpu")) == {}
        monkeypatch.setattr(moe_kernel, "PDL", False)
        assert moe_kernel.pdl(gpu) == {}
    monkeypatch.setattr(moe_kernel, "PDL", True)
    assert moe_kernel.pdl(gpu) == {}


def _covered(tiny_ftw: dict[str, Path]) -> list[str]:
    """The tiny families the graph step covers."""
    out = []
    for family, path in tiny_ftw.items():
        with flint.LLM(path, device="cpu", context_length=8) as llm:
            if family_unsupported(llm.model.config) is None:
                out.append(family)
    return out


def _decode(model: MoEModel, prompt: list[int], steps: int) -> tuple[list[int], torch.Tensor]:
    return greedy_decode(model, prompt, steps)


@pytest.mark.interpreter
@pytest.mark.parametrize(
    ("family", "made"), [("qwen3_moe", set()), ("olmoe", {"cos", "sin", "mask"})]
)
def test_the_step_makes_rope_rows_only_where_a_path_takes_them(
    family: str, made: set[str], tiny_ftw: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``StepRows``: a step whose kernels read the position themselves (the fused q/k/v
    RoPE and attention) makes no RoPE rows nor mask; OLMoE's q/k norm over all heads
    projects through the attention's torch ops and attends through SDPA, which take
    them."""
    asked: set[str] = set()

    class Counted(decode_module.StepRows):
        def __getattribute__(self, name: str) -> object:
            if name in ("cos", "sin", "mask"):
                asked.add(name)
            return super().__getattribute__(name)

    monkeypatch.setattr(decode_module, "StepRows", Counted)
    with _uncaptured_step(tiny_ftw[family]) as llm:
        _decode(llm.model, [5, 17, 250, 3], 2)
    assert asked == made


@contextmanager
def _uncaptured_step(path: Path) -> Iterator[flint.LLM]:
    """``path`` on the CPU in bf16 (64 positions, torch's expert kernels) decoding
    through the graph step launched op by op."""
    with flint.LLM(
        path, device="cpu", dtype="bfloat16", context_length=64, expert_kernels="torch"
    ) as llm:
        pools = expert_pools(llm.model.experts)
        assert pools is not None
        llm.model.decoder = GraphDecoder(llm.model, pools, capture=False)
        yield llm


def test_the_step_covers_the_standard_attention_families(tiny_ftw: dict[str, Path]) -> None:
    covered = _covered(tiny_ftw)
    assert set(COVERED) <= set(covered), covered


@pytest.mark.interpreter
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("family", COVERED)
def test_the_step_follows_the_eager_layer_loop(
    family: str, dtype: str, tiny_ftw: dict[str, Path]
) -> None:
    """The fixed-address step (uncaptured, on the CPU) against the model's own decode,
    across a span boundary (positions SPAN_STEP - 3 onwards); its KV cache writes serve
    the eager path too. torch's expert kernels, as on CUDA: the step's pools are the
    resident torch backend's. In fp32 the step's own kernels (matrix-vector products,
    attention, norms) differ from torch's only in summation order: the same tokens,
    logits within 1e-4 of their scale. In bf16 each rounds where torch rounds
    (``assert_follows``)."""
    with flint.LLM(
        tiny_ftw[family],
        device="cpu",
        dtype=dtype,
        context_length=SPAN_STEP + 16,
        expert_kernels="torch",
    ) as llm:
        model = llm.model
        pools = expert_pools(model.experts)
        assert pools is not None
        prompt = [(7 * i + 3) % 300 + 2 for i in range(SPAN_STEP - 3)]
        want_tokens, want = _decode(model, prompt, 8)
        model.decoder = GraphDecoder(model, pools, capture=False)
        got_tokens, got = _decode(model, prompt, 8)
        scale = want.abs().max().item()
        rows = (got - want).abs().amax(dim=1)  # [8]
        if dtype == "float32":
            assert got_tokens == want_tokens
            assert rows.max().item() <= 1e-4 * scale
        else:  # a flipped tie comes after the span boundary (rows from 3 on)
            assert_follows(got_tokens, got, want_tokens, want, min_same=5)
        # the eager path continues from the step's cache writes
        model.decoder = None
        tail = model.forward(torch.tensor([got_tokens[-1]]))[-1]
        assert torch.isfinite(tail).all()


def _eager_step_from(model: MoEModel, pools: dict, path: Path) -> GraphDecoder:
    """The step, launched op by op, made with ``path``'s file as its weight source (its
    int8 matrices as stored), set as ``model``'s decoder."""
    source = FtwSource(path)
    try:
        model.decoder = decoder = GraphDecoder(model, pools, capture=False, source=source)
    finally:
        source.close()
    return decoder


@pytest.fixture(scope="module")
def int8_dense_ftw(tiny_models: dict, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """qwen3_moe (q/k norms) and qwen2_moe (q/k/v biases, a shared expert) converted with
    --dense-quant int8."""
    from flint.convert import ConvertOptions, convert

    out = tmp_path_factory.mktemp("int8_dense")
    files = {}
    for family in ("qwen3_moe", "qwen2_moe"):
        files[family] = out / f"{family}.ftw"
        convert(str(tiny_models[family][0]), files[family], ConvertOptions(dense_quant="int8"))
    return files


@pytest.mark.interpreter
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("family", ["qwen3_moe", "qwen2_moe"])
def test_the_step_reads_int8_attention_as_stored(
    family: str, dtype: str, int8_dense_ftw: dict[str, Path]
) -> None:
    """A --dense-quant int8 file: the step's q/k/v and o products read the stored int8
    matrices and row scales (every layer's), the rest of the model the dequantized
    ones. Against the model's own decode: in fp32 the same tokens and logits within
    1e-4 of their scale (the scale applied after the dot instead of before); in bf16
    ``assert_follows``."""
    path = int8_dense_ftw[family]
    with flint.LLM(
        path, device="cpu", dtype=dtype, context_length=64, expert_kernels="torch"
    ) as llm:
        model = llm.model
        pools = expert_pools(model.experts)
        assert pools is not None
        prompt = [(5 * i + 1) % 300 + 2 for i in range(20)]
        want_tokens, want = _decode(model, prompt, 8)
        decoder = _eager_step_from(model, pools, path)
        assert sorted(decoder.int8) == [layer.index for layer in model.layers]
        assert decoder.int8_head is not None  # their heads are not tied: int8 too
        (qkv, qkv_scale), (o, o_scale) = decoder.int8[0]
        assert qkv.dtype == o.dtype == torch.int8
        assert qkv_scale.dtype == o_scale.dtype == torch.float32
        attn = model.layers[0].attn
        assert qkv.shape == (attn.q_w.shape[0] + 2 * attn.k_w.shape[0], attn.q_w.shape[1])
        assert o.shape == attn.o_w.shape
        got_tokens, got = _decode(model, prompt, 8)
        o_scale.zero_()  # the step reads these: layer 0's attention output drops out
        assert not torch.equal(_decode(model, prompt, 1)[1][0], got[0])
    if dtype == "float32":
        assert got_tokens == want_tokens
        assert (got - want).abs().max().item() <= 1e-4 * want.abs().max().item()
    else:
        assert_follows(got_tokens, got, want_tokens, want)


@pytest.mark.interpreter
def test_the_step_reads_the_int8_lm_head_as_stored(
    wide_files: dict[str, Path], tiny_models: dict, tmp_path: Path
) -> None:
    """A --dense-quant int8 file with its own LM head: the step's head product reads
    the stored int8 matrix and row scales (fp32: the model's own decode's tokens, logits
    within 1e-4 of their scale); a bf16 file and a tied model's int8 file have none."""
    from flint.convert import ConvertOptions, convert

    path = wide_files["dense-int8"]
    with flint.LLM(
        path, device="cpu", dtype="float32", context_length=64, expert_kernels="torch"
    ) as llm:
        model = llm.model
        pools = expert_pools(model.experts)
        assert pools is not None
        prompt = [5, 17, 250, 3, 99, 42, 7, 7, 120]
        want_tokens, want = _decode(model, prompt, 6)
        decoder = _eager_step_from(model, pools, path)
        assert decoder.int8_head is not None
        q, scale = decoder.int8_head
        assert q.dtype == torch.int8 and q.shape == model.lm_head.shape
        assert scale.dtype == torch.float32 and scale.shape == (q.shape[0],)
        got_tokens, got = _decode(model, prompt, 6)
        scale[: q.shape[0] // 2].zero_()  # the step reads these: half the logits drop to 0
        zeroed = _decode(model, prompt, 1)[1][0]
        assert bool((zeroed[: q.shape[0] // 2] == 0).all()) and bool(zeroed.abs().max() > 0)
    assert got_tokens == want_tokens
    assert (got - want).abs().max().item() <= 1e-4 * want.abs().max().item()
    tied = tmp_path / "tied.ftw"  # tiny Mixtral ties its head to the embedding
    convert(str(tiny_models["mixtral"][0]), tied, ConvertOptions(dense_quant="int8"))
    for path in (wide_files["none"], tied):
        source = FtwSource(path)
        try:  # nothing stored as int8 under the head's name
            assert source.int8_matrix("lm_head.weight") is None
            assert int8_head(model, source) is None
        finally:
            source.close()


@pytest.mark.interpreter
@pytest.mark.parametrize("quant", ["int8", "int4"])
def test_slab_experts_step_follows_torch_kernels(
    quant: str, wide_files: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """int8/int4 experts kept as slabs: eager prefill dequantizes per expert, the step
    computes by slot index; both follow the usual quantized backend's greedy tokens.
    int4's input in the word kernels' layout comes from the norm's launch, with the
    bits of its own launch. The post-attention norm is made in the router's launch
    (each MoE layer's, each token), and the step with its own launch agrees."""
    from flint.graphs.slab_experts import SlabResidentExperts
    from flint.models.loading import Placement

    path = wide_files[quant]
    with flint.LLM(
        path, device="cpu", dtype="bfloat16", context_length=64, expert_kernels="torch"
    ) as usual:
        prompt = [5, 17, 250, 3, 99, 42, 7, 7, 120]
        want_tokens, want = _decode(usual.model, prompt, 6)
        config, source = usual.model.config, usual.source
        backend = SlabResidentExperts(
            config, source, Placement(torch.device("cpu"), torch.bfloat16)
        )
    with flint.LLM(
        path, device="cpu", dtype="bfloat16", context_length=64, expert_backend=backend
    ) as slabs:
        model = slabs.model
        assert model.expert_kernel.startswith(f"flint Triton slot kernels ({quant}")
        model.decoder = decoder = GraphDecoder(model, backend.pools, capture=False)
        # int4: the experts' input in the word kernels' layout, written by the norm
        assert bool(decoder.eighths) == (quant == "int4")
        folds: list[int] = []  # the post-attention norm made in the router's launch
        monkeypatch.setattr(fused, "CLUSTER_ROUTE", 0)  # its product's own (not the top-k's)
        norm_linear = fused.norm_linear
        monkeypatch.setattr(
            fused, "norm_linear", lambda *a, **k: folds.append(1) or norm_linear(*a, **k)
        )
        got_tokens, got = _decode(model, prompt, 6)
        moe_layers = sum(isinstance(layer.mlp, MoEBlock) for layer in model.layers)
        assert len(folds) == moe_layers * 6
        if quant == "int4":  # the same bits as its own launch (moe_kernel.eighths)
            monkeypatch.setattr(decode_module, "EIGHTHS_IN_NORM", False)
            model.decoder = decoder = GraphDecoder(model, backend.pools, capture=False)
            assert not decoder.eighths
            assert torch.equal(_decode(model, prompt, 6)[1], got)
        # the norm's own launch and the router's own product instead: the same tokens
        monkeypatch.setattr(decode_module, "NORM_IN_ROUTER", False)
        model.decoder = GraphDecoder(model, backend.pools, capture=False)
        apart_tokens, apart = _decode(model, prompt, 6)
        assert len(folds) == moe_layers * (12 if quant == "int4" else 6)
        assert apart_tokens == got_tokens
        assert (apart - got).abs().max().item() <= 0.02 * got.abs().max().item()
    assert got_tokens == want_tokens
    assert (got - want).abs().max().item() <= 0.05 * want.abs().max().item()


@pytest.mark.interpreter
@pytest.mark.parametrize("quant", ["int8", "int4"])
def test_slab_experts_prompt_equals_dequantizing_each_expert(
    quant: str, wide_files: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without Triton, a prompt's experts dequantized a chunk at a time (a chunk of two
    experts here) give the bits of dequantizing each one with the file's own rule; with
    it, the grouped kernels agree with that within bf16 rounding."""
    from flint.graphs import slab_experts
    from flint.graphs.slab_experts import SlabResidentExperts
    from flint.models.loading import Placement
    from flint.models.moe import dispatch

    with flint.LLM(wide_files[quant], device="cpu", context_length=8) as llm:
        config, place = llm.model.config, Placement(torch.device("cpu"), torch.bfloat16)
        backend = SlabResidentExperts(config, llm.source, place)  # type: ignore[arg-type]
    layout = backend.layout
    per_expert = 4 * sum(r * c for r, c in layout.shapes)
    monkeypatch.setattr(slab_experts, "DEQUANT_BYTES", 2 * per_expert)
    torch.manual_seed(5)
    tokens = slab_experts.KERNEL_TOKENS + 3  # past the slot-indexed kernels' calls
    x = torch.randn(tokens, config.hidden_size).bfloat16()
    experts = config.num_experts
    ids = torch.stack([torch.randperm(experts)[: config.top_k] for _ in range(tokens)])
    w = torch.rand(tokens, config.top_k).bfloat16()
    grouped = backend(0, x, ids, w)
    monkeypatch.setattr(slab_experts, "available", lambda: "no Triton (test)")
    got = backend(0, x, ids, w)

    def run(e: int, xs: torch.Tensor) -> torch.Tensor:
        g, u, d = (layout.weight(backend.slabs[0][e], p).to(torch.bfloat16) for p in range(3))
        return F.linear(F.silu(F.linear(xs, g)) * F.linear(xs, u), d)

    want = dispatch(x, ids, w, config.num_experts, run)
    assert torch.equal(got, want)
    err = ((grouped.float() - want.float()).norm() / want.float().norm()).item()
    assert err <= 1e-2, err  # the same bits here; another summation order on a GPU


def test_int4_groups_the_kernels_cannot_tile_are_refused() -> None:
    from flint.graphs.moe_kernel import slab_unsupported

    assert slab_unsupported("int4", 32) is None and slab_unsupported("int4", 2) is None
    assert slab_unsupported("int8", 1) is None
    for group in (6, 48, 2048):
        why = slab_unsupported("int4", group)
        assert why is not None and str(group) in why


@pytest.mark.interpreter
def test_greedy_ahead_gives_the_plain_loops_tokens(
    tiny_ftw: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Greedy decode one step ahead on the device (``_greedy_ahead``) against the loop
    that reads each token before the next step: the same tokens, text and finish, and
    the KV cache left at the same length with the same tokens, whether the reply ends
    by its token budget, by the context filling up, at an end-of-sequence token or by
    a cancel; with a penalty the plain loop runs."""
    import threading

    from flint import generation
    from flint.graphs.decode import GraphDecoder
    from flint.sampling import SamplingParams

    calls: list[int] = []
    ahead = generation._greedy_ahead

    def counted(*args: object, **kw: object) -> object:
        calls.append(1)
        return ahead(*args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(generation, "_greedy_ahead", counted)
    prompt = [(7 * i + 3) % 300 + 2 for i in range(6)]
    cases = [
        ({"max_tokens": 3, "ignore_eos": True}, 64),
        ({"max_tokens": 40, "ignore_eos": True}, 11),  # the context fills at 11
        ({"max_tokens": 2, "ignore_eos": True, "repetition_penalty": 1.3}, 64),
    ]
    with _uncaptured_step(tiny_ftw["qwen3_moe"]) as llm:
        model = llm.model
        # an end-of-sequence token: the third token the plain loop gives
        want = llm.generate(prompt, max_tokens=3, temperature=0.0, ignore_eos=True)
        monkeypatch.setattr(llm.tokenizer, "eos_token_ids", frozenset({want.token_ids[-1]}))
        cases.append(({"max_tokens": 6}, 64))
        for kw, context in cases:
            model.cache.context_length = context
            runs = []
            for device_greedy in (False, True):
                monkeypatch.setattr(GraphDecoder, "device_greedy", device_greedy)
                calls.clear()
                out = llm.generate(prompt, temperature=0.0, **kw)
                assert len(calls) == (device_greedy and "repetition_penalty" not in kw)
                length = model.cache.length
                runs.append((out.token_ids, out.text, out.finish_reason, length,
                             model.cache.tokens[:length].tolist()))  # fmt: skip
            assert runs[0] == runs[1], kw
        assert len(runs[0][0]) == 3 and runs[0][2] == "stop"  # the last case: at the eos
        # cancelled after the first chunk: the same tokens streamed, the same cache
        model.cache.context_length = 64
        params = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)
        runs = []
        for device_greedy in (False, True):
            monkeypatch.setattr(GraphDecoder, "device_greedy", device_greedy)
            cancel, ids = threading.Event(), []
            stream = generation.generate_stream(model, llm.tokenizer, prompt, params, cancel=cancel)
            for i, chunk in enumerate(stream):
                ids += chunk.token_ids
                if i == 0:
                    cancel.set()
            length = model.cache.length
            runs.append((ids, length, model.cache.tokens[:length].tolist()))
        assert runs[0] == runs[1] and len(runs[0][0]) < 5


def test_closing_frees_a_model_with_a_decoder(tiny_ftw: dict[str, Path]) -> None:
    """The decoder refers back to its model: close() breaks that, so the weights and
    KV cache go at close, not at some later garbage collection."""
    import gc
    import weakref

    gc.disable()
    try:
        # torch's kernels, as on CUDA: the step's pools are the resident torch backend's
        llm = flint.LLM(
            tiny_ftw["qwen3_moe"], device="cpu", context_length=16, expert_kernels="torch"
        )
        model = llm.model
        pools = expert_pools(model.experts)
        assert pools is not None
        model.decoder = GraphDecoder(model, pools, capture=False)
        alive = weakref.ref(model)
        del model, pools
        llm.close()
        assert alive() is None
    finally:
        gc.enable()


def test_a_step_that_fails_to_start_leaves_the_model_eager(
    tiny_ftw: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """auto: a kernel or capture the GPU refuses, or no memory for the step's buffers,
    costs one line, not the load; on and eager: the error stands. (Run on the CPU with
    the device check and the warm-up stubbed.)"""
    from flint.graphs import setup

    def refuse(self: GraphDecoder) -> None:
        raise RuntimeError("CUDA error: no kernel image is available\nmore")

    monkeypatch.setattr(setup, "unsupported", lambda model, backend: None)
    monkeypatch.setattr(GraphDecoder, "warm_up", refuse)
    # torch's kernels, as on CUDA (the fused ones would give the model a Rust decode step)
    with flint.LLM(
        tiny_ftw["qwen3_moe"], device="cpu", context_length=16, expert_kernels="torch"
    ) as llm:
        lines: list[str] = []
        why = setup.attach_decoder(llm.model, "auto", notice=lines.append)
        assert why == "CUDA error: no kernel image is available"
        assert llm.model.decoder is None
        assert lines == [f"flint: CUDA graph decode failed to start ({why}); decoding eagerly"]
        with pytest.raises(RuntimeError, match="no kernel image"):
            setup.attach_decoder(llm.model, "on", notice=lines.append)
        # no GPU memory for the step's own buffers (built before the warm-up) is the same
        monkeypatch.setattr(GraphDecoder, "__init__", _out_of_memory)
        lines.clear()
        why = setup.attach_decoder(llm.model, "auto", notice=lines.append)
        assert why == "CUDA out of memory. Tried to allocate 1.00 GiB"
        assert llm.model.decoder is None and len(lines) == 1
        with pytest.raises(torch.OutOfMemoryError):
            setup.attach_decoder(llm.model, "eager", notice=lines.append)


def _out_of_memory(self: GraphDecoder, *args: object) -> None:
    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.00 GiB")


def test_graph_modes_are_checked(tiny_ftw: dict[str, Path]) -> None:
    with pytest.raises(ValueError, match="graphs must be one of"):
        flint.LLM(tiny_ftw["qwen3_moe"], device="cpu", graphs="sometimes")
    with pytest.raises(ValueError, match="CUDA graphs need a CUDA device"):
        flint.LLM(tiny_ftw["qwen3_moe"], device="cpu", graphs="on")
    # torch's kernels: the fused ones would give the model the Rust CPU decode step
    with flint.LLM(
        tiny_ftw["qwen3_moe"], device="cpu", context_length=8, expert_kernels="torch"
    ) as llm:
        assert llm.model.decoder is None  # auto: CUDA only, without a word


# -- CUDA: the captured step ------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("family", COVERED)
def test_captured_and_eager_steps_are_bit_identical(family: str, tiny_ftw: dict[str, Path]) -> None:
    """64 greedy tokens through CUDA graphs and through the same step launched op by op:
    the same bits; several spans captured (the context crosses SPAN_STEP); the general
    eager path (torch's kernels) gives the same tokens up to a flipped tie
    (``assert_follows``)."""
    prompt = [(7 * i + 3) % 300 + 2 for i in range(SPAN_STEP - 20)]
    runs = {}
    for mode in ("on", "eager", "off"):
        with flint.LLM(
            tiny_ftw[family], device="cuda:0", context_length=SPAN_STEP + 64, graphs=mode
        ) as llm:
            runs[mode] = _decode(llm.model, prompt, 64)
            decoder = llm.model.decoder
            if mode == "on":
                assert isinstance(decoder, GraphDecoder) and len(decoder.graphs) == 2
                assert decoder.replays == 65  # one at load (warm_up)
            elif mode == "off":
                assert decoder is None
    assert runs["on"][0] == runs["eager"][0]
    assert torch.equal(runs["on"][1], runs["eager"][1])
    assert_follows(runs["on"][0], runs["on"][1], runs["off"][0], runs["off"][1])


def test_gate_up_never_lets_down_start_early(monkeypatch: pytest.MonkeyPatch) -> None:
    """down reads the router's ids (two kernels back) before its wait, so gate/up must
    not let it start before gate/up's own wait: ``pdl`` refuses such a set anywhere (the
    CPU too); the sets name only known kernels."""
    assert "gate_up" not in moe_kernel.EARLY_NAMES
    assert moe_kernel.EARLY | moe_kernel.SMALL_KERNELS <= moe_kernel.EARLY_NAMES
    monkeypatch.setattr(moe_kernel, "EARLY", frozenset({"gate_up"}))
    with pytest.raises(AssertionError, match="router's ids"):
        moe_kernel.pdl(torch.device("cpu"), "norm")


@pytest.mark.gpu
@pytest.mark.parametrize(
    "early", ["none", "route", "small", "all", "late1-async", "late1-barrier", "late2-async"]
)
@pytest.mark.parametrize("family", COVERED)
def test_dependent_launch_gives_the_serial_launchs_bits(
    family: str, early: str, tiny_ftw: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The step's kernels with programmatic dependent launch (each starting while the
    one before finishes, on Hopper and later) and launched one after the other: the
    same bits over 40 tokens (a kernel reading its input before the one before has
    written it would show here). ``early``: which kernels let the next one start before
    their own wait (``moe_kernel.EARLY``): none (the default), the router's top-k, the
    small ones, or all but gate/up; "lateN-EXCHANGE": the cluster norm letting the next
    start once it has the ranks' rows (1) or has exchanged its sums of squares (2)
    instead of at its wait (``fused.CLUSTER_NORM_LATE``), the sums exchanged through
    asynchronous stores or plain stores and a cluster barrier (``fused.CLUSTER_ASYNC``;
    the defaults are 0 and asynchronous)."""
    names = {
        "route": frozenset({"route"}),
        "small": moe_kernel.SMALL_KERNELS,
        "all": moe_kernel.EARLY_NAMES,
    }
    monkeypatch.setattr(moe_kernel, "EARLY", names.get(early, frozenset()))
    if early.startswith("late"):
        late, exchange = early.removeprefix("late").split("-")
        monkeypatch.setattr(fused, "CLUSTER_NORM_LATE", int(late))
        monkeypatch.setattr(fused, "CLUSTER_ASYNC", exchange == "async")
    if not moe_kernel._pdl_capable(0):
        pytest.skip("programmatic dependent launch needs Hopper or later and Triton's gdc")
    with moe_kernel.dependent_launch():
        assert moe_kernel.pdl(torch.device("cuda", 0)) == {"GDC": True, "launch_pdl": True}
    prompt = [(11 * i + 5) % 300 + 2 for i in range(24)]
    runs = {}
    for on in (True, False):
        monkeypatch.setattr(moe_kernel, "PDL", on)
        with flint.LLM(tiny_ftw[family], device="cuda:0", context_length=128, graphs="on") as llm:
            runs[on] = _decode(llm.model, prompt, 40)
    assert runs[True][0] == runs[False][0]
    assert torch.equal(runs[True][1], runs[False][1])


@pytest.mark.gpu
@pytest.mark.parametrize("ask", ["rope", "attention"])
def test_asking_the_l2_for_keys_and_values_gives_the_same_bits(
    ask: str, tiny_ftw: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``fused.KV_ASK``: the attention's earlier keys and values asked of the L2 before
    the wait, by RoPE's key and value programs or by the attention's own (a hint): the
    same tokens and logits over 40 captured tokens as without the asks."""
    if not moe_kernel._pdl_capable(0):
        pytest.skip("the asks are made under dependent launch: Hopper or later and Triton's gdc")
    prompt = [(11 * i + 5) % 300 + 2 for i in range(24)]
    runs = {}
    for value in (ask, ""):
        monkeypatch.setattr(fused, "KV_ASK", value)
        path = tiny_ftw["qwen3_moe"]
        with flint.LLM(path, device="cuda:0", context_length=128, graphs="on") as llm:
            runs[value] = _decode(llm.model, prompt, 40)
    assert runs[ask][0] == runs[""][0]
    assert torch.equal(runs[ask][1], runs[""][1])


@pytest.mark.gpu
def test_a_captured_int8_head_of_a_wide_vocabulary(
    tiny_tokenizer_json: str, tmp_path: Path
) -> None:
    """--dense-quant int8 with a vocabulary past 16384 rows (the LM head's own block
    shape, a masked last block, the argmax's blocks): 24 greedy tokens through CUDA
    graphs and through the same step launched op by op give the same bits, with the
    head read as stored; the model's own decode (the dequantized head) the same tokens
    up to a flipped tie."""
    from flint.convert import ConvertOptions, convert

    save_wide_qwen3(tmp_path / "ckpt", tiny_tokenizer_json, 20011, positions=128, seed=3)
    path = tmp_path / "wide-vocab.ftw"
    convert(str(tmp_path / "ckpt"), path, ConvertOptions(quant="int4", dense_quant="int8"))
    prompt = [5, 17, 250, 3, 99, 42, 7, 7, 120]
    runs = {}
    for mode in ("on", "eager", "off"):
        with flint.LLM(path, device="cuda:0", context_length=64, graphs=mode) as llm:
            runs[mode] = _decode(llm.model, prompt, 24)
            if mode != "off":
                decoder = llm.model.decoder
                assert isinstance(decoder, GraphDecoder) and decoder.int8_head is not None
                assert decoder.int8_head[0].shape == (20011, 64)
    assert runs["on"][0] == runs["eager"][0]
    assert torch.equal(runs["on"][1], runs["eager"][1])
    assert_follows(runs["on"][0], runs["on"][1], runs["off"][0], runs["off"][1])


@pytest.mark.gpu
@pytest.mark.parametrize("quant", ["int8", "int4"])
def test_captured_quantized_steps_follow_torch_kernels(
    quant: str, wide_files: dict[str, Path]
) -> None:
    prompt = [5, 17, 250, 3, 99, 42, 7, 7, 120]
    runs = {}
    for mode in ("on", "eager", "off"):
        with flint.LLM(wide_files[quant], device="cuda:0", context_length=128, graphs=mode) as llm:
            runs[mode] = _decode(llm.model, prompt, 32)
    assert torch.equal(runs["on"][1], runs["eager"][1])
    assert runs["on"][0] == runs["off"][0]
    scale = runs["off"][1].abs().max().item()
    assert (runs["on"][1] - runs["off"][1]).abs().max().item() <= 0.05 * scale


@pytest.mark.gpu
def test_greedy_ahead_through_graphs_gives_the_plain_loops_tokens(
    tiny_ftw: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """On CUDA with captured graphs: greedy decode one step ahead against the loop that
    reads each token first, 64 tokens across a span boundary: the same tokens and cache."""
    from flint.graphs.decode import GraphDecoder

    prompt = [(7 * i + 3) % 300 + 2 for i in range(SPAN_STEP - 20)]
    with flint.LLM(tiny_ftw["qwen3_moe"], device="cuda:0", context_length=SPAN_STEP + 64) as llm:
        assert isinstance(llm.model.decoder, GraphDecoder) and llm.model.decoder.capture
        runs = []
        for device_greedy in (False, True):
            monkeypatch.setattr(GraphDecoder, "device_greedy", device_greedy)
            out = llm.generate(prompt, max_tokens=64, temperature=0.0, ignore_eos=True)
            length = llm.model.cache.length
            runs.append((out.token_ids, length, llm.model.cache.tokens[:length].tolist()))
        assert runs[0] == runs[1]


# torch warns once a process when the mode is first set, after setting it (an error
# here; in a whole run tests/models/test_gpu_waves.py sets it first, catching warnings)
@pytest.mark.gpu
@pytest.mark.filterwarnings("ignore:Synchronization debug mode is a prototype:UserWarning")
def test_greedy_ahead_makes_no_synchronising_call(
    tiny_ftw: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The loop one step ahead waits only on the event of the token it reads: with
    torch's sync debug mode raising inside it, a reply decodes (a cache write that
    copied the id from pageable memory waited for the queued step every token, so
    the next was queued only after the GPU had finished: docs/benchmarks.md, gpu111).
    Within the span captured at load: capturing another synchronises by design."""
    from flint import generation

    ahead = generation._greedy_ahead

    def strict(*args: object, **kw: object) -> Iterator[object]:
        torch.cuda.set_sync_debug_mode("error")
        try:
            yield from ahead(*args, **kw)  # type: ignore[arg-type]
        finally:
            torch.cuda.set_sync_debug_mode("default")

    monkeypatch.setattr(generation, "_greedy_ahead", strict)
    prompt = [(7 * i + 3) % 300 + 2 for i in range(16)]
    with flint.LLM(tiny_ftw["qwen3_moe"], device="cuda:0", context_length=128) as llm:
        try:
            out = llm.generate(prompt, max_tokens=24, temperature=0.0, ignore_eos=True)
        finally:  # the mode off for later tests, whatever happened in the generator
            torch.cuda.set_sync_debug_mode("default")
        assert len(out.token_ids) == 24 and llm.model.cache.length == 16 + 23
        assert llm.model.cache.tokens[16:39].tolist() == list(out.token_ids[:23])


@pytest.mark.gpu
@pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs two GPUs"
)
def test_a_model_on_the_second_gpu_decodes_through_graphs(tiny_ftw: dict[str, Path]) -> None:
    """Triton launches and graph replays go to the current device: a model on cuda:1
    (while cuda:0 is current) gives the tokens and logits it gives on cuda:0, and
    greedy decode one step ahead waits on cuda:1's stream (the same reply)."""
    prompt = [(7 * i + 3) % 300 + 2 for i in range(40)]
    runs, replies = [], []
    for device in ("cuda:0", "cuda:1"):
        with flint.LLM(tiny_ftw["qwen3_moe"], device=device, context_length=128) as llm:
            assert isinstance(llm.model.decoder, GraphDecoder)
            runs.append(_decode(llm.model, prompt, 16))
            out = llm.generate(prompt, max_tokens=32, temperature=0.0, ignore_eos=True)
            replies.append(out.token_ids)
    assert runs[0][0] == runs[1][0]
    assert torch.equal(runs[0][1], runs[1][1])
    assert replies[0] == replies[1]
