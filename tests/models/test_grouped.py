"""Grouped expert kernels for prompts (``flint.graphs.grouped``): against the per-expert
torch path, and a pair's bits independent of what shares its launch. Without a GPU the
kernels run in Triton's CPU interpreter (tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_graphs import GptOssExperts, _reference, _slabs

import flint
from flint.graphs import grouped
from flint.graphs.grouped import Tiles, block_m, dequantize_slots, grouped_experts, pair_plan
from flint.graphs.moe_kernel import available, dequantize, slab_pool, stacked_pool
from flint.models.moe import weighted_sum

pytestmark = pytest.mark.skipif(available() is not None, reason="needs Triton")


def _pool(
    scheme: str, experts: int, inter: int, hidden: int, group: int = 8, device: str = "cpu"
) -> tuple:
    shapes = ((inter, hidden), (inter, hidden), (hidden, inter))
    if scheme == "raw":
        g, u, d = (torch.randn(experts, *s).bfloat16() for s in shapes)
        dense = [(g[e].float(), u[e].float(), d[e].float()) for e in range(experts)]
        return stacked_pool(g.to(device), u.to(device), d.to(device)), dense
    slabs, offsets, dense = _slabs(scheme, experts, shapes, group)
    return slab_pool(slabs.to(device), scheme, group, shapes, offsets), dense


def _route(tokens: int, experts: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.stack([torch.randperm(experts)[:k] for _ in range(tokens)])
    return ids, torch.rand(tokens, k).bfloat16()


# 128-pair programs of 8 warps (``tiles_for``'s shape for long prompts on a large GPU)
BIG = Tiles(128, warps=8, native=True)
# the down kernel with its own shape (BN 32, BK 128)
OWN_DOWN = Tiles(16, down=(32, 128, 4, 3))


@pytest.mark.interpreter
@pytest.mark.parametrize(
    ("scheme", "tiles"),
    [("raw", None), ("int8", None), ("int4", None), ("int4", BIG), ("int8", OWN_DOWN)],
)
def test_grouped_kernels_follow_the_per_expert_path(scheme: str, tiles: Tiles | None) -> None:
    """Odd shapes (rows and columns not multiples of the tiles or the int4 group
    count, a slot's pairs not a multiple of the block): within bf16 rounding of the
    per-expert torch path on the file's dequantized weights."""
    torch.manual_seed(1)
    experts, inter, hidden, k, tokens = 5, 40, 200, 3, 37
    pool, dense = _pool(scheme, experts, inter, hidden)
    x = torch.randn(tokens, hidden).bfloat16()
    ids, w = _route(tokens, experts, k)
    out = torch.full((tokens * k, hidden), float("nan"))
    every = {e: e for e in range(experts)}
    grouped_experts(x, pair_plan(ids, experts, x.device), every, pool, out, tiles)
    got = weighted_sum(out.view(tokens, k, -1), w).to(x.dtype)
    want = _reference(x, ids, w, dense)
    err = ((got.float() - want.float()).norm() / want.float().norm()).item()
    assert err <= 1e-2, err


@pytest.mark.interpreter
@pytest.mark.parametrize("tiles", [None, BIG])
def test_a_pair_gets_the_same_bits_whatever_shares_its_launch(tiles: Tiles | None) -> None:
    """The experts split over two launches (the others' pairs skipped) give the bits of
    one launch over all of them; a skipped pair's row is left as it was."""
    torch.manual_seed(2)
    experts, inter, hidden, k, tokens = 6, 24, 136, 2, 50
    pool, _ = _pool("int4", experts, inter, hidden)
    x = torch.randn(tokens, hidden).bfloat16()
    ids, _ = _route(tokens, experts, k)
    plan = pair_plan(ids, experts, x.device)
    whole = torch.full((tokens * k, hidden), float("nan"))
    grouped_experts(x, plan, {e: e for e in range(experts)}, pool, whole, tiles)
    assert not whole.isnan().any()
    parts = torch.full_like(whole, float("nan"))
    first = ids.reshape(-1) < 2
    grouped_experts(x, plan, {0: 0, 1: 1}, pool, parts, tiles)
    assert parts[~first].isnan().all() and not parts[first].isnan().any()
    grouped_experts(x, plan, {e: e for e in range(2, experts)}, pool, parts, tiles)
    assert torch.equal(parts, whole)


@pytest.mark.interpreter
def test_grouped_kernels_add_biases_by_expert_id_from_any_slot() -> None:
    """A pool whose slots hold the experts in another order (as the streaming
    backend's staging buffers do): biases are looked up by expert id, GPT-OSS's clamped
    activation is applied; against ``ExpertMath`` around torch's matmuls."""
    torch.manual_seed(4)
    k, tokens = 2, 33
    ex = GptOssExperts(5, 24, 72)
    perm = torch.tensor([3, 0, 4, 1, 2])  # slot s holds expert perm[s]
    pool = stacked_pool(ex.g[perm], ex.u[perm], ex.d[perm]).with_math(ex.math, 0)
    x = torch.randn(tokens, 72).bfloat16() * 4  # some gates past the clamp
    ids, w = _route(tokens, ex.experts, k)
    slot_of = {int(e): s for s, e in enumerate(perm)}
    out = torch.empty(tokens * k, 72)
    grouped_experts(x, pair_plan(ids, ex.experts, x.device), slot_of, pool, out)
    got = weighted_sum(out.view(tokens, k, -1), w).to(x.dtype)
    want = ex.reference(x, ids, w)
    err = ((got.float() - want.float()).norm() / want.float().norm()).item()
    assert err <= 1e-2, err


def test_block_shape_depends_on_the_token_count_only() -> None:
    assert [block_m(t) for t in (33, 127, 128, 1023, 1024, 8192)] == [16, 16, 32, 32, 64, 64]


@pytest.mark.interpreter
@pytest.mark.parametrize("quant", ["int8", "int4"])
def test_streamed_vram_experts_equal_the_resident_slab_backend(
    quant: str, wide_files: dict[str, Path]
) -> None:
    """A streamed model whose "VRAM" cache (in RAM here) holds every expert as slabs
    computes a prompt's experts in one grouped launch from that pool: the bits of the
    resident slab backend's grouped launch over its own."""
    from test_vram_cache import _open

    from flint.graphs.slab_experts import KERNEL_TOKENS, SlabResidentExperts
    from flint.models.loading import Placement

    path = wide_files[quant]
    with flint.LLM(path, device="cpu", context_length=8) as llm:
        config = llm.model.config
        resident = SlabResidentExperts(
            config,
            llm.source,  # type: ignore[arg-type]
            Placement(torch.device("cpu"), torch.float32),
        )
    layer = config.sparse_layers.index(True)
    with _open(path, ram_slots=2, vram_slots=config.num_experts, slab_kernels=True) as streamed:
        backend = streamed.expert_backend
        assert backend.slab_kernels and backend.vram_of[layer].pack is None  # type: ignore[union-attr]
        torch.manual_seed(3)
        tokens = KERNEL_TOKENS + 8
        x = torch.randn(tokens, config.hidden_size)
        ids, w = _route(tokens, config.num_experts, config.top_k)
        got = backend(layer, x, ids, w.float())  # type: ignore[misc]
        stats = streamed.stats()
    assert stats is not None and stats["gpu_experts"] == len(set(ids.reshape(-1).tolist()))
    assert torch.equal(got, resident(layer, x, ids, w.float()))


@pytest.mark.interpreter
def test_streamed_slab_kernels_decode_as_the_per_expert_path(wide_files: dict[str, Path]) -> None:
    """Two "VRAM" slots per layer, filled on first use (admissions) then held: a prompt
    and greedy decode through the slab kernels give the per-expert path's tokens, and
    logits within rounding."""
    from test_vram_cache import _open

    prompt = torch.tensor([3, 17, 42, 7, 99, 5, 23, 61] * 5)  # 40 tokens: a grouped prompt
    runs = {}
    for slab in (True, False):
        with _open(wide_files["int4"], ram_slots=3, vram_slots=2, slab_kernels=slab) as llm:
            ids, logits = prompt.tolist(), []
            for _ in range(6):
                out = llm.model.forward(torch.tensor(ids[-1:] if logits else ids))
                logits.append(out[-1])
                ids.append(int(out[-1].argmax()))
            s = llm.stats()
            assert s is not None and s["vram_admitted"] > 0 and s["vram_hits"] > 0
            runs[slab] = (ids, torch.stack(logits))
    assert runs[True][0] == runs[False][0]
    a, b = runs[True][1], runs[False][1]
    assert ((a - b).norm() / b.norm()).item() <= 1e-3


@pytest.mark.gpu
@pytest.mark.parametrize("scheme", ["raw", "int8", "int4"])
def test_grouped_kernels_on_the_gpu(scheme: str) -> None:
    """On the tensor cores: within bf16 rounding of the per-expert path (odd shapes, a
    block size past the smallest), and a pair's bits the same in a launch of its own
    slot's pairs as in one of every slot's."""
    torch.manual_seed(6)
    cuda = torch.device("cuda", 0)
    experts, inter, hidden, k, tokens = 9, 136, 520, 4, 300
    pool, dense = _pool(scheme, experts, inter, hidden, device="cuda")
    x = torch.randn(tokens, hidden).bfloat16()
    ids, w = _route(tokens, experts, k)
    plan = pair_plan(ids.to(cuda), experts, cuda)  # sorted on the GPU
    out = torch.full((tokens * k, hidden), float("nan"), device=cuda)
    grouped_experts(x.to(cuda), plan, {e: e for e in range(experts)}, pool, out)
    got = weighted_sum(out.view(tokens, k, -1), w.to(cuda)).to(torch.bfloat16).cpu()
    want = _reference(x, ids, w, dense)
    err = ((got.float() - want.float()).norm() / want.float().norm()).item()
    assert err <= 1e-2, err
    alone = torch.full_like(out, float("nan"))
    plan = pair_plan(ids, experts, cuda)  # sorted on the CPU
    for e in range(experts):  # one launch per slot
        grouped_experts(x.to(cuda), plan, {e: e}, pool, alone)
    assert torch.equal(alone, out)


def test_slab_kernels_are_chosen_alike_by_the_api_and_the_bench(
    monkeypatch: pytest.MonkeyPatch, wide_files: dict[str, Path]
) -> None:
    """On CUDA beside the graph step, unless FLINT_SLAB_KERNELS=0; and ``flint bench``'s
    streamed modes, which build their backend themselves, ask the same question."""
    from flint import api
    from flint.bench import modes
    from flint.stream import slab_kernels_default

    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert slab_kernels_default("auto", cuda) and slab_kernels_default("on", cuda)
    assert not slab_kernels_default("off", cuda) and not slab_kernels_default("auto", cpu)
    monkeypatch.setenv("FLINT_SLAB_KERNELS", "0")
    assert not slab_kernels_default("auto", cuda)
    monkeypatch.delenv("FLINT_SLAB_KERNELS")

    seen = []

    class Stop(Exception):
        pass

    def capture(*args: object, **kw: object) -> None:
        seen.append(kw["slab_kernels"])
        raise Stop

    monkeypatch.setattr(modes, "slab_kernels_default", lambda graphs, device: graphs == "on")
    monkeypatch.setattr(modes, "streamed_backend", capture)
    for graphs in ("on", "off"):
        with pytest.raises(Stop):
            modes.load("full", modes.Setup(wide_files["int4"], device="cpu", graphs=graphs), print)
    monkeypatch.setattr("flint.stream.slab_kernels_default", lambda g, d: g == "on")
    monkeypatch.setattr("flint.stream.streamed_backend", capture)
    for graphs in ("on", "off"):
        with pytest.raises(Stop):
            api.LLM(wide_files["int4"], device="cpu", stream=True, graphs=graphs)
    assert seen == [True, False, True, False]


def test_index_views_start_aligned_so_kernels_do_not_recompile() -> None:
    """Triton compiles a kernel again for a pointer that is not 16-byte aligned: every
    view handed to the kernels starts aligned, whatever the lengths before it."""
    from flint.graphs.moe_kernel import aligned_views

    for dtype in (torch.int32, torch.int64):
        for lengths in ([1, 3, 2], [5, 0, 7, 1], [4, 4]):
            parts = [list(range(10 * i, 10 * i + n)) for i, n in enumerate(lengths)]
            views = aligned_views(parts, dtype, torch.device("cpu"))
            assert [v.tolist() for v in views] == parts
            assert all(v.data_ptr() % 16 == 0 for v in views if v.numel())


@pytest.mark.interpreter
def test_a_resized_vram_pool_drops_the_kernels_view_of_the_old_one(
    wide_files: dict[str, Path],
) -> None:
    """The slab kernels' view of a layer's VRAM pool holds the pool's memory: a resize
    (elastic VRAM) drops it with the pool, and the next call makes one of the new pool."""
    from test_vram_cache import _open

    prompt = torch.tensor([3, 17, 42, 7, 99, 5, 23, 61])
    with _open(wide_files["int4"], ram_slots=3, vram_slots=2, slab_kernels=True) as llm:
        llm.model.forward(prompt)
        backend = llm.expert_backend
        vram = next(iter(backend.vrams.values()))  # type: ignore[union-attr]
        layer = next(iter(vram.views))
        old = vram.views[layer]
        assert old.gate.weights.data_ptr() == vram.pools[layer].data_ptr()
        vram.resize(1)
        assert not vram.views, "views of replaced pools are gone"
        llm.model.forward(prompt[:1])
        new = vram.views[layer]
        assert new is not old and new.gate.weights.data_ptr() == vram.pools[layer].data_ptr()


@pytest.mark.interpreter
@pytest.mark.parametrize("scheme", ["int8", "int4"])
def test_dequantizing_first_gives_the_same_bits(
    scheme: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``FLINT_PROMPT_DEQUANT=1`` (the launch's slots dequantized by ``_tile``, then the
    kernels on bf16 weights) gives the bits of the kernels dequantizing in place, for
    a launch over some slots (experts in other slots than their ids); the dequantized
    weights are ``dequantize``'s values."""
    torch.manual_seed(4)
    experts, inter, hidden, k, tokens = 6, 40, 200, 2, 37
    pool, _ = _pool(scheme, experts, inter, hidden)
    x = torch.randn(tokens, hidden).bfloat16()
    ids, _ = _route(tokens, experts, k)
    plan = pair_plan(ids, experts, x.device)
    slot_of = {0: 3, 2: 1, 5: 4}
    outs = []
    for first, parts in (("0", 0), ("1", 0), ("1", 2)):
        monkeypatch.setenv("FLINT_PROMPT_DEQUANT", first)
        if parts:  # the dequantized slots in parts of two (a GPU short of memory)
            monkeypatch.setattr(grouped, "dequant_slots_per_launch", lambda *_, n=parts: n)
        out = torch.full((tokens * k, hidden), float("nan"))
        grouped_experts(x, plan, slot_of, pool, out)
        outs.append(out)
    assert not outs[0][(ids.reshape(-1) == 0)].isnan().any()
    assert torch.equal(outs[0].nan_to_num(7.0), outs[1].nan_to_num(7.0))
    assert torch.equal(outs[0].nan_to_num(7.0), outs[2].nan_to_num(7.0)), "in parts"
    # short of memory: the dequantized copies in smaller parts, at worst in place
    dequantized = grouped._dequantized
    for most in (1, 0):

        def short(parts: list, *args: object, most: int = most) -> object:
            if sum(len(slots) for _, slots in parts) > most:
                raise torch.OutOfMemoryError("simulated")
            return dequantized(parts, *args)  # type: ignore[arg-type]

        monkeypatch.setattr(grouped, "_dequantized", short)
        out = torch.full((tokens * k, hidden), float("nan"))
        grouped_experts(x, plan, slot_of, pool, out)
        assert torch.equal(outs[0].nan_to_num(7.0), out.nan_to_num(7.0)), ("short", most)
    monkeypatch.undo()
    for first in ("0", "1"):  # over two pools (here one pool twice, other experts)
        monkeypatch.setenv("FLINT_PROMPT_DEQUANT", first)
        out = torch.full((tokens * k, hidden), float("nan"))
        grouped.grouped_over(x, plan, [(pool, {2: 1}), (pool, {}), (pool, {0: 3, 5: 4})], out)
        assert torch.equal(outs[0].nan_to_num(7.0), out.nan_to_num(7.0)), ("two pools", first)
    raw = dequantize_slots(pool, [3, 1], torch.bfloat16, native=False)
    index = torch.tensor([3, 1])
    for p, proj in enumerate((raw.gate, raw.up, raw.down)):
        assert torch.equal(proj.weights, dequantize(pool, p, index, torch.bfloat16))


def test_long_prompts_dequantize_first_on_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """The route and the program shape are functions of the token count (and the GPU):
    from ``DEQUANT_TOKENS`` a CUDA launch dequantizes first, and takes 128-row
    programs where the shared memory holds them; ``FLINT_PROMPT_DEQUANT`` forces
    either way; the CPU (Triton's interpreter) never by default."""
    monkeypatch.setattr(grouped, "_INTERPRETED", False)
    monkeypatch.delenv("FLINT_PROMPT_DEQUANT", raising=False)
    cuda, cpu, long = torch.device("cuda"), torch.device("cpu"), grouped.DEQUANT_TOKENS
    assert grouped.dequant_route(long, cuda) and not grouped.dequant_route(long - 1, cuda)
    assert not grouped.dequant_route(long, cpu)
    monkeypatch.setenv("FLINT_PROMPT_DEQUANT", "0")
    assert not grouped.dequant_route(long, cuda)
    monkeypatch.setenv("FLINT_PROMPT_DEQUANT", "1")
    assert grouped.dequant_route(1, cpu)
    for smem, bn in ((227 * 1024, 128), (164 * 1024, 64)):
        monkeypatch.setattr(grouped, "_smem", lambda _d, s=smem: s)
        t = grouped.tiles_for(8192, 32, cuda, dequantized=True)
        assert (t.bm, t.bn, t.warps, t.native) == (128, bn, 8, True)
        assert grouped.tiles_for(8192, 32, cuda).bn == 64, "in place: 64 rows"
        assert grouped.tiles_for(2048, 32, cuda, dequantized=True).bm == block_m(2048)
