"""Rotary position embeddings: inverse frequencies per rope type, cos/sin tables.

The tables hold exactly what transformers' rotary module computes per position
(``pos * inv_freq`` in fp32, cos/sin, times the attention factor, cast to the model
dtype), so indexing them by position gives bit-identical values.
"""

from __future__ import annotations

import math

import torch

from flint.models.config import ModelConfig, RopeConfig

# P = positions, D = head dim, Dr = rotated dims (D unless the rotary is partial)


def inv_freq(rope: RopeConfig, dim: int, max_positions: int) -> tuple[torch.Tensor, float]:
    """The [D/2] inverse frequencies and the cos/sin scaling factor for ``rope``."""
    base = 1.0 / (rope.theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    if rope.rope_type == "default":
        return base, 1.0
    if rope.rope_type == "linear":
        return base / _factor(rope), 1.0
    if rope.rope_type == "llama3":
        return _llama3(rope, base), 1.0
    if rope.rope_type == "yarn":
        return _yarn(rope, dim, max_positions)
    raise ValueError(f"rope_type {rope.rope_type!r} is not supported")


def _factor(rope: RopeConfig) -> float:
    if rope.factor is None:
        raise ValueError(f"rope_type {rope.rope_type!r} needs a 'factor'")
    return rope.factor


def _original_max(rope: RopeConfig) -> int:
    if rope.original_max_position_embeddings is None:
        raise ValueError(f"rope_type {rope.rope_type!r} needs 'original_max_position_embeddings'")
    return int(rope.original_max_position_embeddings)


def _llama3(rope: RopeConfig, base: torch.Tensor) -> torch.Tensor:
    factor, old_len = _factor(rope), _original_max(rope)
    low, high = rope.low_freq_factor, rope.high_freq_factor
    if low is None or high is None:
        raise ValueError("rope_type 'llama3' needs 'low_freq_factor' and 'high_freq_factor'")
    wavelen = 2 * math.pi / base
    scaled = torch.where(wavelen > old_len / low, base / factor, base)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < old_len / high) * ~(wavelen > old_len / low)
    return torch.where(medium, smoothed, scaled)


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn(rope: RopeConfig, dim: int, max_positions: int) -> tuple[torch.Tensor, float]:
    old_len = _original_max(rope)
    factor = rope.factor if rope.factor is not None else max_positions / old_len
    attn = rope.attention_factor
    if attn is None:
        if rope.mscale and rope.mscale_all_dim:
            attn = _yarn_mscale(factor, rope.mscale) / _yarn_mscale(factor, rope.mscale_all_dim)
        else:
            attn = _yarn_mscale(factor)
    beta_fast, beta_slow = rope.beta_fast or 32, rope.beta_slow or 1

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(old_len / (rotations * 2 * math.pi))) / (2 * math.log(rope.theta))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if rope.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # as transformers: avoid a zero-width ramp
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    pos_freqs = rope.theta ** (torch.arange(0, dim, 2).float() / dim)
    extrapolation = 1 - ramp
    freq = (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation
    return freq, float(attn)


def cos_sin_tables(
    config: ModelConfig, positions: int, dtype: torch.dtype, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin, each [P, Dr], for positions 0..P-1 (Dr = the rotated dims: D, or
    ``int(D * partial_rotary_factor)``)."""
    dim = int(config.head_dim * config.rope.partial_rotary_factor)
    freq, scale = inv_freq(config.rope, dim, config.max_position_embeddings)
    pos = torch.arange(positions, dtype=torch.int64).float()
    freqs = pos[:, None] * freq[None, :]  # [P, D/2]
    emb = torch.cat((freqs, freqs), dim=-1)  # [P, D]
    cos, sin = emb.cos() * scale, emb.sin() * scale
    return cos.to(device=device, dtype=dtype), sin.to(device=device, dtype=dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [N, T, D] (N = heads) rotated by cos/sin [T, Dr]: the first Dr dims rotate, the
    rest pass through (partial rotary, as transformers' GLM-4.5)."""
    rotary = cos.shape[-1]
    if rotary == x.shape[-1]:
        return (x * cos) + (rotate_half(x) * sin)
    x_rot, x_pass = x[..., :rotary], x[..., rotary:]
    return torch.cat(((x_rot * cos) + (rotate_half(x_rot) * sin), x_pass), dim=-1)
