"""A preallocated key/value cache for one sequence, sized from the context length."""

from __future__ import annotations

from collections.abc import Callable

import torch

# L = layers, N = kv heads, S = context length (cache slots), T = new tokens, D = head dim


class KVCache:
    """Keys and values of every layer, [L, N, S, D] each, written in place (values
    [L, N, S, value_dim] where that differs: latent attention caches its latents as
    "keys" and its rotated shared key as "values").

    ``length`` is the number of positions filled; the model advances it once per
    forward, after every layer has written its keys and values. ``tokens`` [S] holds
    the token id of each filled position, so a new request can reuse the positions
    of a prefix it shares with what the cache holds.
    """

    def __init__(
        self,
        layers: int,
        kv_heads: int,
        context_length: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
        value_dim: int | None = None,
    ) -> None:
        if context_length < 1:
            raise ValueError(f"context_length must be >= 1, got {context_length}")
        shape = (layers, kv_heads, context_length, head_dim)
        v_shape = (layers, kv_heads, context_length, value_dim or head_dim)
        self.keys = torch.zeros(shape, dtype=dtype, device=device)
        self.values = torch.zeros(v_shape, dtype=dtype, device=device)
        self.tokens = torch.full((context_length,), -1, dtype=torch.int64, device=device)
        self.context_length = context_length
        self.length = 0

    def write(
        self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Stores k, v [N, T, D] at positions start..start+T-1; returns all keys and
        values [N, start+T, D] of this layer (views, no copy)."""
        end = start + k.shape[1]
        assert end <= self.context_length, "caller checks the context length"
        self.keys[layer, :, start:end] = k
        self.values[layer, :, start:end] = v
        return self.keys[layer, :, :end], self.values[layer, :, :end]

    def reset(self, length: int = 0) -> None:
        """Forgets every position from ``length`` on (stale slots are overwritten later)."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot truncate a cache of {self.length} positions to {length}")
        self.length = length


class SplitKVCache(KVCache):
    """KV cache slots on several devices, for a model whose layers are split across
    GPUs: slot s is row ``rows[s][1]`` of part ``rows[s][0]`` (a ``KVCache`` on the
    device of the layer that owns the slot). ``tokens`` and ``length`` are kept once,
    here; the parts' own are unused."""

    def __init__(
        self, parts: list[KVCache], rows: list[tuple[int, int]], context_length: int
    ) -> None:
        self.parts, self.rows = parts, rows
        self.tokens = torch.full(
            (context_length,), -1, dtype=torch.int64, device=parts[0].tokens.device
        )
        self.context_length = context_length
        self.length = 0

    def write(
        self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        part, row = self.rows[layer]
        return self.parts[part].write(row, start, k, v)


def split_cache(
    make: Callable[[int, torch.device], KVCache],
    slot_devices: list[torch.device],
    context_length: int,
    home: torch.device,
) -> KVCache:
    """One cache for the slots (``slot_devices[s]``: where slot s's layer lives): a plain
    ``KVCache`` from ``make(slots, device)`` when they share a device (``home`` when
    there is no slot), else one part per device holding only that device's slots (a
    ``SplitKVCache``)."""
    devices = list(dict.fromkeys(slot_devices))
    if len(devices) <= 1:
        return make(max(1, len(slot_devices)), devices[0] if devices else home)
    counts = [0] * len(devices)
    rows: list[tuple[int, int]] = []
    for device in slot_devices:
        part = devices.index(device)
        rows.append((part, counts[part]))
        counts[part] += 1
    parts = [make(n, device) for n, device in zip(counts, devices, strict=True)]
    return SplitKVCache(parts, rows, context_length)
