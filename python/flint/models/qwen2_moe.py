"""Qwen2-MoE (``Qwen2MoeForCausalLM``): q/k/v bias, sigmoid-gated shared expert."""

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
    return ModelConfig(
        family="qwen2_moe",
        **common_fields(hf, 1e-6, 10000.0),
        qkv_bias=bool(get(hf, "qkv_bias", True)),  # older configs: always biased
        o_bias=False,
        qk_norm="none",
        clip_qkv=None,
        moe_intermediate_size=int(require(hf, "moe_intermediate_size")),
        norm_topk_prob=bool(get(hf, "norm_topk_prob", False)),
        router_weights_fp32=False,
        shared_expert_intermediate_size=int(require(hf, "shared_expert_intermediate_size")),
        sparse_layers=sparse_layers(hf, layers),
        moe_prefix="mlp",
    )
