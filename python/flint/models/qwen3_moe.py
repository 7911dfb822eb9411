"""Qwen3-MoE (``Qwen3MoeForCausalLM``): per-head q/k RMSNorm, optional dense layers."""

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
    sparse_layers,
)


def parse_config(hf: dict[str, Any]) -> ModelConfig:
    check_silu(hf)
    no_sliding_window(hf, bool(get(hf, "use_sliding_window", False)))
    layers = int(require(hf, "num_hidden_layers"))
    bias = bool(get(hf, "attention_bias", False))
    return ModelConfig(
        family="qwen3_moe",
        vocab_size=int(require(hf, "vocab_size")),
        hidden_size=int(require(hf, "hidden_size")),
        num_layers=layers,
        num_heads=int(require(hf, "num_attention_heads")),
        num_kv_heads=int(get(hf, "num_key_value_heads", hf["num_attention_heads"])),
        head_dim=head_dim(hf),
        rms_norm_eps=float(get(hf, "rms_norm_eps", 1e-6)),
        max_position_embeddings=int(require(hf, "max_position_embeddings")),
        rope=rope_config(hf, 10000.0),
        qkv_bias=bias,
        o_bias=bias,
        qk_norm="per_head",
        clip_qkv=None,
        num_experts=num_experts(hf),
        top_k=int(require(hf, "num_experts_per_tok")),
        moe_intermediate_size=int(require(hf, "moe_intermediate_size")),
        intermediate_size=int(require(hf, "intermediate_size")),
        norm_topk_prob=bool(get(hf, "norm_topk_prob", False)),
        router_weights_fp32=False,
        shared_expert_intermediate_size=0,
        sparse_layers=sparse_layers(hf, layers),
        tie_word_embeddings=bool(get(hf, "tie_word_embeddings", False)),
        moe_prefix="mlp",
    )
