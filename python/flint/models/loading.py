"""Helpers that move tensors from a WeightSource onto the model's device and dtype."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from flint.models.weights import WeightSource


@dataclass(slots=True, frozen=True)
class Placement:
    """Where and in what dtype the model's weights live."""

    device: torch.device
    dtype: torch.dtype

    def load(self, source: WeightSource, name: str) -> torch.Tensor:
        return self.put(source.tensor(name))

    def load_optional(self, source: WeightSource, name: str) -> torch.Tensor | None:
        return self.load(source, name) if source.has_tensor(name) else None

    def put(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.to(device=self.device, dtype=self.dtype).contiguous()
