"""Qwen3-MoE (``Qwen3MoeForCausalLM``): per-head q/k RMSNorm, optional dense layers."""

from __future__ import annotations

from typing import Any

from flint.models.config import (
    ModelConfig,
    check_silu,
    common_fields,
    get,
    no_sliding_window,
    require,
    sparse_layers,
)


def parse_config(hf: dict[str, Any]) -> ModelConfig:
    check_silu(hf)
    no_sliding_window(hf, bool(get(hf, "use_sliding_window", False)))
    layers = int(require(hf, "num_hidden_layers"))
    bias = bool(get(hf, "attention_bias", False))
    return ModelConfig(
        family="qwen3_moe",
        **common_fields(hf, 1e-6, 10000.0),
        qkv_bias=bias,
        o_bias=bias,
        qk_norm="per_head",
        clip_qkv=None,
        moe_intermediate_size=int(require(hf, "moe_intermediate_size")),
        norm_topk_prob=bool(get(hf, "norm_topk_prob", False)),
        router_weights_fp32=False,
        shared_expert_intermediate_size=0,
        sparse_layers=sparse_layers(hf, layers),
        moe_prefix="mlp",
    )
