"""Plain-torch implementations of MoE model families, numerically transformers'.

``load_model`` builds one from any ``WeightSource``; the family is the config's
``model_type``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from flint.models import (
    cpu_decode,
    deepseek_v2,
    deepseek_v3,
    glm4_moe,
    gpt_oss,
    mixtral,
    olmoe,
    qwen2_moe,
    qwen3_moe,
    qwen3_next,
)
from flint.models.config import ModelConfig
from flint.models.ftw_source import FtwSource
from flint.models.loading import Placement
from flint.models.moe import ExpertBackend, ResidentExperts
from flint.models.quant_experts import QuantizedResidentExperts, resident_experts
from flint.models.transformer import MoEModel
from flint.models.weights import ExpertWeights, SafetensorsSource, WeightSource

FAMILIES: dict[str, Callable[[dict[str, Any]], ModelConfig]] = {
    "qwen3_moe": qwen3_moe.parse_config,
    "qwen2_moe": qwen2_moe.parse_config,
    "mixtral": mixtral.parse_config,
    "olmoe": olmoe.parse_config,
    "deepseek_v3": deepseek_v3.parse_config,
    # Kimi K2 (and K2-Thinking): DeepSeek-V3's architecture (``DeepseekV3ForCausalLM``)
    # under its own model_type; flint runs it as DeepSeek-V3.
    "kimi_k2": deepseek_v3.parse_config,
    "glm4_moe": glm4_moe.parse_config,
    "deepseek_v2": deepseek_v2.parse_config,
    "gpt_oss": gpt_oss.parse_config,
    "qwen3_next": qwen3_next.parse_config,
}


def parse_config(hf_config: dict[str, Any]) -> ModelConfig:
    """The ``ModelConfig`` of an HF config dict; ValueError for unsupported families."""
    model_type = hf_config.get("model_type")
    parse = FAMILIES.get(str(model_type))
    if parse is None:
        supported = ", ".join(sorted(FAMILIES))
        raise ValueError(f"model_type {model_type!r} is not supported (supported: {supported})")
    return parse(hf_config)


def load_model(
    source: WeightSource,
    device: torch.device,
    dtype: torch.dtype,
    context_length: int,
    backend: ExpertBackend | None = None,
    expert_kernels: str = "auto",
    layer_devices: tuple[torch.device, ...] = (),
    cpu_decode_step: bool = True,
) -> MoEModel:
    """Builds the model with every dense weight on ``device`` (or, with
    ``layer_devices``, each decoder layer's on its own device: several GPUs, see
    ``flint.models.split``); experts come from ``backend`` (default: all resident beside
    their layer, computed with ``expert_kernels``' kernels: see
    ``quant_experts.resident_experts``; "auto" is the fused kernels on the CPU and
    torch's on CUDA). ``cpu_decode_step``: decode one token at a time through the Rust
    decode step where it applies (``flint.models.cpu_decode``: the CPU, fused expert
    kernels, a standard-shape family), unless ``FLINT_CPU_DECODE_STEP=0``."""
    config = parse_config(source.config)
    place = Placement(device=device, dtype=dtype, layers=layer_devices)
    experts = (
        backend if backend is not None else resident_experts(config, source, place, expert_kernels)
    )
    model = MoEModel(config, source, place, experts, context_length)
    if cpu_decode_step and cpu_decode.enabled():
        model.decoder = cpu_decode.cpu_decoder(model)
    return model


__all__ = [
    "FAMILIES",
    "ExpertBackend",
    "ExpertWeights",
    "FtwSource",
    "MoEModel",
    "ModelConfig",
    "QuantizedResidentExperts",
    "ResidentExperts",
    "SafetensorsSource",
    "WeightSource",
    "load_model",
    "parse_config",
]
