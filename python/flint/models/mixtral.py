"""Mixtral (``MixtralForCausalLM``): every layer MoE, always renormalised fp32 top-k."""

from __future__ import annotations

from typing import Any

from flint.models.config import (
    ModelConfig,
    check_silu,
    common_fields,
    no_sliding_window,
    require,
)


def parse_config(hf: dict[str, Any]) -> ModelConfig:
    check_silu(hf)
    no_sliding_window(hf, True)
    layers = int(require(hf, "num_hidden_layers"))
    return ModelConfig(
        family="mixtral",
        **common_fields(hf, 1e-5, 1e6),
        qkv_bias=False,
        o_bias=False,
        qk_norm="none",
        clip_qkv=None,
        moe_intermediate_size=int(require(hf, "intermediate_size")),
        norm_topk_prob=True,
        router_weights_fp32=True,
        shared_expert_intermediate_size=0,
        sparse_layers=(True,) * layers,
        moe_prefix="block_sparse_moe",
    )
