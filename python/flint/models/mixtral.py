"""Mixtral (``MixtralForCausalLM``): every layer MoE, always renormalised fp32 top-k."""

from __future__ import annotations

from typing import Any

from flint.models.config import (
    ModelConfig,
    check_silu,
    get,
    head_dim,
    no_sliding_window,
    num_experts,
    require,
    rope_config,
)


def parse_config(hf: dict[str, Any]) -> ModelConfig:
    check_silu(hf)
    no_sliding_window(hf, True)
    layers = int(require(hf, "num_hidden_layers"))
    return ModelConfig(
        family="mixtral",
        vocab_size=int(require(hf, "vocab_size")),
        hidden_size=int(require(hf, "hidden_size")),
        num_layers=layers,
        num_heads=int(require(hf, "num_attention_heads")),
        num_kv_heads=int(get(hf, "num_key_value_heads", hf["num_attention_heads"])),
        head_dim=head_dim(hf),
        rms_norm_eps=float(get(hf, "rms_norm_eps", 1e-5)),
        max_position_embeddings=int(require(hf, "max_position_embeddings")),
        rope=rope_config(hf, 1e6),
        qkv_bias=False,
        o_bias=False,
        qk_norm="none",
        clip_qkv=None,
        num_experts=num_experts(hf),
        top_k=int(require(hf, "num_experts_per_tok")),
        moe_intermediate_size=int(require(hf, "intermediate_size")),
        intermediate_size=int(require(hf, "intermediate_size")),
        norm_topk_prob=True,
        router_weights_fp32=True,
        shared_expert_intermediate_size=0,
        sparse_layers=(True,) * layers,
        tie_word_embeddings=bool(get(hf, "tie_word_embeddings", False)),
        moe_prefix="block_sparse_moe",
    )
