"""Multi-head latent attention (DeepSeek-V2/V3), numerically transformers'
``DeepseekV3Attention`` and ``DeepseekV2Attention`` (which differ only in the rope).

Queries: ``q_proj`` or the low-rank ``q_b(norm(q_a(x)))``; each head is a no-rope part
and a rotary part. Keys and values come from one compressed latent per position
(``kv_a_proj_with_mqa``: a normed ``kv_lora_rank`` latent plus a ``qk_rope_head_dim``
rotary key shared by every head). The cache holds only the latent and the rotated
shared key, so it is (kv_lora_rank + qk_rope_head_dim) values per position and layer,
not 2 x heads x head_dim; each call expands the cached latents through ``kv_b_proj``
into per-head keys and values, as transformers does.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from flint.models.config import MlaConfig, ModelConfig
from flint.models.kv_cache import KVCache
from flint.models.loading import Placement
from flint.models.norm import rms_norm
from flint.models.rope import apply_rope
from flint.models.weights import WeightSource

# T = new tokens, S = cached + new positions, H = hidden, N = heads, R = kv_lora_rank,
# Dn / Dr / Dv = no-rope, rotary and value head dims, Q = q_lora_rank

LATENT_EPS = 1e-6  # q_a_layernorm / kv_a_layernorm: transformers builds them with eps 1e-6


def apply_rope_interleaved(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [N, T, Dr] whose rotary pairs are interleaved (x0, x1), (x2, x3), ...; rotated
    pairs come out de-interleaved (all first members, then all second), as transformers'
    ``apply_rotary_pos_emb_interleave``. cos/sin [T, Dr] hold each angle twice."""
    half = cos.shape[-1] // 2
    c, s = cos[..., :half], sin[..., :half]  # [T, Dr/2]
    x1, x2 = x[..., 0::2], x[..., 1::2]  # [N, T, Dr/2]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)


def apply_rope_pairs(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """DeepSeek-V2's rotation (transformers' ``apply_rotary_emb``): x [N, T, Dr] holds
    interleaved pairs, each rotated as a complex number in fp32, and they stay
    interleaved; the result is cast back to x's dtype. cos/sin [T, Dr] (fp32) hold each
    angle twice."""
    half = cos.shape[-1] // 2
    c, s = cos[..., :half].float(), sin[..., :half].float()  # [T, Dr/2]
    xf = x.float()
    x1, x2 = xf[..., 0::2], xf[..., 1::2]  # [N, T, Dr/2]
    return torch.stack((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).flatten(-2).to(x.dtype)


class LatentAttention:
    """One layer's MLA; weights named as ``model.layers.N.self_attn.*``."""

    def __init__(
        self, config: ModelConfig, layer: int, source: WeightSource, place: Placement
    ) -> None:
        assert config.mla is not None
        p = f"model.layers.{layer}.self_attn."
        self.layer, self.heads, self.m = layer, config.num_heads, config.mla
        bias = config.o_bias  # attention_bias: q_a, kv_a and o projections

        def opt(name: str) -> torch.Tensor | None:
            return place.load(source, p + name) if bias else None

        self.q_w: torch.Tensor | None = None  # [N*(Dn+Dr), H]
        self.q_a_w: torch.Tensor | None = None
        self.q_a_b: torch.Tensor | None = None
        self.q_a_norm: torch.Tensor | None = None
        self.q_b_w: torch.Tensor | None = None
        if self.m.q_lora_rank is None:
            self.q_w = place.load(source, p + "q_proj.weight")
        else:
            self.q_a_w = place.load(source, p + "q_a_proj.weight")  # [Q, H]
            self.q_a_b = opt("q_a_proj.bias")
            self.q_a_norm = place.load(source, p + "q_a_layernorm.weight")  # [Q]
            self.q_b_w = place.load(source, p + "q_b_proj.weight")  # [N*(Dn+Dr), Q]
        self.kv_a_w = place.load(source, p + "kv_a_proj_with_mqa.weight")  # [R+Dr, H]
        self.kv_a_b = opt("kv_a_proj_with_mqa.bias")
        self.kv_a_norm = place.load(source, p + "kv_a_layernorm.weight")  # [R]
        self.kv_b_w = place.load(source, p + "kv_b_proj.weight")  # [N*(Dn+Dv), R]
        self.o_w = place.load(source, p + "o_proj.weight")  # [H, N*Dv]
        self.o_b = opt("o_proj.bias")

    def _queries(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, H] -> [N, T, Dn+Dr]."""
        if self.q_w is not None:
            q = F.linear(x, self.q_w)
        else:
            assert self.q_a_w is not None and self.q_a_norm is not None and self.q_b_w is not None
            low = rms_norm(F.linear(x, self.q_a_w, self.q_a_b), self.q_a_norm, LATENT_EPS)
            q = F.linear(low, self.q_b_w)  # [T, N*(Dn+Dr)]
        return q.view(x.shape[0], self.heads, -1).transpose(0, 1)

    def _rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        if self.m.rope_pairs_kept:
            return apply_rope_pairs(x, cos, sin)
        if self.m.rope_interleave:
            return apply_rope_interleaved(x, cos, sin)
        return apply_rope(x, cos, sin)

    def expand(
        self, latents: torch.Tensor, k_rots: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Cached latents [1, S, R] and rotated shared keys [1, S, Dr] -> per-head keys
        [N, S, Dn+Dr] and values [N, S, Dv], through ``kv_b_proj``."""
        m, positions = self.m, latents.shape[1]
        kv = F.linear(latents[0], self.kv_b_w)  # [S, N*(Dn+Dv)]
        kv = kv.view(positions, self.heads, -1).transpose(0, 1)  # [N, S, Dn+Dv]
        k_nope, values = torch.split(kv, [m.qk_nope_head_dim, m.v_head_dim], -1)
        keys = torch.cat((k_nope, k_rots.expand(self.heads, -1, -1)), dim=-1)  # [N, S, Dn+Dr]
        return keys, values

    def project(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [T, H] -> (queries [N, T, Dn+Dr], normed latents [1, T, R], rotated shared
        keys [1, T, Dr]): what the cache stores and what attends to it."""
        m = self.m
        q_pass, q_rot = torch.split(self._queries(x), [m.qk_nope_head_dim, m.qk_rope_head_dim], -1)
        query = torch.cat((q_pass, self._rope(q_rot, cos, sin)), dim=-1)  # [N, T, Dn+Dr]
        compressed = F.linear(x, self.kv_a_w, self.kv_a_b)  # [T, R+Dr]
        latent, k_rot = torch.split(compressed, [m.kv_lora_rank, m.qk_rope_head_dim], -1)
        latent = rms_norm(latent, self.kv_a_norm, LATENT_EPS)  # [T, R]
        k_rot = self._rope(k_rot.unsqueeze(0), cos, sin)  # [1, T, Dr]
        return query, latent.unsqueeze(0), k_rot

    def attend(
        self,
        query: torch.Tensor,  # [N, T, Dn+Dr]
        latents: torch.Tensor,  # [1, S, R]
        k_rots: torch.Tensor,  # [1, S, Dr]
        mask: torch.Tensor | None,  # [T, S] bool (or broadcastable), None: every key
    ) -> torch.Tensor:
        """The queries against the cached positions, through ``o_proj``: [T, H]."""
        keys, values = self.expand(latents, k_rots)
        out = F.scaled_dot_product_attention(
            query.unsqueeze(0),
            keys.unsqueeze(0),
            values.unsqueeze(0),
            attn_mask=mask,
            scale=self.m.softmax_scale,
        )  # [1, N, T, Dv]
        out = out[0].transpose(0, 1).reshape(query.shape[1], -1)  # [T, N*Dv]
        return F.linear(out, self.o_w, self.o_b)  # [T, H]

    def __call__(
        self,
        x: torch.Tensor,  # [T, H]
        start: int,
        cache: KVCache,
        cos: torch.Tensor,  # [T, Dr]
        sin: torch.Tensor,  # [T, Dr]
        mask: torch.Tensor | None,  # [T, S] bool, None for one new token
    ) -> torch.Tensor:
        query, latent, k_rot = self.project(x, cos, sin)
        latents, k_rots = cache.write(self.layer, start, latent, k_rot)
        return self.attend(query, latents, k_rots, mask)


def latent_cache(
    config: ModelConfig,
    mla: MlaConfig,
    context_length: int,
    place: Placement,
    layers: int | None = None,
) -> KVCache:
    """The MLA cache: per layer, one "head" of latents [S, R] and rotated keys [S, Dr]
    (``layers`` rows; default every layer of the model)."""
    return KVCache(
        config.num_layers if layers is None else layers,
        1,
        context_length,
        mla.kv_lora_rank,
        place.dtype,
        place.device,
        value_dim=mla.qk_rope_head_dim,
    )
