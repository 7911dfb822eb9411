"""Where model weights come from: the ``WeightSource`` protocol and a safetensors reader.

Tensor names are Hugging Face's (``model.layers.3.self_attn.q_proj.weight``); every
source answers to them, whatever its own storage looks like. Routed experts are asked
for by (layer, expert) so a source can store them however it likes (per-expert keys,
fused 3-D tensors, an aligned .ftw slab) and so a streaming runtime can fetch one
expert at a time.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch
from safetensors import safe_open

from flint.models import gpt_oss
from flint.models.fp8 import FP8_DTYPES, SCALE_SUFFIX, dequantize_fp8

# I = expert intermediate size, H = hidden size, E = experts per layer


@dataclass(slots=True, frozen=True)
class ExpertWeights:
    """One routed expert's SwiGLU weights in the HF [out, in] convention, float dtype."""

    gate: torch.Tensor  # [I, H]
    up: torch.Tensor  # [I, H]
    down: torch.Tensor  # [H, I]


@runtime_checkable
class WeightSource(Protocol):
    """Everything a model needs to be built: config, tensors, tokenizer, templates.

    ``special_tokens`` maps the tokenizer's named special tokens (``bos_token``,
    ``eos_token``, ``pad_token``, ``unk_token``) to their text; chat templates read them.
    """

    config: dict[str, Any]
    generation_config: dict[str, Any]
    tokenizer_json: str | None
    chat_template: str | None
    special_tokens: dict[str, str]

    def tensor(self, name: str) -> torch.Tensor: ...

    def has_tensor(self, name: str) -> bool: ...

    def expert(self, layer: int, expert: int) -> ExpertWeights: ...


# Per-expert key layouts: (module path, gate, up, down) under model.layers.N.
_EXPERT_LAYOUTS = (
    ("mlp.experts", "gate_proj", "up_proj", "down_proj"),
    ("block_sparse_moe.experts", "w1", "w3", "w2"),
)


class SafetensorsSource:
    """A Hugging Face checkpoint directory (config.json, *.safetensors, tokenizer files).

    Tensors are read lazily from memory-mapped files; nothing is loaded at open.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not (self.path / "config.json").is_file():
            raise ValueError(f"{self.path} is not a checkpoint directory (no config.json)")
        self.config: dict[str, Any] = _read_json(self.path / "config.json") or {}
        self.generation_config: dict[str, Any] = (
            _read_json(self.path / "generation_config.json") or {}
        )
        tok_path = self.path / "tokenizer.json"
        self.tokenizer_json: str | None = (
            tok_path.read_text("utf-8") if tok_path.is_file() else None
        )
        tok_config = _read_json(self.path / "tokenizer_config.json") or {}
        self.chat_template: str | None = _find_chat_template(self.path, tok_config)
        self.special_tokens: dict[str, str] = special_tokens_of(tok_config)
        self._files: dict[str, Path] = _index_tensors(self.path)
        self._handles: dict[Path, Any] = {}

    def has_tensor(self, name: str) -> bool:
        return name in self._files

    def tensor(self, name: str) -> torch.Tensor:
        file = self._files.get(name)
        if file is None:
            raise KeyError(f"tensor {name!r} not found in {self.path}")
        out: torch.Tensor = self._handle(file).get_tensor(name)
        if out.dtype in FP8_DTYPES:  # block-scaled FP8 (DeepSeek-V3): back to bf16
            scale = self._files.get(name + SCALE_SUFFIX)
            if scale is None:
                raise ValueError(f"FP8 tensor {name!r} has no {name + SCALE_SUFFIX!r} scale")
            return dequantize_fp8(out, self._handle(scale).get_tensor(name + SCALE_SUFFIX))
        return out

    def expert(self, layer: int, expert: int) -> ExpertWeights:
        base = f"model.layers.{layer}."
        if self.config.get("model_type") == "gpt_oss":
            return self._gpt_oss_expert(f"{base}mlp.experts.", expert)
        for module, gate, up, down in _EXPERT_LAYOUTS:
            prefix = f"{base}{module}.{expert}."
            if prefix + gate + ".weight" in self._files:
                return ExpertWeights(
                    gate=self.tensor(prefix + gate + ".weight"),
                    up=self.tensor(prefix + up + ".weight"),
                    down=self.tensor(prefix + down + ".weight"),
                )
        fused = f"{base}mlp.experts.gate_up_proj"
        if fused in self._files:
            return self._fused_expert(fused, f"{base}mlp.experts.down_proj", expert)
        raise KeyError(f"no weights for expert {expert} of layer {layer} in {self.path}")

    def _fused_expert(self, gate_up_name: str, down_name: str, expert: int) -> ExpertWeights:
        # transformers 5 in-memory layout: gate_up_proj [E, 2I, H] (gate rows first),
        # down_proj [E, H, I].
        gate_up = self._handle(self._files[gate_up_name]).get_slice(gate_up_name)[expert]
        down = self._handle(self._files[down_name]).get_slice(down_name)[expert]
        gate, up = gate_up.chunk(2, dim=0)
        return ExpertWeights(gate=gate.contiguous(), up=up.contiguous(), down=down)

    def _gpt_oss_expert(self, prefix: str, expert: int) -> ExpertWeights:
        def row(name: str) -> torch.Tensor | None:
            file = self._files.get(prefix + name)
            if file is None:
                return None
            out: torch.Tensor = self._handle(file).get_slice(prefix + name)[expert]
            return out

        gate, up, down = gpt_oss.expert_projections(row)
        return ExpertWeights(gate=gate, up=up, down=down)

    def _handle(self, file: Path) -> Any:
        handle = self._handles.get(file)
        if handle is None:
            handle = safe_open(str(file), framework="pt", device="cpu")
            self._handles[file] = handle
        return handle

    def close(self) -> None:
        """Drops the memory maps (tensors already returned stay valid)."""
        self._handles.clear()


def _read_json(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    data = json.loads(path.read_text("utf-8"))
    if not isinstance(data, dict):
        raise ValueError(f"{path} does not hold a JSON object")
    return data


def _index_tensors(path: Path) -> dict[str, Path]:
    index = _read_json(path / "model.safetensors.index.json")
    if index is not None:
        return {name: path / file for name, file in index["weight_map"].items()}
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ValueError(f"no *.safetensors files in {path}")
    names: dict[str, Path] = {}
    for file in files:
        with safe_open(str(file), framework="pt", device="cpu") as handle:
            names.update(dict.fromkeys(handle.keys(), file))
    return names


def _find_chat_template(path: Path, tok_config: dict[str, Any]) -> str | None:
    jinja = path / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text("utf-8")
    template = tok_config.get("chat_template")
    if isinstance(template, list):  # named templates: [{"name": ..., "template": ...}]
        named = {t["name"]: t["template"] for t in template}
        template = named.get("default")
    return template if isinstance(template, str) else None


def special_tokens_of(tok_config: dict[str, Any]) -> dict[str, str]:
    """The named special tokens of a ``tokenizer_config.json`` dict, as text."""
    out: dict[str, str] = {}
    for key in ("bos_token", "eos_token", "unk_token", "pad_token"):
        value = tok_config.get(key)
        if isinstance(value, dict):  # AddedToken serialised as {"content": ...}
            value = value.get("content")
        if isinstance(value, str):
            out[key] = value
    return out
