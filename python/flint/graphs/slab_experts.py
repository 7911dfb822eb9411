"""Resident int8/int4 experts kept as the file's slabs, for the slot-indexed kernels.

``QuantizedResidentExperts`` repacks every projection for torch's quantized kernels,
which take one expert per call. The CUDA graph decode step computes a layer's experts
in one launch by slot index instead (``flint.graphs.moe_kernel``), straight from the
file's bytes: this backend keeps each layer's experts as ``[E, slab_bytes]`` uint8 on
the GPU (what the VRAM expert cache holds too). A prompt's experts (many tokens each)
are dequantized one expert at a time into the model dtype and multiplied by cuBLAS;
a call of at most ``KERNEL_TOKENS`` tokens uses the slot-indexed kernels, so an
eagerly launched decode step and a captured one compute alike.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from flint.format.reader import ExpertLayout
from flint.graphs.moe_kernel import ExpertPool, moe_experts, slab_pool
from flint.models.config import ModelConfig
from flint.models.loading import Placement
from flint.models.moe import dispatch, expert_math
from flint.models.quant_experts import PackedExpertSource

KERNEL_TOKENS = 4  # calls of at most this many tokens use the slot-indexed kernels


class SlabResidentExperts:
    """Every routed expert of every MoE layer, as its .ftw slab, on one GPU."""

    def __init__(self, config: ModelConfig, source: PackedExpertSource, place: Placement) -> None:
        layout = source.expert_layout
        if layout is None or layout.scheme not in ("int8", "int4"):
            raise ValueError("SlabResidentExperts needs int8 or int4 experts")
        self.layout: ExpertLayout = layout
        self.math = expert_math(config, source, place)
        self.dtype = place.dtype
        self.slabs: dict[int, torch.Tensor] = {}  # layer -> [E, slab_bytes] uint8
        self.pools: dict[int, ExpertPool] = {}
        for layer, sparse in enumerate(config.sparse_layers):
            if not sparse:
                continue
            slabs = torch.stack([source.expert_slab(layer, e) for e in range(config.num_experts)])
            self.slabs[layer] = slabs.to(place.device)
            self.pools[layer] = slab_pool(
                self.slabs[layer],
                layout.scheme,
                layout.group_size,
                layout.shapes,
                layout.proj_offsets,
            )

    def _dense(self, layer: int, expert: int, p: int) -> torch.Tensor:
        return self.layout.weight(self.slabs[layer][expert], p).to(self.dtype)

    def __call__(
        self, layer: int, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor
    ) -> torch.Tensor:
        if x.shape[0] <= KERNEL_TOKENS and self.math.plain:
            return moe_experts(x, ids, weights, self.pools[layer])
        m, dense = self.math, self._dense

        def run(e: int, xs: torch.Tensor) -> torch.Tensor:  # [N, H] -> [N, H]
            gate, up = F.linear(xs, dense(layer, e, 0)), F.linear(xs, dense(layer, e, 1))
            return m.output(layer, e, F.linear(m.hidden(layer, e, gate, up), dense(layer, e, 2)))

        return dispatch(x, ids, weights, self.layout.n_experts, run)
