"""Where a CUDA layer's experts outside VRAM are computed, on the host side of
``StreamedExperts`` (``backend.py``): a prompt's through GPU waves (``gpu_waves.py``),
a decode step's on the CPU beside the GPU in one fused call, or split between PCIe
fills and the CPU by the q* rule (``qsplit.py``). A mixin: ``StreamedExperts`` holds
the state these methods read (its engine, layout, counters, targets)."""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

import torch

from flint.format.reader import ExpertLayout
from flint.graphs.grouped import MAX_GROUP, PairPlan, grouped_experts, grouped_over
from flint.graphs.moe_kernel import (
    ExpertPool,
    available,
    slab_pool,
    slab_unsupported,
    slot_outputs,
)
from flint.graphs.slab_experts import KERNEL_TOKENS
from flint.models.config import ModelConfig
from flint.models.cpu_kernels import FusedKernel, slab_addresses
from flint.models.moe import ExpertMath
from flint.stream.elastic import usable_vram
from flint.stream.gpu_waves import GpuStager, cuda_event
from flint.stream.pinned import PinnedArena
from flint.stream.placement import HostBatch, Target
from flint.stream.prompt_ahead import (
    AREA_SHARE,
    Ahead,
    PromptAhead,
    prompt_ahead_enabled,
    worth_it,
)
from flint.stream.prompt_mem import PromptMemory
from flint.stream.qsplit import QSplit
from flint.stream.slab import slot_bytes
from flint.stream.vram import VramCache

if TYPE_CHECKING:
    from flint import _core
    from flint.stream.backend import Counters


def slab_ready(layout: ExpertLayout) -> bool:
    """Whether the slab kernels (Triton) can compute ``layout``'s experts."""
    return (
        layout.scheme in ("int8", "int4")
        and available() is None
        and slab_unsupported(layout.scheme, layout.group_size) is None
        and layout.group_size <= MAX_GROUP
    )


def early_split(
    counts: list[int], held: dict[int, int], ahead: dict[int, int]
) -> tuple[dict[int, int], dict[int, int], int]:
    """A prompt call's experts by where the early launches find them (``_early``): the
    selected ones (``counts`` > 0) that VRAM holds (``held``: expert -> slot), the
    selected ones copied ahead and not held (``ahead``: expert -> row of the area), and
    how many selected ones are left for the waves."""
    in_vram = {e: s for e, s in held.items() if counts[e]}
    copied = {e: r for e, r in ahead.items() if counts[e] and e not in held}
    rest = sum(1 for e, n in enumerate(counts) if n and e not in held and e not in copied)
    return in_vram, copied, rest


class CudaPlacement:
    """The host-side placement methods of ``StreamedExperts`` (see the module docs)."""

    engine: _core.IoEngine
    layout: ExpertLayout
    counters: Counters
    host: Target | None
    host_fused: FusedKernel | None
    qsplit: QSplit | None
    gpu_waves: bool
    slab_kernels: bool
    math: ExpertMath
    _slab_pools: dict[tuple[int, int, int], ExpertPool]
    _stagers: dict[torch.device, GpuStager]
    _aheads: dict[torch.device, PromptAhead | None]
    _next_layer: dict[int, int]
    _layer_device: dict[int, torch.device]
    vram_of: dict[int, VramCache]
    pinned: PinnedArena | None
    prompt_memory: PromptMemory
    cfg: ModelConfig

    if TYPE_CHECKING:  # defined by StreamedExperts

        def _on(self, device: torch.device) -> Target: ...

        def _wait(self, layer: int, expert: int, proj: int) -> None: ...

        def _expert(
            self,
            t: Target,
            layer: int,
            expert: int,
            slab: torch.Tensor,
            hit: bool,
            xs: torch.Tensor,
        ) -> torch.Tensor: ...

    def _stager(self, device: torch.device) -> GpuStager | None:
        """The GPU-wave buffers of ``device`` (CUDA, ``gpu_waves`` on), made on first use."""
        if not self.gpu_waves or device.type != "cuda":
            return None
        if device not in self._stagers:
            self._stagers[device] = GpuStager(device, self.layout.slab_bytes)
        return self._stagers[device]

    # --- a long prompt's next layer copied up ahead (prompt_ahead.py) ---
    def _copy_ahead(self, layer: int, tokens: int, device: torch.device) -> None:
        """Once a prompt layer's work is queued (its waves', or, where the early
        launches left it none, theirs): the next streamed layer's experts that are
        complete in RAM and not in VRAM, pinned and copied up on the copy stream
        (where ``prompt_ahead.py`` says it helps and is safe)."""
        nxt = self._next_layer.get(layer)
        if (
            nxt is None
            or device.type != "cuda"
            or self.pinned is None  # pageable copies would block the host
            or not worth_it(tokens, self.cfg.top_k, self.cfg.num_experts)
            or self._layer_device.get(nxt, device) != device
            or self.prompt_memory.capacity(nxt) < self.cfg.num_experts  # several waves
            or not prompt_ahead_enabled()
        ):
            return
        vram = self.vram_of.get(nxt)
        if vram is not None and vram.free[nxt]:  # its first use fills VRAM from RAM
            return
        ahead = self._prompt_ahead(device, vram)
        if ahead is None:
            return
        held = vram.where[nxt] if vram is not None else {}
        want = [e for e in self.engine.resident(nxt) if e not in held][: ahead.rows]
        placed = self.engine.pin_resident(nxt, want)  # the complete ones
        if not placed:
            return
        try:
            calls = ahead.queue(nxt, placed)
        except BaseException:  # not queued: nothing would unpin them
            self.engine.unpin(nxt, [e for e, _ in placed])
            raise
        self.counters.copy_bytes += len(placed) * self.layout.slab_bytes
        self.counters.ahead_copied += len(placed)
        self.counters.ahead_copy_calls += calls

    def _prompt_ahead(self, device: torch.device, vram: VramCache | None) -> PromptAhead | None:
        """``device``'s two areas, made on first use: a row for every expert VRAM does
        not hold; None (for good) when they would take more than ``AREA_SHARE`` of the
        usable VRAM."""
        if device in self._aheads:
            return self._aheads[device]
        stager = self._stager(device)
        rows = self.cfg.num_experts - (vram.slots if vram is not None else 0)
        made = None
        if stager is not None and rows > 0:
            need = 2 * rows * self.layout.slab_bytes
            if need <= AREA_SHARE * usable_vram(device):
                made = PromptAhead(device, self.layout.slab_bytes, rows, stager.copies)
        self._aheads[device] = made
        return made

    def _pending_ahead(self, layer: int, device: torch.device) -> Ahead | None:
        """``layer``'s experts copied ahead, or None; the caller queues their work
        (``main`` waits for ``copied``) and then ``_release_ahead``s them."""
        prompt_ahead = self._aheads.get(device)
        return prompt_ahead.pending.pop(layer, None) if prompt_ahead is not None else None

    def _release_ahead(self, ahead: Ahead) -> None:
        """Waits for ``ahead``'s copies (usually landed by now) and unpins their RAM
        slots."""
        ahead.copied.synchronize()
        self.engine.unpin(ahead.layer, ahead.pinned)

    def _from_ahead(
        self,
        layer: int,
        ahead: Ahead,
        experts: list[int],
        x: torch.Tensor,  # [T, H] on the GPU
        plan: PairPlan,
        outputs: torch.Tensor,  # [T*K, H] fp32 on the GPU
    ) -> None:
        """``experts`` (copied ahead) in one grouped launch from their area."""
        main = torch.cuda.current_stream(x.device)
        main.wait_event(ahead.copied)
        pool = self._ahead_pool(layer, ahead, x.device)
        self._grouped(layer, pool, {e: ahead.rows[e] for e in experts}, x, plan, outputs)
        self._ahead_read(ahead, experts, main, x.device)

    def _ahead_pool(self, layer: int, ahead: Ahead, device: torch.device) -> ExpertPool:
        """The kernels' view of ``ahead``'s area, made once per (layer, area)."""
        prompt_ahead = self._aheads[device]
        assert prompt_ahead is not None
        key = (layer, ahead.area)
        pool = prompt_ahead.pools.get(key)
        if pool is None:
            pool = prompt_ahead.pools[key] = self._make_pool(layer, prompt_ahead.area(ahead))
        return pool

    def _ahead_read(
        self, ahead: Ahead, experts: list[int], main: Any, device: torch.device
    ) -> None:
        """The launch reading ``ahead``'s area for ``experts`` is queued on ``main``."""
        prompt_ahead = self._aheads[device]
        assert prompt_ahead is not None
        prompt_ahead.read(ahead, main)
        self.counters.ahead_computed += len(experts)

    def _vram_pool(self, layer: int, vram: VramCache) -> ExpertPool:
        """The kernels' view of ``layer``'s VRAM pool (kept by the cache)."""
        pool = vram.views.get(layer)
        if pool is None:
            pool = vram.views[layer] = self._make_pool(layer, vram.pools[layer])
        return pool

    def _vram_grouped(
        self,
        layer: int,
        vram: VramCache,
        experts: list[int],
        x: torch.Tensor,
        plan: PairPlan,
        outputs: torch.Tensor,
    ) -> None:
        """``experts`` (held in ``vram``) computed from its pool in one launch."""
        where = vram.where[layer]
        slots = {e: where[e] for e in experts}
        self._grouped(layer, self._vram_pool(layer, vram), slots, x, plan, outputs)

    def _early(
        self,
        layer: int,
        vram: VramCache | None,
        ahead: Ahead | None,
        counts: list[int],
        x: torch.Tensor,  # [T, H] on the GPU
        plan: PairPlan,
        outputs: torch.Tensor,  # [T*K, H] fp32 on the GPU
    ) -> tuple[set[int], int]:
        """A prompt's experts that need no wave plan, queued as soon as the router's
        ids reach the host (the GPU idles from then until its next launch): the
        selected ones VRAM holds and the selected ones copied ahead (not held), in one
        grouped call (``grouped_over``: one launch per pool, or, dequantized first
        from ``DEQUANT_TOKENS``, one launch). The waves would send each of them to the
        same pool (no VRAM slot is free), and a pair's bits do not depend on what
        shares its launch. Returns the ones copied ahead and the number of selected
        experts left for the waves."""
        where = vram.where[layer] if vram is not None else {}
        held, early, rest = early_split(counts, where, ahead.rows if ahead is not None else {})
        parts = []
        if vram is not None and held:
            parts.append((self._vram_pool(layer, vram), held))
        main = torch.cuda.current_stream(x.device)
        if ahead is not None and early:
            main.wait_event(ahead.copied)
            parts.append((self._ahead_pool(layer, ahead, x.device), early))
        grouped_over(x, plan, parts, outputs)
        self.counters.gpu_experts += sum(len(slots) for _, slots in parts)
        if ahead is not None and early:
            self._ahead_read(ahead, list(early), main, x.device)
        return set(early), rest

    def _drop_aheads(self) -> None:
        """Unpins whatever a forward that ended early left copied ahead."""
        for prompt_ahead in self._aheads.values():
            if prompt_ahead is not None:
                for ahead in prompt_ahead.drop_all():
                    self.engine.unpin(ahead.layer, ahead.pinned)

    def _free_aheads(self) -> None:
        """Decode has begun: the areas (with the kernels' views of them) go back to
        torch's allocator, where the next prompt's activations or areas reuse them; a
        device with no room stays marked. ``stats()`` keeps counting."""
        self._drop_aheads()
        self._aheads = {d: a for d, a in self._aheads.items() if a is None}

    # --- end of the next layer copied ahead ---

    def _staged(
        self,
        layer: int,
        stager: GpuStager,
        experts: list[tuple[int, int, bool]],
        x: torch.Tensor,  # [T, H] on the GPU
        rows_of: Callable[[int], torch.Tensor],
        outputs: torch.Tensor,  # [T*K, H] fp32 on the GPU
        plan: PairPlan | None = None,  # the slab kernels' pairs
        sync: bool = True,  # return once the copies have landed (see GpuStager.run)
    ) -> None:
        """A wave's experts outside VRAM through the double-buffered staging copies
        (gpu_waves.py), computed on the GPU as from their slots: with the slab kernels
        one grouped launch per chunk, else each expert as its copy lands."""
        t, k = self._on(x.device), outputs.shape[0] // x.shape[0]
        wait = partial(self._wait, layer, proj=2)  # down's flag: the whole slab verified

        def compute(expert: int, slab: torch.Tensor) -> None:
            rows = rows_of(expert)
            y = self._expert(t, layer, expert, slab, True, x[rows // k])
            outputs[rows] = y.to(torch.float32)

        def compute_chunk(chunk: list[int], buffers: torch.Tensor) -> None:
            assert plan is not None
            slot = dict(zip(chunk, range(len(chunk)), strict=True))
            self._grouped(layer, self._slab_pool(layer, buffers), slot, x, plan, outputs)

        if self.slab_kernels and plan is not None:
            stager.run(experts, wait, compute_chunk=compute_chunk, sync=sync)
        else:
            stager.run(experts, wait, compute, sync=sync)
        self.counters.copy_bytes += len(experts) * self.layout.slab_bytes

    def _grouped(
        self,
        layer: int,
        pool: ExpertPool,  # a view of [slots, slab_bytes] slabs on the GPU
        slot: dict[int, int],  # expert -> its slot in ``pool``
        x: torch.Tensor,  # [T, H]
        plan: PairPlan,
        outputs: torch.Tensor,  # [T*K, H] fp32
    ) -> None:
        """The pairs routed to ``slot``'s experts, computed from ``pool`` into their rows
        of ``outputs``: one grouped launch (``flint.graphs.grouped``) for a prompt, the
        slot kernels on the pairs for a few tokens (``moe_kernel.slot_outputs``)."""
        if plan.tokens > KERNEL_TOKENS:
            grouped_experts(x, plan, slot, pool, outputs)
        else:
            assert plan.host_ids is not None
            pairs = [i for i, e in enumerate(plan.host_ids) if e in slot]
            slots = [slot[plan.host_ids[i]] for i in pairs]
            slot_outputs(x, pairs, slots, len(plan.host_ids) // plan.tokens, pool, outputs)
        self.counters.gpu_experts += len(slot)

    def _slab_pool(self, layer: int, slabs: torch.Tensor) -> ExpertPool:
        """The kernels' view of ``slabs`` (~20 tensor views), made once per buffer: for
        the staging buffers, which live as long as their stager. (A VRAM pool's view is
        kept by its cache, which drops it when the pool is replaced.)"""
        key = (layer, slabs.data_ptr(), slabs.shape[0])
        pool = self._slab_pools.get(key)
        if pool is None:
            pool = self._slab_pools[key] = self._make_pool(layer, slabs)
        return pool

    def _make_pool(self, layer: int, slabs: torch.Tensor) -> ExpertPool:
        lay = self.layout
        pool = slab_pool(slabs, lay.scheme, lay.group_size, lay.shapes, lay.proj_offsets)
        return pool.with_math(self.math, layer)

    def _split(
        self, missing: list[tuple[int, int, bool]]
    ) -> tuple[list[tuple[int, int, bool]], list[tuple[int, int, bool]]]:
        """(filled over PCIe, computed on the CPU) of a decode step's missing experts:
        the q* split (``qsplit.py``), the ones already in RAM filled first (a fill waits
        for its bytes on this thread; the CPU's fused call waits inside)."""
        if self.qsplit is None:
            return [], missing
        q = self.qsplit.q(len(missing))
        ranked = sorted(missing, key=lambda e: not e[2])  # hits first, stable
        self.qsplit.record(q, len(missing) - q)
        return ranked[:q], ranked[q:]

    def _fill(
        self,
        layer: int,
        fills: list[tuple[int, int, bool]],
        x: torch.Tensor,  # [T, H] on the GPU
        rows_of: Callable[[int], torch.Tensor],
        outputs: torch.Tensor,  # [T*K, H] fp32 on the GPU
        plan: PairPlan | None = None,  # the slab kernels' pairs
    ) -> tuple[Any, Any, int, float]:
        """Copies ``fills``' slabs up (asynchronous from a page-locked arena) and queues
        their computation on the GPU: with the slab kernels through the staging buffers
        (one launch per chunk), else each from its own copy through torch's kernels;
        returns what ``_observe`` times it by."""
        t, k, lay = self._on(x.device), outputs.shape[0] // x.shape[0], self.layout
        nbytes = len(fills) * lay.slab_bytes
        # events on the stream of the GPU the copies go to (not the current device's:
        # with --device cuda:1 or a layer on a split's second GPU they differ), so the
        # wait in ``_observe`` covers the copies before their slots are unpinned
        stream = torch.cuda.current_stream(x.device) if x.device.type == "cuda" else None
        start = cuda_event(timing=True) if stream is not None else None
        end = cuda_event(timing=True) if stream is not None else None
        if start is not None:
            start.record(stream)
        t0 = time.perf_counter()
        stager = self._stager(x.device) if self.slab_kernels and plan is not None else None
        if stager is not None:
            # no wait for the copies here: the CPU's share starts now, and ``_observe``
            # waits for ``end`` (after these copies and their computation) before the
            # slots are unpinned
            self._staged(layer, stager, fills, x, rows_of, outputs, plan, sync=False)
            fills = []
        for expert, address, hit in fills:
            if not hit:
                self._wait(layer, expert, 2)  # copy verified bytes only
            slab = slot_bytes(address, lay.slab_bytes).to(x.device, non_blocking=True)
            self.counters.copy_bytes += lay.slab_bytes
            rows = rows_of(expert)
            outputs[rows] = self._expert(t, layer, expert, slab, True, x[rows // k]).float()
        if end is not None:
            end.record(stream)
        return start, end, nbytes, time.perf_counter() - t0

    def _observe(
        self,
        queued: tuple[Any, Any, int, float] | None,
        kept: list[tuple[int, int, bool]],
        host_s: float,
    ) -> None:
        """Updates the q* bandwidths from this step: the fills' GPU time (waited for
        here: their source slots are unpinned next) and the CPU's time when none of its
        experts had to wait for a read."""
        qs = self.qsplit
        assert qs is not None
        if queued is not None:
            start, end, nbytes, host_side = queued
            if end is not None:
                end.synchronize()
                qs.observe_pcie(nbytes, start.elapsed_time(end) / 1000)
            else:
                qs.observe_pcie(nbytes, host_side)
        if kept and all(hit for _, _, hit in kept):
            qs.observe_host(len(kept) * self.layout.slab_bytes, host_s)

    def _host_experts(
        self,
        layer: int,
        experts: list[tuple[int, int, bool]],  # (expert, slot address, hit)
        b: HostBatch,
        starts: list[int],
        counts: list[int],
        outputs: torch.Tensor,  # [T*K, H] fp32 on the GPU
    ) -> None:
        """Experts computed on the CPU beside the GPU (model on CUDA, a decode-sized
        batch): one fused call (waits inside), or per expert through torch with
        ``expert_kernels="dequant"`` or for experts the fused kernels do not compute
        (GPT-OSS: ``ExpertMath``); the results go up to ``outputs``."""
        host, k = self.host, b.ids.shape[1]
        assert host is not None
        fused = self.host_fused
        if fused is not None:  # counted here; ``_expert`` counts the torch path's
            self.counters.host_experts += len(experts)
            order = b.order_list
            rows = torch.tensor(
                [p for e, _, _ in experts for p in order[starts[e] : starts[e] + counts[e]]],
                dtype=torch.int64,
            )  # the experts' (token, rank) pairs, expert by expert
            listed = [(e, *slab_addresses(a, self.layout)) for e, a, _ in experts]
            hits = [e for e, _, hit in experts if hit]
            fused.expert_outputs(b.x32, b.ids, listed, b.y, self.engine, layer, hits)
            ys = b.y.index_select(0, rows)
            if outputs.device.type == "cuda":  # page-locked: the copies do not wait for
                rows, ys = rows.pin_memory(), ys.pin_memory()  # the GPU's queued work
            dev = outputs.device
            outputs.index_copy_(0, rows.to(dev, non_blocking=True), ys.to(dev, non_blocking=True))
            return
        for e, address, hit in experts:
            r = b.order[starts[e] : starts[e] + counts[e]]
            slab = slot_bytes(address, self.layout.slab_bytes)
            y = self._expert(host, layer, e, slab, hit, b.x[r // k])
            outputs[r.to(outputs.device)] = y.to(device=outputs.device, dtype=torch.float32)
