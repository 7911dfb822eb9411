"""The configurations ``flint bench`` compares (BENCHMARKS.md, "Yardsticks"):

- ``resident``: every expert loaded; the ceiling of the path and the control whose
  greedy tokens every streamed mode must reproduce.
- ``full``: the streaming engine as configured (policy, lookahead, chunking, workers).
- ``naive``: the same O_DIRECT engine, workers and budget with prediction off
  (lookahead 0), chunking off and LRU: a layer's misses are read in parallel on demand.
- ``nowait``: nothing is read while timing: the cache's slots are filled once with
  the first experts of each layer, and every selected expert is computed from one of
  them (expert e from the layer's slot e mod slots). Same kernels, shapes and slot
  views as a hit in ``full``, so the clock shows the compute ceiling of streaming;
  the output is garbage by construction and is not compared.

A streamed mode may name its own ``--host-split`` as ``MODE:SPLIT`` (``full:fill``), so
two ways of computing a CUDA decode step's experts outside VRAM run interleaved in one
bench, on the same machine state.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from flint.api import LLM, resolve_devices, resolve_dtype
from flint.models import parse_config
from flint.models.cpu_kernels import slab_addresses
from flint.models.ftw_source import FtwSource
from flint.models.moe import weighted_sum
from flint.stream import StreamedExperts, slab_kernels_default, streamed_backend
from flint.stream.qsplit import HOST_SPLITS
from flint.stream.slab import slot_bytes

MODES = ("resident", "full", "naive", "nowait")
POLICIES = ("decay", "lru", "lfu")

# T = tokens, H = hidden, K = top-k


@dataclass(slots=True, frozen=True)
class Engine:
    """The streaming settings of ``full`` (``naive`` and ``nowait`` fix their own)."""

    ram_budget: float | None = None
    lookahead: int = 2
    io_workers: int = 8
    chunking: bool = True
    policy: str = "decay"
    lookahead_width: float = 1.0  # experts predicted per layer, x top-k (benches/ only)
    vram_budget: float | None = None  # CUDA: GiB for the VRAM expert cache (0: none)
    deterministic: bool = False  # CUDA: every expert on the GPU
    lookahead_from: str = "output"  # predict from each layer's MoE input or output
    host_split: str = "auto"  # CUDA: a decode step's missing experts: auto, cpu, fill or q*
    gpu_waves: bool = True  # CUDA: prompt experts through double-buffered VRAM staging

    def validate(self) -> None:
        if self.ram_budget is not None and not self.ram_budget >= 0:
            raise ValueError(f"--ram-budget must be >= 0 GiB, got {self.ram_budget}")
        if self.vram_budget is not None and not self.vram_budget >= 0:
            raise ValueError(f"--vram-budget must be >= 0 GiB, got {self.vram_budget}")
        if not 0 <= self.lookahead <= 3:
            raise ValueError(f"--lookahead must be 0..3, got {self.lookahead}")
        if not 1 <= self.io_workers <= 256:
            raise ValueError(f"--io-workers must be 1..256, got {self.io_workers}")
        if self.lookahead_from not in ("input", "output"):
            raise ValueError(
                f"--lookahead-from must be input or output, not {self.lookahead_from!r}"
            )
        if self.host_split not in HOST_SPLITS:
            raise ValueError(f"--host-split must be one of {', '.join(HOST_SPLITS)}")
        if self.policy not in POLICIES:
            raise ValueError(f"--policy must be one of {', '.join(POLICIES)}, not {self.policy!r}")


class NoWaitExperts(StreamedExperts):
    """The ``nowait`` yardstick (module docs): computes every selected expert from a
    slot filled at start; no reads, no engine calls, no prediction while timing."""

    def fill(self) -> None:
        """Reads the first ``slots`` experts of every streamed layer and keeps them
        pinned: their slots are never evicted."""
        self.addresses: dict[int, list[int]] = {}
        n = min(self.capacity, self.cfg.num_experts)
        for layer in self.plan.streamed_layers:
            placed = self.engine.place(layer, list(range(n)))
            self.addresses[layer] = [self.engine.wait(layer, e, 2) for e, *_ in placed]

    def observe(self, layer: int, h: torch.Tensor) -> None:
        """No prediction: nothing is ever read."""

    def __call__(
        self, layer: int, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor
    ) -> torch.Tensor:
        if layer == self.first_layer:
            self.counters.tokens += 1
        tokens, k = ids.shape
        flat = ids.reshape(-1)  # [T*K]
        outputs = torch.empty(tokens * k, x.shape[1], dtype=torch.float32, device=x.device)
        slots = self.addresses[layer]
        if self.fused is not None:  # the fused kernels, as full and naive compute
            listed = [
                (e, *slab_addresses(slots[e % len(slots)], self.layout))
                for e in dict.fromkeys(flat.tolist())
            ]
            x32 = x.to(torch.float32).contiguous()
            self.fused.expert_outputs(x32, ids.contiguous(), listed, outputs)
            return self.fused.weighted_sum(outputs, weights).to(x.dtype)
        for expert in dict.fromkeys(flat.tolist()):
            rows = (flat == expert).nonzero().squeeze(1)  # [N]
            address = slots[expert % len(slots)]
            slab = slot_bytes(address, self.layout.slab_bytes)
            y = self._expert(self.main, layer, expert, slab, True, x[rows // k])
            outputs[rows] = y.float()
        return weighted_sum(outputs.view(tokens, k, -1), weights).to(x.dtype)


@dataclass(slots=True, frozen=True)
class Setup:
    """Everything but the mode that decides how a model is loaded for the bench."""

    model: Path
    device: str | None = None
    dtype: str | None = None
    context_length: int = 1024
    expert_kernels: str = "auto"
    engine: Engine = Engine()
    graphs: str = "auto"  # every mode's CUDA decode step (flint.graphs.GRAPH_MODES)


def mode_of(spec: str) -> tuple[str, str | None]:
    """``full`` -> ("full", None), ``full:fill`` -> ("full", "fill"): the mode and the
    host split it names (None: the bench's ``--host-split``)."""
    mode, colon, split = spec.partition(":")
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; use {', '.join(MODES)}")
    if not colon:
        return mode, None
    if mode == "resident":
        raise ValueError("resident computes every expert where it lives: no host split")
    if split not in HOST_SPLITS:
        raise ValueError(f"{spec!r}: the host split must be one of {', '.join(HOST_SPLITS)}")
    return mode, split


def load(spec: str, setup: Setup, notice: Callable[[str], None]) -> LLM:
    """A fresh model in mode ``spec`` (``mode_of``); streamed modes start cold (no usage
    table, no idle fill), so every run measures the same thing; a model whose experts
    all fit the RAM budget is returned once they are all read (as its load starts
    them)."""
    mode, split = mode_of(spec)
    if split is not None:
        setup = replace(setup, engine=replace(setup.engine, host_split=split))
    if mode == "resident":
        return LLM(
            setup.model,
            device=setup.device,
            dtype=setup.dtype,
            context_length=setup.context_length,
            expert_kernels=setup.expert_kernels,
            stream=False,
            graphs=setup.graphs,
        )
    if setup.model.is_dir():
        raise ValueError(f"mode {mode} streams from a .ftw file; {setup.model} is a directory")
    source = FtwSource(setup.model)
    device = resolve_devices(setup.device)[0]  # the first GPU of a split
    e = setup.engine
    naive = mode == "naive"
    backend = streamed_backend(
        source,
        parse_config(source.config),
        device,
        resolve_dtype(setup.dtype, device),
        e.ram_budget,
        lookahead=e.lookahead if mode == "full" else 0,
        lookahead_width=e.lookahead_width,
        io_workers=e.io_workers,
        policy="lru" if naive else e.policy,
        chunking=e.chunking and not naive,
        expert_kernels=setup.expert_kernels,
        usage=False,
        notice=notice,
        vram_budget_gib=e.vram_budget,
        deterministic=e.deterministic,
        lookahead_from=e.lookahead_from,
        host_split=e.host_split,
        gpu_waves=e.gpu_waves,
        slab_kernels=slab_kernels_default(setup.graphs, device),
        backend=NoWaitExperts if mode == "nowait" else StreamedExperts,
    )
    if isinstance(backend, NoWaitExperts):
        backend.fill()
    llm = LLM(
        source,
        device=setup.device,
        dtype=setup.dtype,
        context_length=setup.context_length,
        expert_backend=backend,
        expert_kernels=setup.expert_kernels,
        graphs=setup.graphs,
    )
    # Every expert fits the RAM budget (V1): the load started reading them all in the
    # background; the rows measure the model with its experts in RAM, not that read.
    waited, during, total = backend.wait_for_fill()
    if total:
        rate = f", {during / waited / 1e9:.2f} GB/s" if waited > 0.1 else ""
        notice(
            f"every expert fits the RAM budget: waited {waited:.1f} s for the rest of "
            f"their read ({during / (1 << 30):.2f} of {total / (1 << 30):.2f} GiB{rate})"
        )
    return llm
