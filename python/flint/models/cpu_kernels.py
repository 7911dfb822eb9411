"""flint's fused CPU expert kernels (crate ``cpu_kernels``, through ``flint._core.CpuKernels``).

One call computes every routed expert of a layer for the current tokens, reading each
expert's projections in place in the .ftw layout (raw f32/bf16/f16, int8, int4): gate,
up and SiLU fused in one pass, then down, split across a thread pool by output rows,
then the top-k summed in fp32 in router-rank order. Activations stay fp32 throughout.
On AVX-512 an expert with several tokens in the call (a prompt) runs as a small matrix
product over an f32 tile of its rows (``docs/cpu-kernels.md``, "The prompt path").

- ``FusedKernel``: checked tensor wrapper over ``_core.CpuKernels`` (every address it
  passes belongs to a CPU tensor of the right dtype, shape and layout, kept alive by
  the caller for the call).
- ``FusedResidentExperts``: the resident backend on it (``expert_kernels="fused"``).
  ``StreamedExperts`` uses the same ``FusedKernel`` on cache slots, waiting on the
  engine's per-projection ready flags inside the call, so streamed == resident bit for
  bit.

Tolerance against torch's per-expert path (``docs/cpu-kernels.md``): the same math up
to summation order, fused multiply-adds and SiLU's exp; within 1e-5 of the layer's
largest |output| on the tests' layers (tests/models/test_cpu_kernels.py).
"""

from __future__ import annotations

import torch

from flint import _core
from flint.format.reader import ExpertLayout
from flint.models.config import ModelConfig
from flint.models.loading import Placement
from flint.models.weights import WeightSource

# T = tokens, H = hidden, K = top-k, E = experts per layer, I = expert intermediate

_FLOAT_NAMES = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16"}


# Threads a streamed model's kernels leave to the readers, their verifiers and (on CUDA)
# the main thread and CUDA's own, when torch has >= STREAMING_MIN_CORES threads: V1 on
# the 16-core GPU box decoded at 2.50 tok/s with 16 kernel threads, 4.02 with 14 and
# 4.07 with 10 (spinning threads preempted by the others hold up each step;
# docs/benchmarks.md, issue 15). Measured on CUDA only; CPU-only streaming keeps the
# same rule (its readers and verifiers need cores too).
STREAMING_RESERVE = 2
STREAMING_MIN_CORES = 8


def default_threads() -> int:
    """The pool size when none is given: torch's intra-op threads (``--threads``)."""
    return max(1, torch.get_num_threads())


def streaming_threads() -> int:
    """The pool size of a streamed model's kernels: ``default_threads`` less
    ``STREAMING_RESERVE`` when that is at least ``STREAMING_MIN_CORES`` (results do not
    depend on the pool size)."""
    n = default_threads()
    return n - STREAMING_RESERVE if n >= STREAMING_MIN_CORES else n


class FusedKernel:
    """The fused layer call for one expert format (see the module docs)."""

    def __init__(
        self,
        scheme: str,
        dtype: str,
        group_size: int,
        shapes: tuple[tuple[int, int], ...],
        n_experts: int,
        threads: int | None = None,
        isa: str = "auto",
        round_hidden: bool = False,
    ) -> None:
        if len(shapes) != 3:
            raise ValueError(f"an expert has 3 projections, got shapes {shapes}")
        g, u, d = (tuple(s) for s in shapes)
        n = default_threads() if threads is None else threads
        if n < 1:
            raise ValueError(f"kernel threads must be >= 1, got {n}")
        shapes3 = ((g[0], g[1]), (u[0], u[1]), (d[0], d[1]))
        self.core = _core.CpuKernels(
            scheme, dtype, group_size, shapes3, n_experts, n, isa, round_hidden
        )
        self.hidden, self.n_experts = g[1], n_experts
        self.proj_bytes = self.core.proj_bytes
        what = ", ".join(v for v in (self.core.isa, self.core.variants) if v)
        self.name = f"flint fused CPU kernels ({what}, {self.core.threads} threads)"

    @classmethod
    def for_layout(
        cls,
        layout: ExpertLayout,
        threads: int | None = None,
        isa: str = "auto",
        round_hidden: bool = False,
    ) -> FusedKernel:
        return cls(
            layout.scheme,
            layout.dtype,
            layout.group_size,
            layout.shapes,
            layout.n_experts,
            threads,
            isa,
            round_hidden,
        )

    def _inputs(
        self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """fp32 contiguous CPU x [T, H], int64 ids [T, K], fp32 weights [T, K]."""
        if x.device.type != "cpu" or ids.device.type != "cpu":
            raise ValueError("the fused CPU kernels take CPU tensors")
        if (
            x.dim() != 2
            or x.shape[1] != self.hidden
            or ids.dim() != 2
            or ids.shape[0] != x.shape[0]
        ):
            raise ValueError(
                f"x {tuple(x.shape)} / ids {tuple(ids.shape)} do not fit H={self.hidden}"
            )
        x32 = x.to(torch.float32).contiguous()
        ids64 = ids.to(torch.int64).contiguous()
        w32 = None
        if weights is not None:
            if weights.shape != ids.shape:
                raise ValueError(f"weights {tuple(weights.shape)} != ids {tuple(ids.shape)}")
            w32 = weights.to(device="cpu", dtype=torch.float32).contiguous()
        return x32, ids64, w32

    def moe_layer(
        self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, table: torch.Tensor
    ) -> torch.Tensor:
        """sum_k weights[t, k] * expert_{ids[t, k]}(x[t]) -> [T, H] in x's dtype. ``table``:
        int64 [E, 3] projection addresses, owned by the caller (``ExpertTable``)."""
        if table.dtype != torch.int64 or tuple(table.shape) != (self.n_experts, 3):
            raise ValueError(f"table must be int64 [{self.n_experts}, 3]")
        x32, ids64, w32 = self._inputs(x, ids, weights)
        assert w32 is not None
        out = torch.empty_like(x32)  # [T, H]
        tokens, k = ids64.shape
        self.core.moe_layer(
            x32.data_ptr(),
            ids64.data_ptr(),
            w32.data_ptr(),
            tokens,
            k,
            table.contiguous().data_ptr(),
            out.data_ptr(),
        )
        return out.to(x.dtype)

    def expert_outputs(
        self,
        x32: torch.Tensor,  # [T, H] fp32, contiguous
        ids: torch.Tensor,  # [T, K] int64, contiguous
        experts: list[tuple[int, int, int, int]],  # (expert, gate, up, down addresses)
        y: torch.Tensor,  # [T*K, H] fp32, written at the listed experts' positions
        engine: _core.IoEngine | None = None,
        layer: int = 0,
        hits: list[int] | None = None,
    ) -> None:
        """The listed experts' outputs into ``y``; with ``engine``, experts not in
        ``hits`` are waited for inside the call (gate/up, then down)."""
        tokens, k = ids.shape
        ok = x32.dtype == torch.float32 and x32.is_contiguous() and ids.dtype == torch.int64
        ok = ok and ids.is_contiguous() and y.dtype == torch.float32 and y.is_contiguous()
        if not ok or tuple(y.shape) != (tokens * k, self.hidden) or x32.shape[0] != tokens:
            raise ValueError("expert_outputs: x32 [T, H] f32, ids [T, K] i64, y [T*K, H] f32")
        self.core.expert_outputs(
            x32.data_ptr(), ids.data_ptr(), tokens, k, experts, y.data_ptr(),
            engine, layer, hits or [],
        )  # fmt: skip

    def weighted_sum(self, y: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """y [T*K, H] fp32, weights [T, K] -> [T, H] fp32, k in rank order."""
        tokens, k = weights.shape
        if (
            y.dtype != torch.float32
            or not y.is_contiguous()
            or tuple(y.shape) != (tokens * k, self.hidden)
        ):
            raise ValueError("weighted_sum: y must be contiguous f32 [T*K, H]")
        w32 = weights.to(device="cpu", dtype=torch.float32).contiguous()
        out = torch.empty(tokens, self.hidden, dtype=torch.float32)
        self.core.weighted_sum(y.data_ptr(), w32.data_ptr(), tokens, k, out.data_ptr())
        return out


def slab_addresses(address: int, layout: ExpertLayout) -> tuple[int, int, int]:
    """Gate, up and down addresses of the slab at ``address``."""
    g, u, d = (address + off for off in layout.proj_offsets)
    return g, u, d


class FusedResidentExperts:
    """Every routed expert resident in RAM in the kernels' layout, computed by one fused
    call per layer. From a .ftw file the slabs are kept byte for byte as the file (and
    the streamed cache) holds them; from a checkpoint the float weights are kept in
    their own dtype (f32, bf16 or f16; others become f32)."""

    def __init__(
        self,
        config: ModelConfig,
        source: WeightSource,
        place: Placement,
        threads: int | None = None,
        isa: str = "auto",
    ) -> None:
        if place.device.type != "cpu":
            raise ValueError("FusedResidentExperts runs on the CPU")
        self._keep: list[torch.Tensor] = []  # owners of every address in the tables
        self.tables: dict[int, torch.Tensor] = {}  # layer -> [E, 3] int64 addresses
        layout: ExpertLayout | None = getattr(source, "expert_layout", None)
        layers = [i for i, sparse in enumerate(config.sparse_layers) if sparse]
        if layout is not None and hasattr(source, "expert_slab"):
            self.kernel = FusedKernel.for_layout(layout, threads, isa)
            for layer in layers:
                self.tables[layer] = self._slab_table(source, layout, layer, config.num_experts)
        else:
            self.kernel = self._float_kernel(config, source, layers, threads, isa)

    def _slab_table(
        self, source: WeightSource, layout: ExpertLayout, layer: int, n: int
    ) -> torch.Tensor:
        slabs = torch.stack([source.expert_slab(layer, e) for e in range(n)])  # type: ignore[attr-defined]
        self._keep.append(slabs)  # [E, slab bytes] uint8
        base, stride = slabs.data_ptr(), slabs.stride(0)
        return torch.tensor([slab_addresses(base + e * stride, layout) for e in range(n)])

    def _float_kernel(
        self,
        config: ModelConfig,
        source: WeightSource,
        layers: list[int],
        threads: int | None,
        isa: str,
    ) -> FusedKernel:
        inter, hidden = config.moe_intermediate_size, config.hidden_size
        dtype: torch.dtype | None = None
        for layer in layers:
            experts = [source.expert(layer, e) for e in range(config.num_experts)]
            if dtype is None:  # the first expert's dtype, for every layer
                first = experts[0].gate.dtype
                dtype = first if first in _FLOAT_NAMES else torch.float32
            table = []
            for w in experts:
                projs = [
                    t.to(torch.device("cpu"), dtype).contiguous() for t in (w.gate, w.up, w.down)
                ]
                if tuple(projs[0].shape) != (inter, hidden) or tuple(projs[2].shape) != (
                    hidden,
                    inter,
                ):
                    raise ValueError(f"layer {layer}: expert shapes do not fit the config")
                self._keep.extend(projs)
                table.append([p.data_ptr() for p in projs])
            self.tables[layer] = torch.tensor(table, dtype=torch.int64)
        shapes = ((inter, hidden), (inter, hidden), (hidden, inter))
        name = _FLOAT_NAMES[dtype or torch.float32]
        return FusedKernel("raw", name, 0, shapes, config.num_experts, threads, isa)

    def __call__(
        self, layer: int, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor
    ) -> torch.Tensor:
        return self.kernel.moe_layer(x, ids, weights, self.tables[layer])  # [T, H]
