"""GLM-4.5 beyond the shared family tests: more geometries against transformers and
streamed == resident, and the config forms of partial rotary."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from tiny import build, glm4_moe_config, save_tokenizer
from variants import assert_logits_match, assert_streamed_equals_resident

from flint.models import parse_config

CPU = torch.device("cpu")
PROMPTS = ([5, 17, 250, 3, 99], list(range(40, 77)), [11])

# Each differs from the FAMILY_NAMES model (quarter rotary, q/k norm, bias, 4 groups of
# 2 with 2 eligible, one dense layer) where the name says.
VARIANTS: dict[str, dict[str, Any]] = {
    # no q/k norm, no bias, the rope's default half rotary with yarn, 2 shared experts
    "plain_half_rotary_yarn": {
        "use_qk_norm": False,
        "attention_bias": False,
        "n_shared_experts": 2,
        "rope_parameters": {
            "rope_type": "yarn",
            "rope_theta": 10000.0,
            "factor": 2.0,
            "original_max_position_embeddings": 64,
            "partial_rotary_factor": 0.5,
        },
    },
    # GLM-4.5's own router shape: one group, no renormalisation, every layer MoE
    "ungrouped": {
        "n_group": 1,
        "topk_group": 1,
        "norm_topk_prob": False,
        "first_k_dense_replace": 0,
        "num_experts_per_tok": 3,
    },
}


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def variant(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    tiny_tokenizer_json: str,
) -> tuple[Path, Any]:
    path = tmp_path_factory.mktemp(request.param)
    model = build("glm4_moe", path, config=glm4_moe_config(**VARIANTS[request.param]))
    save_tokenizer(path, tiny_tokenizer_json)
    return path, model


def test_variant_logits_match_transformers(variant: tuple[Path, Any]) -> None:
    path, ref = variant
    assert_logits_match(path, ref, PROMPTS)


def test_variant_streamed_equals_resident(variant: tuple[Path, Any], tmp_path: Path) -> None:
    stats = assert_streamed_equals_resident(variant[0], tmp_path, PROMPTS, (42,))
    assert stats["demands"] > 0


def test_partial_rotary_from_every_config_form() -> None:
    hf = glm4_moe_config().to_dict()
    assert parse_config(hf).rope.partial_rotary_factor == 0.25
    # a GLM-4.5 release config: top-level rope_theta and partial_rotary_factor
    legacy = {k: v for k, v in hf.items() if k != "rope_parameters"}
    legacy.update(rope_theta=1e6, partial_rotary_factor=0.5)
    rope = parse_config(legacy).rope
    assert (rope.theta, rope.partial_rotary_factor) == (1e6, 0.5)
    del legacy["partial_rotary_factor"]
    assert parse_config(legacy).rope.partial_rotary_factor == 0.5  # transformers' default
    qwen = {**hf, "model_type": "qwen3_moe", "num_experts": 8, "moe_intermediate_size": 16}
    with pytest.raises(ValueError, match="partial_rotary_factor"):
        parse_config(qwen)
