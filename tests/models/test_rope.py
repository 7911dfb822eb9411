"""RoPE inverse frequencies against transformers' for each supported rope type."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from flint.models.config import rope_config
from flint.models.rope import inv_freq

ROPES: list[dict[str, Any]] = [
    {"rope_type": "default", "rope_theta": 10000.0},
    {"rope_type": "linear", "rope_theta": 5000.0, "factor": 4.0},
    {
        "rope_type": "yarn",
        "rope_theta": 1e6,
        "factor": 4.0,
        "original_max_position_embeddings": 512,
    },
    {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 256,
    },
]


@pytest.mark.parametrize("rope", ROPES, ids=lambda r: r["rope_type"])
def test_inv_freq_matches_transformers(rope: dict[str, Any]) -> None:
    import transformers as tf
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    hf = tf.Qwen3MoeConfig(
        hidden_size=64,
        num_attention_heads=4,
        head_dim=32,
        max_position_embeddings=2048,
        rope_parameters=dict(rope),
    )
    if rope["rope_type"] == "default":
        rotary = tf.models.qwen3_moe.modeling_qwen3_moe.Qwen3MoeRotaryEmbedding
        want, want_scale = rotary.compute_default_rope_parameters(hf)
    else:
        want, want_scale = ROPE_INIT_FUNCTIONS[rope["rope_type"]](hf, "cpu")
    got, scale = inv_freq(rope_config(hf.to_dict(), 10000.0), 32, 2048)
    assert torch.equal(got, want)
    assert scale == pytest.approx(want_scale, abs=0)


def test_old_style_rope_config() -> None:
    rope = rope_config({"rope_theta": 123.0, "rope_scaling": {"type": "linear", "factor": 2}}, 1.0)
    assert (rope.rope_type, rope.theta, rope.factor) == ("linear", 123.0, 2.0)
    with pytest.raises(ValueError, match="not supported"):
        inv_freq(rope_config({"rope_parameters": {"rope_type": "dynamic"}}, 1.0), 8, 16)
