"""``StreamedExperts``: the MoE expert backend that streams routed experts through the
RAM expert cache (``flint._core.IoEngine``) instead of holding them all.

Per MoE layer: the router's selection goes to the engine (``begin_layer``: wrong
predictions cancelled, selected prefetches promoted); the selected experts are placed
in waves of at most the layer's slots (hits, reads in flight, demand reads); each
expert is computed from its slot (a zero-copy view; copied to the GPU on CUDA) on the
rows that chose it, exactly as the resident backend computes it, gate and up as soon
as their bytes are in, down once the slab is verified; outputs are summed
in fp32 in router-rank order (``weighted_sum``). So with the same device and batch
shapes the result is bit-identical to ``ResidentExperts``.

This is the reference path (Python drives it layer by layer); the speed path drives
the same engine protocol from Rust (see ARCHITECTURE.md).
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from flint import _core
from flint.format.reader import ExpertLayout
from flint.models.config import ModelConfig
from flint.models.moe import weighted_sum
from flint.models.quant_experts import QUANT_SCHEMES
from flint.models.quant_linear import ProjectionKernel, select_kernel
from flint.stream.lookahead import Lookahead
from flint.stream.plan import StreamPlan
from flint.stream.readahead import ReadAhead
from flint.stream.slab import slot_bytes
from flint.stream.waves import plan_waves

# T = tokens, H = hidden, K = top-k, E = experts per layer, N = rows routed to one expert


IDLE_FILL_AFTER_S = 0.5  # no forward call for this long: fill empty slots


@dataclass(slots=True)
class Counters:
    tokens: int = 0
    stall_s: float = 0.0
    # Prompt layers (forwards of more than one token): per streamed layer call, the
    # distinct experts selected and the waves they were placed in.
    prompt_layers: int = 0
    prompt_distinct: int = 0
    prompt_waves: int = 0


class StreamedExperts:
    """Routed experts streamed from a .ftw file (see the module docs)."""

    def __init__(
        self,
        config: ModelConfig,
        layout: ExpertLayout,
        engine: _core.IoEngine,
        plan: StreamPlan,
        device: torch.device,
        dtype: torch.dtype,
        lookahead: int = 2,
        lookahead_width: float = 1.0,
        expert_kernels: str = "auto",
        idle_fill: bool = True,
    ) -> None:
        self.cfg, self.layout, self.engine, self.plan = config, layout, engine, plan
        self.device, self.dtype = device, dtype
        self.capacity = plan.slots_per_layer
        self.first_layer = plan.streamed_layers[0]
        self.lookahead = Lookahead(lookahead, config.top_k, config.rms_norm_eps, lookahead_width)
        self.read_ahead = ReadAhead(
            plan.streamed_layers,
            self.capacity,
            config.num_experts,
            config.top_k,
            depth=2 if lookahead else 0,  # no prediction at all with lookahead 0
        )
        self.counters = Counters()
        self._last_call = time.monotonic()
        self._last_tokens = 1
        self._filled_since_call = False
        self._stop = threading.Event()
        self._idle = threading.Thread(target=self._idle_loop, name="flint-idle-fill", daemon=True)
        if idle_fill:
            self._idle.start()
        # int8/int4 experts go through the same kernel the resident backend would pick
        # (packed from the slot on each use), so streamed equals resident for them too.
        self.kernel: ProjectionKernel | None = None
        if layout.scheme in QUANT_SCHEMES:
            self.kernel = select_kernel(
                layout.scheme, layout.group_size, layout.shapes, device, dtype, expert_kernels
            )

    def attach(self, model: Any) -> None:
        """Takes the routers and norms lookahead needs from the built model."""
        for i, layer in enumerate(model.layers):
            router = getattr(layer.mlp, "router", None)
            if router is not None:
                self.lookahead.add_layer(i, layer.post_norm, router)
            layer.observe = self.observe

    def observe(self, layer: int, h: torch.Tensor) -> None:
        """Layer ``layer``'s MoE input (residual after attention, [T, H]) is known."""
        if self.lookahead.depth and h.shape[0] == 1:
            self.engine.predict(self.lookahead.predict(layer, h))
        elif h.shape[0] > 1:
            self.read_ahead(self.engine, layer, h.shape[0])

    def _linear(self, xs: torch.Tensor, slab: torch.Tensor, p: int) -> torch.Tensor:
        """xs @ projection p^T: float weights, or the quantized kernel on packed bytes."""
        lay = self.layout
        if self.kernel is None:
            return F.linear(xs, lay.weight(slab, p).to(device=self.device, dtype=self.dtype))
        return self.kernel(xs, self.kernel.pack(lay.raw(slab, p), *lay.shapes[p]))

    def _wait(self, layer: int, expert: int, proj: int) -> None:
        t0 = time.perf_counter()
        self.engine.wait(layer, expert, proj)
        self.counters.stall_s += time.perf_counter() - t0

    def _expert(
        self, layer: int, expert: int, address: int, hit: bool, xs: torch.Tensor
    ) -> torch.Tensor:
        """``swiglu(xs, gate, up, down)`` (same ops, same order), starting on gate and up
        as soon as their bytes are in and waiting for down, which is flagged only once
        the whole slab matched its checksum: no output comes from unverified bytes."""
        slab = slot_bytes(address, self.layout.slab_bytes)
        if not hit:
            self._wait(layer, expert, 1)  # up landed, so gate too
        h = F.silu(self._linear(xs, slab, 0)) * self._linear(xs, slab, 1)  # [N, I]
        if not hit:
            self._wait(layer, expert, 2)
        return self._linear(h, slab, 2)  # [N, H]

    def _idle_loop(self) -> None:
        """Fills empty slots with the most-used experts (usage table) once no forward
        call has come for ``IDLE_FILL_AFTER_S``; never evicts."""
        while not self._stop.wait(0.1):
            idle = time.monotonic() - self._last_call >= IDLE_FILL_AFTER_S
            if idle and not self._filled_since_call:
                self._filled_since_call = True
                try:
                    self.engine.idle_fill()
                except (_core.FlintError, OSError, ValueError) as err:
                    # A failed read surfaces again, named, when a layer needs it.
                    print(f"flint: idle fill stopped: {err}", file=sys.stderr)
                    return

    def load_usage(self, path: Path, notice: Callable[[str], None]) -> None:
        """Seeds the usage table from ``path`` (missing: first run; corrupt or another
        model's: ignored with one line)."""
        reason = self.engine.load_usage(str(path))
        if reason is not None:
            notice(f"{reason}; it is ignored and counting starts afresh")
        self.usage_path: Path | None = path

    def close(self) -> None:
        """Stops idle fill and saves the usage table next to the model."""
        self._stop.set()
        if self._idle.is_alive():
            self._idle.join(timeout=2)
        path = getattr(self, "usage_path", None)
        if path is not None:
            try:
                self.engine.save_usage(str(path))
            except (OSError, _core.FlintError) as err:
                print(f"flint: could not save the usage table {path}: {err}", file=sys.stderr)

    def __call__(
        self, layer: int, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor
    ) -> torch.Tensor:
        self._last_call = time.monotonic()
        self._filled_since_call = False
        tokens, k = ids.shape
        if layer == self.first_layer:
            self._new_forward(tokens)
        flat = ids.reshape(-1)  # [T*K], entry t*K + k
        order = torch.argsort(flat, stable=True)
        counts = torch.bincount(flat, minlength=self.cfg.num_experts).tolist()
        starts = [0] * len(counts)
        for e in range(1, len(counts)):
            starts[e] = starts[e - 1] + counts[e - 1]
        selected = list(dict.fromkeys(flat.tolist()))  # rank order of first selection
        self.lookahead.score(layer, set(selected))
        self.engine.begin_layer(layer, selected)
        outputs = torch.empty(tokens * k, x.shape[1], dtype=torch.float32, device=x.device)
        for wave in self._waves(layer, ids, selected):
            for expert, _slot, address, hit in self.engine.place(layer, wave):
                rows = order[starts[expert] : starts[expert] + counts[expert]]  # [N]
                y = self._expert(layer, expert, address, hit, x[rows // k])
                outputs[rows] = y.to(torch.float32)
            self.engine.unpin(layer, wave)
        return weighted_sum(outputs.view(tokens, k, -1), weights).to(x.dtype)

    # --- prompt waves (issue 8) ---
    def _waves(self, layer: int, ids: torch.Tensor, selected: list[int]) -> list[list[int]]:
        """Decode: the selection in router-rank order, in waves of the layer's slots.
        A prompt: ``plan_waves`` (residents first, the experts the end of the prompt
        used last, each selected expert placed once)."""
        if ids.shape[0] == 1:
            return [selected[i : i + self.capacity] for i in range(0, len(selected), self.capacity)]
        plan = plan_waves(ids, self.cfg.num_experts, self.capacity, self.engine.resident(layer))
        if plan.protect:
            self.engine.protect(layer, list(plan.protect))
        c = self.counters
        c.prompt_layers += 1
        c.prompt_distinct += len(selected)
        c.prompt_waves += len(plan.waves)
        return [list(w) for w in plan.waves]

    # --- end prompt waves ---

    def _new_forward(self, tokens: int) -> None:
        """The previous forward pass is over: age the cache by its token count (a prompt
        batch of T tokens ages like T decode steps); evict LRU during prompt batches."""
        if self.counters.tokens:
            self.engine.forward_done(self._last_tokens)
        self.engine.set_prompt_mode(tokens > 1)
        self._last_tokens = tokens
        self.counters.tokens += 1

    def stats(self) -> dict[str, Any]:
        """Cumulative streaming statistics (engine, cache and prediction quality)."""
        s: dict[str, Any] = dict(self.engine.stats())
        c, q = self.counters, self.lookahead.quality
        placed = s["hits"] + s["in_flight_at_start"] + s["demand_placements"]
        s.update(
            forward_calls=c.tokens,
            stall_s=c.stall_s,
            prompt_layers=c.prompt_layers,
            prompt_distinct=c.prompt_distinct,
            prompt_waves=c.prompt_waves,
            read_ahead=self.read_ahead.issued,
            ram_hit_rate=s["hits"] / placed if placed else None,
            slots_per_layer=self.capacity,
            n_experts=self.cfg.num_experts,
            streamed_layers=len(self.plan.streamed_layers),
            mode=self.engine.mode,
        )
        for d in range(1, self.lookahead.depth + 1):
            s[f"recall_d{d}"] = q.recall(d)
            s[f"precision_d{d}"] = q.precision(d)
        return s
