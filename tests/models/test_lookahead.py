"""Router lookahead's fused op: one RMS normalisation and one matmul for every target
layer give each target's router logits as its own norm and router would."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import flint
from flint.models import parse_config
from flint.models.ftw_source import FtwSource
from flint.models.norm import rms_norm
from flint.stream import streamed_backend
from flint.stream.lookahead import Lookahead


def test_fused_logits_match_each_layers_norm_and_router() -> None:
    g = torch.Generator().manual_seed(0)
    hidden, experts = 64, 16
    look = Lookahead(depth=3, top_k=4, eps=1e-6)
    for layer in (1, 2, 4):  # layer 3 dense: no router
        norm = 1 + 0.1 * torch.randn(hidden, generator=g)
        look.add_layer(layer, norm, torch.randn(experts, hidden, generator=g))
    h = 3 * torch.randn(1, hidden, generator=g)
    targets, logits = look.logits(1, h)
    assert targets == [(2, 1), (4, 3)], "targets without a router are skipped"
    for (target, _), got in zip(targets, logits, strict=True):
        want = F.linear(rms_norm(h, look.norms[target], 1e-6), look.routers[target])[0]
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    predictions = look.predict(1, h)
    assert {(t, d) for t, _, d, _ in predictions} == {(2, 1), (4, 3)}
    for target, d in targets:
        want = set(torch.topk(logits[targets.index((target, d))], 4).indices.tolist())
        assert look.pending[(target, d)] == want
    assert look.predict(4, h) == [], "nothing after the last layer"


def test_a_group_routers_predictions_are_what_it_would_select() -> None:
    """DeepSeek-V3-style targets are ranked as their router ranks: sigmoid scores plus
    the correction bias, within the best groups."""
    from flint.models.config import GroupRouterConfig
    from flint.models.router import route_grouped

    g = torch.Generator().manual_seed(1)
    hidden, experts, k = 32, 16, 4
    cfg = GroupRouterConfig(n_group=4, topk_group=2, routed_scaling_factor=2.5)
    look = Lookahead(depth=1, top_k=k, eps=1e-6)
    norm = 1 + 0.1 * torch.randn(hidden, generator=g)
    router = torch.randn(experts, hidden, generator=g)
    bias = torch.randn(experts, generator=g)  # large: it decides much of the choice
    look.add_layer(2, norm, router, (bias, cfg))
    for _ in range(20):
        h = torch.randn(1, hidden, generator=g)
        look.predict(1, h)
        ids, _ = route_grouped(rms_norm(h, norm, 1e-6), router, bias, cfg, k, True)
        assert look.pending[(2, 1)] == set(ids[0].tolist())


def test_a_softmax_group_routers_predictions_are_what_it_would_select() -> None:
    """DeepSeek-V2's targets (no bias; groups ranked by their best softmax score) are
    ranked as their router ranks."""
    from flint.models.config import GroupRouterConfig
    from flint.models.router import route_grouped

    g = torch.Generator().manual_seed(2)
    hidden, experts, k = 32, 16, 3
    cfg = GroupRouterConfig(n_group=4, topk_group=1, routed_scaling_factor=16.0, scoring="softmax")
    look = Lookahead(depth=1, top_k=k, eps=1e-6)
    norm = 1 + 0.1 * torch.randn(hidden, generator=g)
    router = torch.randn(experts, hidden, generator=g)
    look.add_layer(2, norm, router, (None, cfg))
    for _ in range(20):
        h = torch.randn(1, hidden, generator=g)
        look.predict(1, h)
        ids, _ = route_grouped(rms_norm(h, norm, 1e-6), router, None, cfg, k, False)
        assert look.pending[(2, 1)] == set(ids[0].tolist())
        assert len({e // 4 for e in ids[0].tolist()}) == 1, "one group eligible"


@pytest.mark.parametrize("family", ["qwen2_moe", "deepseek_v3"])
def test_lookahead_from_the_input_adds_the_shared_experts_output(
    family: str, tiny_ftw: dict[str, Path]
) -> None:
    """With ``lookahead_from="input"``, a layer with a shared expert predicts from its
    MoE input plus that expert's output (computed first, added to the layer's output
    as before: streamed output still equals resident bit for bit)."""
    path = tiny_ftw[family]
    with (
        flint.LLM(path, device="cpu", context_length=64) as resident,
        flint.LLM(path, device="cpu", context_length=64, ram_budget=1e-6, lookahead=2) as streamed,
    ):
        backend: Any = streamed.expert_backend
        assert backend.lookahead_from == "output" and not backend._with_shared
    source = FtwSource(path)
    config = parse_config(source.config)
    backend = streamed_backend(
        source,
        config,
        torch.device("cpu"),
        torch.float32,
        1e-6,
        usage=False,
        lookahead_from="input",
        notice=lambda _: None,
    )
    seen: dict[int, torch.Tensor] = {}
    predicted: dict[int, torch.Tensor] = {}
    observe, predict = backend.observe, backend._predict

    def spy_observe(layer: int, h: torch.Tensor) -> None:
        seen[layer] = h.clone()
        observe(layer, h)

    def spy_predict(layer: int, h: torch.Tensor) -> None:
        predicted[layer] = h.clone()
        predict(layer, h)

    with (
        flint.LLM(path, device="cpu", context_length=64) as resident,
        flint.LLM(source, device="cpu", context_length=64, expert_backend=backend) as s,
    ):
        assert backend._with_shared == {
            i for i, layer in enumerate(s.model.layers) if getattr(layer.mlp, "shared", None)
        }
        for layer in s.model.layers:
            layer.observe = spy_observe
        backend._predict = spy_predict  # type: ignore[method-assign]
        for ids in ([5, 17, 250], [7], [300]):
            want = resident.model.forward(torch.tensor(ids), all_logits=True)
            assert torch.equal(s.model.forward(torch.tensor(ids), all_logits=True), want)
        for i in backend._with_shared:
            layer = s.model.layers[i]
            h = seen[i]
            shared = layer.mlp._shared(layer.norm(h, layer.post_norm, layer.eps))
            assert torch.equal(predicted[i], h + shared)
