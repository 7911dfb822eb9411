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
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from flint import _core
from flint.format.reader import ExpertLayout
from flint.graphs.grouped import PairPlan, prompt_sum, starts_of
from flint.graphs.moe_kernel import ExpertPool, ranked_sum
from flint.graphs.slab_experts import KERNEL_TOKENS
from flint.models.config import ModelConfig
from flint.models.cpu_kernels import FusedKernel, slab_addresses, streaming_threads
from flint.models.loading import indexed
from flint.models.moe import ExpertMath, weighted_sum
from flint.models.quant_experts import QUANT_SCHEMES, fused_supported, resolve_kernels
from flint.models.quant_linear import select_kernel
from flint.stream.cuda_place import CudaPlacement, slab_ready
from flint.stream.elastic import ElasticVram, usable_vram
from flint.stream.gpu_waves import GpuStager
from flint.stream.lookahead import Lookahead
from flint.stream.pinned import PinnedArena
from flint.stream.placement import HOST_MAX_TOKENS, HostBatch, Target
from flint.stream.plan import StreamPlan, plan_vram
from flint.stream.prompt_ahead import PromptAhead
from flint.stream.prompt_mem import PromptMemory
from flint.stream.qsplit import QSplit, pcie_bandwidth, resolve_host_split
from flint.stream.readahead import ReadAhead
from flint.stream.slab import slot_bytes
from flint.stream.vram import VramCache, VramRequest, free_vram
from flint.stream.waves import first_selected, plan_waves, routing_summary

# T = tokens, H = hidden, K = top-k, E = experts per layer, N = rows routed to one expert


# Lookahead predicts layers L+1..L+d from layer L's MoE input (the residual after
# attention: early, more time for the read) or from its output (after the MoE add:
# later, closer to what those layers see). Measured end to end: docs/benchmarks.md.
LOOKAHEAD_FROM = ("input", "output")
IDLE_FILL_AFTER_S = 0.5  # no forward call for this long: fill empty slots


def _stderr(line: str) -> None:
    print(f"flint: {line}", file=sys.stderr)


@dataclass(slots=True)
class Counters:
    tokens: int = 0
    gpu_experts: int = 0  # expert computations on the model's device (CUDA)
    host_experts: int = 0  # expert computations on the CPU while the model is on CUDA
    host_s: float = 0.0  # wall time of those computations (their calls, copies up)
    copy_bytes: int = 0  # slab bytes copied to the device for a single use
    # Prompt layers (forwards of more than one token): per streamed layer call, the
    # distinct experts selected and the waves they were placed in.
    prompt_layers: int = 0
    prompt_distinct: int = 0
    prompt_waves: int = 0
    # A long prompt's next layer copied up ahead (prompt_ahead.py): experts copied, and
    # of those computed from the area (the rest went unselected).
    ahead_copied: int = 0
    ahead_copy_calls: int = 0  # the copies that moved them (adjacent slots: one)
    ahead_computed: int = 0


class StreamedExperts(CudaPlacement):
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
        lookahead_from: str = "output",
        idle_fill: bool = True,
        vram: VramRequest | None = None,
        deterministic: bool = False,
        notice: Callable[[str], None] | None = None,
        math: ExpertMath | None = None,
        host_split: str = "auto",
        gpu_waves: bool = True,
        slab_kernels: bool = False,
    ) -> None:
        self.cfg, self.layout, self.engine, self.plan = config, layout, engine, plan
        device = indexed(device)  # "cuda" -> "cuda:N": one key per GPU everywhere
        # the activation and (GPT-OSS) resident biases around each expert's projections
        self.math = math if math is not None else ExpertMath(config.expert_act)
        if config.expert_bias and not self.math.biases:
            raise ValueError(f"{config.family} experts need their biases (pass math)")
        self.device, self.dtype = device, dtype
        self.capacity = plan.slots_per_layer
        self.first_layer = plan.streamed_layers[0]
        self.lookahead = Lookahead(lookahead, config.top_k, config.rms_norm_eps, lookahead_width)
        if lookahead_from not in LOOKAHEAD_FROM:
            raise ValueError(
                f"lookahead_from must be one of {LOOKAHEAD_FROM}, not {lookahead_from!r}"
            )
        self.lookahead_from = lookahead_from
        self._with_shared: set[int] = set()  # layers predicting from input + shared output
        self._residual: torch.Tensor | None = None
        self.read_ahead = ReadAhead(
            plan.streamed_layers,
            self.capacity,
            config.num_experts,
            config.top_k,
            depth=2 if lookahead else 0,  # no prediction at all with lookahead 0
        )
        # prompt memory (issue 7): slots lent while a prompt runs; waves and read-ahead
        # use the layers' usable slots meanwhile
        self.prompt_memory = PromptMemory(
            engine, plan.streamed_layers, self.capacity, notice or _stderr
        )
        self.read_ahead.capacity = self.prompt_memory.capacity
        self.counters = Counters()
        # decode steps' selections (one list of K ids per streamed layer call, rank
        # order) while a bench records them for its Belady bound; None: not recording
        self.routing: list[list[int]] | None = None
        self._last_call = time.monotonic()
        self._last_tokens = 1
        self._filled_since_call = False
        self._stop = threading.Event()
        self._idle = threading.Thread(target=self._idle_loop, name="flint-idle-fill", daemon=True)
        if idle_fill:
            self._idle.start()

        # "auto" is "fused" on the CPU where the fused kernels compute the family's
        # experts, "torch" otherwise (``resolve_kernels``: the resident backend's choice)
        fusable = self.math.plain and fused_supported(config)
        mode = expert_kernels
        if device.type != "cpu" and mode == "fused":
            mode = "torch"  # the GPU's experts; "fused" names the CPU's share (host_fused)
        say = notice or _stderr  # its lines without resolve_kernels' "flint: "
        kernels = resolve_kernels(
            mode, device, config.family, fusable, lambda m: say(m.removeprefix("flint: "))
        )

        # int8/int4 experts go through the same kernel the resident backend would pick
        # (packed from the slot on each use), so streamed equals resident for them too.
        def target(dev: torch.device, dt: torch.dtype) -> Target:
            kernel = None
            if layout.scheme in QUANT_SCHEMES:
                kernel = select_kernel(
                    layout.scheme, layout.group_size, layout.shapes, dev, dt, kernels
                )
            return Target(dev, dt, kernel)

        self._target = target
        self.main = target(device, dtype)
        # with the layers split across GPUs, each other GPU's (``_on``)
        self._targets: dict[torch.device, Target] = {device: self.main}
        # On CUDA, experts in neither VRAM nor a free VRAM slot run on the CPU, in
        # parallel with the GPU's; --deterministic computes every expert on the GPU.
        self.host: Target | None = None
        if device.type == "cuda" and not deterministic:
            # in the model's dtype: the same rounding steps as the GPU's kernels
            self.host = target(torch.device("cpu"), dtype)
        self.deterministic = deterministic
        self.vram_request = vram
        # one VRAM expert cache per GPU, for the streamed layers it holds
        self.vrams: dict[torch.device, VramCache] = {}
        self.vram_of: dict[int, VramCache] = {}  # streamed layer -> its GPU's cache
        self._layer_device: dict[int, torch.device] = {}  # with the layers split
        self.elastic: list[ElasticVram] = []  # one per VRAM cache (``_watch_vram``)
        self.pinned: PinnedArena | None = None  # the RAM cache page-locked for CUDA
        # "fused" on the CPU: one Rust call per wave computes the wave's experts from
        # their slots, waiting on each projection's ready flag itself; the resident
        # backend makes the same calls, so streamed equals resident here too.
        self.fused: FusedKernel | None = None
        if kernels == "fused":
            self.fused = FusedKernel.for_layout(layout, streaming_threads())
        # On CUDA the CPU's share of decode steps goes through the fused kernels with
        # "auto" and "fused" (measured faster there: docs/benchmarks.md), through torch's
        # with "torch" and "dequant", or where the family's experts are not what the
        # fused kernels compute (GPT-OSS).
        self.host_fused: FusedKernel | None = None
        if self.host is not None and expert_kernels in ("auto", "fused") and fusable:
            # a bf16 model's hidden rows rounded to bf16 before down, as the GPU's
            # kernels and the torch host path hold them (and down's fast kernel)
            self.host_fused = FusedKernel.for_layout(
                layout, streaming_threads(), round_hidden=dtype == torch.bfloat16
            )
        # A prompt's experts outside VRAM staged through double-buffered VRAM copies on
        # CUDA (gpu_waves.py); off: copied per projection on the compute stream.
        self.gpu_waves = gpu_waves
        self._stagers: dict[torch.device, GpuStager] = {}
        # a long prompt's next layer copied up ahead (prompt_ahead.py), per GPU; None:
        # no room for its areas
        self._aheads: dict[torch.device, PromptAhead | None] = {}
        self._next_layer = dict(pairwise(plan.streamed_layers))
        # int8/int4 on CUDA beside the graph step (``slab_kernels``): the VRAM cache
        # holds slabs, and the GPU computes from slabs in grouped launches
        # (flint.graphs.grouped): a layer's VRAM experts in one, each staged chunk of a
        # prompt's in one; a decode step's VRAM experts in one launch of the slot
        # kernels. The resident slab backend's prompts run the same kernels, so the two
        # agree bit for bit. Off (and for experts with biases, which the slot kernels
        # look up by slot): each expert through torch's kernels.
        self.slab_kernels = slab_kernels and slab_ready(layout) and not self.math.biases
        self._slab_pools: dict[tuple[int, int, int], ExpertPool] = {}  # _slab_pool's views
        # The q* split of a decode step's missing experts between PCIe fills and the CPU
        # (qsplit.py); None: all on the CPU.
        self.qsplit: QSplit | None = None
        self.host_split = resolve_host_split(host_split, self.slab_kernels and gpu_waves)
        if self.host is not None and self.host_split != "cpu":
            pcie = pcie_bandwidth(device)
            self.qsplit = QSplit(pcie, pcie, self.host_split)

    @property
    def vram(self) -> VramCache | None:
        """The VRAM expert cache (the first GPU's when the layers are split)."""
        return next(iter(self.vrams.values()), None)

    def _on(self, device: torch.device) -> Target:
        """The target that computes on ``device`` (the model's, or another GPU's)."""
        if device not in self._targets:
            self._targets[device] = self._target(device, self.dtype)
        return self._targets[device]

    def attach(self, model: Any) -> None:
        """Takes the routers and norms lookahead needs from the built model."""
        if len(model.place.devices) > 1:
            self._layer_device = {i: model.place.at(i).device for i in self.plan.streamed_layers}
        for i, layer in enumerate(model.layers):
            router = getattr(layer.mlp, "router", None)
            if router is not None:
                grouped = None
                if self.cfg.group_router is not None:
                    grouped = (getattr(layer.mlp, "bias32", None), self.cfg.group_router)
                bias = getattr(layer.mlp, "router_bias", None)  # GPT-OSS
                self.lookahead.add_layer(i, layer.post_scale, router, grouped, bias=bias)
            layer.observe = self.observe
            if self.lookahead_from == "output":
                layer.observe_output = self.observe_output
            elif getattr(layer.mlp, "shared", None) is not None:
                # from the MoE input plus the layer's shared-expert output
                layer.mlp.observe_shared = self.observe_shared
                self._with_shared.add(i)
        model.prompt_memory = self.lend_for_prompt  # prompt memory (issue 7)
        if self.vram_request is not None:
            self._start_vram(self.vram_request)

    def _start_vram(self, req: VramRequest) -> None:
        """Plans the VRAM cache from what is free now (dense weights and KV cache are
        in place) and seeds it from the usage table. With the layers split across GPUs,
        each GPU gets its own for its layers, sized from its own free memory (a
        ``--vram-budget`` is shared in proportion to their streamed layers)."""
        lay, streamed = self.layout, self.plan.streamed_layers
        groups: dict[torch.device, list[int]] = {}
        for layer in streamed:
            device = self._layer_device.get(layer, indexed(req.device))
            groups.setdefault(device, []).append(layer)
        split = len(groups) > 1
        for device, layers in groups.items():
            free = req.free_bytes() if req.free_bytes is not None else free_vram(device)
            budget = req.budget_gib
            if budget is not None:
                budget *= len(layers) / len(streamed)
            plan = plan_vram(len(layers), lay.n_experts, lay.slab_bytes, free, budget)
            label = f"{device}: " if split else ""
            for line in plan.notes:
                req.notice(label + line)
            if plan.slots_per_layer < 1:
                continue
            req.notice(label + plan.describe(lay.n_experts))
            kernel, pack = self._on(device).kernel, None
            if kernel is not None and not self.slab_kernels:  # held packed for the kernel

                def pack(slab: torch.Tensor, kernel: Any = kernel) -> list[Any]:
                    return [kernel.pack(lay.raw(slab, p), *lay.shapes[p]) for p in range(3)]

            vram = VramCache(
                tuple(layers), lay.n_experts, plan.slots_per_layer, lay.slab_bytes, device, pack
            )
            self.vrams[device] = vram
            self.vram_of.update(dict.fromkeys(layers, vram))
            if req.read_slab is not None:
                vram.seed(self.engine.usage, req.read_slab)
            self._watch_vram(vram, req, budget)

    def _watch_vram(self, vram: VramCache, req: VramRequest, budget: float | None) -> None:
        """Elastic VRAM: ``vram`` is resized at token boundaries to what is free."""
        if not req.elastic:
            return
        dev = vram.device
        if req.free_bytes is not None:  # simulated (tests)
            self.elastic.append(ElasticVram(vram, req.free_bytes, budget, req.notice))
            return
        free, mine = (lambda: usable_vram(dev)), (lambda: torch.cuda.memory_allocated(dev))
        self.elastic.append(ElasticVram(vram, free, budget, req.notice, mine))

    def _elastic_stats(self) -> dict[str, int]:
        e = [w.counters for w in self.elastic]
        return {
            "vram_shrinks": sum(c.shrinks for c in e),
            "vram_grows": sum(c.grows for c in e),
            "vram_dropped": sum(c.dropped for c in e),
        }

    def _elastic_round(self, tokens: int) -> None:
        """At a token boundary (before a forward of ``tokens``): each VRAM cache
        checks free VRAM when due and shrinks or grows (``flint.stream.elastic``)."""
        for watch in self.elastic:
            if watch.due(tokens):
                watch.check()

    def observe(self, layer: int, h: torch.Tensor) -> None:
        """Layer ``layer``'s MoE input (residual after attention, [T, H]) is known: a
        decode step predicts from it (``lookahead_from="input"``), a prompt reads ahead."""
        if h.shape[0] > 1:
            self.read_ahead(self.engine, layer, h.shape[0])
        elif self.lookahead_from == "input":
            if layer in self._with_shared:
                self._residual = h  # predicted once the shared expert's output is in
            else:
                self._predict(layer, h)

    def observe_shared(self, layer: int, shared: torch.Tensor) -> None:
        """A decode step's shared-expert output of ``layer`` (computed before its routed
        experts): predict from the MoE input plus it, as the issue's lookahead asks."""
        h, self._residual = self._residual, None
        if h is not None:
            self._predict(layer, h + shared)

    def observe_output(self, layer: int, h: torch.Tensor) -> None:
        """Layer ``layer``'s output is known (``lookahead_from="output"``)."""
        if h.shape[0] == 1:
            self._predict(layer, h)

    def _predict(self, layer: int, h: torch.Tensor) -> None:
        # Every expert in RAM (a budget that holds them all, its fill done): nothing to
        # read ahead, and the prediction's router products and device sync would only
        # cost the host time (V1 decoded 27% slower with them, docs/benchmarks.md).
        if not self.lookahead.depth or self.engine.all_resident():
            return
        predictions = self.lookahead.predict(layer, h)
        if self.vram_of:  # what VRAM holds needs no read
            of = self.vram_of
            predictions = [
                p for p in predictions if p[0] not in of or p[1] not in of[p[0]].where[p[0]]
            ]
        self.engine.predict(predictions)

    def _linear(self, t: Target, xs: torch.Tensor, slab: torch.Tensor, p: int) -> torch.Tensor:
        """xs @ projection p^T on ``t``: float weights, or the quantized kernel on packed
        bytes. A slab elsewhere than ``t.device`` is copied per projection."""
        lay = self.layout
        if slab.device.type != t.device.type:
            self.counters.copy_bytes += lay.proj_bytes[p]
        if t.kernel is None:
            return F.linear(xs, lay.weight(slab, p).to(device=t.device, dtype=t.dtype))
        return t.kernel(xs, t.kernel.pack(lay.raw(slab, p), *lay.shapes[p]))

    def _wait(self, layer: int, expert: int, proj: int) -> None:
        self.engine.wait(layer, expert, proj)  # a blocked wait counts in "wait_us"

    def _expert(
        self,
        t: Target,
        layer: int,
        expert: int,
        slab: torch.Tensor,
        hit: bool,
        xs: torch.Tensor,
    ) -> torch.Tensor:
        """The expert as the resident backends compute it (same ops, same order:
        ``ExpertMath``) on ``t``, starting on gate and up as soon as their bytes are in
        and waiting for down, which is flagged only once the whole slab matched its
        checksum: no output comes from unverified bytes."""
        if t.device.type == "cuda":
            self.counters.gpu_experts += 1
        elif self.main.device.type == "cuda":
            self.counters.host_experts += 1
        if not hit:
            self._wait(layer, expert, 1)  # up landed, so gate too
        m = self.math
        h = m.hidden(layer, expert, self._linear(t, xs, slab, 0), self._linear(t, xs, slab, 1))
        if not hit:
            self._wait(layer, expert, 2)
        return m.output(layer, expert, self._linear(t, h, slab, 2))  # [N, H]

    def _vram_expert(self, layer: int, expert: int, xs: torch.Tensor) -> torch.Tensor:
        """The expert computed on the GPU from its VRAM copy (the same ops as
        ``_expert``; a quantized expert from the packed form the kernel made once)."""
        vram = self.vram_of[layer]
        w = vram.entry(layer, expert)
        t = self._on(vram.device)
        kernel = t.kernel
        if kernel is None or vram.pack is None:
            return self._expert(t, layer, expert, w, True, xs)
        self.counters.gpu_experts += 1
        m = self.math
        h = m.hidden(layer, expert, kernel(xs, w[0]), kernel(xs, w[1]))  # [N, I]
        return m.output(layer, expert, kernel(h, w[2]))  # [N, H]

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

    def held(self) -> list[set[int]]:
        """Per streamed layer, the experts in a RAM slot or a VRAM slot now."""
        out = []
        for layer in self.plan.streamed_layers:
            experts = set(self.engine.resident(layer))
            vram = self.vram_of.get(layer)
            if vram is not None:
                experts |= set(vram.where[layer])
            out.append(experts)
        return out

    def wait_for_fill(self, poll_s: float = 0.05) -> tuple[float, int, int]:
        """Blocks until the background fill (``engine.idle_fill``: at load when every
        expert fits the RAM budget, or when idle) has read all its experts; returns
        (seconds waited, bytes the fills read during the wait, bytes they read in all)."""
        t0, before = time.perf_counter(), int(self.engine.stats()["bytes_fill"])
        while self.engine.fills_left():
            time.sleep(poll_s)
        total = int(self.engine.stats()["bytes_fill"])
        return time.perf_counter() - t0, total - before, total

    def load_usage(self, path: Path, notice: Callable[[str], None]) -> None:
        """Seeds the usage table from ``path`` (missing: first run; corrupt or another
        model's: ignored with one line)."""
        reason = self.engine.load_usage(str(path))
        if reason is not None:
            notice(f"{reason}; it is ignored and counting starts afresh")
        self.usage_path: Path | None = path

    def close(self) -> None:
        """Stops idle fill, saves the usage table next to the model and unregisters a
        page-locked RAM cache."""
        self._stop.set()
        if self._idle.is_alive():
            self._idle.join(timeout=2)
        path = getattr(self, "usage_path", None)
        if path is not None:
            try:
                self.engine.save_usage(str(path))
            except (OSError, _core.FlintError) as err:
                print(f"flint: could not save the usage table {path}: {err}", file=sys.stderr)
        self._drop_aheads()
        if self.pinned is not None:
            self.pinned.release()  # before the arena can go

    def __call__(
        self, layer: int, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor
    ) -> torch.Tensor:
        self._last_call = time.monotonic()
        self._filled_since_call = False
        tokens, k = ids.shape
        if layer == self.first_layer:
            self._new_forward(tokens)
        flat = ids.reshape(-1)  # [T*K], entry t*K + k
        small = tokens <= KERNEL_TOKENS and (self.slab_kernels or x.device.type == "cpu")
        # The ids reach the CPU in one copy, ordered on the model's stream (no device-
        # wide synchronisation); everything the host decides is computed from it. A
        # prompt on a GPU brings its counts, first and last selections along.
        first = last = None
        if tokens > KERNEL_TOKENS and x.device.type == "cuda":
            flat_host, counts, first, last = routing_summary(flat, k, self.cfg.num_experts)
        else:
            flat_host = flat.cpu()  # the ids' read-back: one wait
            counts = np.bincount(flat_host.numpy(), minlength=self.cfg.num_experts).tolist()
        # The pairs sorted by expert: a decode-sized call with the slab kernels sorts
        # them on the host, where its ids already are (its kernels take host lists); a
        # prompt's, and those of the per-expert paths (which index the device's tensors
        # with them: a host index would be a synchronising copy each), on the device.
        order = torch.argsort(flat_host if small else flat, stable=True)
        starts = starts_of(counts)
        # the pairs' experts as a list where the slot kernels or the routing record
        # read them (decode-sized calls), not for a prompt's tens of thousands
        host_ids = flat_host.tolist() if tokens <= KERNEL_TOKENS else None
        outputs = torch.empty(tokens * k, x.shape[1], dtype=torch.float32, device=x.device)
        plan = PairPlan(tokens, order, starts, counts, host_ids) if self.slab_kernels else None
        vram = self.vram_of.get(layer)
        # A prompt on a GPU (more tokens than the slot kernels take) queues what needs
        # no wave plan first (its VRAM experts, the ones copied ahead) and, when that
        # was all of them, the next layer's copies: the GPU has been idle since the ids
        # left it, and the host's plan takes ~1 ms a layer.
        early = (
            not small
            and x.device.type == "cuda"
            and (vram is None or not vram.free[layer])  # else first uses admit experts
            and not (self.fused is not None and vram is None)
        )
        # the experts copied up while the layer before ran (their copies have usually
        # landed by now: the wait comes after the launches below)
        ahead = self._pending_ahead(layer, x.device) if self._aheads else None
        early_ahead: set[int] = set()
        queued_ahead = False  # the next layer's copies
        try:
            if early and plan is not None:
                early_ahead, rest = self._early(layer, vram, ahead, counts, x, plan, outputs)
                # now they have the most time, unless this layer has copies of its own
                # to make: those would queue behind them on the one copy stream
                if not rest:
                    self._copy_ahead(layer, tokens, x.device)
                    queued_ahead = True
        finally:
            if ahead is not None:
                self._release_ahead(ahead)
        if self.routing is not None and tokens == 1 and host_ids is not None:
            self.routing.append(host_ids)
        # rank order of first selection
        selected = first_selected(flat_host, self.cfg.num_experts, first)
        self.lookahead.score(layer, set(selected))
        held: list[int] = []
        if vram is not None:
            vram.note(layer, counts)
            vram.counters.selections += len(selected)
            held = [e for e in selected if e in vram.where[layer]]
            selected = [e for e in selected if e not in vram.where[layer]]
            self.engine.record_use(layer, held)
            vram.counters.hits += len(held)
        self.engine.begin_layer(layer, selected)
        if self.fused is not None and vram is None:
            waves = self._waves(layer, flat_host.view(tokens, k), selected, counts)
            return self._fused_waves(layer, x, ids, weights, waves, outputs)

        def rows_of(expert: int) -> torch.Tensor:
            return order[starts[expert] : starts[expert] + counts[expert]]  # [N]

        host = self.host
        # ``--host-split fill`` with the slab kernels: every expert outside VRAM goes
        # through the staging buffers below and one slot-kernel launch per chunk, as a
        # prompt's do (the CPU's batch is not needed)
        fill_all = (
            self.slab_kernels
            and self.qsplit is not None
            and self.qsplit.mode == "fill"
            and self._stager(x.device) is not None  # made here on first use
        )
        x_host = None
        if host is not None and selected and tokens <= HOST_MAX_TOKENS and not fill_all:
            # copied now, before the GPU work below is queued (ids, order: on the host)
            x_host = HostBatch(x, flat_host.view(tokens, k), order, host.dtype)
        # the VRAM experts' work is queued on the GPU first: it runs while the CPU works
        if plan is not None:
            if vram is not None and held and not early:  # one launch (else queued above)
                self._vram_grouped(layer, vram, held, x, plan, outputs)
        else:
            for expert in held:
                rows = rows_of(expert)
                outputs[rows] = self._vram_expert(layer, expert, x[rows // k]).float()
        stager = self._stager(x.device) if x_host is None else None
        admitted: list[int] = []
        # planned from the host's ids: from the device's, the plan's reads would wait
        # for the VRAM experts' work just queued, and the copies below with them
        for wave in self._waves(layer, flat_host.view(tokens, k), selected, counts, last):
            on_host: list[tuple[int, int, bool]] = []
            staged: list[tuple[int, int, bool]] = []
            from_ahead: list[int] = []
            # (the rows and the slot's tensor only where a branch uses them: a decode
            # step's host experts need neither, and each is a few torch calls)
            for expert, _slot, address, hit in self.engine.place(layer, wave):
                if vram is not None and vram.free[layer]:  # first use fills a free slot
                    if not hit:
                        self._wait(layer, expert, 2)
                    vram.admit(layer, expert, slot_bytes(address, self.layout.slab_bytes))
                    if self.slab_kernels:
                        admitted.append(expert)
                        continue
                    rows = rows_of(expert)
                    y = self._vram_expert(layer, expert, x[rows // k])
                    outputs[rows] = y.to(torch.float32)
                elif ahead is not None and expert in ahead.rows:
                    if expert not in early_ahead:  # (those are queued already)
                        from_ahead.append(expert)  # copied up while the layer before ran
                elif x_host is not None:
                    on_host.append((expert, address, hit))
                elif stager is not None:
                    staged.append((expert, address, hit))
                else:
                    rows = rows_of(expert)
                    slab = slot_bytes(address, self.layout.slab_bytes)
                    y = self._expert(self._on(x.device), layer, expert, slab, hit, x[rows // k])
                    outputs[rows] = y.to(torch.float32)
            if from_ahead:  # only ever with the slab kernels (``_copy_ahead``)
                assert ahead is not None and plan is not None
                self._from_ahead(layer, ahead, from_ahead, x, plan, outputs)
            if staged and stager is not None:
                self._staged(layer, stager, staged, x, rows_of, outputs, plan)
                if fill_all and self.qsplit is not None and tokens <= HOST_MAX_TOKENS:
                    self.qsplit.record(len(staged), 0)  # a decode step's, not a prompt's
            if on_host and x_host is not None:
                fills, on_host = self._split(on_host)
                queued = self._fill(layer, fills, x, rows_of, outputs, plan) if fills else None
                t0 = time.perf_counter()
                if on_host:
                    self._host_experts(layer, on_host, x_host, starts, counts, outputs)
                    self.counters.host_s += time.perf_counter() - t0
                if self.qsplit is not None:
                    self._observe(queued, on_host, time.perf_counter() - t0)
            self.engine.unpin(layer, wave)
        if vram is not None and admitted and plan is not None:
            self._vram_grouped(layer, vram, admitted, x, plan, outputs)
        if plan is not None:
            if small:  # one launch instead of ~15 ops (within rounding)
                return ranked_sum(outputs, weights, x.dtype)
            if not queued_ahead:
                self._copy_ahead(layer, tokens, x.device)
            return prompt_sum(outputs, weights, x.dtype)  # as the resident slab backend
        return weighted_sum(outputs.view(tokens, k, -1), weights).to(x.dtype)

    def _fused_waves(
        self,
        layer: int,
        x: torch.Tensor,  # [T, H]
        ids: torch.Tensor,  # [T, K]
        weights: torch.Tensor,  # [T, K]
        waves: list[list[int]],
        outputs: torch.Tensor,  # [T*K, H] fp32
    ) -> torch.Tensor:
        """The fused kernels on each wave's slots (waiting inside the call), then the
        rank-order sum: the calls ``FusedResidentExperts`` makes, so the same bytes."""
        assert self.fused is not None
        x32, ids64 = x.to(torch.float32).contiguous(), ids.contiguous()
        for wave in waves:
            placed = self.engine.place(layer, wave)
            experts = [(e, *slab_addresses(addr, self.layout)) for e, _, addr, _ in placed]
            hits = [e for e, _, _, hit in placed if hit]
            try:  # waits happen inside (the engine's wait_us counts them, not stall_s)
                self.fused.expert_outputs(x32, ids64, experts, outputs, self.engine, layer, hits)
            finally:
                self.engine.unpin(layer, wave)
        return self.fused.weighted_sum(outputs, weights).to(x.dtype)

    # --- prompt waves (issue 8) ---
    def _waves(
        self,
        layer: int,
        ids: torch.Tensor,
        selected: list[int],
        counts: list[int],
        last: np.ndarray | None = None,
    ) -> list[list[int]]:
        """``ids`` [T, K] on the CPU, ``counts`` their selections per expert (``last``:
        the last token of each, where the caller has it). Decode: the selection in
        router-rank order, in waves of the layer's slots. A prompt:
        ``plan_waves`` (residents first, the experts the end of the prompt used last,
        each selected expert placed once). Experts the VRAM cache holds are not in
        ``selected`` and are left out of every wave."""
        cap = self.prompt_memory.capacity(layer)  # fewer while slots are lent
        if ids.shape[0] == 1:
            return [selected[i : i + cap] for i in range(0, len(selected), cap)]
        resident = self.engine.resident(layer)
        plan = plan_waves(ids, self.cfg.num_experts, cap, resident, counts, last)
        if plan.protect:
            self.engine.protect(layer, list(plan.protect))
        c = self.counters
        c.prompt_layers += 1
        c.prompt_distinct += len(selected)
        c.prompt_waves += len(plan.waves)
        chosen = set(selected)
        waves = [[e for e in w if e in chosen] for w in plan.waves]
        return [w for w in waves if w]

    # --- end prompt waves ---

    # --- prompt memory (issue 7) ---
    def lend_for_prompt(self, nbytes: int) -> int:
        """A prompt's activations need ``nbytes`` more than is free: lends RAM cache
        slots (empty, then coldest) for it until the first decode token; returns the
        bytes given back. On CUDA the activations are in VRAM: nothing is lent."""
        if self.device.type != "cpu":
            return 0
        return self.prompt_memory.lend(nbytes)

    # --- end prompt memory ---

    def _new_forward(self, tokens: int) -> None:
        """The previous forward pass is over: age the cache by its token count (a prompt
        batch of T tokens ages like T decode steps); evict LRU during prompt batches."""
        self._drop_aheads()  # a forward that stopped between two layers
        if self.counters.tokens:
            self.engine.forward_done(self._last_tokens)
            for vram in self.vrams.values():
                if vram.token_done(self._last_tokens):
                    self._swap_round(vram)
        self._elastic_round(tokens)
        if tokens == 1:  # the first decode token takes lent slots back
            self.prompt_memory.reclaim()
            self._free_aheads()  # and the prompt's areas go back to torch's allocator
        self.engine.set_prompt_mode(tokens > 1)
        self._last_tokens = tokens
        self.counters.tokens += 1

    def _swap_round(self, vram: VramCache) -> None:
        """Copies hot experts over cold ones in VRAM, from their pinned RAM slots (an
        expert not complete in RAM now waits for a later round)."""
        by_layer: dict[int, dict[int, int]] = {}
        for layer, comer, leaver in vram.swap_plan():
            by_layer.setdefault(layer, {})[comer] = leaver
        for layer, pairs in by_layer.items():
            pinned = self.engine.pin_resident(layer, list(pairs))
            try:
                for comer, address in pinned:
                    vram.swap(layer, comer, pairs[comer], slot_bytes(address, vram.slab_bytes))
            finally:
                self.engine.unpin(layer, [e for e, _ in pinned])

    def stats(self) -> dict[str, Any]:
        """Cumulative streaming statistics (engine, cache and prediction quality)."""
        s: dict[str, Any] = dict(self.engine.stats())
        c, q = self.counters, self.lookahead.quality
        placed = s["hits"] + s["in_flight_at_start"] + s["demand_placements"]
        s.update(
            forward_calls=c.tokens,
            # blocked waits for bytes, timed in the engine: the torch path's waits and
            # the ones the fused kernels make inside their call alike
            stall_s=s["wait_us"] / 1e6,
            prompt_layers=c.prompt_layers,
            prompt_distinct=c.prompt_distinct,
            prompt_waves=c.prompt_waves,
            read_ahead=self.read_ahead.issued,
            ram_hit_rate=s["hits"] / placed if placed else None,
            slots_per_layer=self.capacity,
            n_experts=self.cfg.num_experts,
            streamed_layers=len(self.plan.streamed_layers),
            mode=self.engine.mode,
            gpu_experts=c.gpu_experts,
            cpu_experts=c.host_experts,
            cpu_expert_s=c.host_s,
            cpu_share=c.host_experts / max(1, c.host_experts + c.gpu_experts)
            if self.main.device.type == "cuda"
            else 1.0,
            pcie_bytes=c.copy_bytes,
            deterministic=self.deterministic,
        )
        if self._stagers:  # GPU waves: prompt experts staged through VRAM buffers
            s["gpu_wave_experts"] = sum(st.staged for st in self._stagers.values())
            s["gpu_wave_chunks"] = sum(st.chunks for st in self._stagers.values())
        if c.ahead_copied:  # a long prompt's next layer copied up ahead
            s["prompt_ahead_experts"] = c.ahead_copied
            s["prompt_ahead_computed"] = c.ahead_computed
            s["prompt_ahead_copies"] = c.ahead_copy_calls
        if self.host is not None:  # experts outside VRAM may run beside the GPU
            s["host_split"] = self.host_split  # "auto" resolved
        qs = self.qsplit
        if qs is not None:  # the q* split's decisions and current bandwidths
            s.update(
                host_split=qs.mode,
                split_filled=qs.filled,
                split_on_cpu=qs.kept,
                split_pcie_gb_s=qs.pcie / 1e9,
                split_host_gb_s=qs.host / 1e9,
            )
        if self.vrams:
            vrams = list(self.vrams.values())
            hits = sum(v.counters.hits for v in vrams)
            selections = placed + hits
            s.update(
                vram_slots_per_layer=vrams[0].slots,
                vram_hits=hits,
                vram_hit_rate=hits / selections if selections else None,
                vram_admitted=sum(v.counters.admitted for v in vrams),
                vram_swaps=sum(v.counters.swaps for v in vrams),
                vram_seeded=sum(v.counters.seeded for v in vrams),
            )
            s["pcie_bytes"] += sum(v.counters.pcie_bytes for v in vrams)
            s.update(self._elastic_stats())
            if len(vrams) > 1:  # layers split across GPUs: each GPU's own share
                for v in vrams:
                    vc = v.counters
                    rate = vc.hits / vc.selections if vc.selections else None
                    s[f"vram_hit_rate {v.device}"] = rate
                    s[f"vram_slots_per_layer {v.device}"] = v.slots
        for d in range(1, self.lookahead.depth + 1):
            s[f"recall_d{d}"] = q.recall(d)
            s[f"precision_d{d}"] = q.precision(d)
        return s
