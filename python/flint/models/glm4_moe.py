"""GLM-4.5 (``Glm4MoeForCausalLM``): grouped-query attention with partial rotary
(default half of each head), optional per-head q/k RMSNorm, q/k/v bias; DeepSeek-V3's
sigmoid group router (``flint.models.router``), ungated shared experts, the first
layers dense.

Absent config keys take transformers' ``Glm4MoeConfig`` defaults.
"""

from __future__ import annotations

from typing import Any

from flint.models.config import (
    ModelConfig,
    check_silu,
    common_fields,
    get,
    group_router_config,
    require,
)

# n_group, topk_group, routed_scaling_factor of Glm4MoeConfig
ROUTER_DEFAULTS = (1, 1, 1.0)


def parse_config(hf: dict[str, Any]) -> ModelConfig:
    check_silu(hf)
    fields = common_fields(hf, 1e-5, 10000.0, partial_rotary=0.5)
    layers = int(require(hf, "num_hidden_layers"))
    dense = int(get(hf, "first_k_dense_replace", 1))
    moe_width = int(require(hf, "moe_intermediate_size"))
    shared = hf.get("n_shared_experts", 1)  # absent: transformers' default 1
    return ModelConfig(
        family="glm4_moe",
        **fields,
        qkv_bias=bool(get(hf, "attention_bias", False)),
        o_bias=False,
        qk_norm="per_head" if get(hf, "use_qk_norm", False) else "none",
        clip_qkv=None,
        moe_intermediate_size=moe_width,
        norm_topk_prob=bool(get(hf, "norm_topk_prob", True)),
        router_weights_fp32=True,  # sigmoid scores stay fp32 up to the weighted sum
        shared_expert_intermediate_size=moe_width * int(shared or 0),
        sparse_layers=tuple(i >= dense for i in range(layers)),
        moe_prefix="mlp",
        group_router=group_router_config(
            hf, ROUTER_DEFAULTS, fields["num_experts"], fields["top_k"]
        ),
        shared_expert_gated=False,
    )
