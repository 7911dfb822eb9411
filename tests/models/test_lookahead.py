"""Router lookahead's fused op: one RMS normalisation and one matmul for every target
layer give each target's router logits as its own norm and router would."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from flint.models.norm import rms_norm
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
