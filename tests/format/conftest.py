"""Tiny random transformers MoE checkpoints of every supported architecture, built on the fly."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
SHARED = REPO.parent / "shared"


def _common() -> dict[str, Any]:
    return dict(
        vocab_size=96,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )


def tiny_model(arch: str) -> Any:
    """A seeded tiny random transformers model of ``arch`` in fp32."""
    import transformers as tf

    torch.manual_seed(0)
    c = _common()
    if arch == "qwen3_moe":
        cfg = tf.Qwen3MoeConfig(
            **c,
            head_dim=8,
            intermediate_size=48,
            moe_intermediate_size=16,
            num_experts=4,
            num_experts_per_tok=2,
            mlp_only_layers=[0],
        )
        return tf.Qwen3MoeForCausalLM(cfg)
    if arch == "qwen2_moe":
        cfg = tf.Qwen2MoeConfig(
            **c,
            intermediate_size=48,
            moe_intermediate_size=16,
            shared_expert_intermediate_size=24,
            num_experts=4,
            num_experts_per_tok=2,
        )
        return tf.Qwen2MoeForCausalLM(cfg)
    if arch == "mixtral":
        cfg = tf.MixtralConfig(
            **c, intermediate_size=16, num_local_experts=4, num_experts_per_tok=2
        )
        return tf.MixtralForCausalLM(cfg)
    if arch == "olmoe":
        cfg = tf.OlmoeConfig(**c, intermediate_size=16, num_experts=4, num_experts_per_tok=2)
        return tf.OlmoeForCausalLM(cfg)
    if arch == "deepseek_v3":
        cfg = tf.DeepseekV3Config(
            **{**c, "num_key_value_heads": 4},
            intermediate_size=48,
            moe_intermediate_size=16,
            n_routed_experts=4,
            num_experts_per_tok=2,
            n_group=2,
            topk_group=1,
            first_k_dense_replace=1,
            q_lora_rank=16,
            kv_lora_rank=16,
            qk_nope_head_dim=8,
            qk_rope_head_dim=8,
            v_head_dim=8,
        )
        return tf.DeepseekV3ForCausalLM(cfg)
    if arch == "glm4_moe":
        cfg = tf.Glm4MoeConfig(
            **c,
            head_dim=8,
            intermediate_size=48,
            moe_intermediate_size=16,
            n_routed_experts=4,
            num_experts_per_tok=2,
            use_qk_norm=True,
            attention_bias=True,
        )
        return tf.Glm4MoeForCausalLM(cfg)
    raise ValueError(arch)


ARCHS = ["qwen3_moe", "qwen2_moe", "mixtral", "olmoe", "deepseek_v3", "glm4_moe"]


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """arch -> saved checkpoint dir; plus "<arch>-sharded" saved in several shards."""
    out: dict[str, Path] = {}
    for arch in ARCHS:
        m = tiny_model(arch)
        d = tmp_path_factory.mktemp(arch)
        m.save_pretrained(d)
        out[arch] = d
        if arch == "qwen3_moe":
            s = tmp_path_factory.mktemp(arch + "-sharded")
            m.save_pretrained(s, max_shard_size="20KB")
            out[arch + "-sharded"] = s
    return out
