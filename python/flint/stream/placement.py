"""Where a streamed expert is computed when the model runs on CUDA: on the GPU (from
its VRAM copy, or copied up from its RAM slot) or on the CPU beside it (a decode-sized
batch, from the RAM slot, no copy). The backend (``backend.py``) decides per expert;
this module holds what a decision needs."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from flint.models.quant_linear import ProjectionKernel


@dataclass(slots=True, frozen=True)
class Target:
    """Where an expert is computed: device, activation dtype, quantized kernel."""

    device: torch.device
    dtype: torch.dtype
    kernel: ProjectionKernel | None


# On CUDA, experts outside VRAM are computed on the CPU only in forwards of at most
# this many tokens (decode steps); a prompt's are copied up and computed on the GPU,
# where PCIe (~55 GB/s pinned on the H200 box) beats CPU compute of a many-row batch:
# V1 pp512 ran at 23 tok/s with those experts on the CPU (docs/benchmarks.md).
HOST_MAX_TOKENS = 8


class HostBatch:
    """A forward's tokens on the CPU, copied once before the GPU's work is queued:
    x in the host target's dtype (torch path) and in fp32 (fused path), ids, the row
    order (both passed from the host: no copy), and a fp32 output buffer for the fused
    call."""

    def __init__(
        self, x: torch.Tensor, ids: torch.Tensor, order: torch.Tensor, dtype: torch.dtype
    ) -> None:
        cpu = torch.device("cpu")
        host = x.to(cpu)  # one copy off the device; the casts below are on the CPU
        self.x32 = host.to(torch.float32).contiguous()  # [T, H]
        self.x = self.x32 if dtype == torch.float32 else host.to(dtype)
        self.ids = ids.to(cpu).contiguous()  # [T, K]
        self.order = order.cpu()  # [T*K]
        self.order_list: list[int] = self.order.tolist()
        self.y = torch.empty(ids.numel(), x.shape[1], dtype=torch.float32)  # [T*K, H]
