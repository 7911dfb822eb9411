"""Several GPUs in one process: consecutive decoder layers assigned to GPUs by their free
memory (a pipeline split; the hidden state moves once per boundary per token, and back
to the first GPU at the end of a forward).

Each layer's cost is planned from the config's shapes: its dense weights (attention,
dense MLP or router and shared experts), its routed experts when they are resident (a
streamed model keeps them in the RAM cache and each GPU's own VRAM expert cache, sized
after loading from what is left), and its KV cache. The embedding, final norm and LM
head stay on the first GPU (the logits come back where generation samples them).
Layers are cut in proportion to each GPU's free memory (less the embedding and head on
the first), which leaves every GPU about the same free memory per layer for its VRAM
expert cache. The split never
changes what a layer computes: every op runs on one device with the same inputs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from flint.models.config import ModelConfig

GIB = 1 << 30
HEADROOM_FRACTION = 0.10  # of each GPU's free memory, kept for activations and others
HEADROOM_MIN = 1 << 30


def free_bytes(device: torch.device) -> int:
    """What ``device`` has free: the CUDA driver's count, or free RAM for the CPU."""
    from flint.stream.plan import available_memory
    from flint.stream.vram import free_vram

    return free_vram(device) if device.type == "cuda" else available_memory()


def layer_costs(
    config: ModelConfig,
    dtype: torch.dtype,
    context_length: int,
    expert_bytes: int | None,
) -> tuple[list[int], int, int]:
    """Bytes per decoder layer, then of the embedding and of the final norm + LM head
    (both on the first device).
    ``expert_bytes``: one routed expert's bytes when the experts are resident (None:
    streamed, not on the GPUs)."""
    b = torch.tensor([], dtype=dtype).element_size()
    h, d, n, nkv = config.hidden_size, config.head_dim, config.num_heads, config.num_kv_heads
    m = config.mla
    if m is not None:
        q_in = m.q_lora_rank or h
        rope, nope = m.qk_rope_head_dim, m.qk_nope_head_dim
        attention = (h * m.q_lora_rank if m.q_lora_rank else 0) + q_in * n * (nope + rope)
        attention += h * (m.kv_lora_rank + rope) + m.kv_lora_rank * n * (nope + m.v_head_dim)
        attention += n * m.v_head_dim * h
        kv = context_length * (m.kv_lora_rank + rope) * b
    else:
        attention = h * n * d * 2 + h * nkv * d * 2
        kv = context_length * nkv * d * 2 * b
    la = config.linear_attention
    costs: list[int] = []
    for layer, sparse in enumerate(config.sparse_layers):
        linear = la is not None and la.layers[layer]
        if sparse:
            mlp = config.num_experts * h + 3 * h * config.shared_expert_intermediate_size
            mlp *= b
            if expert_bytes is not None:
                mlp += config.num_experts * expert_bytes
        else:
            mlp = 3 * h * config.intermediate_size * b
        costs.append(attention * b + mlp + (0 if linear else kv))
    embed = config.vocab_size * h * b
    head = h * b + (0 if config.tie_word_embeddings else config.vocab_size * h * b)
    return costs, embed, head


@dataclass(slots=True, frozen=True)
class DeviceSplit:
    """Which device holds each decoder layer, and the planned bytes per device."""

    devices: tuple[torch.device, ...]
    layer_device: tuple[int, ...]  # per layer: index into ``devices``
    planned: tuple[int, ...]  # bytes per device (its layers, embedding / head)
    free: tuple[int, ...]
    notes: tuple[str, ...] = ()  # a device whose share looks too large for it

    def layers_of(self, i: int) -> list[int]:
        return [layer for layer, d in enumerate(self.layer_device) if d == i]

    @property
    def layer_devices(self) -> tuple[torch.device, ...]:
        return tuple(self.devices[d] for d in self.layer_device)

    def describe(self) -> list[str]:
        """One line per device."""
        out = []
        for i, device in enumerate(self.devices):
            layers = self.layers_of(i)
            span = f"layers {layers[0]}-{layers[-1]}" if layers else "no layers"
            out.append(
                f"{device}: {span} ({len(layers)}), {self.planned[i] / GIB:.2f} GiB of "
                f"weights and KV cache planned, {self.free[i] / GIB:.2f} GiB free"
            )
        return out


def plan_split(
    devices: list[torch.device],
    costs: list[int],
    embed: int,
    head: int,
    free: Callable[[torch.device], int] = free_bytes,
) -> DeviceSplit:
    """Consecutive layers to ``devices`` in proportion to what each has free once the
    first one holds the embedding and LM head, so every device keeps about the same
    free memory per layer (the room its VRAM expert cache divides among its layers);
    layer 0 goes to the first device, no device is skipped, and each gets at least one
    layer while there are enough (a GPU with no room for its layer still gets it: name
    the GPUs to use, e.g. ``cuda:0,cuda:2``, to leave one out). A device whose share
    does not fit what it has free after headroom is named in ``notes`` (the costs are
    estimates: the load goes ahead)."""
    if not devices:
        raise ValueError("no device to place the model on")
    room = [free(d) for d in devices]
    capacity = [max(0, r) for r in room]
    capacity[0] = max(0, capacity[0] - embed - head)
    scale = sum(costs) / max(1, sum(capacity))
    ends, acc = [], 0.0
    for c in capacity:
        acc += c * scale
        ends.append(acc)
    layer_device: list[int] = []
    done, d, n = 0, 0, len(costs)
    for i, cost in enumerate(costs):
        mid = done + cost / 2
        while d < len(devices) - 1 and mid > ends[d]:
            d += 1
        if n >= len(devices):  # every device gets at least one layer
            d = min(max(d, len(devices) - (n - i)), i)
        # consecutive and no device skipped; layer 0 beside the embedding, on the first
        d = min(max(d, layer_device[-1]), layer_device[-1] + 1) if layer_device else 0
        layer_device.append(d)
        done += cost
    planned = [0] * len(devices)
    for i, d_i in enumerate(layer_device):
        planned[d_i] += costs[i]
    planned[0] += embed + head  # always on the first device
    notes = []
    for i, device in enumerate(devices):
        usable = room[i] - max(HEADROOM_MIN, int(room[i] * HEADROOM_FRACTION))
        if planned[i] > usable:
            notes.append(
                f"{device} is planned {planned[i] / GIB:.2f} GiB of weights and KV cache but "
                f"has {max(0, usable) / GIB:.2f} GiB usable ({room[i] / GIB:.2f} GiB free): it "
                "may run out of memory; stream the experts (--ram-budget) or shorten "
                "--context-length"
            )
    return DeviceSplit(
        tuple(devices), tuple(layer_device), tuple(planned), tuple(room), tuple(notes)
    )
