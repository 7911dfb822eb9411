"""Recognising routed-expert tensors in a checkpoint, per-expert or fused, and the
architectures flint can convert."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import torch

from flint.convert.source import Checkpoint
from flint.models import gpt_oss

SUPPORTED_ARCHS = (
    "qwen3_moe",
    "qwen2_moe",
    "mixtral",
    "olmoe",
    "deepseek_v3",
    "kimi_k2",  # DeepSeek-V3's architecture (flint.models.FAMILIES)
    "glm4_moe",
    "deepseek_v2",
    "gpt_oss",
    "qwen3_next",
)

# model.layers.L.(mlp|block_sparse_moe).experts.E.(gate_proj|up_proj|down_proj|w1|w3|w2).weight
_PER_EXPERT = re.compile(
    r"^model\.layers\.(\d+)\.(?:mlp|block_sparse_moe)\.experts\.(\d+)\."
    r"(gate_proj|up_proj|down_proj|w1|w3|w2)\.weight$"
)
# model.layers.L.mlp.experts.(gate_up_proj [E,2I,H] | gate_proj/up_proj [E,I,H] | down_proj [E,H,I])
_FUSED = re.compile(
    r"^model\.layers\.(\d+)\.(?:mlp|block_sparse_moe)\.experts\.(gate_up_proj|gate_proj|up_proj|down_proj)(?:\.weight)?$"
)
# GPT-OSS's MXFP4 experts: model.layers.L.mlp.experts.(gate_up_proj|down_proj)_(blocks|scales)
_MXFP4 = re.compile(
    r"^model\.layers\.(\d+)\.mlp\.experts\.((?:gate_up|down)_proj_(?:blocks|scales))$"
)
_GPT_OSS_SETS = (
    {"gate_up_proj", "down_proj"},
    {"gate_up_proj_blocks", "gate_up_proj_scales", "down_proj_blocks", "down_proj_scales"},
)
_ROLE = {"gate_proj": 0, "w1": 0, "up_proj": 1, "w3": 1, "down_proj": 2, "w2": 2}


def config_int(config: dict[str, Any], *keys: str) -> int:
    """The first of ``keys`` present in the config (configs name the same thing differently)."""
    for k in keys:
        if config.get(k) is not None:
            return int(config[k])
    raise ValueError(f"config.json has none of {', '.join(keys)}")


def check_arch(config: dict[str, Any]) -> str:
    arch = str(config.get("model_type", ""))
    if arch not in SUPPORTED_ARCHS:
        raise ValueError(
            f"unsupported architecture {arch or '(no model_type)'!r}; "
            f"flint converts: {', '.join(SUPPORTED_ARCHS)}"
        )
    return arch


@dataclass
class ExpertMap:
    """Where each (layer, expert)'s gate, up and down come from."""

    n_layers: int
    n_experts: int
    fused: bool
    per_expert: dict[tuple[int, int], list[str]]  # (L, E) -> [gate, up, down] names
    fused_names: dict[int, dict[str, str]]  # L -> {"gate_up_proj"|...: name}
    gpt_oss: bool = False  # fused keys in GPT-OSS's layout (flint.models.gpt_oss)

    def expert_names(self) -> set[str]:
        names = {n for v in self.per_expert.values() for n in v}
        return names | {n for v in self.fused_names.values() for n in v.values()}

    def layers(self) -> list[int]:
        return sorted({k[0] for k in self.per_expert} | set(self.fused_names))

    def source_bytes(self, ck: Checkpoint, layer: int, expert: int) -> int:
        """Bytes of the source tensors one expert is read from (the progress unit)."""
        if not self.fused:
            return sum(ck.nbytes(n) for n in self.per_expert[(layer, expert)])
        return sum(ck.nbytes(n) for n in self.fused_names[layer].values()) // self.n_experts

    def load(self, ck: Checkpoint, layer: int, expert: int) -> list[torch.Tensor]:
        """Gate [I,H], up [I,H], down [H,I] of one expert."""
        if not self.fused:
            return [ck.get(n) for n in self.per_expert[(layer, expert)]]
        names = self.fused_names[layer]
        if self.gpt_oss:
            row = lambda n: ck.get_row(names[n], expert) if n in names else None  # noqa: E731
            return list(gpt_oss.expert_projections(row))
        if "gate_up_proj" in names:
            gu = ck.get_row(names["gate_up_proj"], expert)
            half = gu.shape[0] // 2
            gate, up = gu[:half], gu[half:]
        else:
            gate = ck.get_row(names["gate_proj"], expert)
            up = ck.get_row(names["up_proj"], expert)
        return [gate, up, ck.get_row(names["down_proj"], expert)]


def map_experts(ck: Checkpoint) -> ExpertMap:
    cfg = ck.config
    n_layers = config_int(cfg, "num_hidden_layers")
    n_experts = config_int(cfg, "num_experts", "num_local_experts", "n_routed_experts")
    per: dict[tuple[int, int], list[str]] = {}
    fused: dict[int, dict[str, str]] = {}
    for name in ck.names():
        if m := _PER_EXPERT.match(name):
            layer, e, role = int(m[1]), int(m[2]), _ROLE[m[3]]
            per.setdefault((layer, e), ["", "", ""])[role] = name
        elif (m := _FUSED.match(name)) or (m := _MXFP4.match(name)):
            fused.setdefault(int(m[1]), {})[m[2]] = name
    if per and fused:
        raise ValueError("checkpoint mixes per-expert and fused expert tensors")
    for (layer, e), names in per.items():
        if "" in names or e >= n_experts or layer >= n_layers:
            raise ValueError(f"expert {e} of layer {layer}: incomplete or outside the config")
    gpt = cfg.get("model_type") == "gpt_oss"
    for layer, parts in fused.items():
        if gpt and not any(want <= set(parts) for want in _GPT_OSS_SETS):
            raise ValueError(f"layer {layer}: incomplete GPT-OSS expert tensors {sorted(parts)}")
        if not gpt and (
            "down_proj" not in parts
            or not ({"gate_up_proj"} <= set(parts) or {"gate_proj", "up_proj"} <= set(parts))
        ):
            raise ValueError(f"layer {layer}: incomplete fused expert tensors {sorted(parts)}")
    layers = sorted({k[0] for k in per} | set(fused))
    if not fused:
        for layer in layers:
            have = sum(1 for k in per if k[0] == layer)
            if have != n_experts:
                raise ValueError(f"layer {layer} has {have} experts, config says {n_experts}")
    if not layers:
        raise ValueError("no routed-expert tensors found in the checkpoint")
    return ExpertMap(n_layers, n_experts, bool(fused), per, fused, gpt)
