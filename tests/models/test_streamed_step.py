"""The streamed decode step (``flint.graphs.streamed``): a streamed model's dense parts
through the graph step's ops, the routed experts through the streaming backend between
segments. On the CPU it runs uncaptured (Triton's interpreter); the gpu-marked tests
capture it."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import flint
from flint.graphs.streamed import StreamedDecoder, segments
from flint.models.ftw_source import FtwSource
from flint.models.moe import MoEBlock
from flint.models.transformer import MoEModel
from flint.stream import streamed_backend
from flint.stream.plan import GIB

PROMPT = [(13 * i + 5) % 300 for i in range(23)]  # no near-tie flips a token in 16 steps


def _streamed(path: Path, lookahead_from: str = "output", **kw: Any) -> flint.LLM:
    """A streamed tiny model on the CPU in bf16, two RAM slots per layer (demand reads
    and evictions every step), usage table off (both runs start alike)."""
    source = FtwSource(path)
    config = flint.models.parse_config(source.config)
    layout = source.expert_layout
    assert layout is not None
    budget = 2 * sum(config.sparse_layers) * layout.slab_bytes / GIB
    backend = streamed_backend(
        source,
        config,
        torch.device("cpu"),
        torch.bfloat16,
        budget,
        lookahead=2,
        usage=False,
        lookahead_from=lookahead_from,
        notice=lambda line: None,
    )
    return flint.LLM(
        source, device="cpu", dtype="bfloat16", context_length=64, expert_backend=backend, **kw
    )


def _spy(model: MoEModel) -> Counter[tuple[str, int, int]]:
    """Counts the calls of every hook the backend set, per (hook, layer, rows)."""
    calls: Counter[tuple[str, int, int]] = Counter()

    def counted(name: str, fn: Callable[[int, torch.Tensor], None]) -> Callable[..., None]:
        def hook(layer: int, x: torch.Tensor) -> None:
            assert x.shape[1] == model.config.hidden_size
            calls[(name, layer, x.shape[0])] += 1
            fn(layer, x)

        return hook

    def backend(inner: Any) -> Any:
        def call(layer: int, x: torch.Tensor, ids: torch.Tensor, w: torch.Tensor) -> Any:
            calls[("backend", layer, x.shape[0])] += 1
            return inner(layer, x, ids, w)

        return call

    for layer in model.layers:
        if layer.observe is not None:
            layer.observe = counted("observe", layer.observe)
        if layer.observe_output is not None:
            layer.observe_output = counted("observe_output", layer.observe_output)
        mlp = layer.mlp
        if isinstance(mlp, MoEBlock) and mlp.observe_shared is not None:
            mlp.observe_shared = counted("observe_shared", mlp.observe_shared)
        if isinstance(mlp, MoEBlock):
            mlp.backend = backend(mlp.backend)
    return calls


def _decode(model: MoEModel, steps: int) -> tuple[list[int], torch.Tensor]:
    model.reset()
    logits = model.forward(torch.tensor(PROMPT))[-1]
    tokens, rows = [], []
    for _ in range(steps):
        token = int(logits.argmax())
        tokens.append(token)
        logits = model.forward(torch.tensor([token]))[-1]
        rows.append(logits.float())
    return tokens, torch.stack(rows)


def _run(path: Path, step: bool, lookahead_from: str, steps: int) -> tuple[Any, ...]:
    with _streamed(path, lookahead_from) as llm:
        model = llm.model
        if step:
            model.decoder = StreamedDecoder(model, capture=False)
        calls = _spy(model)
        tokens, logits = _decode(model, steps)
        stats = llm.stats()
        assert stats is not None
        stats["placed"] = stats["hits"] + stats["in_flight_at_start"] + stats["demand_placements"]
        return tokens, logits, calls, stats


FAMILIES = [
    ("qwen3_moe", "output"),
    ("mixtral", "output"),
    ("qwen2_moe", "input"),  # the shared expert's output reaches the lookahead
    ("deepseek_v3", "output"),  # a dense first layer inside segment 0
]


@pytest.mark.parametrize(("family", "lookahead_from"), FAMILIES)
def test_the_streamed_step_follows_the_general_path(
    family: str, lookahead_from: str, tiny_ftw: dict[str, Path]
) -> None:
    """The step (uncaptured, on the CPU) against the same streamed model's layer loop:
    the same greedy tokens, logits within bf16 rounding (the bound the resident step's
    test uses), every hook called as often per layer, the backend called once per
    MoE layer and token (the same forward count and demand traffic)."""
    steps = 16
    want_tokens, want, want_calls, want_stats = _run(tiny_ftw[family], False, lookahead_from, steps)
    got_tokens, got, got_calls, got_stats = _run(tiny_ftw[family], True, lookahead_from, steps)
    assert got_tokens == want_tokens
    scale = want.abs().max().item()
    assert (got - want).abs().max().item() <= 0.03 * scale
    assert got_calls == want_calls and want_calls, (got_calls, want_calls)
    if lookahead_from == "input":
        assert any(key[0] == "observe_shared" for key in got_calls)
    # what rounding may move (which expert a near-tie picks, so which read is on
    # demand) aside, the backend saw the same calls: forwards, K placements per MoE
    # layer and token, the backend once per MoE layer and token
    for key in ("forward_calls", "placed"):
        assert got_stats[key] == want_stats[key], key
    assert got_stats["forward_calls"] == steps + 1


def test_segments_cut_at_the_moe_layers(tiny_ftw: dict[str, Path]) -> None:
    with flint.LLM(tiny_ftw["deepseek_v3"], device="cpu", context_length=8) as llm:
        model = llm.model
        sparse = [i for i, s in enumerate(model.config.sparse_layers) if s]
        segs = segments(model)
        assert [s.moe for s in segs] == [*sparse, None]
        layers = [i for s in segs for i in s.dense + ([] if s.moe is None else [s.moe])]
        assert layers == list(range(model.config.num_layers))
