"""DeepSeek-V3 beyond the shared family tests: more geometries against transformers, the
group router against transformers' own router, converted files streamed == resident."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from tiny import build, deepseek_v3_config, save_tokenizer
from variants import (
    assert_incremental_equals_full,
    assert_logits_match,
    assert_streamed_equals_resident,
)

from flint.models import parse_config
from flint.models.router import route_grouped

CPU = torch.device("cpu")
PROMPTS = ([5, 17, 250, 3, 99], list(range(40, 77)), [11])

# Each differs from the FAMILY_NAMES model (low-rank q, interleaved yarn rope, 4 groups
# of 2 with 2 eligible, one dense layer, one shared expert) where the name says.
VARIANTS: dict[str, dict[str, Any]] = {
    # full-rank q_proj, rope not interleaved and unscaled, q_a/kv_a/o biases, no
    # renormalisation, two shared experts, every layer MoE
    "q_full_rank": {
        "q_lora_rank": None,
        "rope_interleave": False,
        "rope_parameters": {"rope_type": "default", "rope_theta": 5000.0},
        "attention_bias": True,
        "norm_topk_prob": False,
        "n_shared_experts": 2,
        "first_k_dense_replace": 0,
    },
    # 16 experts in 4 groups of 4, one group eligible, top-3; DeepSeek-V3's own yarn
    # (mscale == mscale_all_dim); two dense layers
    "one_group_of_four": {
        "n_routed_experts": 16,
        "n_group": 4,
        "topk_group": 1,
        "num_experts_per_tok": 3,
        "first_k_dense_replace": 2,
        "routed_scaling_factor": 1.5,
        "rope_parameters": {
            "rope_type": "yarn",
            "rope_theta": 10000.0,
            "factor": 4.0,
            "original_max_position_embeddings": 32,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
        },
    },
    # no groups (n_group 1), top-4 of 8
    "ungrouped": {"n_group": 1, "topk_group": 1, "num_experts_per_tok": 4},
}


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def variant(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    tiny_tokenizer_json: str,
) -> tuple[Path, Any]:
    path = tmp_path_factory.mktemp(request.param)
    model = build("deepseek_v3", path, config=deepseek_v3_config(**VARIANTS[request.param]))
    save_tokenizer(path, tiny_tokenizer_json)
    return path, model


def test_variant_logits_match_transformers(variant: tuple[Path, Any]) -> None:
    path, ref = variant
    model = assert_logits_match(path, ref, PROMPTS)
    # decoding token by token reads the latent cache: same logits as the full forward
    assert_incremental_equals_full(model, PROMPTS[1][:12])


def test_variant_streamed_equals_resident(variant: tuple[Path, Any], tmp_path: Path) -> None:
    stats = assert_streamed_equals_resident(variant[0], tmp_path, PROMPTS, (11, 42))
    assert stats["demands"] > 0


@pytest.mark.parametrize(
    ("experts", "groups", "best", "top_k", "normalize"),
    [(8, 4, 2, 2, True), (16, 4, 1, 3, False), (12, 3, 2, 4, True), (6, 1, 1, 2, True)],
)
def test_router_matches_transformers_router(
    experts: int, groups: int, best: int, top_k: int, normalize: bool
) -> None:
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter

    hf = deepseek_v3_config(
        n_routed_experts=experts,
        n_group=groups,
        topk_group=best,
        num_experts_per_tok=top_k,
        norm_topk_prob=normalize,
        routed_scaling_factor=2.5,
    )
    torch.manual_seed(experts + top_k)
    ref = DeepseekV3TopkRouter(hf)
    with torch.no_grad():
        ref.weight.normal_(0.0, 0.5)
        ref.e_score_correction_bias.uniform_(-0.3, 0.3)
    x = torch.randn(64, hf.hidden_size)
    with torch.no_grad():
        _, want_w, want_ids = ref(x)
    cfg = parse_config(hf.to_dict()).group_router
    assert cfg is not None
    ids, weights = route_grouped(
        x, ref.weight.data, ref.e_score_correction_bias, cfg, top_k, normalize
    )
    # transformers' top-k is unsorted: compare per token as expert -> weight maps
    for t in range(x.shape[0]):
        got = dict(zip(ids[t].tolist(), weights[t].tolist(), strict=True))
        want = dict(zip(want_ids[t].tolist(), want_w[t].tolist(), strict=True))
        assert got.keys() == want.keys(), t
        assert all(abs(got[e] - want[e]) <= 1e-6 for e in got)
    # router-rank order: descending biased score
    biased = torch.sigmoid(x @ ref.weight.data.T) + ref.e_score_correction_bias
    ranked = biased.gather(1, ids)
    assert bool((ranked[:, :-1] >= ranked[:, 1:]).all())


def test_bias_only_chooses_and_groups_limit_the_choice() -> None:
    hf = deepseek_v3_config(n_routed_experts=16, n_group=4, topk_group=2, num_experts_per_tok=4)
    cfg = parse_config(hf.to_dict()).group_router
    assert cfg is not None
    torch.manual_seed(1)
    router, x = torch.randn(16, 32) * 0.5, torch.randn(200, 32)
    zero, bias = torch.zeros(16), torch.rand(16) * 0.6 - 0.3
    ids0, _ = route_grouped(x, router, zero, cfg, 4, False)
    ids, weights = route_grouped(x, router, bias, cfg, 4, False)
    assert not torch.equal(ids0, ids), "the bias changes some selections"
    scores = torch.sigmoid(x @ router.T)
    assert torch.equal(weights, scores.gather(1, ids) * 2.5), "weights are unbiased scores"
    groups = (ids // 4).tolist()
    assert all(len(set(g)) <= 2 for g in groups), "experts come from at most topk_group groups"
    assert any(len(set(g)) == 2 for g in groups)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"n_group": 3}, "does not divide"),
        ({"n_group": 8}, "at least 2 experts per group"),
        ({"topk_group": 5}, "topk_group"),
        ({"n_group": 4, "topk_group": 1, "num_experts_per_tok": 3}, "exceeds"),
        ({"num_key_value_heads": 2}, "num_key_value_heads"),
    ],
)
def test_bad_configs_are_refused(overrides: dict[str, Any], message: str) -> None:
    hf = deepseek_v3_config(**overrides).to_dict()
    with pytest.raises(ValueError, match=message):
        parse_config(hf)


def test_softmax_scale_uses_yarn_mscale_all_dim() -> None:
    import math

    mla = parse_config(deepseek_v3_config().to_dict()).mla
    assert mla is not None
    mscale = 0.1 * 0.8 * math.log(2.0) + 1.0
    assert mla.softmax_scale == pytest.approx(16**-0.5 * mscale * mscale, rel=1e-12)
    plain = deepseek_v3_config(rope_parameters={"rope_type": "default", "rope_theta": 1e4})
    unscaled = parse_config(plain.to_dict()).mla
    assert unscaled is not None and unscaled.softmax_scale == 16**-0.5
