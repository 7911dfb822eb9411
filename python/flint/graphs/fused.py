"""The decode step's small ops fused into one Triton kernel each: RMSNorm, a head's
q/k norm with RoPE (written straight into the KV cache for keys and values), and the
softmax router. Eager decode spends a kernel launch per elementwise op (an RMSNorm is
seven, RoPE five per tensor); in a graph each launch still costs a few microseconds of
GPU time, so the step fuses them. Each follows its torch counterpart's ops and
roundings to the model dtype; only the order of a row's sum of squares differs."""

from __future__ import annotations

import torch

from flint.graphs.moe_kernel import on_device
from flint.graphs.triton_kernels import head_rope_kernel, rms_norm_kernel, route_kernel, triton

# T = tokens, H = hidden, N = heads, D = head dim, E = experts, K = top-k


def _block(n: int) -> int:
    assert triton is not None
    return int(triton.next_power_of_2(n))


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, weight_in_fp32: bool = False
) -> torch.Tensor:
    """x [T, H] -> ``flint.models.norm.rms_norm(x, weight, eps, weight_in_fp32)``."""
    x = x.contiguous()
    out = torch.empty_like(x)
    n = x.shape[1]
    with on_device(x.device):
        rms_norm_kernel[(x.shape[0],)](x, weight, out, n, eps, BLOCK=_block(n), W32=weight_in_fp32)
    return out


def head_rope(
    y: torch.Tensor,  # [N * D], one token's projection
    norm: torch.Tensor | None,  # [D] per-head RMSNorm weight, or None
    cos: torch.Tensor,  # [S, R] table (R rotary dims; R = 0: no rotation)
    sin: torch.Tensor,
    position: torch.Tensor,  # [1] int64
    out: torch.Tensor,  # where head h goes: out + h * out_head + position * out_pos
    out_head: int,
    out_pos: int,
    heads: int,
    dim: int,
    eps: float,
    rotate: bool = True,
) -> None:
    """Normalises each head (when ``norm``), rotates it at ``position`` (when
    ``rotate``) and writes it into ``out``: a query buffer, or a KV cache row."""
    rot = cos.shape[-1] if rotate else 0
    with on_device(y.device):
        head_rope_kernel[(heads,)](
            y, y if norm is None else norm, cos, sin, position, out, out_head, out_pos, dim,
            eps, NORM=norm is not None, ROT=rot, BLOCK=_block(dim),
        )  # fmt: skip


def route(
    logits: torch.Tensor, top_k: int, normalize: bool, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """Router logits [T, E] -> (ids [T, K] int64, weights [T, K] in ``dtype``) as
    ``flint.models.moe.route`` for a softmax router without bias."""
    tokens, experts = logits.shape
    ids = torch.empty(tokens, top_k, dtype=torch.int64, device=logits.device)
    weights = torch.empty(tokens, top_k, dtype=dtype, device=logits.device)
    with on_device(logits.device):
        route_kernel[(tokens,)](
            logits.contiguous(), ids, weights, experts, TOPK=top_k, NORM=normalize,
            BLOCK=_block(experts),
        )  # fmt: skip
    return ids, weights
