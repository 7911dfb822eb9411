"""One decode step of a streamed model on one GPU: the dense parts through the graph
step's ops, captured as CUDA graphs between the hops to the streaming backend.

A streamed model's routed experts are chosen on the GPU but placed, read and computed
by the host (``StreamedExperts``: RAM and VRAM caches, the CPU beside the GPU), so the
step cannot be one graph. It is cut into *segments* at the MoE layers:

- segment 0: the token's embedding, the layers before the first MoE layer, and that
  layer's dense part: input norm, attention (``GraphDecoder``'s fused or torch ops,
  its KV cache writes at ``position``), residual add -> ``h``, post-attention norm ->
  ``normed``, router -> ``ids``, ``weights`` (and a shared expert's output);
- segment k: from the input of the layer after MoE layer k - 1 (``x``) to the dense
  part of MoE layer k, dense layers in between computed whole;
- the last segment: the layers after the last MoE layer, the final norm, the LM head.

Between two segments the host runs what the eager layer runs around its experts, in
the same order: the hooks (``observe``, ``observe_shared``, ``observe_output``: the
lookahead's predictions), the backend call ``backend(layer, normed, ids, weights)``,
the shared expert's add and ``x = h + out``, written into the next segment's input
buffer (``torch.add(..., out=)``: never rebound). A dense layer's hooks run after its
segment, before the next MoE layer's, from its own ``h`` and output buffers.

Everything a segment reads or writes across the hop sits at a fixed address: the token
and position, the input ``x`` of each layer, ``h``, ``normed``, ``ids``, ``weights``
and the shared output of each layer, the logits. With ``capture=True`` each segment of
each span (``SPAN_STEP``) is a CUDA graph, captured the first time a step needs it,
all in one memory pool; ``capture=False`` launches the same ops one by one (identical
output, bit for bit).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from flint.graphs.decode import GraphDecoder, StepRows
from flint.graphs.moe_kernel import on_device
from flint.models.moe import MoEBlock
from flint.models.transformer import MoEModel

# H = hidden, K = top-k


@dataclass(slots=True)
class Segment:
    """Layers ``dense`` computed whole, then ``moe``'s dense part (None: the last
    segment, which ends with the LM head)."""

    dense: list[int] = field(default_factory=list)
    moe: int | None = None


def segments(model: MoEModel) -> list[Segment]:
    """The step's segments: one per MoE layer, and the last one."""
    out, current = [], Segment()
    for layer in model.layers:
        if isinstance(layer.mlp, MoEBlock):
            current.moe = layer.index
            out.append(current)
            current = Segment()
        else:
            current.dense.append(layer.index)
    out.append(current)
    return out


class StreamedDecoder(GraphDecoder):
    """Decodes one token at a time for a streamed ``model`` (one GPU): see the module."""

    device_greedy = False  # the host reads each MoE layer's ids between segments

    def __init__(self, model: MoEModel, capture: bool = True, source: object = None) -> None:
        super().__init__(model, {}, capture, source)
        cfg, device, dtype = model.config, self.device, model.place.dtype
        self.segments = segments(model)

        def row() -> torch.Tensor:
            return torch.zeros(1, cfg.hidden_size, dtype=dtype, device=device)

        layers = range(cfg.num_layers)
        self.x = [row() for _ in range(cfg.num_layers + 1)]  # layer l's input; [L]: output
        self.h = [row() for _ in layers]  # residual after attention
        self.normed: dict[int, torch.Tensor] = {}  # MoE layer -> its experts' input
        self.ids: dict[int, torch.Tensor] = {}  # [1, K] int64
        self.weights: dict[int, torch.Tensor] = {}  # [1, K], the router's dtype
        self.shared: dict[int, torch.Tensor] = {}  # the shared expert's output
        weight_dtype: torch.dtype | None = None  # every MoE layer routes alike
        for seg in self.segments:
            if seg.moe is None:
                continue
            mlp = model.layers[seg.moe].mlp
            assert isinstance(mlp, MoEBlock)
            weight_dtype = weight_dtype or self._weight_dtype(mlp)
            self.normed[seg.moe] = row()
            self.ids[seg.moe] = torch.zeros(1, cfg.top_k, dtype=torch.int64, device=device)
            self.weights[seg.moe] = torch.zeros(1, cfg.top_k, dtype=weight_dtype, device=device)
            if mlp.shared is not None:
                self.shared[seg.moe] = row()
        self.segment_graphs: dict[tuple[int, int], Any] = {}  # (span, segment) -> graph

    def _weight_dtype(self, mlp: MoEBlock) -> torch.dtype:
        """The dtype of the router's weights, from the family's torch router on a zero
        row (the fused router returns the same dtype; no kernel compiles before the
        warm-up, where a failure falls back)."""
        cfg, place = self.model.config, self.model.place
        zero = torch.zeros(1, cfg.hidden_size, dtype=place.dtype, device=self.device)
        with torch.inference_mode():
            return mlp.route(zero)[1].dtype

    @property
    def name(self) -> str:
        return "streamed CUDA graphs" if self.capture else "streamed graph step, eager launches"

    def warm_up(self) -> None:
        """Compiles the kernels and captures the first span's segments now (at load).
        The hops skip the backend and the hooks (the routed experts count as zero): no
        read, prediction or token is counted; the keys and values written at position
        0 are overwritten by any prompt."""
        with torch.inference_mode():
            self._run(torch.zeros(1, dtype=torch.int64, device=self.device), 0, experts=False)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def __call__(self, token: torch.Tensor, position: int) -> torch.Tensor:
        """Logits [1, V] (fp32) of ``token`` [1] at ``position``; writes its keys and
        values into the model's cache (the caller advances ``cache.length``)."""
        with torch.inference_mode():
            return self._run(token, position, experts=True)

    def close(self) -> None:
        self.segment_graphs.clear()
        super().close()

    def _run(self, token: torch.Tensor, position: int, experts: bool) -> torch.Tensor:
        with on_device(self.device):  # Triton and graph replay use the current device
            self.token.copy_(token, non_blocking=True)
            self.position.fill_(position)
            span = self.span(position)
            for k, seg in enumerate(self.segments):
                self._launch(span, k)
                self._hop(seg, experts)
            if self.capture:
                self.replays += 1
            return self.logits.clone()

    def _launch(self, span: int, k: int) -> None:
        if not self.capture:
            self._segment(span, k)
            return
        graph = self.segment_graphs.get((span, k))
        if graph is None:
            graph = self._capture(lambda: self._segment(span, k))
            self.segment_graphs[(span, k)] = graph
        graph.replay()

    @torch.inference_mode()
    def _segment(self, span: int, k: int) -> None:
        """Segment ``k``'s ops, from and into the fixed buffers."""
        model, seg = self.model, self.segments[k]
        rows = StepRows(self, span)
        first = seg.dense[0] if seg.dense else seg.moe
        if first is None:  # no layer after the last MoE layer
            self._head(self.x[-1])
            return
        x = model.embed.index_select(0, self.token) if first == 0 else self.x[first]
        for index in seg.dense:
            layer = model.layers[index]
            h = self._attended(layer, x, rows, self.h[index])
            normed = self._norm(layer.norm, h, layer.post_norm, layer.eps)
            x = torch.add(h, layer.mlp(normed), out=self.x[index + 1])
        if seg.moe is None:
            self._head(x)
            return
        index = seg.moe
        layer = model.layers[index]
        mlp = layer.mlp
        assert isinstance(mlp, MoEBlock)
        h = self._attended(layer, x, rows, self.h[index])
        normed, ids, weights = self._moe_input(layer, mlp, h, None)
        self.normed[index].copy_(normed)
        self.ids[index].copy_(ids)
        self.weights[index].copy_(weights)
        if mlp.shared is not None:
            self.shared[index].copy_(mlp._shared(normed))

    def _hop(self, seg: Segment, experts: bool) -> None:
        """After a segment, on the host: the dense layers' hooks, then the MoE layer's
        hooks and routed experts as ``DecoderLayer`` and ``MoEBlock`` call them, the
        layer's output written into the next segment's input."""
        if not experts:  # warm-up: no backend, no hooks
            if seg.moe is not None:
                self.x[seg.moe + 1].copy_(self.h[seg.moe])
            return
        layers = self.model.layers
        for index in seg.dense:
            layer = layers[index]
            if layer.observe is not None:
                layer.observe(index, self.h[index])
            if layer.observe_output is not None:
                layer.observe_output(index, self.x[index + 1])
        if seg.moe is None:
            return
        index = seg.moe
        layer = layers[index]
        mlp = layer.mlp
        assert isinstance(mlp, MoEBlock)
        h, normed = self.h[index], self.normed[index]
        if layer.observe is not None:
            layer.observe(index, h)
        shared = self.shared.get(index)
        if shared is not None and mlp.observe_shared is not None:
            mlp.observe_shared(index, shared)
        out = mlp.backend(index, normed, self.ids[index], self.weights[index])
        if shared is not None:
            out = out + shared
        torch.add(h, out, out=self.x[index + 1])
        if layer.observe_output is not None:
            layer.observe_output(index, self.x[index + 1])
