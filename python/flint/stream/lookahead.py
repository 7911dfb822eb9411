"""Router lookahead: the routers of layers L+1..L+d applied to layer L's output (or its
MoE input, the residual after attention), each through its own post-attention norm,
predict which experts those layers will select; the I/O engine reads them early. All
targets of a layer are one fused op: one RMS normalisation, one matmul with their
stacked routers (norm weights folded in, router biases added: GPT-OSS), one top-k,
one copy to the CPU. Top-k of the logits is top-k of their softmax, so families that
take top-k before (GPT-OSS) or after the softmax predict alike; a group router's
targets (sigmoid: DeepSeek-V3, GLM-4.5; softmax: DeepSeek-V2) are ranked as that router
ranks them.

Measured on tiny-code-moe (README of the model): recall 74.5 / 63.1 / 54.7 % at
distance 1 / 2 / 3 from the MoE input."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from flint.models.config import GroupRouterConfig
from flint.models.router import selection_scores

# H = hidden, E = experts, K = top-k


@dataclass(slots=True)
class Recall:
    """Prediction quality per distance: hits / selected and hits / predicted."""

    hits: list[int] = field(default_factory=lambda: [0] * 4)
    selected: list[int] = field(default_factory=lambda: [0] * 4)
    predicted: list[int] = field(default_factory=lambda: [0] * 4)

    def record(self, distance: int, predicted: set[int], selected: set[int]) -> None:
        self.hits[distance] += len(predicted & selected)
        self.selected[distance] += len(selected)
        self.predicted[distance] += len(predicted)

    def recall(self, distance: int) -> float | None:
        n = self.selected[distance]
        return self.hits[distance] / n if n else None

    def precision(self, distance: int) -> float | None:
        n = self.predicted[distance]
        return self.hits[distance] / n if n else None


class Lookahead:
    """Predicts the experts of the next ``depth`` streamed layers from a residual."""

    def __init__(self, depth: int, top_k: int, eps: float, width: float = 1.0) -> None:
        if not 0 <= depth <= 3:
            raise ValueError(f"--lookahead must be 0..3, got {depth}")
        if not 1.0 <= width <= 4.0:
            raise ValueError(f"lookahead width must be 1..4 (x top-k), got {width}")
        self.depth, self.top_k, self.eps = depth, top_k, eps
        self.width = max(top_k, round(top_k * width))  # experts predicted per layer
        self.norms: dict[int, torch.Tensor] = {}  # layer -> post-attention norm [H]
        self.routers: dict[int, torch.Tensor] = {}  # layer -> router [E, H]
        self.biases: dict[int, torch.Tensor] = {}  # layer -> router bias [E] (GPT-OSS)
        # layer -> (correction bias [E] fp32 or None, its group config): group routers
        # rank experts by their choice score within the best groups, as the router does
        # (sigmoid(logit) + bias; DeepSeek-V2: softmax)
        self.grouped: dict[int, tuple[torch.Tensor | None, GroupRouterConfig]] = {}
        self.pending: dict[tuple[int, int], set[int]] = {}  # (layer, distance) -> experts
        self.quality = Recall()
        # layer -> (targets [(layer, distance)], the targets' routers with their norm
        # weights folded in, stacked [n*E, H], and their biases [n*E] or None): one
        # matmul per prediction
        self._fused: dict[int, tuple[list[tuple[int, int]], torch.Tensor, torch.Tensor | None]]
        self._fused = {}
        # (layer, device) -> a group router's correction bias copied to another GPU
        self._moved: dict[tuple[int, torch.device], torch.Tensor] = {}

    def add_layer(
        self,
        layer: int,
        norm: torch.Tensor,
        router: torch.Tensor,
        grouped: tuple[torch.Tensor | None, GroupRouterConfig] | None = None,
        *,
        bias: torch.Tensor | None = None,
    ) -> None:
        """``grouped``: a group router's correction bias (None for DeepSeek-V2's softmax
        router) and config; ``bias``: the router's own bias [E], part of its logits
        (GPT-OSS)."""
        self.norms[layer], self.routers[layer] = norm, router
        if bias is not None:
            self.biases[layer] = bias
        if grouped is not None:
            self.grouped[layer] = grouped
        self._fused.clear()

    def _stack(
        self, layer: int, device: torch.device
    ) -> tuple[list[tuple[int, int]], torch.Tensor, torch.Tensor | None]:
        """Layer ``layer``'s targets, their routers x norm weights and biases, stacked on
        ``device`` (where layer ``layer``'s residual is: with the layers split across
        GPUs, a target's router may live on the next one)."""
        if layer not in self._fused:
            targets = [
                (layer + d, d) for d in range(1, self.depth + 1) if layer + d in self.routers
            ]
            rows = [(self.routers[t] * self.norms[t]).to(device) for t, _ in targets]  # [E, H]
            stacked = torch.cat(rows) if rows else torch.empty(0)
            bias = None  # router biases (GPT-OSS); zeros for a target without one
            if any(t in self.biases for t, _ in targets):
                bias = torch.cat(
                    [
                        self.biases.get(t, self.routers[t].new_zeros(len(self.routers[t]))).to(
                            device
                        )
                        for t, _ in targets
                    ]
                )
            self._fused[layer] = (targets, stacked, bias)
        return self._fused[layer]

    def logits(self, layer: int, h: torch.Tensor) -> tuple[list[tuple[int, int]], torch.Tensor]:
        """The targets after ``layer`` and their router logits [n, E] (fp32) for h
        [1, H], in one fused op: RMS-normalise once, then one matmul with the targets'
        routers (each scaled by its layer's norm weight, its router bias added where it
        has one; a prediction, so rounding differs from the router's own only in the
        last bits)."""
        targets, stacked, bias = self._stack(layer, h.device)
        if not targets:
            return targets, torch.empty(0)
        h32 = h.to(torch.float32)
        xn = (h32 * torch.rsqrt(h32.pow(2).mean(-1, keepdim=True) + self.eps)).to(h.dtype)
        return targets, F.linear(xn, stacked, bias).view(len(targets), -1).float()

    def predict(self, layer: int, h: torch.Tensor) -> list[tuple[int, int, int, int]]:
        """(layer, expert, distance, rank) for the layers after ``layer``; h [1, H]."""
        targets, logits = self.logits(layer, h)
        if not targets:
            return []
        n = min(self.width, logits.shape[-1])
        rows = []
        for (target, _), row in zip(targets, logits, strict=True):
            g = self.grouped.get(target)
            if g is not None:  # rank as the group router will
                bias, cfg = g
                if bias is not None and bias.device != row.device:  # layers split over GPUs
                    key = (target, row.device)
                    if key not in self._moved:
                        self._moved[key] = bias.to(row.device)
                    bias = self._moved[key]
                row = selection_scores(row[None], bias, cfg)[1][0]
            rows.append(row)
        ranked = torch.stack(rows) if self.grouped else logits
        top = torch.topk(ranked, n, dim=-1).indices.tolist()  # one copy to the CPU
        out: list[tuple[int, int, int, int]] = []
        for (target, d), experts in zip(targets, top, strict=True):
            self.pending[(target, d)] = set(experts)
            out.extend((target, e, d, rank) for rank, e in enumerate(experts))
        return out

    def score(self, layer: int, selected: set[int]) -> None:
        """Compares this layer's predictions (made at earlier layers) with its selection."""
        for d in range(1, self.depth + 1):
            predicted = self.pending.pop((layer, d), None)
            if predicted is not None:
                self.quality.record(d, predicted, selected)
