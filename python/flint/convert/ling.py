"""Ling / Ring 2.0 (``BailingMoeV2ForCausalLM``, inclusionAI; no transformers class)
converted onto the GLM-4.5 code path.

The architecture is GLM-4.5's (grouped-query attention with per-head q/k RMSNorm and
partial rotary, the sigmoid group router with a selection-only bias, ungated shared
experts, the first layers dense) under other names: one fused ``query_key_value``
projection ([q heads; k heads; v heads] rows), ``dense`` for the output projection,
``query_layernorm`` / ``key_layernorm``, ``expert_bias``, ``word_embeddings``. The
converter presents such a checkpoint with GLM-4.5's tensor names and ``config.json``;
the .ftw file then holds a ``glm4_moe`` model (``config.converted_from`` says what it
was). Semantics follow inclusionAI's ``modeling_bailing_moe_v2.py``: the router always
renormalises when it picks more than one expert (``norm_topk_prob`` is not read),
always scores with a sigmoid, and the last ``num_nextn_predict_layers`` layers are the
next-token-prediction module (left out, like DeepSeek-V3's).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import torch

from flint.convert.source import Checkpoint

ARCHITECTURE = "BailingMoeV2ForCausalLM"

# Absent keys: BailingMoeV2Config's defaults as published with the checkpoints.
_DEFAULTS: dict[str, Any] = {
    "num_key_value_heads": 4,
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 32768,
    "rope_theta": 600000.0,
    "num_shared_experts": 1,
    "n_group": 8,
    "topk_group": 4,
    "first_k_dense_replace": 1,
    "routed_scaling_factor": 1.0,
    "use_qk_norm": True,
    "use_qkv_bias": False,
    "use_bias": False,
    "num_nextn_predict_layers": 0,
    "partial_rotary_factor": 1.0,
    "tie_word_embeddings": False,
    "hidden_act": "silu",
}

# Ling name (after model.layers.N.) -> GLM-4.5 name, for the tensors renamed one to one
_RENAMES = {
    "attention.dense.weight": "self_attn.o_proj.weight",
    "attention.query_layernorm.weight": "self_attn.q_norm.weight",
    "attention.key_layernorm.weight": "self_attn.k_norm.weight",
    "mlp.gate.expert_bias": "mlp.gate.e_score_correction_bias",
}
_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")


def is_ling(config: dict[str, Any]) -> bool:
    """``bailing_moe_v2``, or ``bailing_moe`` naming the V2 architecture (the Ling 2.0
    releases; ``bailing_moe`` alone is Ling 1, a different model)."""
    kind = config.get("model_type")
    archs = config.get("architectures") or []
    return kind == "bailing_moe_v2" or (kind == "bailing_moe" and ARCHITECTURE in archs)


def _value(ling: dict[str, Any], key: str) -> Any:
    value = ling.get(key)
    return _DEFAULTS[key] if value is None else value


def glm_config(ling: dict[str, Any]) -> dict[str, Any]:
    """The GLM-4.5 ``config.json`` that computes what ``ling`` does."""
    if _value(ling, "use_bias"):
        raise ValueError("Ling with use_bias (a bias on attention.dense) is not supported")
    heads = int(ling["num_attention_heads"])
    head_dim = int(ling.get("head_dim") or int(ling["hidden_size"]) // heads)
    rotary = ling.get("rotary_dim")
    partial = rotary / head_dim if rotary else float(_value(ling, "partial_rotary_factor"))
    top_k = int(ling["num_experts_per_tok"])
    layers = int(ling["num_hidden_layers"]) - int(_value(ling, "num_nextn_predict_layers"))
    kept = ("vocab_size", "hidden_size", "intermediate_size", "moe_intermediate_size")
    out: dict[str, Any] = {k: ling[k] for k in kept if k in ling}
    out.update(
        model_type="glm4_moe",
        architectures=["Glm4MoeForCausalLM"],
        converted_from=str(ling.get("model_type")),
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=int(_value(ling, "num_key_value_heads")),
        head_dim=head_dim,
        hidden_act=_value(ling, "hidden_act"),
        rms_norm_eps=float(_value(ling, "rms_norm_eps")),
        max_position_embeddings=int(_value(ling, "max_position_embeddings")),
        rope_theta=float(_value(ling, "rope_theta")),
        rope_scaling=ling.get("rope_scaling"),
        partial_rotary_factor=partial,
        attention_bias=bool(_value(ling, "use_qkv_bias")),
        use_qk_norm=bool(_value(ling, "use_qk_norm")),
        n_routed_experts=int(ling["num_experts"]),
        num_experts_per_tok=top_k,
        n_shared_experts=int(ling.get("num_shared_experts") or 0),
        n_group=int(_value(ling, "n_group")),
        topk_group=int(_value(ling, "topk_group")),
        routed_scaling_factor=float(_value(ling, "routed_scaling_factor")),
        norm_topk_prob=top_k > 1,  # the Ling router renormalises whenever top-k > 1
        first_k_dense_replace=int(_value(ling, "first_k_dense_replace")),
        tie_word_embeddings=bool(_value(ling, "tie_word_embeddings")),
    )
    for key in ("bos_token_id", "eos_token_id", "pad_token_id", "torch_dtype", "dtype"):
        if key in ling:
            out[key] = ling[key]
    return out


@dataclass
class LingCheckpoint(Checkpoint):
    """A Ling checkpoint seen under GLM-4.5's names: ``parts`` maps each GLM name to
    (Ling name, first row, rows); a whole tensor has rows -1."""

    parts: dict[str, tuple[str, int, int]] = field(default_factory=dict)
    zeros: dict[str, int] = field(default_factory=dict)  # absent expert_bias -> experts

    def names(self) -> list[str]:
        return list(self.parts) + list(self.zeros)

    def shape(self, name: str) -> list[int]:
        if name in self.zeros:
            return [self.zeros[name]]
        src, _, rows = self.parts[name]
        full = super().shape(src)
        return full if rows < 0 else [rows, *full[1:]]

    def dtype_name(self, name: str) -> str:
        return "f32" if name in self.zeros else super().dtype_name(self.parts[name][0])

    def nbytes(self, name: str) -> int:
        if name in self.zeros:
            return 4 * self.zeros[name]
        src, _, rows = self.parts[name]
        whole = super().nbytes(src)
        return whole if rows < 0 else whole // super().shape(src)[0] * rows

    def get(self, name: str) -> torch.Tensor:
        if name in self.zeros:
            return torch.zeros(self.zeros[name], dtype=torch.float32)
        src, first, rows = self.parts[name]
        t = super().get(src)
        return t if rows < 0 else t[first : first + rows]


def adapt(ck: Checkpoint) -> Checkpoint:
    """``ck`` itself, or, for a Ling checkpoint, the same tensors under GLM-4.5's names
    and config (the next-token-prediction layers left out and listed in ``skipped``)."""
    if not is_ling(ck.config):
        return ck
    cfg = glm_config(ck.config)
    out = LingCheckpoint(
        ck.root, cfg, ck.shards, dict(ck.where), dict(ck.scales), list(ck.skipped), ck._open
    )
    heads, kv, dim = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    splits = [
        ("q_proj", 0, heads * dim),
        ("k_proj", heads * dim, kv * dim),
        ("v_proj", (heads + kv) * dim, kv * dim),
    ]
    for name in ck.where:
        m = _LAYER.match(name)
        if name == "model.word_embeddings.weight":
            out.parts["model.embed_tokens.weight"] = (name, 0, -1)
        elif m is None:
            out.parts[name] = (name, 0, -1)
        elif int(m[1]) >= cfg["num_hidden_layers"]:
            out.skipped.append(name)
        elif m[2].startswith("attention.query_key_value."):
            kind = m[2].rsplit(".", 1)[1]  # weight or bias
            for proj, first, rows in splits:
                out.parts[f"model.layers.{m[1]}.self_attn.{proj}.{kind}"] = (name, first, rows)
        elif m[2].startswith("attention.") and m[2] not in _RENAMES:
            raise ValueError(f"unexpected Ling attention tensor {name!r}")
        else:
            out.parts[f"model.layers.{m[1]}.{_RENAMES.get(m[2], m[2])}"] = (name, 0, -1)
    for layer in range(cfg["first_k_dense_replace"], cfg["num_hidden_layers"]):
        bias = f"model.layers.{layer}.mlp.gate.e_score_correction_bias"
        if bias not in out.parts:  # moe_router_enable_expert_bias false: a zero buffer
            out.zeros[bias] = cfg["n_routed_experts"]
    return out
