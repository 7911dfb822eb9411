"""Layer-major prefill (issue 8): a prompt is one forward, chunked along tokens for
attention, and each MoE layer meets each selected expert once, in waves when the layer
has fewer slots than the prompt selects experts; prefix reuse across turns.

Tolerance against the token-by-token path: fp32 on the CPU, the same weights run with
other batch shapes (matmuls of T rows vs 1 row, attention over chunks vs one query),
so logits differ by rounding only; measured max |diff| here is ~1e-6 on logits of
size ~1-10, and the test allows 1e-4."""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
from tiny import FAMILY_NAMES

import flint
from flint.models.moe import MoEBlock
from flint.models.prefill import activation_bytes, split_prompt
from flint.stream.plan import GIB

PROMPT = [(37 * i + 11) % 300 for i in range(41)]  # 41 tokens: routes to every expert
CHUNK = 8  # attention chunk: 41 tokens run as 6 chunks
TOLERANCE = 1e-4


def _slab_gib(path: Path, slots: int) -> float:
    with flint.LLM(path, device="cpu", context_length=8) as llm:
        lay = llm.source.expert_layout  # type: ignore[attr-defined]
        layers = sum(llm.model.config.sparse_layers)
    return float(slots * layers * lay.slab_bytes / GIB)


class PlaceRecorder:
    """Wraps the engine: records every placement (layer, expert, hit)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.placed: list[tuple[int, int, bool]] = []

    def place(self, layer: int, experts: list[int]) -> list[tuple[int, int, int, bool]]:
        out: list[tuple[int, int, int, bool]] = self.inner.place(layer, experts)
        self.placed.extend((layer, e, hit) for e, _s, _a, hit in out)
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _stream(path: Path, slots: int, lookahead: int, expert_kernels: str = "auto") -> flint.LLM:
    return flint.LLM(
        path,
        device="cpu",
        context_length=128,
        ram_budget=_slab_gib(path, slots),
        lookahead=lookahead,
        expert_kernels=expert_kernels,
    )


@pytest.mark.parametrize("family", FAMILY_NAMES)
@pytest.mark.parametrize("lookahead", [0, 2])
def test_layer_major_streamed_in_waves_equals_resident(
    family: str, lookahead: int, tiny_ftw: dict[str, Path]
) -> None:
    """Two slots per layer force several waves; the logits of every prompt position
    are bit-identical to the resident model's over the same forward, each selected
    expert is placed exactly once per layer and read at most once. torch's kernels on
    both sides: the recorder stands in for the engine, which the fused call hands to
    Rust."""
    path = tiny_ftw[family]
    ids = torch.tensor(PROMPT)
    with (
        flint.LLM(path, device="cpu", context_length=128, expert_kernels="torch") as resident,
        _stream(path, 2, lookahead, "torch") as streamed,
    ):
        backend: Any = streamed.expert_backend
        backend.engine = rec = PlaceRecorder(backend.engine)
        for prompt in (ids, ids.flip(0)):  # the second starts with a warm cache
            resident.model.reset()
            streamed.model.reset()
            want = resident.model.forward(prompt, all_logits=True, chunk=CHUNK)
            got = streamed.model.forward(prompt, all_logits=True, chunk=CHUNK)
            assert torch.equal(got, want), family
            uses = Counter((layer, e) for layer, e, _ in rec.placed)
            reads = Counter((layer, e) for layer, e, hit in rec.placed if not hit)
            assert set(uses.values()) == {1}, "each selected expert placed once per layer"
            assert max(reads.values(), default=0) <= 1
            rec.placed.clear()
        stats = streamed.stats()
    assert stats is not None
    n_layers, distinct = stats["prompt_layers"], stats["prompt_distinct"]
    assert n_layers == 2 * stats["streamed_layers"]
    assert stats["prompt_waves"] >= math.ceil(distinct / 2) > n_layers, "several waves"
    assert stats["demands"] > 0
    if lookahead == 0:
        # A cold first prompt reads each distinct expert once; the second one hits
        # what the first left. No prediction of any kind without lookahead.
        assert stats["demands"] <= distinct and stats["bound"] == 0


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_cold_layer_major_prompt_reads_each_selected_expert_exactly_once(
    family: str, tiny_ftw: dict[str, Path]
) -> None:
    with _stream(tiny_ftw[family], 2, 0) as llm:
        llm.model.forward(torch.tensor(PROMPT), chunk=CHUNK)
        stats = llm.stats()
    assert stats is not None
    assert stats["demands"] == stats["prompt_distinct"] > 2 * stats["streamed_layers"]


def _greedy(llm: flint.LLM, logits: torch.Tensor, steps: int) -> list[int]:
    out = []
    for _ in range(steps):
        token = int(torch.argmax(logits))
        out.append(token)
        logits = llm.model.forward(torch.tensor([token]))[-1]
    return out


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_layer_major_prefill_matches_the_token_by_token_path(
    family: str, tiny_ftw: dict[str, Path]
) -> None:
    """Different batch shapes: streamed layer-major (waves) against resident one token
    per forward. Greedy continuations agree; last logits within TOLERANCE."""
    path = tiny_ftw[family]
    with (
        flint.LLM(path, device="cpu", context_length=128) as resident,
        _stream(path, 2, 2) as streamed,
    ):
        want = torch.empty(0)
        for token in PROMPT:
            want = resident.model.forward(torch.tensor([token]))[-1]
        got = streamed.model.forward(torch.tensor(PROMPT), chunk=CHUNK)[-1]
        diff = (got - want).abs().max().item()
        assert diff <= TOLERANCE, (family, diff)
        assert _greedy(streamed, got, 12) == _greedy(resident, want, 12)


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_the_end_of_the_prompt_stays_resident_for_decode(
    family: str, tiny_ftw: dict[str, Path]
) -> None:
    """With as many slots as top-k, after a prompt of many waves every streamed layer
    still holds the experts the last prompt token selected (the final wave)."""
    last: dict[int, set[int]] = {}
    with _stream(tiny_ftw[family], 2, 0) as llm:
        for layer in llm.model.layers:
            if isinstance(layer.mlp, MoEBlock):
                layer.mlp.backend = _recording(layer.mlp.backend, last)
        llm.model.forward(torch.tensor(PROMPT), chunk=CHUNK)
        engine: Any = llm.expert_backend.engine  # type: ignore[union-attr]
        for layer, experts in last.items():
            assert experts <= set(engine.resident(layer)), (family, layer)
        stats = llm.stats()
        assert stats is not None and stats["prompt_waves"] > stats["prompt_layers"]


def _recording(backend: Any, last: dict[int, set[int]]) -> Any:
    def call(layer: int, x: torch.Tensor, ids: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        last[layer] = set(ids[-1].tolist())
        return backend(layer, x, ids, w)

    return call


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_prefix_reuse_gives_the_cold_prefill_continuation(
    family: str, tiny_ftw: dict[str, Path]
) -> None:
    """Turn 2 starts with turn 1's prompt and reply: reused, only the new suffix is
    prefilled, and the greedy reply equals a cold prefill of the whole prompt."""
    path = tiny_ftw[family]
    kw: dict[str, Any] = {"max_tokens": 10, "ignore_eos": True, "temperature": 0.0}
    first = PROMPT[:17]
    with flint.LLM(path, device="cpu", context_length=128) as warm:
        reply = warm.generate(first, reuse_prefix=True, **kw)
        second = [*first, *reply.token_ids, 7, 99, 250, 3]
        again = warm.generate(second, reuse_prefix=True, **kw)
        # The last reply token never ran: the cache holds prompt + reply[:-1].
        assert again.timings.cached_tokens == len(first) + len(reply.token_ids) - 1
        unrelated = warm.generate([5, 6, 7], reuse_prefix=True, **kw)
        assert unrelated.timings.cached_tokens == 0
    with flint.LLM(path, device="cpu", context_length=128) as cold:
        want = cold.generate(second, **kw)
        assert want.timings.cached_tokens == 0
        assert cold.generate([5, 6, 7], **kw).token_ids == unrelated.token_ids
    assert again.token_ids == want.token_ids


def test_prefix_reuse_streamed_equals_cold(tiny_ftw: dict[str, Path]) -> None:
    path = tiny_ftw["qwen2_moe"]
    kw: dict[str, Any] = {"max_tokens": 8, "ignore_eos": True, "temperature": 0.0}
    with _stream(path, 2, 2) as warm:
        reply = warm.generate(PROMPT[:20], reuse_prefix=True, **kw)
        second = [*PROMPT[:20], *reply.token_ids, *PROMPT[20:]]
        again = warm.generate(second, reuse_prefix=True, **kw)
        assert again.timings.cached_tokens > 20
    with _stream(path, 2, 2) as cold:
        assert cold.generate(second, **kw).token_ids == again.token_ids


def test_a_prompt_over_the_activation_budget_is_split_with_one_line(
    tiny_ftw: dict[str, Path], capfd: pytest.CaptureFixture[str]
) -> None:
    path = tiny_ftw["olmoe"]
    kw: dict[str, Any] = {"max_tokens": 6, "ignore_eos": True, "temperature": 0.0}
    with flint.LLM(path, device="cpu", context_length=128) as llm:
        want = llm.generate(PROMPT, **kw).token_ids
        cfg = llm.model.config
        budget = activation_bytes(cfg, 12, len(PROMPT), torch.float32, 512)
        llm.model.activation_budget = budget
        got = llm.generate(PROMPT, **kw).token_ids
    err = capfd.readouterr().err
    lines = [ln for ln in err.splitlines() if "activations" in ln]
    assert len(lines) == 1 and "passes of <= 11 tokens" in lines[0], err
    assert got == want


def test_split_prompt_fits_the_budget_in_the_fewest_passes(tiny_ftw: dict[str, Path]) -> None:
    with flint.LLM(tiny_ftw["qwen3_moe"], device="cpu", context_length=8) as llm:
        cfg = llm.model.config
    whole = split_prompt(cfg, 1000, 0, torch.float32, 1 << 40)
    assert whole.piece == 1000 and whole.note is None
    budget = activation_bytes(cfg, 300, 1000, torch.float32, 512)
    split = split_prompt(cfg, 1000, 0, torch.float32, budget)
    assert split.piece <= 300 and split.note is not None
    assert activation_bytes(cfg, split.piece, 1000, torch.float32, 512) <= budget
    fewer = -(-1000 // (-(-1000 // split.piece) - 1))
    assert activation_bytes(cfg, fewer, 1000, torch.float32, 512) > budget
    with pytest.raises(ValueError, match="activation_budget"):
        flint.LLM(tiny_ftw["qwen3_moe"], device="cpu", context_length=8, activation_budget=0)


def test_read_ahead_reads_the_next_layers_most_used_experts_into_free_slots(
    tiny_ftw: dict[str, Path], tmp_path: Path
) -> None:
    """A fresh cache with a usage table: while a layer computes the prompt, the next
    layers' most-used experts are read into their free slots; the logits stay
    bit-identical to resident and no prompt layer places an expert twice."""
    from flint.models import parse_config
    from flint.models.ftw_source import FtwSource
    from flint.stream import streamed_backend

    path = tiny_ftw["qwen3_moe"]
    table = tmp_path / "usage"
    budget = _slab_gib(path, 4)
    with _stream(path, 4, 2) as first:
        first.model.forward(torch.tensor(PROMPT), chunk=CHUNK)
        first.expert_backend.engine.save_usage(str(table))  # type: ignore[union-attr]
    source = FtwSource(path)
    cfg = parse_config(source.config)
    backend = streamed_backend(
        source, cfg, torch.device("cpu"), torch.float32, budget, lookahead=2, usage=False
    )
    backend.load_usage(table, print)
    ids = torch.tensor(PROMPT[::-1])
    with (
        flint.LLM(path, device="cpu", context_length=128) as resident,
        flint.LLM(source, device="cpu", context_length=128, expert_backend=backend) as streamed,
    ):
        want = resident.model.forward(ids, all_logits=True, chunk=CHUNK)
        got = streamed.model.forward(ids, all_logits=True, chunk=CHUNK)
        stats = streamed.stats()
    assert torch.equal(got, want)
    assert stats is not None and stats["read_ahead"] > 0 and stats["bound"] > 0
    assert stats["in_flight_at_start"] + stats["hits"] > 0, "read-ahead was used"
    assert stats["demands"] + stats["bound"] <= stats["prompt_distinct"] + stats["cancelled"]
