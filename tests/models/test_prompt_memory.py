"""A prompt's working memory counts (issue 7, memory planner): when a prompt's
activations would not fit the memory left beside the RAM expert cache, the cache lends
slots back (empty, then coldest) for the prompt and takes them back at the first decode
token. Output stays bit-identical to resident; waves fit the usable slots meanwhile."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from tiny import FAMILY_NAMES

import flint
import flint.models.prefill as prefill_mod
from flint.models.prefill import activation_bytes, prefill
from flint.models.transformer import ATTENTION_CHUNK
from flint.stream.plan import GIB
from flint.stream.prompt_mem import PromptMemory

PROMPT = [(37 * i + 11) % 300 for i in range(41)]  # routes to most experts
SLOTS = 3
LINE = "the RAM expert cache gives back"


def _stream(path: Path, slots: int, expert_kernels: str = "auto") -> flint.LLM:
    with flint.LLM(path, device="cpu", context_length=8) as llm:
        lay = llm.source.expert_layout  # type: ignore[attr-defined]
        layers = sum(llm.model.config.sparse_layers)
    budget = slots * layers * lay.slab_bytes / GIB
    return flint.LLM(
        path,
        device="cpu",
        context_length=128,
        ram_budget=budget,
        lookahead=2,
        expert_kernels=expert_kernels,
    )


class WaveRecorder:
    """Wraps the engine: checks every wave fits the layer's usable slots and records
    the largest wave per layer while slots are lent."""

    def __init__(self, inner: Any, memory: PromptMemory) -> None:
        self.inner, self.memory = inner, memory
        self.lent_waves: dict[int, int] = {}

    def place(self, layer: int, experts: list[int]) -> list[tuple[int, int, int, bool]]:
        cap = self.memory.capacity(layer)
        assert len(experts) <= cap, (layer, experts, cap)
        if self.memory.lent_bytes:
            self.lent_waves[layer] = max(self.lent_waves.get(layer, 0), len(experts))
        out: list[tuple[int, int, int, bool]] = self.inner.place(layer, experts)
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _short_of(llm: flint.LLM, tokens: int, slots: int, monkeypatch: pytest.MonkeyPatch) -> int:
    """Makes free memory ``slots`` slots (less one byte) short of what a prompt of
    ``tokens`` tokens needs; returns the shortfall in bytes."""
    cfg, backend = llm.model.config, llm.expert_backend
    assert backend is not None
    need = activation_bytes(cfg, tokens, tokens, torch.float32, ATTENTION_CHUNK)
    short = slots * backend.plan.slot_bytes - 1  # type: ignore[attr-defined]
    monkeypatch.setattr(prefill_mod, "free_activation_memory", lambda device: need - short)
    return short


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_a_prompt_with_memory_lent_equals_resident_bit_for_bit(
    family: str,
    tiny_ftw: dict[str, Path],
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    path = tiny_ftw[family]
    ids = torch.tensor(PROMPT)
    with (
        # torch's kernels on both sides: the recorder stands in for the engine, which the
        # fused call hands to Rust
        flint.LLM(path, device="cpu", context_length=128, expert_kernels="torch") as resident,
        _stream(path, SLOTS, "torch") as streamed,
    ):
        backend: Any = streamed.expert_backend
        memory: PromptMemory = backend.prompt_memory
        backend.engine = rec = WaveRecorder(backend.engine, memory)
        layers = backend.plan.streamed_layers
        slot = backend.plan.slot_bytes
        # A first prompt that fits fills every layer's slots: lending must then evict.
        monkeypatch.setattr(prefill_mod, "free_activation_memory", lambda device: 1 << 40)
        prefill(streamed.model, ids.flip(0))
        assert all(len(backend.engine.resident(layer)) == SLOTS for layer in layers)
        lend = min(3, (SLOTS - 1) * len(layers))  # each layer keeps one slot
        short = _short_of(streamed, len(PROMPT), lend, monkeypatch)
        for n, prompt in enumerate((ids, ids.flip(0))):
            resident.model.reset()
            streamed.model.reset()
            want = prefill(resident.model, prompt, budget=1 << 40)
            got = prefill(streamed.model, prompt)  # lends slots, then one forward
            assert torch.equal(got, want), family
            s = streamed.stats()
            assert s is not None and s["lent_slots"] == lend and s["lent_bytes"] == lend * slot
            assert s["lent_bytes"] >= short
            if n == 0:
                assert s["lend_evicted"] == lend, "a full cache lends its coldest residents"
            usable = backend.engine.usable_slots()
            assert sum(SLOTS - n for n in usable) == lend and min(usable) >= 1
            assert dict(zip(layers, usable, strict=True)) == memory.usable
            for layer, n in zip(layers, usable, strict=True):
                assert len(backend.engine.resident(layer)) <= n, "nothing in a lent slot"
            assert any(rec.lent_waves.get(layer, 0) > 0 for layer in layers)
            for step in (11, 42, 7):  # decode: the first step takes the slots back
                want = resident.model.forward(torch.tensor([step]))
                got = streamed.model.forward(torch.tensor([step]))
                assert torch.equal(got, want), (family, step)
                s = streamed.stats()
                assert s is not None and s["lent_slots"] == 0 and memory.usable == {}
            assert backend.engine.usable_slots() == [SLOTS] * len(layers)
        s = streamed.stats()
    assert s is not None
    assert s["lends"] == 2 and s["given_back_bytes"] == 2 * lend * slot
    assert s["demands"] > 0 and s["demand_placements"] > len(layers) * SLOTS
    err = capfd.readouterr().err
    assert err.count(LINE) == 1, err


@pytest.mark.parametrize("family", ["qwen3_moe", "olmoe"])
def test_generation_with_memory_lent_equals_resident(
    family: str, tiny_ftw: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tiny_ftw[family]
    kw: dict[str, Any] = {"max_tokens": 8, "ignore_eos": True, "temperature": 0.0}
    with flint.LLM(path, device="cpu", context_length=128) as resident:
        want = resident.generate(PROMPT, **kw).token_ids
    with _stream(path, 2) as streamed:
        _short_of(streamed, len(PROMPT), 2, monkeypatch)
        got = streamed.generate(PROMPT, **kw).token_ids
        s = streamed.stats()
    assert got == want
    assert s is not None and s["lends"] == 1 and s["lent_slots"] == 0


def test_no_memory_is_lent_when_the_prompt_fits(
    tiny_ftw: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    with _stream(tiny_ftw["mixtral"], 2) as streamed:
        monkeypatch.setattr(prefill_mod, "free_activation_memory", lambda device: 1 << 40)
        prefill(streamed.model, torch.tensor(PROMPT))
        s = streamed.stats()
        # An explicit budget is the caller's cap: the cache does not lend for it.
        streamed.model.reset()
        streamed.model.activation_budget = 1
        prefill(streamed.model, torch.tensor(PROMPT[:4]))
        s2 = streamed.stats()
    assert s is not None and s["lends"] == 0 and s["given_back_bytes"] == 0
    assert s2 is not None and s2["lends"] == 0


class FakeEngine:
    def __init__(self, gives: int) -> None:
        self.gives, self.reclaims = gives, 0
        self.asked: list[int] = []
        self.usable = [2, 2]

    def lend(self, nbytes: int) -> int:
        self.asked.append(nbytes)
        if self.gives:
            self.usable = [1, 2]
        return self.gives

    def reclaim(self) -> int:
        self.reclaims += 1
        self.usable = [2, 2]
        return 1

    def usable_slots(self) -> list[int]:
        return self.usable


def test_prompt_memory_bookkeeping_and_its_one_line() -> None:
    lines: list[str] = []
    eng = FakeEngine(gives=4096)
    mem = PromptMemory(eng, [3, 5], 2, lines.append)
    assert mem.lend(0) == 0 and eng.asked == [], "nothing asked for nothing"
    mem.reclaim()
    assert eng.reclaims == 0, "nothing lent, nothing to take back"
    assert mem.lend(100) == 4096 and mem.lend(100) == 4096
    assert mem.lent_bytes == 8192 and (mem.capacity(3), mem.capacity(5)) == (1, 2)
    assert len(lines) == 1 and "1 slots" in lines[0]
    mem.reclaim()
    assert eng.reclaims == 1 and mem.lent_bytes == 0 and mem.capacity(3) == 2
    none = PromptMemory(FakeEngine(gives=0), [3, 5], 2, lines.append)
    assert none.lend(100) == 0 and none.capacity(3) == 2 and len(lines) == 1
