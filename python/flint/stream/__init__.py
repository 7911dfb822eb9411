"""Streaming routed experts from NVMe through the RAM expert cache.

``streamed_backend`` builds the expert backend of a model whose experts are read on
demand and by lookahead from its .ftw file (``flint.LLM(..., stream=True)`` uses it).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

import torch

from flint import _core
from flint.models.config import ModelConfig
from flint.models.ftw_source import FtwSource
from flint.models.loading import Placement
from flint.models.moe import expert_math
from flint.stream.backend import StreamedExperts
from flint.stream.pinned import pin_arena, wanted
from flint.stream.plan import StreamPlan, plan_cache
from flint.stream.vram import VramRequest


def _stderr(line: str) -> None:
    print(f"flint: {line}", file=sys.stderr)


def streamed_backend(
    source: FtwSource,
    config: ModelConfig,
    device: torch.device,
    dtype: torch.dtype,
    ram_budget_gib: float | None = None,
    lookahead: int = 2,
    io_workers: int = 8,
    policy: str = "decay",
    chunking: bool = True,
    lookahead_width: float = 1.0,
    expert_kernels: str = "auto",
    usage: bool = True,
    notice: Callable[[str], None] = _stderr,
    vram_budget_gib: float | None = None,
    deterministic: bool = False,
    vram_device: torch.device | None = None,
    vram_free_bytes: Callable[[], int] | None = None,
    backend: type[StreamedExperts] = StreamedExperts,
    lookahead_from: str = "output",
    host_split: str = "auto",
    gpu_waves: bool = True,
    pin_ram: bool | None = None,
    slab_kernels: bool = False,
) -> StreamedExperts:
    """A ``StreamedExperts`` for ``source`` with a RAM cache planned from
    ``ram_budget_gib`` (or free memory); plan notes go to ``notice``, one line each.
    ``usage``: load the usage table beside the model, save it at close, and fill empty
    slots from it when idle (off for benchmarks that must start cold).

    On CUDA a VRAM expert cache of ``vram_budget_gib`` (default: what is free; 0: none)
    is planned once the model is built. ``deterministic`` computes every expert on the
    GPU (none on the CPU), so placement cannot change a bit of the output.
    ``vram_device``/``vram_free_bytes`` put the "VRAM" cache on another device with a
    simulated free size (tests of its logic on a CPU-only machine).
    ``lookahead_from``: predict from each layer's MoE "input" or its "output".
    ``host_split`` (CUDA): a decode step's experts outside VRAM all on the CPU ("cpu"),
    all copied up ("fill"), split between the two by the q* rule ("q": qsplit.py), or
    "auto": fill with the slab kernels and GPU waves, else cpu.
    ``gpu_waves`` (CUDA): a prompt's experts outside VRAM staged through double-buffered
    VRAM copies on a side stream (gpu_waves.py); off: copied per projection.
    ``slab_kernels``: int8/int4 experts computed on the GPU from their slabs in grouped
    Triton launches (the VRAM cache then holds slabs; ``LLM`` turns it on for CUDA with
    graphs); off: each expert through torch's kernels.
    ``pin_ram``: page-lock the RAM expert cache for CUDA copies (default: on when
    ``device`` is CUDA, unless ``FLINT_PIN_RAM=0``; ``flint.stream.pinned``).
    ``backend``: the class built over the engine (``flint.bench`` passes its ``nowait``
    yardstick)."""
    layout = source.expert_layout
    if layout is None:
        raise ValueError(f"{source.path} holds no routed experts to stream")
    streamed = [i for i, sparse in enumerate(config.sparse_layers) if sparse]
    if vram_device is None and device.type == "cuda" and vram_budget_gib != 0:
        vram_device = device
    vram = None
    if vram_device is not None:
        vram = VramRequest(
            vram_device,
            vram_budget_gib,
            notice,
            read_slab=source.expert_slab,
            free_bytes=vram_free_bytes,
        )
    plan = plan_cache(streamed, layout.n_experts, layout.slab_bytes, ram_budget_gib)
    for line in plan.notes:
        notice(line)
    engine = _core.IoEngine(
        str(source.path),
        streamed,
        plan.slots_per_layer,
        policy=policy,
        workers=io_workers,
        chunking=chunking,
    )
    experts = backend(
        config,
        layout,
        engine,
        plan,
        device,
        dtype,
        lookahead,
        lookahead_width,
        expert_kernels,
        idle_fill=usage,
        vram=vram,
        deterministic=deterministic,
        lookahead_from=lookahead_from,
        notice=notice,
        math=expert_math(config, source, Placement(device, dtype)),
        host_split=host_split,
        gpu_waves=gpu_waves,
        slab_kernels=slab_kernels,
    )
    if wanted(device, pin_ram):
        experts.pinned = pin_arena(engine.arena_address, engine.arena_len, experts, notice)
    if usage:
        experts.load_usage(usage_path(source.path), notice)
    if plan.slots_per_layer >= layout.n_experts:
        # every expert fits: read them all now (in the background), none is streamed
        notice("every routed expert fits the RAM budget: reading them all now")
        engine.idle_fill()
    return experts


def slab_kernels_default(graphs: str, device: torch.device) -> bool:
    """Whether a streamed model computes its GPU experts with the slab kernels: on CUDA
    beside the graph step (``graphs`` not "off"), unless ``FLINT_SLAB_KERNELS=0``
    (torch's per-expert kernels, to compare); the layout's own limits are checked by
    the backend (``slab_ready``)."""
    return (
        graphs != "off"
        and device.type == "cuda"
        and os.environ.get("FLINT_SLAB_KERNELS", "1") != "0"
    )


def usage_path(model: Path) -> Path:
    """Where a model's usage table lives: beside the model file when that directory is
    writable, else in flint's cache directory."""
    beside = model.with_name(model.name + ".usage")
    if os.access(model.parent, os.W_OK):
        return beside
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "flint"
    base.mkdir(parents=True, exist_ok=True)
    return base / beside.name


__all__ = [
    "StreamPlan",
    "StreamedExperts",
    "plan_cache",
    "slab_kernels_default",
    "streamed_backend",
    "usage_path",
]
