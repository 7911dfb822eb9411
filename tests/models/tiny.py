"""Tiny random transformers MoE models, built on the fly, for reference tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

FAMILY_NAMES = ("qwen3_moe", "qwen2_moe", "mixtral", "olmoe")

_COMMON: dict[str, Any] = {
    "vocab_size": 96,
    "hidden_size": 32,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 128,
    "num_experts_per_tok": 2,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
}


def hf_config(family: str) -> Any:
    """A tiny transformers config exercising what is special about ``family``."""
    import transformers as tf

    if family == "qwen3_moe":
        return tf.Qwen3MoeConfig(
            **_COMMON,
            head_dim=16,
            intermediate_size=48,
            moe_intermediate_size=16,
            num_experts=6,
            mlp_only_layers=[0],
            norm_topk_prob=True,
            attention_bias=True,
            rope_parameters={
                "rope_type": "yarn",
                "rope_theta": 10000.0,
                "factor": 2.0,
                "original_max_position_embeddings": 64,
            },
        )
    if family == "qwen2_moe":
        return tf.Qwen2MoeConfig(
            **_COMMON,
            intermediate_size=40,
            moe_intermediate_size=16,
            num_experts=6,
            shared_expert_intermediate_size=24,
            decoder_sparse_step=2,
            norm_topk_prob=False,
        )
    if family == "mixtral":
        return tf.MixtralConfig(
            **_COMMON,
            intermediate_size=24,
            num_local_experts=4,
            tie_word_embeddings=True,
            rope_parameters={"rope_type": "linear", "rope_theta": 5000.0, "factor": 2.0},
        )
    if family == "olmoe":
        return tf.OlmoeConfig(
            **_COMMON,
            intermediate_size=16,
            num_experts=6,
            clip_qkv=3.0,
            norm_topk_prob=False,
        )
    raise ValueError(family)


def build(family: str, path: Path, seed: int = 0) -> Any:
    """Builds, re-initialises (large router weights: no near-ties) and saves a model."""
    import transformers as tf

    torch.manual_seed(seed)
    model = tf.AutoModelForCausalLM.from_config(hf_config(family), dtype=torch.float32)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("mlp.gate.weight") or name.endswith("block_sparse_moe.gate.weight"):
                param.normal_(0.0, 1.0)
            elif name.endswith("norm.weight"):
                param.uniform_(0.5, 1.5)
            elif name.endswith("bias"):
                param.normal_(0.0, 0.1)
            else:
                param.normal_(0.0, 0.15)
    model.eval()
    model.save_pretrained(path)
    return model
