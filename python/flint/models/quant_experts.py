"""Resident routed experts computed on their quantized (int8/int4) layout.

``QuantizedResidentExperts`` reads every expert slab of a .ftw file once, packs each
projection for the kernel chosen at load (``quant_linear.select_kernel``: torch's int8
/ int4 kernel on the device in use, or dequantize-then-matmul) and keeps it resident.
``resident_experts`` picks the resident backend that fits a source and the expert
kernels (``resolve_kernels``): ``FusedResidentExperts`` for "fused" (what "auto" means
on the CPU), else this one for int8/int4 files and ``ResidentExperts`` (float weights)
for everything else.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

from flint.format.reader import ExpertLayout
from flint.models.config import ModelConfig
from flint.models.cpu_kernels import FusedResidentExperts
from flint.models.loading import Placement
from flint.models.moe import ExpertBackend, ResidentExperts, dispatch, expert_math
from flint.models.quant_linear import (
    KERNEL_MODES,
    Notice,
    Packed,
    ProjectionKernel,
    select_kernel,
    stderr_notice,
)
from flint.models.weights import WeightSource

# T = tokens, H = hidden, K = top-k, I = expert intermediate, N = rows routed to one expert

QUANT_SCHEMES = ("int8", "int4")


@runtime_checkable
class PackedExpertSource(Protocol):
    """A source that can hand out routed experts in the .ftw slab layout."""

    @property
    def expert_layout(self) -> ExpertLayout | None: ...

    def expert_slab(self, layer: int, expert: int) -> torch.Tensor: ...

    def tensor(self, name: str) -> torch.Tensor: ...


class QuantizedResidentExperts:
    """Every routed expert of every MoE layer, resident in its packed quantized form."""

    def __init__(
        self,
        config: ModelConfig,
        source: PackedExpertSource,
        place: Placement,
        mode: str = "auto",
        notice: Notice = stderr_notice,
    ) -> None:
        layout = source.expert_layout
        if layout is None or layout.scheme not in QUANT_SCHEMES:
            raise ValueError("QuantizedResidentExperts needs int8 or int4 experts")
        inter, hidden = config.moe_intermediate_size, config.hidden_size
        if layout.shapes != ((inter, hidden), (inter, hidden), (hidden, inter)):
            raise ValueError(f"expert shapes {layout.shapes} do not fit the model's config")
        self.layout = layout
        self.math = expert_math(config, source, place)
        # one kernel per device (layers split across GPUs: each packs onto its own)
        kernels = {
            device: select_kernel(
                layout.scheme, layout.group_size, layout.shapes, device, place.dtype, mode, notice
            )
            for device in place.devices
        }
        self.kernel = kernels[place.device]
        self.kernels: dict[int, ProjectionKernel] = {}  # layer -> its device's kernel
        self.experts: dict[int, list[tuple[Packed, Packed, Packed]]] = {}  # layer -> [E]
        for layer, sparse in enumerate(config.sparse_layers):
            if sparse:
                kernel = self.kernels[layer] = kernels[place.at(layer).device]
                self.experts[layer] = [
                    self._pack(kernel, source.expert_slab(layer, e))
                    for e in range(config.num_experts)
                ]

    def _pack(self, kernel: ProjectionKernel, slab: torch.Tensor) -> tuple[Packed, Packed, Packed]:
        lay, pack = self.layout, kernel.pack
        gate, up, down = (pack(lay.raw(slab, p), *lay.shapes[p]) for p in range(3))
        return gate, up, down

    def __call__(
        self, layer: int, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor
    ) -> torch.Tensor:
        experts, mm, m = self.experts[layer], self.kernels[layer], self.math

        def run(e: int, xs: torch.Tensor) -> torch.Tensor:  # [N, H] -> [N, H]
            gate, up, down = experts[e]
            return m.output(layer, e, mm(m.hidden(layer, e, mm(xs, gate), mm(xs, up)), down))

        return dispatch(x, ids, weights, len(experts), run)


def fused_supported(config: ModelConfig) -> bool:
    """Whether flint's fused CPU kernels compute this family's experts: SwiGLU, no
    biases (not GPT-OSS)."""
    return config.expert_act.kind == "swiglu" and not config.expert_bias


def resolve_kernels(
    mode: str, device: torch.device, family: str, fusable: bool, notice: Notice = stderr_notice
) -> str:
    """The kernels ``mode`` computes experts with on ``device``: "auto" is "fused" on the
    CPU where the fused kernels compute the family's experts (``fusable``), else
    "torch"; "fused" where they do not, or off the CPU, is "torch" with one line to
    ``notice``; "torch" and "dequant" are themselves."""
    if mode not in KERNEL_MODES:
        raise ValueError(f"expert kernels must be one of {', '.join(KERNEL_MODES)}, not {mode!r}")
    if mode == "auto":
        return "fused" if device.type == "cpu" and fusable else "torch"
    if mode != "fused":
        return mode
    if not fusable:
        notice(
            "flint: the fused expert kernels compute SwiGLU experts without biases; "
            f"{family}'s experts use torch's"
        )
        return "torch"
    if device.type != "cpu":
        notice(f"flint: the fused expert kernels run on the CPU only; {device.type} uses torch's")
        return "torch"
    return "fused"


def resident_experts(
    config: ModelConfig,
    source: WeightSource,
    place: Placement,
    mode: str = "auto",
    notice: Notice = stderr_notice,
) -> ExpertBackend:
    """The resident backend for ``source`` with ``mode``'s kernels (``expert_kernels``):
    "fused" computes every scheme with flint's fused CPU kernels (the default on the
    CPU); otherwise int8/int4 experts of a .ftw file go through torch's quantized
    kernels ("dequant": dequantize-then-matmul), float experts through torch's matmul."""
    mode = resolve_kernels(mode, place.device, config.family, fused_supported(config), notice)
    if mode == "fused":
        return FusedResidentExperts(config, source, place)
    if isinstance(source, PackedExpertSource):
        layout = source.expert_layout
        if layout is not None and layout.scheme in QUANT_SCHEMES:
            return QuantizedResidentExperts(config, source, place, mode, notice)
    return ResidentExperts(config, source, place)
