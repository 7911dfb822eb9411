"""q/k/v RoPE and one query's attention in one launch, for short spans (issue 10).

The resident step's attention takes two launches a layer: ``fused.qkv_rope`` (one
program a head: norm, RoPE, the key and value into the cache row) and
``fused.decode_attention`` (one program a key/value head, its query group on tensor
cores). Here one program a *query* head does both for spans of at most ``SPAN``
positions: it reads its key/value head's earlier cache rows before its wait (they were
written by earlier steps), then normalises and rotates its own query and its group's
new key (the same code and roundings as ``qkv_rope``), and attends over the cache rows
and the new one. The first program of each group writes the new key and value into the
cache row, as ``qkv_rope`` does. No program reads a row another program of the launch
writes, so nothing waits inside the launch.

Scores are fp32 dot products; the softmax takes one max over the span (no blocks),
probabilities are cast to the cache's dtype for the product with the values (as flash
attention does; the earlier rows' products summed, then the new row's added) and the
sum divides at the end. Bits differ from
``fused.decode_attention``'s (its products on tensor cores, its online softmax), so
every path of a step uses one or the other for the same span: the captured, eager and
streamed steps agree bit for bit."""

from __future__ import annotations

import torch

from flint.graphs.moe_kernel import ahead, on_device, pdl
from flint.graphs.triton_kernels import triton

if triton is not None:
    import triton.language as tl

    from flint.graphs.triton_kernels import _await_inputs, _head_roped, _round

__all__ = ["SPAN", "rope_attention", "takes"]

# The longest span this launch takes (the step's spans are multiples of 256): its
# programs hold the span's keys and values in registers.
SPAN = 256
# Warps a program: the span's keys and values spread over them (compiled for sm_90,
# Triton 3.6: 128 registers on 16 warps, 217 on 8, no spills)
WARPS = 16


def takes(span: int, dim: int) -> bool:
    """Whether ``rope_attention`` serves a step of this span and head size."""
    return triton is not None and span <= SPAN and dim <= 256


if triton is not None:

    @triton.jit
    def rope_attention_kernel(
        y_ptr,
        qn_ptr,
        kn_ptr,
        cos_ptr,
        sin_ptr,
        pos_ptr,
        k_ptr,
        v_ptr,
        o_ptr,
        k_head,
        k_pos,
        v_head,
        v_pos,
        heads,
        kv_heads,
        dim,
        eps,
        scale,
        NORM: tl.constexpr,
        ROT: tl.constexpr,
        BLOCK: tl.constexpr,
        SPAN: tl.constexpr,
        AHEAD: tl.constexpr = False,
        GDC: tl.constexpr = False,
    ):
        """Query head ``program_id(0)`` of the stacked projection ``y`` [(Nq + 2 Nkv) *
        D]: ``_head_roped`` query and key, the value as projected; the key and value
        into cache row ``pos`` (the group's first program); softmax(q . k / sqrt(D))
        over rows 0..pos of its key/value head, times the values, into ``o_ptr`` [Nq *
        D]. ``AHEAD``: the position and the earlier rows read before the wait."""
        h = tl.program_id(0)
        group = heads // kv_heads
        kv = h // group
        s = tl.arange(0, SPAN)
        d = tl.arange(0, BLOCK)
        d_ok = d < dim
        k_at = k_ptr + kv * k_head + s[:, None] * k_pos + d[None, :]
        v_at = v_ptr + kv * v_head + s[:, None] * v_pos + d[None, :]
        if AHEAD:
            pos = tl.load(pos_ptr).to(tl.int32)
            past = (s < pos)[:, None] & d_ok[None, :]
            keys = tl.load(k_at, mask=past, other=0.0)
            values = tl.load(v_at, mask=past, other=0.0)
        _await_inputs(GDC)
        if not AHEAD:
            pos = tl.load(pos_ptr).to(tl.int32)
            past = (s < pos)[:, None] & d_ok[None, :]
            keys = tl.load(k_at, mask=past, other=0.0)
            values = tl.load(v_at, mask=past, other=0.0)
        out_type: tl.constexpr = k_ptr.dtype.element_ty
        q = _head_roped(y_ptr + h * dim, qn_ptr, cos_ptr, sin_ptr, pos, dim, eps, NORM, ROT,
                        BLOCK, out_type)  # fmt: skip
        key = _head_roped(y_ptr + (heads + kv) * dim, kn_ptr, cos_ptr, sin_ptr, pos, dim, eps,
                          NORM, ROT, BLOCK, out_type)  # fmt: skip
        value = tl.load(y_ptr + (heads + kv_heads + kv) * dim + d, mask=d_ok, other=0.0)
        if h % group == 0:
            tl.store(k_ptr + kv * k_head + pos * k_pos + d, key.to(out_type), mask=d_ok)
            tl.store(v_ptr + kv * v_head + pos * v_pos + d, value, mask=d_ok)
        # the earlier rows' scores, then the new row's (its cache row is not read)
        scores = tl.sum(keys.to(tl.float32) * q[None, :], axis=1) * scale  # [SPAN]
        mine = tl.sum(key * q, axis=0) * scale
        scores = tl.where(s < pos, scores, tl.where(s == pos, mine, float("-inf")))
        top = tl.max(scores, axis=0)
        e = tl.exp(scores - top)
        p = _round(e, out_type)  # the cache's dtype for the product
        total = tl.sum(e, axis=0)
        out = tl.sum(p[:, None] * values.to(tl.float32), axis=0)
        out = out + _round(tl.exp(mine - top), out_type) * value.to(tl.float32)
        tl.store(o_ptr + h * dim + d, (out / total).to(o_ptr.dtype.element_ty), mask=d_ok)


def rope_attention(
    y: torch.Tensor,  # [(Nq + 2 Nkv) * D], one token's stacked projection
    q_norm: torch.Tensor | None,  # [D] per-head RMSNorm weights (both or neither)
    k_norm: torch.Tensor | None,
    cos: torch.Tensor,  # [S, R] tables
    sin: torch.Tensor,
    position: torch.Tensor,  # [1] int64
    keys: torch.Tensor,  # [Nkv, ctx, D], the layer's cache
    values: torch.Tensor,
    out: torch.Tensor,  # [1, Nq * D]
    heads: int,
    eps: float,
) -> torch.Tensor:
    """``fused.qkv_rope`` then ``fused.decode_attention`` for one token, in one launch
    (``takes`` the span): the key and value into the cache row at ``position``, the
    attention's output into ``out``."""
    kv_heads, _, dim = keys.shape
    assert (q_norm is None) == (k_norm is None) and heads % kv_heads == 0
    with on_device(y.device):
        rope_attention_kernel[(heads,)](
            y, y if q_norm is None else q_norm, y if k_norm is None else k_norm, cos, sin,
            position, keys, values, out, keys.stride(0), keys.stride(1), values.stride(0),
            values.stride(1), heads, kv_heads, dim, eps, dim**-0.5, NORM=q_norm is not None,
            ROT=cos.shape[-1], BLOCK=triton.next_power_of_2(dim), SPAN=SPAN, num_warps=WARPS,
            **ahead("attention", y.device), **pdl(y.device, "attention"),
        )  # fmt: skip
    return out
