"""One typed model configuration, parsed from a Hugging Face ``config.json`` dict.

Each family module (qwen3_moe.py, ...) turns its HF config into a ``ModelConfig``;
the shared code reads only this.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

QKNorm = Literal["none", "per_head", "full"]
ExpertActKind = Literal["swiglu", "gpt_oss"]


@dataclass(slots=True, frozen=True)
class RopeConfig:
    """Rotary embedding parameters (transformers' ``rope_parameters``)."""

    rope_type: str
    theta: float
    factor: float | None = None
    original_max_position_embeddings: int | None = None
    low_freq_factor: float | None = None
    high_freq_factor: float | None = None
    attention_factor: float | None = None
    beta_fast: float | None = None
    beta_slow: float | None = None
    mscale: float | None = None
    mscale_all_dim: float | None = None
    truncate: bool = True
    partial_rotary_factor: float = 1.0  # the share of each head's dims that rotate


@dataclass(slots=True, frozen=True)
class MlaConfig:
    """Multi-head latent attention (DeepSeek-V2/V3): low-rank queries and a compressed,
    cached key/value latent plus one shared rotary key per position."""

    q_lora_rank: int | None  # None: a full-rank q_proj
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    rope_interleave: bool  # rotary dims stored as interleaved pairs (x0, x1), (x2, x3)...
    softmax_scale: float
    # DeepSeek-V2: the pairs are rotated as complex numbers in fp32 (fp32 cos/sin) and
    # stay interleaved; DeepSeek-V3 de-interleaves them (all first members, then seconds).
    rope_pairs_kept: bool = False


@dataclass(slots=True, frozen=True)
class GroupRouterConfig:
    """DeepSeek's fp32 routers, top-k limited to the best ``topk_group`` of ``n_group``
    expert groups. "sigmoid" (V3): sigmoid scores, a correction bias used only to
    choose, groups ranked by the sum of their two best; "softmax" (V2): softmax scores,
    no bias, groups ranked by their best score, never renormalised."""

    n_group: int
    topk_group: int
    routed_scaling_factor: float
    scoring: Literal["sigmoid", "softmax"] = "sigmoid"


@dataclass(slots=True, frozen=True)
class ExpertActivation:
    """How a routed expert combines its gate and up projections (biases already added).

    "swiglu": ``silu(gate) * up``. "gpt_oss": gate clamped above at ``limit``, up
    clamped to [-limit, limit], then ``(up + 1) * gate * sigmoid(alpha * gate)``."""

    kind: ExpertActKind = "swiglu"
    alpha: float = 1.702
    limit: float = 7.0


SWIGLU = ExpertActivation()


@dataclass(slots=True, frozen=True)
class LinearAttentionConfig:
    """Qwen3-Next's gated DeltaNet layers: a causal depthwise conv over q/k/v, then the
    gated delta rule with one recurrent state [v_heads, k_head_dim, v_head_dim] per
    layer; each key head serves ``v_heads // k_heads`` consecutive value heads."""

    layers: tuple[bool, ...]  # per layer: gated DeltaNet (True) or full attention
    k_heads: int
    v_heads: int
    k_head_dim: int
    v_head_dim: int
    conv_kernel: int


@dataclass(slots=True, frozen=True)
class ModelConfig:
    """The shape and numerics of one decoder-only MoE model."""

    family: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    rope: RopeConfig
    qkv_bias: bool
    o_bias: bool
    qk_norm: QKNorm
    clip_qkv: float | None
    num_experts: int
    top_k: int
    moe_intermediate_size: int
    intermediate_size: int  # dense (non-MoE) layers
    norm_topk_prob: bool
    router_weights_fp32: bool  # Mixtral keeps top-k weights in fp32; others cast back
    shared_expert_intermediate_size: int  # 0 = no shared expert
    sparse_layers: tuple[bool, ...]  # per layer: MoE block (True) or dense MLP
    tie_word_embeddings: bool
    moe_prefix: str  # module name of the MoE block under model.layers.N ("mlp", ...)
    mla: MlaConfig | None = None  # None: grouped-query attention
    group_router: GroupRouterConfig | None = None  # None: softmax top-k router
    # Qwen2-MoE: one "shared_expert" scaled by sigmoid(shared_expert_gate); DeepSeek:
    # "shared_experts" added as they are.
    shared_expert_gated: bool = True
    # GPT-OSS (the defaults are every other family's):
    router_name: str = "gate"  # the router's module under the MoE block
    router_bias: bool = False  # router.bias added to the logits
    router_topk_first: bool = False  # top-k on the logits, then softmax over the k
    expert_act: ExpertActivation = SWIGLU
    expert_bias: bool = False  # per-expert gate/up/down biases (dense, resident)
    attention_sinks: bool = False  # per-head learned sink logit in the softmax
    norm_weight_fp32: bool = False  # RMSNorm weight multiplied in fp32, then cast (GPT-OSS)
    layer_windows: tuple[int, ...] = ()  # per layer: sliding window (0: full); (): all full
    # Qwen3-Next: RMSNorms scale by (1 + weight) in fp32 (zero-centred weights), q_proj
    # also yields a per-head output gate, and the linear-attention layers (None: none).
    norm_offset: bool = False
    attn_output_gate: bool = False
    linear_attention: LinearAttentionConfig | None = None


def get(config: dict[str, Any], key: str, default: Any = None) -> Any:
    """``config[key]`` with a default for absent or null values."""
    value = config.get(key)
    return default if value is None else value


def require(config: dict[str, Any], key: str) -> Any:
    if config.get(key) is None:
        raise ValueError(f"config.json lacks {key!r}")
    return config[key]


def head_dim(config: dict[str, Any]) -> int:
    value = config.get("head_dim")
    if value:
        return int(value)
    return int(require(config, "hidden_size")) // int(require(config, "num_attention_heads"))


def num_experts(config: dict[str, Any]) -> int:
    """Routed experts per layer; transformers 5 writes ``num_local_experts`` for most,
    DeepSeek configs ``n_routed_experts``."""
    for key in ("num_experts", "num_local_experts", "n_routed_experts"):
        if config.get(key) is not None:
            return int(config[key])
    raise ValueError("config.json lacks 'num_experts' / 'num_local_experts'")


def check_silu(config: dict[str, Any]) -> None:
    act = get(config, "hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"hidden_act {act!r} is not supported (only 'silu')")


def sparse_layers(config: dict[str, Any], num_layers: int) -> tuple[bool, ...]:
    """Qwen's rule: layer i is MoE unless in ``mlp_only_layers`` or off the sparse step."""
    dense = set(get(config, "mlp_only_layers", []))
    step = int(get(config, "decoder_sparse_step", 1))
    experts = num_experts(config)
    if step < 1:
        raise ValueError(f"decoder_sparse_step must be >= 1, got {step}")
    return tuple(i not in dense and experts > 0 and (i + 1) % step == 0 for i in range(num_layers))


def rope_config(
    config: dict[str, Any], default_theta: float, default_partial: float | None = None
) -> RopeConfig:
    """Reads ``rope_parameters`` (transformers 5) or ``rope_theta`` + ``rope_scaling``.
    ``default_partial``: the family's ``partial_rotary_factor`` when the config names
    none (None: the family rotates whole heads and refuses any other factor)."""
    params = config.get("rope_parameters")
    if not isinstance(params, dict):
        params = dict(get(config, "rope_scaling", {}))
        params.setdefault("rope_theta", get(config, "rope_theta", default_theta))
    rope_type = params.get("rope_type", params.get("type", "default"))
    fallback = get(config, "partial_rotary_factor", default_partial or 1.0)
    partial = float(params.get("partial_rotary_factor", fallback))
    if default_partial is None and partial != 1.0:
        raise ValueError("partial_rotary_factor != 1 is not supported for this family")
    if not 0.0 < partial <= 1.0:
        raise ValueError(f"partial_rotary_factor must be in (0, 1], got {partial}")
    factor = params.get("factor")
    return RopeConfig(
        rope_type=str(rope_type),
        theta=float(params.get("rope_theta", default_theta)),
        factor=float(factor) if factor is not None else None,
        original_max_position_embeddings=params.get("original_max_position_embeddings"),
        low_freq_factor=params.get("low_freq_factor"),
        high_freq_factor=params.get("high_freq_factor"),
        attention_factor=params.get("attention_factor"),
        beta_fast=params.get("beta_fast"),
        beta_slow=params.get("beta_slow"),
        mscale=params.get("mscale"),
        mscale_all_dim=params.get("mscale_all_dim"),
        truncate=bool(params.get("truncate", True)),
        partial_rotary_factor=partial,
    )


def no_sliding_window(config: dict[str, Any], enabled: bool) -> None:
    window = config.get("sliding_window")
    max_pos = int(get(config, "max_position_embeddings", 0))
    if enabled and window and int(window) < max_pos:
        raise ValueError(f"sliding-window attention (window {window}) is not supported")


def group_router_config(
    hf: dict[str, Any], defaults: tuple[int, int, float], experts: int, top_k: int
) -> GroupRouterConfig:
    """The sigmoid group router's parameters (``defaults``: the family's n_group,
    topk_group and routed_scaling_factor for absent keys), checked against the experts."""
    groups = int(get(hf, "n_group", defaults[0]))
    best = int(get(hf, "topk_group", defaults[1]))
    if groups < 1 or experts % groups:
        raise ValueError(f"n_group {groups} does not divide {experts} routed experts")
    if experts // groups < 2:
        raise ValueError("group-limited routing needs at least 2 experts per group")
    if not 1 <= best <= groups:
        raise ValueError(f"topk_group must be 1..n_group ({groups}), got {best}")
    if top_k > best * (experts // groups):
        raise ValueError(f"num_experts_per_tok {top_k} exceeds the experts of {best} groups")
    return GroupRouterConfig(
        n_group=groups,
        topk_group=best,
        routed_scaling_factor=float(get(hf, "routed_scaling_factor", defaults[2])),
    )


def common_fields(
    hf: dict[str, Any], eps: float, rope_theta: float, partial_rotary: float | None = None
) -> dict[str, Any]:
    """The ``ModelConfig`` fields every family reads the same way (``eps``,
    ``rope_theta`` and ``partial_rotary`` are the family's defaults when the config omits
    them; ``partial_rotary`` None: whole heads rotate, see ``rope_config``)."""
    return {
        "vocab_size": int(require(hf, "vocab_size")),
        "hidden_size": int(require(hf, "hidden_size")),
        "num_layers": int(require(hf, "num_hidden_layers")),
        "num_heads": int(require(hf, "num_attention_heads")),
        "num_kv_heads": int(get(hf, "num_key_value_heads", hf["num_attention_heads"])),
        "head_dim": head_dim(hf),
        "rms_norm_eps": float(get(hf, "rms_norm_eps", eps)),
        "max_position_embeddings": int(require(hf, "max_position_embeddings")),
        "rope": rope_config(hf, rope_theta, partial_rotary),
        "num_experts": num_experts(hf),
        "top_k": int(require(hf, "num_experts_per_tok")),
        "intermediate_size": int(require(hf, "intermediate_size")),
        "tie_word_embeddings": bool(get(hf, "tie_word_embeddings", False)),
    }
