"""OLMoE (``OlmoeForCausalLM``): q/k RMSNorm over the whole projection, optional clip_qkv."""

from __future__ import annotations

from typing import Any

from flint.models.config import (
    ModelConfig,
    check_silu,
    get,
    head_dim,
    num_experts,
    require,
    rope_config,
)


def parse_config(hf: dict[str, Any]) -> ModelConfig:
    check_silu(hf)
    layers = int(require(hf, "num_hidden_layers"))
    bias = bool(get(hf, "attention_bias", False))
    clip = hf.get("clip_qkv")
    return ModelConfig(
        family="olmoe",
        vocab_size=int(require(hf, "vocab_size")),
        hidden_size=int(require(hf, "hidden_size")),
        num_layers=layers,
        num_heads=int(require(hf, "num_attention_heads")),
        num_kv_heads=int(get(hf, "num_key_value_heads", hf["num_attention_heads"])),
        head_dim=head_dim(hf),
        rms_norm_eps=float(get(hf, "rms_norm_eps", 1e-5)),
        max_position_embeddings=int(require(hf, "max_position_embeddings")),
        rope=rope_config(hf, 10000.0),
        qkv_bias=bias,
        o_bias=bias,
        qk_norm="full",
        clip_qkv=float(clip) if clip is not None else None,
        num_experts=num_experts(hf),
        top_k=int(require(hf, "num_experts_per_tok")),
        moe_intermediate_size=int(require(hf, "intermediate_size")),
        intermediate_size=int(require(hf, "intermediate_size")),
        norm_topk_prob=bool(get(hf, "norm_topk_prob", False)),
        router_weights_fp32=False,
        shared_expert_intermediate_size=0,
        sparse_layers=(True,) * layers,
        tie_word_embeddings=bool(get(hf, "tie_word_embeddings", False)),
        moe_prefix="mlp",
    )
