"""Matmuls on quantized expert projections: torch's int8/int4 kernels, or dequantize.

A ``ProjectionKernel`` turns one projection's bytes from the .ftw file into what it
computes with (``pack``, once, at load, on the device in use) and computes
``y = x @ W.T`` from them (``__call__``, per token). Kernels:

- ``Int8Mm``: ``aten._weight_int8pack_mm(x, q, scales)``, per-row scales, as stored.
- ``Int4MmCpu`` / ``Int4MmCuda``: ``aten._weight_int4pack_mm[_for_cpu]`` on the layout
  ``aten._convert_weight_to_int4pack[_for_cpu]`` produces. torch dequantizes a nibble n
  as ``(n - 8) * scale + zero`` per group; the file stores ``n = q + 8`` with
  ``w = q * scale`` (symmetric, no zero point), so every zero is 0. torch's CUDA packer
  wants element 2j in the high nibble, the file has it in the low one: nibbles swap.
- ``DequantMm``: dequantize (f32, as ``FtwFile.expert`` does) then ``F.linear``, on use.
  The reference every kernel is checked against and the fallback when one fails.

``select_kernel`` probes the torch kernel once, at load, on random weights of each of the
model's projection shapes against ``DequantMm``, and falls back with one printed line.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Sequence
from typing import Protocol

import torch
import torch.nn.functional as F

from flint.format.quant import (
    dequantize_int4,
    encode_projection,
    split_int4,
    split_int8,
    unpack_int4,
)

# M = tokens, N = output features (rows), K = input features (cols), G = K / group size

Packed = tuple[torch.Tensor, ...]
Notice = Callable[[str], None]
# auto: "fused" on the CPU (where the fused kernels compute the family's experts), else
# "torch"; torch: torch's quantized kernels; dequant: dequantize-then-matmul; fused:
# flint.models.cpu_kernels, CPU only
KERNEL_MODES = ("auto", "torch", "dequant", "fused")


class ProjectionKernel(Protocol):
    name: str
    dtype: torch.dtype  # the activation dtype it computes in

    def pack(self, raw: torch.Tensor, rows: int, cols: int) -> Packed:
        """One projection's bytes from the file (uint8, 1-D, CPU) -> device tensors."""
        ...

    def __call__(self, x: torch.Tensor, w: Packed) -> torch.Tensor:
        """x [M, K] in the model dtype -> [M, N] in the same dtype."""
        ...


class DequantMm:
    """Dequantize to f32, cast to x's dtype, ``F.linear``: the reference and fallback."""

    name = "dequantize-then-matmul"

    def __init__(self, scheme: str, group: int, device: torch.device, dtype: torch.dtype) -> None:
        self.scheme, self.group, self.device, self.dtype = scheme, group, device, dtype

    def pack(self, raw: torch.Tensor, rows: int, cols: int) -> Packed:
        if self.scheme == "int8":
            q, scale = split_int8(raw, rows, cols)  # [N, K] int8, [N] f32
            return q.to(self.device), scale.to(self.device)
        packed, scale4 = split_int4(raw, rows, cols, self.group)  # [N, K/2] u8, [N, G] bf16
        return unpack_int4(packed).to(self.device), scale4.to(self.device)

    def __call__(self, x: torch.Tensor, w: Packed) -> torch.Tensor:
        q, scale = w
        dense = q.float() * scale[:, None] if self.scheme == "int8" else dequantize_int4(q, scale)
        return F.linear(x, dense.to(x.dtype))


def compute_dtype(device: torch.device, dtype: torch.dtype) -> torch.dtype:
    """The activation dtype torch's quantized kernels run in. On the CPU their float32
    paths are slow references, so they run in bf16 (x cast in, the result cast back):
    int4 768x2048 at one token took 179 us in bf16 against 5.2 ms in f32, int8 70 us
    against 2.5 ms (CPU box, 2 threads, torch 2.15, 2026-11-29)."""
    return torch.bfloat16 if device.type == "cpu" else dtype


class Int8Mm:
    """``aten._weight_int8pack_mm``: int8 weights [N, K], scales [N] in the compute dtype."""

    name = "torch _weight_int8pack_mm"

    def __init__(self, device: torch.device, dtype: torch.dtype) -> None:
        self.device, self.dtype = device, compute_dtype(device, dtype)

    def pack(self, raw: torch.Tensor, rows: int, cols: int) -> Packed:
        """One copy of the bytes to the device (none if there), q a view of it."""
        q, scale = split_int8(raw.to(self.device), rows, cols)
        return q, scale.to(self.dtype)

    def __call__(self, x: torch.Tensor, w: Packed) -> torch.Tensor:
        out: torch.Tensor = torch.ops.aten._weight_int8pack_mm(x.to(self.dtype), w[0], w[1])
        return out.to(x.dtype)


# a float dtype's width -> (an unsigned int of that width, a signed int twice as wide)
_WIDEN = {2: (torch.uint16, torch.int32), 4: (torch.uint32, torch.int64)}


def _scales_and_zeros(scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """scales [N, G] -> torch's [G, N, 2] (scale, zero) with every zero 0 (see above), in
    one transposing copy (a pack is launch-bound): each scale's bits zero-extended to
    twice their width read, little-endian, as the pair (scale, +0)."""
    s = scale.to(dtype)
    narrow, wide = _WIDEN[s.element_size()]
    pairs = s.view(narrow).t().to(wide, memory_format=torch.contiguous_format)  # [G, N]
    return pairs.view(dtype).view(*pairs.shape, 2)


def _swap_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """uint8 bytes with their two nibbles swapped, in two ops: (b >> 4) + 16 b, the
    product wrapping to its low nibble shifted up (uint8 arithmetic is modulo 256)."""
    return torch.add(packed >> 4, packed, alpha=16)


def torch_packer_inputs(
    packed: torch.Tensor, scale: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(nibble-swapped bytes [N, K/2], scales and zeros [G, N, 2]) for torch's CUDA int4
    packer and kernel, from the file's bytes [N, K/2] and the scales [N, G] in the
    compute dtype: three torch ops. (One Triton launch writing both was measured
    slower on the H200: 0.100-0.107 ms per pack against 0.093-0.096, docs/benchmarks.md;
    the launch of torch's packer dominates either way.)"""
    return _swap_nibbles(packed), _scales_and_zeros(scale, scale.dtype)


@functools.cache
def _inner_k_tiles(cols: int) -> int:
    """tinygemm's inner K tiles for K = ``cols``: the most that divide it."""
    return next((t for t in (8, 4, 2) if cols % (16 * t) == 0), 2)


class Int4MmCpu:
    """``aten._weight_int4pack_mm_for_cpu`` on ``_convert_weight_to_int4pack_for_cpu``."""

    name = "torch _weight_int4pack_mm_for_cpu"

    def __init__(self, group: int, dtype: torch.dtype) -> None:
        self.group, self.dtype = group, compute_dtype(torch.device("cpu"), dtype)

    def pack(self, raw: torch.Tensor, rows: int, cols: int) -> Packed:
        packed, scale = split_int4(raw, rows, cols, self.group)
        nibbles = unpack_int4(packed).to(torch.int32) + 8  # [N, K] in 0..15
        w = torch.ops.aten._convert_weight_to_int4pack_for_cpu(nibbles, 2)
        return w, _scales_and_zeros(scale, self.dtype)

    def __call__(self, x: torch.Tensor, w: Packed) -> torch.Tensor:
        xc = x.to(self.dtype)
        out: torch.Tensor = torch.ops.aten._weight_int4pack_mm_for_cpu(xc, w[0], self.group, w[1])
        return out.to(x.dtype)


class Int4MmCuda:
    """``aten._weight_int4pack_mm`` (bf16 activations) on ``_convert_weight_to_int4pack``."""

    name = "torch _weight_int4pack_mm"

    def __init__(self, group: int, device: torch.device, dtype: torch.dtype) -> None:
        self.group, self.device, self.dtype = group, device, dtype

    def pack(self, raw: torch.Tensor, rows: int, cols: int) -> Packed:
        """Four launches once the bytes are on the device (copied up whole if not; a
        pack per streamed projection is launch-bound): the packer's inputs (the nibbles
        swapped, element 2j to the high one; the scales and zeros), then torch's packer."""
        packed, scale = split_int4(raw.to(self.device), rows, cols, self.group)
        swapped, scales_and_zeros = torch_packer_inputs(packed, scale.to(self.dtype))
        w = torch.ops.aten._convert_weight_to_int4pack(swapped, _inner_k_tiles(cols))
        return w, scales_and_zeros

    def __call__(self, x: torch.Tensor, w: Packed) -> torch.Tensor:
        out: torch.Tensor = torch.ops.aten._weight_int4pack_mm(x, w[0], self.group, w[1])
        return out


def torch_kernel(
    scheme: str, group: int, device: torch.device, dtype: torch.dtype
) -> ProjectionKernel:
    """torch's kernel for ``scheme`` on ``device`` (not yet probed)."""
    if scheme == "int8":
        return Int8Mm(device, dtype)
    if scheme == "int4":
        return Int4MmCpu(group, dtype) if device.type == "cpu" else Int4MmCuda(group, device, dtype)
    raise ValueError(f"no quantized kernel for expert scheme {scheme!r}")


def probe(
    kernel: ProjectionKernel,
    reference: DequantMm,
    shapes: Sequence[tuple[int, int]],
    dtype: torch.dtype,
) -> str | None:
    """Runs ``kernel`` and ``reference`` on random weights of every shape (rows, cols)
    quantized as in the file; None if they agree, else why not."""
    gen = torch.Generator().manual_seed(0)
    tol = 1e-3 if kernel.dtype == torch.float32 else 2e-2  # of the largest |output|
    for rows, cols in sorted(set(shapes)):
        w = torch.randn(rows, cols, generator=gen)
        raw = encode_projection(w, reference.scheme, reference.group)
        x = torch.randn(3, cols, generator=gen).to(reference.device, dtype)  # [M, K]
        try:
            got = kernel(x, kernel.pack(raw, rows, cols)).float()
        except (RuntimeError, NotImplementedError, TypeError, ValueError) as err:
            return str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        want = reference(x, reference.pack(raw, rows, cols)).float()
        if got.shape != want.shape:
            return f"output shape {tuple(got.shape)}, expected {tuple(want.shape)}"
        err_max = (got - want).abs().max().item()
        if not err_max <= tol * want.abs().max().item():  # also catches NaN
            return f"max error {err_max:.3g} on a [{rows}, {cols}] projection"
    return None


def stderr_notice(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def select_kernel(
    scheme: str,
    group: int,
    shapes: Sequence[tuple[int, int]],
    device: torch.device,
    dtype: torch.dtype,
    mode: str = "auto",
    notice: Notice = stderr_notice,
) -> ProjectionKernel:
    """torch's kernel for every ``mode`` but "dequant" ("auto" and "fused" included:
    this is their per-projection path) if it passes its probe, else ``DequantMm`` (with
    one line to ``notice`` when the probe failed)."""
    if mode not in KERNEL_MODES:
        raise ValueError(f"expert kernels must be one of {', '.join(KERNEL_MODES)}, not {mode!r}")
    reference = DequantMm(scheme, group, device, dtype)
    if mode == "dequant":
        return reference
    kernel = torch_kernel(scheme, group, device, dtype)
    reason = probe(kernel, reference, shapes, dtype)
    if reason is None:
        return kernel
    notice(
        f"flint: {kernel.name} failed its start-up check on {device.type} {dtype} ({reason});"
        f" {scheme} experts use dequantize-then-matmul"
    )
    return reference
