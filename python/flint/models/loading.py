"""Helpers that move tensors from a WeightSource onto the model's device and dtype."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from flint.models.weights import WeightSource

ALIGN = 64  # bytes; torch's CPU allocator aligns at least this much


def indexed(device: torch.device) -> torch.device:
    """``device`` with its index: "cuda" is the current GPU ("cuda:0" unless changed),
    so one GPU has one name (torch.device("cuda") != torch.device("cuda", 0))."""
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


@dataclass(slots=True, frozen=True)
class Placement:
    """Where and in what dtype the model's weights live. ``layers``: with the layers
    split across several GPUs, each decoder layer's device (``device`` is the first
    one's, where the embedding lives; empty: every layer on ``device``)."""

    device: torch.device
    dtype: torch.dtype
    layers: tuple[torch.device, ...] = ()

    def at(self, layer: int) -> Placement:
        """Where decoder layer ``layer``'s weights live."""
        if not self.layers or self.layers[layer] == self.device:
            return Placement(self.device, self.dtype)
        return Placement(self.layers[layer], self.dtype)

    @property
    def devices(self) -> tuple[torch.device, ...]:
        """The distinct devices in layer order (one unless the layers are split)."""
        return tuple(dict.fromkeys(self.layers)) if self.layers else (self.device,)

    def load(self, source: WeightSource, name: str) -> torch.Tensor:
        return self.put(source.tensor(name))

    def load_optional(self, source: WeightSource, name: str) -> torch.Tensor | None:
        return self.load(source, name) if source.has_tensor(name) else None

    def put(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` on the device in the dtype, contiguous and 64-byte aligned: CPU BLAS
        rounds a matrix-vector product differently for differently aligned weights
        (seen with a GPT-OSS checkpoint, whose sinks and biases leave later tensors at
        odd offsets in the safetensors file: decode logits differed from the .ftw's in
        the last bit), so every source must give the model aligned copies."""
        out = tensor.to(device=self.device, dtype=self.dtype).contiguous()
        return out.clone() if out.data_ptr() % ALIGN else out
