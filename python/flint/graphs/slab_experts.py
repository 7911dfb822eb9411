"""Resident int8/int4 experts kept as the file's slabs, for the slot-indexed kernels.

``QuantizedResidentExperts`` repacks every projection for torch's quantized kernels,
which take one expert per call. The CUDA graph decode step computes a layer's experts
in one launch by slot index instead (``flint.graphs.moe_kernel``), straight from the
file's bytes: this backend keeps each layer's experts as ``[E, slab_bytes]`` uint8 on
the GPU (what the VRAM expert cache holds too). A call of at most ``KERNEL_TOKENS``
tokens uses the slot-indexed kernels, so an eagerly launched decode step and a
captured one compute alike. A longer prompt's experts are grouped matrix products
straight from the slabs (``flint.graphs.grouped``, two launches per layer). Without
Triton the selected experts are dequantized into the model dtype a chunk at a time by
torch's ops and multiplied by torch (the earlier CUDA path, with a Triton dequantizing
launch: 30B-A3B int4 prefilled 512 tokens at 298 tok/s on the H200).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from flint.format.constants import SCALE_ALIGN
from flint.format.reader import ExpertLayout
from flint.graphs.grouped import MAX_GROUP, grouped_experts, pair_plan, prompt_sum
from flint.graphs.moe_kernel import ExpertPool, available, moe_experts, slab_pool
from flint.models.config import ModelConfig
from flint.models.loading import Placement
from flint.models.moe import dispatch, expert_math
from flint.models.quant_experts import PackedExpertSource

# Calls of at most this many tokens use the slot-indexed kernels (each (token, rank)
# pair reads its expert: ~24 us per token per 30B-A3B layer on the H200, against a
# measured 634 ms time to first token for a short prompt through the dequantizing path
# on a 12-layer model); longer prompts dequantize each selected expert once.
KERNEL_TOKENS = 32
DEQUANT_BYTES = 256 << 20  # f32 bytes of the experts a prompt dequantizes at once


class SlabResidentExperts:
    """Every routed expert of every MoE layer, as its .ftw slab, on one GPU."""

    def __init__(self, config: ModelConfig, source: PackedExpertSource, place: Placement) -> None:
        layout = source.expert_layout
        if layout is None or layout.scheme not in ("int8", "int4"):
            raise ValueError("SlabResidentExperts needs int8 or int4 experts")
        self.layout: ExpertLayout = layout
        # what bench and stats name the resident experts' kernels by
        self.name = f"flint Triton slot kernels ({layout.scheme}; prompts: grouped)"
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
            ).with_math(self.math, layer)

    def _dequantize(self, layer: int, experts: list[int]) -> list[tuple[torch.Tensor, ...]]:
        """``experts``' three projections in the model dtype, dequantized together with
        the file's rule (f32 ``q * scale``, then the cast, as ``ExpertLayout.weight``)."""
        lay, slabs = self.layout, self.slabs[layer]
        index = torch.tensor(experts, device=slabs.device)
        n = len(experts)
        picked = slabs.index_select(0, index)
        dense = []
        for p in range(3):
            rows, cols = lay.shapes[p]
            raw = picked[:, lay.proj_offsets[p] : lay.proj_offsets[p] + lay.proj_bytes[p]]
            if lay.scheme == "int8":
                nbytes = rows * cols
                at = nbytes + (-nbytes % SCALE_ALIGN)
                q = raw[:, :nbytes].view(torch.int8).reshape(n, rows, cols)
                scale = raw[:, at : at + rows * 4].view(torch.float32)
                w = q.float() * scale[:, :, None]
            else:
                nbytes, groups = rows * cols // 2, cols // lay.group_size
                at = nbytes + (-nbytes % SCALE_ALIGN)
                packed = raw[:, :nbytes].reshape(n, rows, cols // 2)
                lo = (packed & 0x0F).to(torch.int8) - 8
                hi = (packed >> 4).to(torch.int8) - 8
                q = torch.stack([lo, hi], dim=-1).reshape(n, rows, groups, lay.group_size)
                scale = raw[:, at : at + rows * groups * 2].view(torch.bfloat16)
                w = (q.float() * scale.reshape(n, rows, groups, 1).float()).reshape(n, rows, cols)
            dense.append(w.to(self.dtype))
        return [tuple(d[j] for d in dense) for j in range(n)]

    def __call__(
        self, layer: int, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor
    ) -> torch.Tensor:
        if x.shape[0] <= KERNEL_TOKENS:
            return moe_experts(x, ids, weights, self.pools[layer])
        if available() is None and self.layout.group_size <= MAX_GROUP:
            tokens, k = ids.shape
            out = torch.empty(tokens * k, x.shape[1], dtype=torch.float32, device=x.device)
            plan = pair_plan(ids, self.layout.n_experts, x.device)
            every = {e: e for e in range(self.layout.n_experts)}
            grouped_experts(x, plan, every, self.pools[layer], out)
            return prompt_sum(out, weights, x.dtype)
        m = self.math
        selected = torch.unique(ids).tolist()  # ascending: the order dispatch runs them in
        at = {e: i for i, e in enumerate(selected)}
        per_expert = 4 * sum(r * c for r, c in self.layout.shapes)
        chunk = max(1, DEQUANT_BYTES // per_expert)
        held: dict[int, tuple[torch.Tensor, ...]] = {}

        def run(e: int, xs: torch.Tensor) -> torch.Tensor:  # [N, H] -> [N, H]
            if e not in held:
                held.clear()
                batch = selected[at[e] : at[e] + chunk]
                held.update(zip(batch, self._dequantize(layer, batch), strict=True))
            g, u, d = held[e]
            hidden = m.hidden(layer, e, F.linear(xs, g), F.linear(xs, u))
            return m.output(layer, e, F.linear(hidden, d))

        return dispatch(x, ids, weights, self.layout.n_experts, run)
