"""SafetensorsSource: per-expert and fused expert keys, tied heads, metadata files."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from flint.models import SafetensorsSource, WeightSource, load_model, parse_config


def _fuse_experts(src: Path, dst: Path, layers: int, experts: int) -> None:
    """Rewrites a checkpoint with transformers 5's fused [E, 2I, H] / [E, H, I] keys."""
    shutil.copytree(src, dst)
    tensors = load_file(str(src / "model.safetensors"))
    for layer in range(layers):
        p = f"model.layers.{layer}.mlp.experts."
        if p + "0.gate_proj.weight" not in tensors:
            continue
        gate_up, down = [], []
        for e in range(experts):
            gate = tensors.pop(f"{p}{e}.gate_proj.weight")
            up = tensors.pop(f"{p}{e}.up_proj.weight")
            gate_up.append(torch.cat([gate, up]))
            down.append(tensors.pop(f"{p}{e}.down_proj.weight"))
        tensors[p + "gate_up_proj"] = torch.stack(gate_up)
        tensors[p + "down_proj"] = torch.stack(down)
    save_file(tensors, str(dst / "model.safetensors"))


@pytest.mark.parametrize("family", ["qwen3_moe", "qwen2_moe", "olmoe", "deepseek_v3", "glm4_moe"])
def test_fused_expert_keys_give_the_same_experts(
    family: str, tiny_models: dict[str, Any], tmp_path: Path
) -> None:
    """Every family stored with per-expert keys also loads (and so converts) from
    transformers 5's fused keys, to the same experts and logits."""
    path, _ = tiny_models[family]
    per_expert = SafetensorsSource(path)
    config = parse_config(per_expert.config)
    _fuse_experts(path, tmp_path / "fused", config.num_layers, config.num_experts)
    fused = SafetensorsSource(tmp_path / "fused")
    sparse = [i for i, s in enumerate(config.sparse_layers) if s]
    assert not fused.has_tensor(f"model.layers.{sparse[0]}.mlp.experts.0.gate_proj.weight")
    for layer in sparse:
        for e in range(config.num_experts):
            a, b = per_expert.expert(layer, e), fused.expert(layer, e)
            assert torch.equal(a.gate, b.gate) and torch.equal(a.up, b.up)
            assert torch.equal(a.down, b.down)
    ids = torch.tensor([3, 1, 4, 1, 5, 9, 2, 6])
    cpu = torch.device("cpu")
    want = load_model(per_expert, cpu, torch.float32, 16).forward(ids, all_logits=True)
    got = load_model(fused, cpu, torch.float32, 16).forward(ids, all_logits=True)
    assert torch.equal(want, got)


def test_mixtral_expert_names_and_tied_head(tiny_models: dict[str, Any]) -> None:
    path, ref = tiny_models["mixtral"]
    source = SafetensorsSource(path)
    assert not source.has_tensor("lm_head.weight")  # tie_word_embeddings
    w = source.expert(1, 3)
    experts = ref.model.layers[1].mlp.experts
    inter = w.gate.shape[0]
    assert torch.equal(w.gate, experts.gate_up_proj[3, :inter])
    assert torch.equal(w.up, experts.gate_up_proj[3, inter:])
    assert torch.equal(w.down, experts.down_proj[3])


def test_source_metadata(tiny_models: dict[str, Any]) -> None:
    path, _ = tiny_models["qwen2_moe"]
    source = SafetensorsSource(path)
    assert isinstance(source, WeightSource)
    assert source.tokenizer_json is not None and source.chat_template is not None
    assert "<|im_start|>" in source.chat_template
    assert source.special_tokens["eos_token"] == "<|im_end|>"
    assert source.config["model_type"] == "qwen2_moe"
    with pytest.raises(KeyError, match="not found"):
        source.tensor("model.nothing.weight")
    with pytest.raises(KeyError, match="expert 99"):
        source.expert(1, 99)


def test_unsupported_configs_are_refused(tiny_models: dict[str, Any], tmp_path: Path) -> None:
    path, _ = tiny_models["qwen3_moe"]
    config = json.loads((path / "config.json").read_text())
    with pytest.raises(ValueError, match="model_type 'llama' is not supported"):
        parse_config({**config, "model_type": "llama"})
    with pytest.raises(ValueError, match="hidden_act"):
        parse_config({**config, "hidden_act": "gelu"})
    with pytest.raises(ValueError, match="sliding-window"):
        parse_config({**config, "use_sliding_window": True, "sliding_window": 16})
    with pytest.raises(ValueError, match=r"no config\.json"):
        SafetensorsSource(tmp_path)
