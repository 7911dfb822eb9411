"""The router's top-k made by the expert kernels themselves (issue 10,
``decode.ROUTE_IN_EXPERTS``, ``moe_kernel.Routing``): each gate/up and down program
picks its pair's expert from the router's logits by their ranks, the ranked sum makes
the weights with the router kernel's own code, so the resident step needs no launch
of the router's top-k and gives the bits the router's launch gives."""

from __future__ import annotations

import pytest
import torch
from test_graphs import _slabs
from test_read_ahead import _same

from flint.graphs import fused, moe_kernel
from flint.graphs.moe_kernel import Routing, moe_experts, slab_pool, stacked_pool


def _by_rank(logits: torch.Tensor, k: int) -> torch.Tensor:
    """The top-k ids of each row: descending logit, ties to the lower id."""
    rows = []
    for row in logits.float():
        order = sorted(range(len(row)), key=lambda e: (-row[e].item(), e))
        rows.append(order[:k])
    return torch.tensor(rows)


@pytest.mark.interpreter
@pytest.mark.parametrize("experts", [60, 128])
def test_the_router_picks_by_the_logits_ranks(experts: int) -> None:
    """``fused.route`` picks the top-k by the logits (ties to the lower id, however
    many tie, an expert count that is not a power of two), weights them as the
    softmax of all the logits renormalised over the picks, as torch does."""
    torch.manual_seed(experts)
    logits = torch.randn(3, experts).bfloat16()
    logits[1, 10:20] = logits[1, 3]  # eleven ties at one value
    logits[2, :] = 0.0  # every logit tied
    ids, weights = fused.route(logits, 8, True, torch.float32)
    assert torch.equal(ids, _by_rank(logits, 8))
    p = torch.softmax(logits.float(), dim=-1).gather(1, ids)
    torch.testing.assert_close(weights, p / p.sum(dim=-1, keepdim=True))


@pytest.mark.interpreter
@pytest.mark.parametrize("scheme", ["raw", "int4"])
@pytest.mark.parametrize(("tokens", "norm", "dtype"), [(1, True, torch.bfloat16),
                                                       (3, False, torch.float32)])  # fmt: skip
def test_the_experts_route_themselves_to_the_routers_bits(
    scheme: str, tokens: int, norm: bool, dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``moe_experts`` given the router's logits (``Routing``) against the same call on
    ``fused.route``'s ids and weights: the same bits, with down reading ahead and
    without, with ties among the logits."""
    monkeypatch.setattr(moe_kernel, "WORDS_GATE_UP_BLOCK", (64, 256, 4))  # fewer programs
    monkeypatch.setattr(moe_kernel, "WORDS_DOWN_BLOCK", (32, 256, 4))
    torch.manual_seed(tokens)
    experts, k, hidden, inter = 12, 3, 64, 96
    if scheme == "raw":
        gate, up = (torch.randn(experts, inter, hidden).bfloat16() for _ in range(2))
        pool = stacked_pool(gate, up, torch.randn(experts, hidden, inter).bfloat16())
    else:
        shapes = ((inter, hidden), (inter, hidden), (hidden, inter))
        slabs, offsets, _ = _slabs("int4", experts, shapes, 32)
        pool = slab_pool(slabs, "int4", 32, shapes, offsets)
    x = (torch.randn(tokens, hidden) / hidden**0.5).bfloat16()
    logits = torch.randn(tokens, experts).bfloat16()
    logits[0, 5:8] = logits[0].max()  # a three-way tie for the first pick
    ids, weights = fused.route(logits, k, norm, dtype)
    for ahead in (True, False):
        monkeypatch.setattr(moe_kernel, "AHEAD_WITHOUT_PDL", ahead)
        want = moe_experts(x, ids, weights, pool)
        got = moe_experts(x, Routing(logits, k, norm, dtype), None, pool)
        assert torch.isfinite(got).all()
        _same(got, want)
