"""SwiGLU feed-forward: dense layers, shared experts, and one routed expert."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from flint.models.config import ExpertActivation
from flint.models.loading import Placement
from flint.models.weights import WeightSource

# T = tokens, H = hidden, I = intermediate


def swiglu(
    x: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor
) -> torch.Tensor:
    """``down(silu(gate(x)) * up(x))``: x [T, H], gate/up [I, H], down [H, I] -> [T, H]."""
    return F.linear(F.silu(F.linear(x, gate)) * F.linear(x, up), down)


def activate(act: ExpertActivation, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """The expert's hidden activation [N, I] from its gate and up outputs [N, I], with the
    ops (and their order) of the family's transformers code."""
    if act.kind == "swiglu":
        return F.silu(gate) * up
    # GptOssExperts._apply_gate
    gate = gate.clamp(min=None, max=act.limit)
    up = up.clamp(min=-act.limit, max=act.limit)
    return (up + 1) * (gate * torch.sigmoid(gate * act.alpha))


class DenseMLP:
    """A SwiGLU MLP stored as ``{prefix}.gate_proj/up_proj/down_proj.weight``."""

    def __init__(self, source: WeightSource, prefix: str, place: Placement) -> None:
        self.gate = place.load(source, prefix + ".gate_proj.weight")  # [I, H]
        self.up = place.load(source, prefix + ".up_proj.weight")  # [I, H]
        self.down = place.load(source, prefix + ".down_proj.weight")  # [H, I]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return swiglu(x, self.gate, self.up, self.down)
