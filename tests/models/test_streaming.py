"""Streamed experts are bit-identical to resident ones (issue 7's exactness contract):
every family, caches of 1-2 slots per layer, with and without lookahead, prompts of
several lengths; the statistics show that demand reads and evictions really happened."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from tiny import FAMILY_NAMES

import flint
from flint.stream.backend import StreamedExperts
from flint.stream.plan import GIB, plan_cache

PROMPTS = ([7], [5, 17, 250, 3, 99], [(13 * i + 5) % 300 for i in range(23)])


def _slab_gib(path: Path, slots: int) -> float:
    with flint.LLM(path, device="cpu", context_length=8) as llm:
        lay = llm.source.expert_layout  # type: ignore[attr-defined]
        layers = sum(llm.model.config.sparse_layers)
    return float(slots * layers * lay.slab_bytes / GIB)


@pytest.mark.parametrize("family", FAMILY_NAMES)
@pytest.mark.parametrize(("slots", "lookahead"), [(1, 0), (2, 2)])
@pytest.mark.parametrize("kernels", ["auto", "torch"])  # auto: the fused CPU kernels
def test_streamed_logits_equal_resident_bit_for_bit(
    family: str, slots: int, lookahead: int, kernels: str, tiny_ftw: dict[str, Path]
) -> None:
    """Against the resident general path (``cpu_decode_step=False``): the Rust decode
    step is only within rounding of it (docs/streaming.md)."""
    path = tiny_ftw[family]
    budget = _slab_gib(path, slots)
    kw: dict[str, Any] = {"device": "cpu", "context_length": 64, "expert_kernels": kernels}
    with (
        flint.LLM(path, cpu_decode_step=False, **kw) as resident,
        flint.LLM(path, ram_budget=budget, lookahead=lookahead, **kw) as streamed,
    ):
        for ids in PROMPTS:
            resident.model.reset()
            streamed.model.reset()
            want = resident.model.forward(torch.tensor(ids), all_logits=True)
            got = streamed.model.forward(torch.tensor(ids), all_logits=True)
            assert torch.equal(got, want), (family, ids)
            for step in (11, 42):  # decode steps, where lookahead runs
                want = resident.model.forward(torch.tensor([step]))
                got = streamed.model.forward(torch.tensor([step]))
                assert torch.equal(got, want), (family, ids, step)
        stats = streamed.stats()
        assert stats is not None and stats["slots_per_layer"] == slots
        layers = stats["streamed_layers"]
        assert stats["demands"] > 0 and stats["bytes_demand"] > 0, "demand reads happened"
        assert stats["demand_placements"] > layers * slots, "more placements than slots: evictions"
        if lookahead:
            assert stats["predictions"] > 0 and stats["recall_d1"] is not None


@pytest.mark.parametrize("family", ["qwen3_moe", "mixtral"])
def test_streamed_greedy_generation_equals_resident(family: str, tiny_ftw: dict[str, Path]) -> None:
    path = tiny_ftw[family]
    kw = {"max_tokens": 24, "ignore_eos": True}
    with flint.LLM(path, device="cpu", context_length=64) as resident:
        want = resident.generate([5, 17, 250], **kw).token_ids
    with flint.LLM(path, device="cpu", context_length=64, stream=True, lookahead=2) as s:
        got = s.generate([5, 17, 250], **kw).token_ids
        stats = s.stats()
    assert got == want
    assert stats is not None and stats["forward_calls"] == 24


def test_plan_never_exceeds_the_budget_and_raises_a_tiny_one() -> None:
    free = lambda: 64 * GIB  # noqa: E731
    plan = plan_cache([0, 1, 2, 3], 64, 3 << 20, ram_budget_gib=0.1, available=free)
    assert plan.cache_bytes <= 0.1 * GIB and plan.slots_per_layer == 8 and not plan.notes
    plan = plan_cache([0, 1], 64, 3 << 20, ram_budget_gib=0.001, available=free)
    assert plan.slots_per_layer == 1 and len(plan.notes) == 1 and "raised" in plan.notes[0]
    plan = plan_cache([0, 1], 64, 3 << 20, ram_budget_gib=100.0, available=free)
    assert plan.slots_per_layer == 64, "never more slots than experts"
    assert "more than is free" in plan.notes[0]
    plan = plan_cache([0, 1], 64, 3 << 20, available=lambda: 2 * GIB)
    assert plan.cache_bytes <= 2 * GIB - (1 << 30), "headroom kept without a budget"
    with pytest.raises(ValueError, match="ram-budget"):
        plan_cache([0], 8, 4096, ram_budget_gib=-1.0, available=free)


def test_budget_notice_is_printed_once(
    tiny_ftw: dict[str, Path], capfd: pytest.CaptureFixture[str]
) -> None:
    with flint.LLM(tiny_ftw["olmoe"], device="cpu", context_length=16, ram_budget=0.0) as llm:
        llm.generate([1, 2, 3], max_tokens=4, ignore_eos=True)
    err = capfd.readouterr().err
    assert err.count("below one expert slot per streamed layer") == 1, err


def test_streaming_needs_a_ftw_file(tiny_models: dict[str, tuple[Path, object]]) -> None:
    with pytest.raises(ValueError, match=r"\.ftw"):
        flint.LLM(tiny_models["olmoe"][0], device="cpu", context_length=8, stream=True)


@pytest.mark.gpu
@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_streamed_on_cuda_equals_resident_on_cuda(family: str, tiny_ftw: dict[str, Path]) -> None:
    """Experts streamed through RAM slots and copied to the GPU per use (no VRAM
    cache, every expert on the GPU) compute exactly what resident GPU experts compute."""
    path = tiny_ftw[family]
    budget = _slab_gib(path, 2)
    with (
        flint.LLM(path, device="cuda", context_length=64, graphs="off") as resident,
        flint.LLM(
            path,
            device="cuda",
            context_length=64,
            ram_budget=budget,
            vram_budget=0,
            deterministic=True,
        ) as streamed,
    ):
        for ids in PROMPTS:
            resident.model.reset()
            streamed.model.reset()
            want = resident.model.forward(torch.tensor(ids), all_logits=True)
            got = streamed.model.forward(torch.tensor(ids), all_logits=True)
            assert torch.equal(got, want), (family, ids)
            for step in (11, 42):
                assert torch.equal(
                    streamed.model.forward(torch.tensor([step])),
                    resident.model.forward(torch.tensor([step])),
                )
        stats = streamed.stats()
        assert stats is not None and stats["demands"] > 0


@pytest.mark.parametrize(("quant", "group"), [("int8", 32), ("int4", 16)])
def test_streamed_quantized_experts_equal_resident(
    quant: str, group: int, tiny_models: dict[str, tuple[Path, object]], tmp_path: Path
) -> None:
    """int8/int4 experts streamed from slots go through the torch kernel the resident
    backend picks, packed from the same bytes: bit-identical too."""
    from flint.convert import ConvertOptions, convert

    path = tmp_path / f"{quant}.ftw"
    convert(str(tiny_models["qwen3_moe"][0]), path, ConvertOptions(quant=quant, group_size=group))
    budget = _slab_gib(path, 1)
    ids = torch.tensor(PROMPTS[2])
    with (
        flint.LLM(path, device="cpu", context_length=64, expert_kernels="torch") as resident,
        flint.LLM(
            path, device="cpu", context_length=64, ram_budget=budget, expert_kernels="torch"
        ) as streamed,
    ):
        want = resident.model.forward(ids, all_logits=True)
        got = streamed.model.forward(ids, all_logits=True)
        assert torch.equal(got, want)
        assert torch.equal(streamed.model.forward(ids[:1]), resident.model.forward(ids[:1]))


def test_usage_table_persists_and_idle_fill_loads_it(
    tiny_ftw: dict[str, Path], tmp_path: Path
) -> None:
    """A closed model leaves its usage table beside the file; the next load reads it and,
    after half a second without requests, fills the empty slots with the most-used
    experts (never evicting), so the first token then hits."""
    import shutil
    import time

    path = tmp_path / "m.ftw"
    shutil.copyfile(tiny_ftw["qwen3_moe"], path)
    budget = _slab_gib(path, 3)
    with flint.LLM(path, device="cpu", context_length=64, ram_budget=budget) as first:
        want = first.generate([5, 17, 250], max_tokens=8, ignore_eos=True).token_ids
    assert (tmp_path / "m.ftw.usage").is_file()
    with flint.LLM(path, device="cpu", context_length=64, ram_budget=budget) as second:
        time.sleep(1.0)
        stats = second.stats()
        assert stats is not None and stats["fills"] > 0, stats
        got = second.generate([5, 17, 250], max_tokens=8, ignore_eos=True).token_ids
        stats = second.stats()
        assert stats is not None and stats["hits"] > 0
    assert got == want


def test_a_corrupt_usage_table_is_ignored_with_one_line(
    tiny_ftw: dict[str, Path], tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    import shutil

    path = tmp_path / "m.ftw"
    shutil.copyfile(tiny_ftw["olmoe"], path)
    (tmp_path / "m.ftw.usage").write_bytes(b"not a usage table")
    with flint.LLM(path, device="cpu", context_length=16, stream=True) as llm:
        llm.generate([1, 2, 3], max_tokens=2, ignore_eos=True)
    lines = [ln for ln in capfd.readouterr().err.splitlines() if "usage table" in ln]
    assert len(lines) == 1 and "corrupt" in lines[0] and "ignored" in lines[0], lines


def test_prompt_batches_age_the_cache_by_their_token_count(tiny_ftw: dict[str, Path]) -> None:
    """A prompt runs with LRU eviction and then ages the cache by its length; decode
    steps tick once each."""
    calls: list[tuple[str, object]] = []

    class Recorder:
        def __init__(self, inner: object) -> None:
            self.inner = inner

        def __getattr__(self, name: str) -> object:
            attr = getattr(self.inner, name)
            if name in ("forward_done", "set_prompt_mode"):
                return lambda arg: (calls.append((name, arg)), attr(arg))[1]
            return attr

    path = tiny_ftw["mixtral"]
    # torch's kernels: the recorder stands in for the engine, which the fused call
    # hands to Rust
    with flint.LLM(
        path, device="cpu", context_length=64, stream=True, expert_kernels="torch"
    ) as llm:
        backend = llm.expert_backend
        backend.engine = Recorder(backend.engine)  # type: ignore[union-attr]
        llm.generate([5, 17, 250, 3, 99], max_tokens=3, ignore_eos=True)
    prompt, decode = ("set_prompt_mode", True), ("set_prompt_mode", False)
    assert calls[:3] == [prompt, ("forward_done", 5), decode], calls
    assert calls[3:] == [("forward_done", 1), decode], calls


@pytest.mark.parametrize("family", ["qwen3_moe", "olmoe"])
def test_lookahead_from_the_layer_output_stays_exact(
    family: str, tiny_ftw: dict[str, Path]
) -> None:
    """Predicting from each layer's output (after the MoE add) instead of its MoE input
    changes only what is read early, never the output."""
    from flint.models import parse_config
    from flint.models.ftw_source import FtwSource
    from flint.stream import streamed_backend

    path = tiny_ftw[family]
    source = FtwSource(path)
    backend = streamed_backend(
        source,
        parse_config(source.config),
        torch.device("cpu"),
        torch.float32,
        _slab_gib(path, 2),
        usage=False,
        lookahead_from="output",
    )
    with (
        flint.LLM(path, device="cpu", context_length=64) as resident,
        flint.LLM(source, device="cpu", context_length=64, expert_backend=backend) as streamed,
    ):
        kw = {"max_tokens": 12, "ignore_eos": True}
        assert (
            streamed.generate([5, 17, 250], **kw).token_ids
            == resident.generate([5, 17, 250], **kw).token_ids
        )
        s = streamed.stats()
    assert s is not None and s["predictions"] > 0 and s["recall_d1"] is not None
    with pytest.raises(ValueError, match="lookahead_from"):
        streamed_backend(
            FtwSource(path), parse_config(source.config), torch.device("cpu"), torch.float32,
            usage=False, lookahead_from="middle",
        )  # fmt: skip


def test_the_first_streamed_layer_is_predicted_from_the_dense_layer_before_it(
    tiny_ftw: dict[str, Path],
) -> None:
    """A model whose first layers are dense: their residual predicts the first streamed
    layer's experts, so its reads start before it does. torch's kernels: the spy stands
    in for the engine, which the fused call hands to Rust. Two slots a layer: with every
    expert in RAM there is nothing to predict."""
    path = tiny_ftw["qwen3_moe"]
    with flint.LLM(
        path, device="cpu", context_length=64, ram_budget=_slab_gib(path, 2), expert_kernels="torch"
    ) as llm:
        sparse = llm.model.config.sparse_layers
        first = sparse.index(True)
        assert first > 0, "the tiny qwen3_moe model starts with a dense layer"
        backend = llm.expert_backend
        sent: list[tuple[int, int, int, int]] = []
        engine = backend.engine  # type: ignore[attr-defined]

        class Spy:
            def __getattr__(self, name: str) -> object:
                return getattr(engine, name)

            def predict(self, p: list[tuple[int, int, int, int]]) -> None:
                sent.extend(p)
                engine.predict(p)

        backend.engine = Spy()  # type: ignore[attr-defined]
        llm.generate([5, 17, 250], max_tokens=3, ignore_eos=True)
        backend.engine = engine  # type: ignore[attr-defined]
    assert any(layer == first and d == 1 for layer, _, d, _ in sent), sent[:8]


def test_a_budget_that_holds_every_expert_keeps_them_whole(
    tiny_ftw: dict[str, Path], capfd: pytest.CaptureFixture[str]
) -> None:
    """When every routed expert fits the RAM budget and streaming is asked for, they are
    all read at start, in the background, and then never streamed: the generation makes
    no demand reads."""
    path = tiny_ftw["olmoe"]
    with flint.LLM(path, device="cpu", context_length=64) as probe:
        n = probe.model.config.num_experts
    budget = _slab_gib(path, n)
    with flint.LLM(path, device="cpu", context_length=64, ram_budget=budget, stream=True) as s:
        assert s.expert_backend.engine.wait_idle(30)  # type: ignore[attr-defined]
        before = s.stats()
        s.generate([5, 17, 250], max_tokens=6, ignore_eos=True)
        after = s.stats()
    assert before is not None and after is not None
    assert before["fills"] == n * before["streamed_layers"]
    assert after["demands"] == before["demands"], "the fill's reads only"
    assert after["demand_placements"] == 0 and after["hits"] > 0
    assert after["predictions"] == before["predictions"], "nothing to read ahead"
    assert "fits the RAM budget" in capfd.readouterr().err


def test_generating_while_the_fill_runs_keeps_every_expert(tiny_ftw: dict[str, Path]) -> None:
    """Decode right after load, while the background fill of a budget that holds every
    expert may still be reading (on a fast disk it may be done first: the scheduler's
    own tests drive the overlap step by step): the fill ends with every expert read
    once, by the fill or by a demand that promoted it, nothing is cancelled, the tokens
    match a resident run, and a later generation finds every expert in RAM."""
    path = tiny_ftw["qwen3_moe"]
    prompt = [5, 17, 250]
    with flint.LLM(path, device="cpu", context_length=64) as ref:
        n = ref.model.config.num_experts
        want = ref.generate(prompt, max_tokens=6, ignore_eos=True)
    budget = _slab_gib(path, n)
    with flint.LLM(path, device="cpu", context_length=64, ram_budget=budget, stream=True) as s:
        backend = s.expert_backend
        got = s.generate(prompt, max_tokens=6, ignore_eos=True)
        _, _, nbytes = backend.wait_for_fill()  # type: ignore[attr-defined]
        assert backend.engine.fills_left() == 0  # type: ignore[attr-defined]
        mid = s.stats()
        again = s.generate(prompt, max_tokens=6, ignore_eos=True)
        after = s.stats()
    assert got.token_ids == want.token_ids == again.token_ids
    assert mid is not None and after is not None
    every = n * mid["streamed_layers"] * backend.layout.slab_bytes  # type: ignore[attr-defined]
    assert mid["cancelled"] == 0
    assert mid["bytes_fill"] + mid["bytes_demand"] == every == nbytes + mid["bytes_demand"]
    assert after["demand_placements"] == mid["demand_placements"], "all in RAM"
    assert after["bytes_demand"] == mid["bytes_demand"]


def test_a_cpu_model_whose_experts_all_fit_the_budget_loads_resident(
    tiny_ftw: dict[str, Path], capfd: pytest.CaptureFixture[str]
) -> None:
    """On the CPU a budget that holds every routed expert loads the model resident (the
    Rust decode step), saying so; stream=True streams it anyway; a smaller budget
    streams. The tokens are the same either way."""
    path = tiny_ftw["qwen3_moe"]
    with flint.LLM(path, device="cpu", context_length=16) as probe:
        n = probe.model.config.num_experts
    prompt = [5, 17, 250]
    with flint.LLM(path, device="cpu", context_length=64, ram_budget=_slab_gib(path, n)) as r:
        assert r.expert_backend is None and r.model.decode_path == "Rust CPU decode step"
        want = r.generate(prompt, max_tokens=6, ignore_eos=True).token_ids
    assert "loaded resident" in capfd.readouterr().err
    budget = _slab_gib(path, n)
    with flint.LLM(path, device="cpu", context_length=64, ram_budget=budget, stream=True) as s:
        assert isinstance(s.expert_backend, StreamedExperts)
        got = s.generate(prompt, max_tokens=6, ignore_eos=True).token_ids
    with flint.LLM(path, device="cpu", context_length=64, ram_budget=_slab_gib(path, 2)) as t:
        assert isinstance(t.expert_backend, StreamedExperts)
    assert got == want
