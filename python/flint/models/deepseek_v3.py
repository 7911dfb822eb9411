"""DeepSeek-V3 (``DeepseekV3ForCausalLM``; also DeepSeek-R1 and Kimi K2 checkpoints):
multi-head latent attention, a sigmoid router with a selection-only correction bias and
group-limited top-k, ungated shared experts, the first layers dense.

Absent config keys take transformers' ``DeepseekV3Config`` defaults, so a config.json
means here what it means there.
"""

from __future__ import annotations

import math
from typing import Any

from flint.models.config import (
    MlaConfig,
    ModelConfig,
    RopeConfig,
    check_silu,
    common_fields,
    get,
    group_router_config,
    require,
)

# n_group, topk_group, routed_scaling_factor of DeepseekV3Config
ROUTER_DEFAULTS = (8, 4, 2.5)


def softmax_scale(qk_head_dim: int, rope: RopeConfig) -> float:
    """``qk_head_dim ** -0.5``, times yarn's ``mscale(factor, mscale_all_dim) ** 2`` when
    the rope is scaled and names ``mscale_all_dim`` (transformers' ``yarn_apply_mscale``)."""
    scale: float = qk_head_dim ** (-0.5)
    if rope.rope_type != "default" and rope.mscale_all_dim:
        if rope.factor is None:
            raise ValueError("rope scaling with 'mscale_all_dim' needs a 'factor'")
        if rope.factor > 1:
            mscale = 0.1 * rope.mscale_all_dim * math.log(rope.factor) + 1.0
            scale = scale * mscale * mscale
    return scale


def mla_config(hf: dict[str, Any], rope: RopeConfig) -> MlaConfig:
    q_rank = hf.get("q_lora_rank", 1536)  # an explicit null: full-rank q_proj
    nope = int(get(hf, "qk_nope_head_dim", 128))
    rot = int(get(hf, "qk_rope_head_dim", 64))
    return MlaConfig(
        q_lora_rank=int(q_rank) if q_rank is not None else None,
        kv_lora_rank=int(get(hf, "kv_lora_rank", 512)),
        qk_nope_head_dim=nope,
        qk_rope_head_dim=rot,
        v_head_dim=int(get(hf, "v_head_dim", 128)),
        rope_interleave=bool(get(hf, "rope_interleave", True)),
        softmax_scale=softmax_scale(nope + rot, rope),
    )


def parse_config(hf: dict[str, Any]) -> ModelConfig:
    check_silu(hf)
    fields = common_fields(hf, 1e-6, 10000.0)
    if fields["num_kv_heads"] != fields["num_heads"]:
        raise ValueError("latent attention needs num_key_value_heads == num_attention_heads")
    mla = mla_config(hf, fields["rope"])
    fields["head_dim"] = mla.qk_rope_head_dim  # the rotary tables' width, as transformers
    layers = int(require(hf, "num_hidden_layers"))
    dense = int(get(hf, "first_k_dense_replace", 3))
    moe_width = int(require(hf, "moe_intermediate_size"))
    shared = hf.get("n_shared_experts", 1)  # absent: transformers' default 1
    return ModelConfig(
        family="deepseek_v3",
        **fields,
        qkv_bias=False,
        o_bias=bool(get(hf, "attention_bias", False)),
        qk_norm="none",
        clip_qkv=None,
        moe_intermediate_size=moe_width,
        norm_topk_prob=bool(get(hf, "norm_topk_prob", True)),
        router_weights_fp32=True,  # sigmoid scores stay fp32 up to the weighted sum
        shared_expert_intermediate_size=moe_width * int(shared or 0),
        sparse_layers=tuple(i >= dense for i in range(layers)),
        moe_prefix="mlp",
        mla=mla,
        group_router=group_router_config(
            hf, ROUTER_DEFAULTS, fields["num_experts"], fields["top_k"]
        ),
        shared_expert_gated=False,
    )
