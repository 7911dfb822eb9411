"""The MoE block: router, the ``ExpertBackend`` interface, and the resident backend.

The model only ever calls ``backend(layer, x, ids, weights)``; where the expert
weights live (all in memory here, streamed from NVMe later) is the backend's business.
Every backend sums the K expert outputs of a token in fp32, in router-rank order
(``weighted_sum``), so resident and streamed results are bit-identical.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F

from flint.models import gpt_oss
from flint.models.config import ExpertActivation, ModelConfig
from flint.models.loading import Placement
from flint.models.mlp import DenseMLP, activate
from flint.models.router import route_grouped
from flint.models.weights import WeightSource

# T = tokens, H = hidden, E = experts per layer, K = top-k, I = expert intermediate,
# N = rows routed to one expert


class ExpertBackend(Protocol):
    """Computes the routed experts of one MoE layer."""

    def __call__(
        self,
        layer: int,
        x: torch.Tensor,  # [T, H], model dtype
        ids: torch.Tensor,  # [T, K] int64, router-rank order
        weights: torch.Tensor,  # [T, K], the router's top-k weights
    ) -> torch.Tensor:  # [T, H] in x's dtype: sum over k of weights[t, k] * expert_k(x[t])
        ...


def route(
    x: torch.Tensor, router: torch.Tensor, config: ModelConfig, bias: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax in fp32 over all E experts -> top-k -> optional renormalisation; GPT-OSS
    (``router_topk_first``): top-k on the biased logits, softmax over the k in x's dtype.

    Returns (ids [T, K], weights [T, K]); weights are cast back to x's dtype unless the
    family keeps them in fp32 (Mixtral), exactly as transformers does.
    """
    logits = F.linear(x, router, bias)  # [T, E]
    if config.router_topk_first:
        top, ids = torch.topk(logits, config.top_k, dim=-1)  # [T, K]
        return ids, torch.softmax(top, dim=-1, dtype=top.dtype)
    probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
    weights, ids = torch.topk(probs, config.top_k, dim=-1)  # [T, K]
    if config.norm_topk_prob:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    if not config.router_weights_fp32:
        weights = weights.to(logits.dtype)
    return ids, weights


def weighted_sum(outputs: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """outputs [T, K, H] fp32, weights [T, K] -> [T, H] fp32, added in rank order k=0..K-1."""
    w = weights.to(torch.float32)
    acc = outputs[:, 0] * w[:, :1]
    for k in range(1, outputs.shape[1]):
        acc = acc + outputs[:, k] * w[:, k : k + 1]
    return acc


@dataclass(slots=True, frozen=True)
class ExpertBiases:
    """One MoE layer's per-expert biases: gate and up [E, I], down [E, H]."""

    gate: torch.Tensor
    up: torch.Tensor
    down: torch.Tensor


class ExpertMath:
    """What surrounds an expert's three projections: the biases (GPT-OSS; resident, the
    slab holds only the matrices) and the activation. Every backend computes an expert
    as ``output(e, down(hidden(e, gate(x), up(x))))``, so they agree bit for bit; for
    SwiGLU without biases that is exactly ``swiglu``'s ops."""

    def __init__(
        self, act: ExpertActivation, biases: dict[int, ExpertBiases] | None = None
    ) -> None:
        self.act = act
        self.biases = biases or {}  # layer -> biases, on the model's device
        self._moved: dict[tuple[int, str], ExpertBiases] = {}  # copies for other devices

    @property
    def plain(self) -> bool:
        """SwiGLU without biases: what flint's fused CPU kernels compute."""
        return self.act.kind == "swiglu" and not self.biases

    def _on(self, layer: int, device: torch.device) -> ExpertBiases | None:
        b = self.biases.get(layer)
        if b is None or b.gate.device == device:
            return b
        key = (layer, str(device))
        if key not in self._moved:
            self._moved[key] = ExpertBiases(*(t.to(device) for t in (b.gate, b.up, b.down)))
        return self._moved[key]

    def hidden(self, layer: int, expert: int, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        """gate(x), up(x) [N, I] -> the activation [N, I] (biases added first)."""
        b = self._on(layer, gate.device)
        if b is not None:
            gate, up = gate + b.gate[expert], up + b.up[expert]
        return activate(self.act, gate, up)

    def output(self, layer: int, expert: int, y: torch.Tensor) -> torch.Tensor:
        """down(h) [N, H] -> the expert's output [N, H] (down's bias added)."""
        b = self._on(layer, y.device)
        return y if b is None else y + b.down[expert]


def expert_math(config: ModelConfig, source: gpt_oss.Tensors, place: Placement) -> ExpertMath:
    """The ``ExpertMath`` of ``config``'s family, biases loaded from ``source``."""
    biases: dict[int, ExpertBiases] = {}
    if config.expert_bias:
        for layer, sparse in enumerate(config.sparse_layers):
            if sparse:
                gate, up, down = gpt_oss.expert_biases(source, layer)
                biases[layer] = ExpertBiases(place.put(gate), place.put(up), place.put(down))
    return ExpertMath(config.expert_act, biases)


class ResidentExperts:
    """Every routed expert of every MoE layer held in memory (RAM or VRAM)."""

    def __init__(self, config: ModelConfig, source: WeightSource, place: Placement) -> None:
        self.math = expert_math(config, source, place)
        self.gate: dict[int, torch.Tensor] = {}  # layer -> [E, I, H]
        self.up: dict[int, torch.Tensor] = {}  # layer -> [E, I, H]
        self.down: dict[int, torch.Tensor] = {}  # layer -> [E, H, I]
        for layer, sparse in enumerate(config.sparse_layers):
            if sparse:
                self._load_layer(config, source, place, layer)

    def _load_layer(
        self, config: ModelConfig, source: WeightSource, place: Placement, layer: int
    ) -> None:
        experts = [source.expert(layer, e) for e in range(config.num_experts)]
        shape = (config.moe_intermediate_size, config.hidden_size)
        for e, w in enumerate(experts):
            if tuple(w.gate.shape) != shape or tuple(w.up.shape) != shape:
                raise ValueError(f"expert {e} of layer {layer}: gate/up not {list(shape)}")
            if tuple(w.down.shape) != shape[::-1]:
                raise ValueError(f"expert {e} of layer {layer}: down not {list(shape[::-1])}")
        at = place.at(layer)  # beside the layer when the layers are split across GPUs
        self.gate[layer] = at.put(torch.stack([w.gate for w in experts]))
        self.up[layer] = at.put(torch.stack([w.up for w in experts]))
        self.down[layer] = at.put(torch.stack([w.down for w in experts]))

    def __call__(
        self, layer: int, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor
    ) -> torch.Tensor:
        gate, up, down, m = self.gate[layer], self.up[layer], self.down[layer], self.math

        def run(e: int, xs: torch.Tensor) -> torch.Tensor:  # [N, H] -> [N, H]
            h = m.hidden(layer, e, F.linear(xs, gate[e]), F.linear(xs, up[e]))  # [N, I]
            return m.output(layer, e, F.linear(h, down[e]))

        return dispatch(x, ids, weights, gate.shape[0], run)


def dispatch(
    x: torch.Tensor,  # [T, H]
    ids: torch.Tensor,  # [T, K]
    weights: torch.Tensor,  # [T, K]
    n_experts: int,
    run: Callable[[int, torch.Tensor], torch.Tensor],  # (expert, x rows [N, H]) -> [N, H]
) -> torch.Tensor:
    """Runs each selected expert once on the rows that chose it, then sums in fp32 in
    router-rank order (``weighted_sum``). Returns [T, H] in x's dtype."""
    tokens, k = ids.shape
    outputs = torch.empty(tokens * k, x.shape[1], dtype=torch.float32, device=x.device)
    flat = ids.reshape(-1)  # [T*K], entry t*K + k
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=n_experts).tolist()
    offset = 0
    for expert, count in enumerate(counts):
        if count == 0:
            continue
        rows = order[offset : offset + count]  # positions in [T*K]
        offset += count
        outputs[rows] = run(expert, x[rows // k]).to(torch.float32)
    return weighted_sum(outputs.view(tokens, k, -1), weights).to(x.dtype)


class MoEBlock:
    """Router + routed experts (through the backend) + optional shared expert(s): Qwen2's
    sigmoid-gated ``shared_expert`` or DeepSeek's ungated ``shared_experts``."""

    def __init__(
        self,
        config: ModelConfig,
        layer: int,
        source: WeightSource,
        place: Placement,
        backend: ExpertBackend,
    ) -> None:
        p = f"model.layers.{layer}.{config.moe_prefix}."
        self.cfg, self.layer, self.backend = config, layer, backend
        router = p + config.router_name
        self.router = place.load(source, router + ".weight")  # [E, H]
        self.router_bias = (
            place.load(source, router + ".bias") if config.router_bias else None
        )  # [E] (GPT-OSS)
        # The group router runs in fp32 on fp32 weights (transformers keeps them fp32).
        self.router32: torch.Tensor | None = None  # [E, H]
        self.bias32: torch.Tensor | None = None  # [E] correction bias
        if config.group_router is not None:
            fp32 = Placement(place.device, torch.float32)
            self.router32 = fp32.load(source, router + ".weight")
            if config.group_router.scoring == "sigmoid":
                self.bias32 = fp32.load(source, router + ".e_score_correction_bias")
        self.shared: DenseMLP | None = None
        self.shared_gate: torch.Tensor | None = None
        if config.shared_expert_intermediate_size > 0 and config.shared_expert_gated:
            self.shared = DenseMLP(source, p + "shared_expert", place)
            self.shared_gate = place.load(source, p + "shared_expert_gate.weight")  # [1, H]
        elif config.shared_expert_intermediate_size > 0:
            self.shared = DenseMLP(source, p + "shared_experts", place)
        # Called with a decode step's shared-expert output before the routed experts
        # run, when set (router lookahead from the MoE input plus the shared output).
        self.observe_shared: Callable[[int, torch.Tensor], None] | None = None

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The family's router: (ids [T, K], weights [T, K]) for x [T, H]."""
        cfg = self.cfg
        if cfg.group_router is None:
            return route(x, self.router, cfg, self.router_bias)
        assert self.router32 is not None
        return route_grouped(
            x, self.router32, self.bias32, cfg.group_router, cfg.top_k, cfg.norm_topk_prob
        )

    def __call__(self, x: torch.Tensor, chunk: int | None = None) -> torch.Tensor:
        """x [T, H] -> [T, H]. The routed experts see all T tokens in one backend call
        (each selected expert once); the shared expert runs in ``chunk``-row pieces."""
        shared = None
        if self.shared is not None and self.observe_shared is not None and x.shape[0] == 1:
            shared = self._shared(x)  # first, for the lookahead; added after as always
            self.observe_shared(self.layer, shared)
        ids, weights = self.route(x)  # [T, K] each
        out = self.backend(self.layer, x, ids, weights)  # [T, H]
        if self.shared is not None:
            if shared is None:
                rows = chunk or x.shape[0]
                parts = [self._shared(x[s : s + rows]) for s in range(0, x.shape[0], rows)]
                shared = parts[0] if len(parts) == 1 else torch.cat(parts)
            out = out + shared
        return out

    def _shared(self, x: torch.Tensor) -> torch.Tensor:
        assert self.shared is not None
        if self.shared_gate is None:
            return self.shared(x)
        return torch.sigmoid(F.linear(x, self.shared_gate)) * self.shared(x)
