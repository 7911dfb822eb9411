"""OLMoE (``OlmoeForCausalLM``): q/k RMSNorm over the whole projection, optional clip_qkv."""

from __future__ import annotations

from typing import Any

from flint.models.config import (
    ModelConfig,
    check_silu,
    common_fields,
    get,
    require,
)


def parse_config(hf: dict[str, Any]) -> ModelConfig:
    check_silu(hf)
    layers = int(require(hf, "num_hidden_layers"))
    bias = bool(get(hf, "attention_bias", False))
    clip = hf.get("clip_qkv")
    return ModelConfig(
        family="olmoe",
        **common_fields(hf, 1e-5, 10000.0),
        qkv_bias=bias,
        o_bias=bias,
        qk_norm="full",
        clip_qkv=float(clip) if clip is not None else None,
        moe_intermediate_size=int(require(hf, "intermediate_size")),
        norm_topk_prob=bool(get(hf, "norm_topk_prob", False)),
        router_weights_fp32=False,
        shared_expert_intermediate_size=0,
        sparse_layers=(True,) * layers,
        moe_prefix="mlp",
    )
