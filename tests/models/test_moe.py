"""The MoE block's contract: routing, rank-order fp32 sums, and a swappable backend."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from flint.models import ResidentExperts, SafetensorsSource, load_model, parse_config
from flint.models.loading import Placement
from flint.models.mlp import swiglu
from flint.models.moe import route, weighted_sum

CPU32 = Placement(torch.device("cpu"), torch.float32)


def _source(tiny_models: dict[str, Any], family: str) -> SafetensorsSource:
    path: Path = tiny_models[family][0]
    return SafetensorsSource(path)


def test_route_shapes_and_renormalisation(tiny_models: dict[str, Any]) -> None:
    source = _source(tiny_models, "qwen3_moe")
    config = parse_config(source.config)
    x = torch.randn(5, config.hidden_size)  # [T, H]
    router = source.tensor("model.layers.1.mlp.gate.weight")  # [E, H]
    ids, weights = route(x, router, config)
    assert ids.shape == weights.shape == (5, config.top_k)
    assert torch.allclose(weights.sum(-1), torch.ones(5))  # norm_topk_prob
    probs = torch.softmax(x @ router.T, -1)
    assert torch.equal(ids, probs.topk(config.top_k).indices)  # rank order: best first


def test_resident_experts_equal_a_per_token_loop(tiny_models: dict[str, Any]) -> None:
    source = _source(tiny_models, "olmoe")
    config = parse_config(source.config)
    experts = ResidentExperts(config, source, CPU32)
    x = torch.randn(7, config.hidden_size)
    ids, weights = route(x, source.tensor("model.layers.2.mlp.gate.weight"), config)
    got = experts(2, x, ids, weights)  # [T, H]
    for t in range(7):
        acc = torch.zeros(config.hidden_size)
        for k in range(config.top_k):  # fp32, router-rank order
            w = source.expert(2, int(ids[t, k]))
            acc = acc + swiglu(x[t : t + 1], w.gate, w.up, w.down)[0] * weights[t, k]
        assert torch.allclose(got[t], acc, atol=1e-6)


def test_weighted_sum_adds_in_rank_order() -> None:
    big, tiny = 1e8, 1.0  # fp32: (big + tiny) - big == 0, order is visible
    outputs = torch.tensor([[[big], [tiny], [-big]]])  # [T=1, K=3, H=1]
    assert weighted_sum(outputs, torch.ones(1, 3)).item() == 0.0
    assert weighted_sum(outputs[:, [0, 2, 1]], torch.ones(1, 3)).item() == 1.0


class _CountingBackend:
    """A stand-in for a streaming backend: same math, counts the experts it is asked for."""

    def __init__(self, inner: ResidentExperts) -> None:
        self.inner = inner
        self.calls: list[tuple[int, int]] = []  # (layer, tokens)

    def __call__(
        self, layer: int, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor
    ) -> torch.Tensor:
        self.calls.append((layer, x.shape[0]))
        return self.inner(layer, x, ids, weights)


def test_backend_is_swappable_without_touching_the_model(tiny_models: dict[str, Any]) -> None:
    source = _source(tiny_models, "qwen2_moe")
    config = parse_config(source.config)
    cpu = torch.device("cpu")
    backend = _CountingBackend(ResidentExperts(config, source, CPU32))
    ids = torch.tensor([4, 8, 15, 16, 23, 42])
    # the default backend on torch's kernels: ``ResidentExperts``, which ``backend`` wraps
    model = load_model(source, cpu, torch.float32, 16, expert_kernels="torch")
    want = model.forward(ids, all_logits=True)
    got = load_model(source, cpu, torch.float32, 16, backend=backend).forward(ids, all_logits=True)
    assert torch.equal(want, got)
    sparse = [i for i, s in enumerate(config.sparse_layers) if s]
    assert sparse == [1]  # decoder_sparse_step=2: layers 0 and 2 are dense
    assert backend.calls == [(1, 6)]


def test_bfloat16_runs_close_to_float32(tiny_models: dict[str, Any]) -> None:
    source = _source(tiny_models, "mixtral")
    cpu = torch.device("cpu")
    ids = torch.tensor([4, 8, 15, 16, 23, 42])
    ref = load_model(source, cpu, torch.float32, 16).forward(ids, all_logits=True)
    bf16 = load_model(source, cpu, torch.bfloat16, 16)
    assert bf16.lm_head.dtype == torch.bfloat16
    got = bf16.forward(ids, all_logits=True)
    assert got.dtype == torch.float32
    assert (got - ref).abs().max().item() < 0.1 * ref.abs().max().item()
