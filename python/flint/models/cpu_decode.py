"""The CPU decode step in Rust: one token through every layer in one call
(``flint._core.DecodeStep``, crate ``cpu_kernels``'s ``Kernels::decode_step``).

On the CPU a decode step of a small model is mostly per-op overhead: tiny-code-moe
spends ~4 ms a token in ~40 torch ops per layer of a few microseconds of math each
(docs/benchmarks.md, "Decode step in Rust"). ``CpuDecodeStep`` runs the same layer loop
in Rust over the model's own tensors: dense weights, norms, RoPE tables and the KV
cache are passed once, by address, at setup; a step takes the token and its position
and returns the logits. Prefill stays in Python (layer-major, torch), and both write the
same KV cache, so prefill, decode, ``reset`` and prefix reuse mix freely.

Scope: a resident model on the CPU with fused expert kernels (``expert_kernels="fused"``)
and a family of the standard shape: grouped-query attention with optional q/k
RMSNorm (per head or full), q/k/v/o biases and clipping, full-dim RoPE, softmax top-k
routing, SwiGLU experts without biases, an optional (gated) shared expert, dense SwiGLU
layers (Qwen3-MoE, Qwen2-MoE, Mixtral, OLMoE). ``cpu_decoder`` says None for anything
else, which keeps the torch path.

Numerics: f32 throughout (the torch path rounds to the model dtype between ops; with
the CPU's default f32 model the two differ only by summation order). Tolerances and the
greedy-token check: tests/models/test_cpu_decode.py.
"""

from __future__ import annotations

import os

import torch

from flint import _core
from flint.models.attention import Attention
from flint.models.cpu_kernels import FusedResidentExperts
from flint.models.kv_cache import KVCache
from flint.models.mlp import DenseMLP
from flint.models.moe import MoEBlock
from flint.models.transformer import MoEModel

# V = vocabulary, H = hidden, D = head dim, S = context length

ENV_SWITCH = "FLINT_CPU_DECODE_STEP"  # "0" turns the Rust decode step off

_DTYPES = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16"}
_CACHE_DTYPES = {torch.float32: "f32", torch.bfloat16: "bf16"}

MatSpec = tuple[int, str, int, int]
VecSpec = tuple[int, int]


def unsupported(model: MoEModel) -> str | None:
    """Why ``model`` cannot use the Rust decode step (None: it can)."""
    cfg, place = model.config, model.place
    if place.device.type != "cpu" or len(place.devices) > 1:
        return "not on one CPU"
    if place.dtype not in _CACHE_DTYPES:
        return f"dtype {place.dtype}"
    other = (
        cfg.mla is not None,
        cfg.group_router is not None,
        cfg.router_topk_first,
        cfg.router_bias,
        cfg.expert_act.kind != "swiglu",
        cfg.expert_bias,
        cfg.attention_sinks,
        cfg.norm_weight_fp32,
        cfg.norm_offset,
        cfg.attn_output_gate,
        cfg.linear_attention is not None,
        any(cfg.layer_windows),
        cfg.rope.partial_rotary_factor != 1.0,
    )
    if any(other):
        return f"{cfg.family}'s layers are not of the standard shape"
    cache = model.cache
    if type(cache) is not KVCache or cache.keys.shape != cache.values.shape:
        return "KV cache layout"
    for layer in model.layers:
        if type(layer.attn) is not Attention:
            return "attention type"
        mlp = layer.mlp
        if isinstance(mlp, MoEBlock) and not isinstance(mlp.backend, FusedResidentExperts):
            return "experts not on the fused CPU kernels"
        if not isinstance(mlp, MoEBlock | DenseMLP):
            return "MLP type"
    return None


def _narrowed(w: torch.Tensor) -> torch.Tensor:
    """An f32 matrix whose every value is a bf16 value (a bf16 checkpoint run in f32,
    the CPU's default) as a bf16 copy: the same values, so the same products, at half
    the bytes a step reads; any other matrix as it is."""
    if w.dtype != torch.float32:
        return w
    narrow = w.to(torch.bfloat16)
    return narrow if torch.equal(narrow.to(torch.float32), w) else w


def enabled() -> bool:
    """False when the environment turns the step off (``FLINT_CPU_DECODE_STEP=0``)."""
    return os.environ.get(ENV_SWITCH, "1").strip().lower() not in ("0", "false", "off", "no")


def cpu_decoder(model: MoEModel) -> CpuDecodeStep | None:
    """The Rust decode step for ``model``, or None where it does not apply."""
    if unsupported(model) is not None:
        return None
    return CpuDecodeStep(model)


class CpuDecodeStep:
    """``step(ids [1], pos)`` -> logits [1, V] f32, advancing nothing: the caller
    (``MoEModel.forward``, as its ``decoder``) updates the cache's length and tokens."""

    name = "Rust CPU decode step"  # how bench and stats name this decode

    def __init__(self, model: MoEModel) -> None:
        reason = unsupported(model)
        if reason is not None:
            raise ValueError(f"the CPU decode step does not apply: {reason}")
        cfg = model.config
        self._keep: list[torch.Tensor] = []  # owners of every address passed to Rust
        self.vocab = model.lm_head.shape[0]
        kernels = None
        layers = []
        for layer in model.layers:
            mlp = layer.mlp
            if isinstance(mlp, MoEBlock):
                assert isinstance(mlp.backend, FusedResidentExperts)
                kernels = mlp.backend.kernel.core
            layers.append(self._layer_spec(layer.index, layer, model))
        if kernels is None:
            raise ValueError("the CPU decode step needs at least one MoE layer")
        cos = self._f32(model.cos)  # [S, D]
        sin = self._f32(model.sin)
        cache = model.cache
        self._keep += [cache.keys, cache.values]
        shape = (
            cfg.hidden_size,
            cfg.num_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            cfg.rms_norm_eps,
            cfg.qk_norm,
            cfg.clip_qkv,
            cfg.top_k,
            cfg.norm_topk_prob,
            cache.context_length,
        )
        self.core = _core.DecodeStep(
            kernels,
            shape,
            self._mat(model.embed),
            self._vec(model.norm),
            self._mat(model.lm_head),
            (cos.data_ptr(), sin.data_ptr()),
            layers,
            (cache.keys.data_ptr(), cache.values.data_ptr(), _CACHE_DTYPES[cache.keys.dtype]),
        )

    def _mat(self, w: torch.Tensor) -> MatSpec:
        """A dense [rows, cols] matrix in its own dtype (f32 -> f32, bf16, f16)."""
        if w.dim() != 2 or w.device.type != "cpu":
            raise ValueError(f"expected a 2-d CPU matrix, got {tuple(w.shape)} on {w.device}")
        if w.dtype not in _DTYPES:
            w = w.float()
        w = _narrowed(w.contiguous())
        self._keep.append(w)
        return (w.data_ptr(), _DTYPES[w.dtype], w.shape[0], w.shape[1])

    def _f32(self, t: torch.Tensor) -> torch.Tensor:
        out = t.to(torch.float32).contiguous()
        self._keep.append(out)
        return out

    def _vec(self, t: torch.Tensor) -> VecSpec:
        v = self._f32(t.reshape(-1))
        return (v.data_ptr(), v.numel())

    def _layer_spec(self, index: int, layer: object, model: MoEModel) -> dict[str, object]:
        from flint.models.transformer import DecoderLayer

        assert isinstance(layer, DecoderLayer) and isinstance(layer.attn, Attention)
        a = layer.attn
        spec: dict[str, object] = {
            "input_norm": self._vec(layer.input_norm),
            "post_norm": self._vec(layer.post_norm),
            "q": self._mat(a.q_w),
            "k": self._mat(a.k_w),
            "v": self._mat(a.v_w),
            "o": self._mat(a.o_w),
            "bias": None,
            "o_bias": None if a.o_b is None else self._vec(a.o_b),
            "qk_norm": None,
            "router": None,
            "experts": None,
            "shared": None,
            "shared_gate": None,
            "dense": None,
        }
        if a.q_b is not None and a.k_b is not None and a.v_b is not None:
            spec["bias"] = [self._vec(a.q_b), self._vec(a.k_b), self._vec(a.v_b)]
        if a.q_norm is not None and a.k_norm is not None:
            spec["qk_norm"] = [self._vec(a.q_norm), self._vec(a.k_norm)]
        mlp = layer.mlp
        if isinstance(mlp, MoEBlock):
            assert isinstance(mlp.backend, FusedResidentExperts)
            table = mlp.backend.tables[index].contiguous()  # [E, 3] int64 addresses
            self._keep.append(table)
            spec["router"] = self._mat(mlp.router)
            spec["experts"] = table.data_ptr()
            if mlp.shared is not None:
                s = mlp.shared
                spec["shared"] = [self._mat(s.gate), self._mat(s.up), self._mat(s.down)]
                if mlp.shared_gate is not None:
                    spec["shared_gate"] = self._mat(mlp.shared_gate)
        else:
            assert isinstance(mlp, DenseMLP)
            spec["dense"] = [self._mat(mlp.gate), self._mat(mlp.up), self._mat(mlp.down)]
        return spec

    def __call__(self, ids: torch.Tensor, pos: int) -> torch.Tensor:
        """Logits [1, V] f32 of the token ``ids`` [1] at position ``pos`` (the cache holds
        0..pos-1); writes the layers' keys and values at ``pos``."""
        logits = torch.empty(1, self.vocab, dtype=torch.float32)
        self.core.step(int(ids[0]), pos, logits.data_ptr())
        return logits
