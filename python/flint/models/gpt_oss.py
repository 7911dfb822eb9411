"""GPT-OSS (``GptOssForCausalLM``): a router with a bias (top-k on the logits, softmax
over the k), experts with interleaved gate/up, biases and a clamped GLU, attention with
per-head sinks and biases, sliding-window layers alternating with full ones, YaRN.

Checkpoints store a layer's experts fused, under ``model.layers.N.mlp.experts.``:
dequantized as transformers holds them (``gate_up_proj`` [E, H, 2I] with gate in the
even and up in the odd columns, ``down_proj`` [E, I, H]: both [in, out]) or as MXFP4
(``gate_up_proj_blocks``/``_scales`` for [E, 2I, H], ``down_proj_blocks``/``_scales``
for [E, H, I]: both [out, in]). flint splits them into the HF [out, in] gate, up and
down of every other family, so the .ftw slab layout is unchanged; the biases
(``gate_up_proj_bias`` [E, 2I] interleaved, ``down_proj_bias`` [E, H]) stay dense
tensors and are held resident (``expert_biases``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import torch

from flint.models.config import ExpertActivation, ModelConfig, common_fields, get, require
from flint.models.mxfp4 import dequantize_mxfp4

# E = experts per layer, H = hidden, I = expert intermediate, G = MXFP4 groups per row

LAYER_TYPES = ("sliding_attention", "full_attention")
# transformers' GptOssConfig defaults, used when config.json has no rope parameters
DEFAULT_ROPE = {
    "rope_type": "yarn",
    "factor": 32.0,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "truncate": False,
    "original_max_position_embeddings": 4096,
}


def _windows(hf: dict[str, Any], layers: int) -> tuple[int, ...]:
    """Per layer: the sliding window (keys within ``window`` positions, itself included)
    or 0 for full attention; transformers' default alternates, sliding first."""
    types = get(hf, "layer_types", [LAYER_TYPES[i % 2] for i in range(layers)])
    if len(types) != layers or not set(types) <= set(LAYER_TYPES):
        raise ValueError(f"layer_types must be {layers} of {LAYER_TYPES}, got {types}")
    window = int(get(hf, "sliding_window", 0))
    if "sliding_attention" in types and window < 1:
        raise ValueError(f"sliding layers need a sliding_window >= 1, got {window}")
    return tuple(window if t == "sliding_attention" else 0 for t in types)


def parse_config(hf: dict[str, Any]) -> ModelConfig:
    if hf.get("rope_parameters") is None and hf.get("rope_scaling") is None:
        hf = {**hf, "rope_scaling": DEFAULT_ROPE}
    layers = int(require(hf, "num_hidden_layers"))
    bias = bool(get(hf, "attention_bias", True))
    act = ExpertActivation(
        "gpt_oss", float(get(hf, "swiglu_alpha", 1.702)), float(get(hf, "swiglu_limit", 7.0))
    )
    return ModelConfig(
        family="gpt_oss",
        **common_fields(hf, 1e-5, 150000.0),
        qkv_bias=bias,
        o_bias=bias,
        qk_norm="none",
        clip_qkv=None,
        moe_intermediate_size=int(require(hf, "intermediate_size")),
        norm_topk_prob=False,
        router_weights_fp32=False,
        shared_expert_intermediate_size=0,
        sparse_layers=(True,) * layers,
        moe_prefix="mlp",
        router_name="router",
        router_bias=True,
        router_topk_first=True,
        expert_act=act,
        expert_bias=True,
        attention_sinks=True,
        norm_weight_fp32=True,
        layer_windows=_windows(hf, layers),
    )


class Tensors(Protocol):
    def tensor(self, name: str) -> torch.Tensor: ...


def expert_biases(source: Tensors, layer: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Layer ``layer``'s expert biases: gate [E, I], up [E, I], down [E, H]."""
    p = f"model.layers.{layer}.mlp.experts."
    gate_up = source.tensor(p + "gate_up_proj_bias")  # [E, 2I], gate even, up odd
    down = source.tensor(p + "down_proj_bias")  # [E, H]
    return gate_up[:, 0::2].contiguous(), gate_up[:, 1::2].contiguous(), down


Row = Callable[[str], torch.Tensor | None]  # fused tensor name -> the expert's row (None: absent)


def is_expert_tensor(name: str) -> bool:
    """A fused expert matrix (dequantized or MXFP4), not a bias."""
    return name in ("gate_up_proj", "down_proj") or name.endswith(("_blocks", "_scales"))


def expert_projections(row: Row) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One expert's gate [I, H], up [I, H], down [H, I] from its rows of the fused
    tensors (names relative to ``model.layers.N.mlp.experts.``)."""
    gate_up, down = row("gate_up_proj"), row("down_proj")  # [H, 2I], [I, H]
    if gate_up is not None and down is not None:
        return (
            gate_up[:, 0::2].t().contiguous(),
            gate_up[:, 1::2].t().contiguous(),
            down.t().contiguous(),
        )
    parts = [row(n) for n in ("gate_up_proj_blocks", "gate_up_proj_scales")]
    parts += [row(n) for n in ("down_proj_blocks", "down_proj_scales")]
    if any(p is None for p in parts):
        raise KeyError("GPT-OSS experts need gate_up_proj/down_proj or their MXFP4 blocks/scales")
    gu_blocks, gu_scales, d_blocks, d_scales = (p for p in parts if p is not None)
    gate_up = dequantize_mxfp4(gu_blocks, gu_scales)  # [2I, H], rows interleaved
    return gate_up[0::2], gate_up[1::2], dequantize_mxfp4(d_blocks, d_scales)  # down [H, I]
