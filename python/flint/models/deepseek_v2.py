"""DeepSeek-V2 (``DeepseekV2ForCausalLM``; also V2-Lite, V2.5 and Coder-V2 checkpoints):
DeepSeek-V3's multi-head latent attention with the rotary pairs kept interleaved (a
complex rotation in fp32), a softmax router in fp32 (``greedy`` top-k, or
``group_limited_greedy``: groups ranked by their best score) whose weights are the
scores times ``routed_scaling_factor``, ungated shared experts, the first layers dense.

Absent config keys take transformers' ``DeepseekV2Config`` defaults, so a config.json
means here what it means there.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from flint.models.config import (
    GroupRouterConfig,
    ModelConfig,
    check_silu,
    common_fields,
    get,
    require,
)
from flint.models.deepseek_v3 import mla_config

TOPK_METHODS = ("greedy", "group_limited_greedy")


def router_config(hf: dict[str, Any], experts: int, top_k: int) -> GroupRouterConfig:
    """The softmax router: ``greedy`` is one group; ``group_limited_greedy`` needs
    ``n_group`` dividing the experts and ``topk_group`` groups holding the top-k."""
    method = str(get(hf, "topk_method", "greedy"))
    if method not in TOPK_METHODS:
        raise ValueError(f"topk_method {method!r} is not supported (only {TOPK_METHODS})")
    if get(hf, "norm_topk_prob", False):
        # transformers' DeepseekV2TopkRouter ignores it, DeepSeek's own code renormalises:
        # the two disagree on what such a checkpoint computes
        raise ValueError("norm_topk_prob true is not supported for deepseek_v2")
    factor = float(get(hf, "routed_scaling_factor", 1.0))
    if method == "greedy":
        return GroupRouterConfig(1, 1, factor, scoring="softmax")
    groups, best = int(require(hf, "n_group")), int(require(hf, "topk_group"))
    if groups < 1 or experts % groups:
        raise ValueError(f"n_group {groups} does not divide {experts} routed experts")
    if not 1 <= best <= groups:
        raise ValueError(f"topk_group must be 1..n_group ({groups}), got {best}")
    if top_k > best * (experts // groups):
        raise ValueError(f"num_experts_per_tok {top_k} exceeds the experts of {best} groups")
    return GroupRouterConfig(groups, best, factor, scoring="softmax")


def parse_config(hf: dict[str, Any]) -> ModelConfig:
    check_silu(hf)
    if get(hf, "mlp_bias", False):
        raise ValueError("mlp_bias is not supported for deepseek_v2")
    fields = common_fields(hf, 1e-6, 10000.0)
    if fields["num_kv_heads"] != fields["num_heads"]:
        raise ValueError("latent attention needs num_key_value_heads == num_attention_heads")
    # transformers' V2 always treats the rotary dims as interleaved pairs
    mla = replace(mla_config(hf, fields["rope"]), rope_interleave=True, rope_pairs_kept=True)
    fields["head_dim"] = mla.qk_rope_head_dim  # the rotary tables' width, as transformers
    layers = int(require(hf, "num_hidden_layers"))
    dense = int(get(hf, "first_k_dense_replace", 0))
    moe_width = int(require(hf, "moe_intermediate_size"))
    shared = int(get(hf, "n_shared_experts", 2))  # 0: none (a zero-width MLP)
    return ModelConfig(
        family="deepseek_v2",
        **fields,
        qkv_bias=False,
        o_bias=bool(get(hf, "attention_bias", False)),
        qk_norm="none",
        clip_qkv=None,
        moe_intermediate_size=moe_width,
        norm_topk_prob=False,
        router_weights_fp32=True,  # softmax scores stay fp32 up to the weighted sum
        shared_expert_intermediate_size=moe_width * shared,
        sparse_layers=tuple(i >= dense for i in range(layers)),
        moe_prefix="mlp",
        mla=mla,
        group_router=router_config(hf, fields["num_experts"], fields["top_k"]),
        shared_expert_gated=False,
    )
