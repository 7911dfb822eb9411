"""Qwen3-Next (``Qwen3NextForCausalLM``): a hybrid of gated DeltaNet linear-attention
layers and, every ``full_attention_interval``-th layer, full attention with a per-head
output gate (q_proj yields query and gate), per-head q/k norm and partial rotary
(default a quarter of each head). Every RMSNorm but the DeltaNet's gated one scales by
``1 + weight``. The MoE block is Qwen2-MoE's: softmax top-k plus a sigmoid-gated shared
expert.

A DeltaNet layer carries two states from one forward to the next, as attention carries
its KV cache: the last ``conv_kernel - 1`` inputs of its causal depthwise conv and the
recurrent state [v_heads, k_head_dim, v_head_dim] (fp32) of the gated delta rule.
A recurrent state cannot be rewound: ``LinearStates`` holds only the state after the
last cached position (see ``MoEModel.reset``).

Absent config keys take transformers' ``Qwen3NextConfig`` defaults.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from flint.models.config import (
    LinearAttentionConfig,
    ModelConfig,
    check_silu,
    common_fields,
    get,
    require,
    sparse_layers,
)
from flint.models.kv_cache import KVCache
from flint.models.loading import Placement
from flint.models.norm import gated_rms_norm, rms_norm_offset
from flint.models.rope import apply_rope
from flint.models.weights import WeightSource

# T = new tokens, H = hidden, Hk / Hv = linear-attention key / value heads, Dk / Dv =
# their head dims, C = conv channels (2*Hk*Dk + Hv*Dv), K = conv kernel, B = tokens per
# delta-rule block, N = attention heads, D = attention head dim

DELTA_BLOCK = 64  # tokens per block of the chunked delta rule over a prompt


def layer_types(hf: dict[str, Any], layers: int) -> tuple[bool, ...]:
    """Per layer: linear attention (True) or full attention, from ``layer_types`` or
    else every ``full_attention_interval``-th layer full (transformers' rule)."""
    types = hf.get("layer_types")
    if types is None:
        interval = int(get(hf, "full_attention_interval", 4))
        if interval < 1:
            raise ValueError(f"full_attention_interval must be >= 1, got {interval}")
        return tuple((i + 1) % interval != 0 for i in range(layers))
    if len(types) != layers:
        raise ValueError(f"layer_types has {len(types)} entries for {layers} layers")
    bad = sorted({t for t in types} - {"linear_attention", "full_attention"})
    if bad:
        raise ValueError(f"unsupported layer types {bad}")
    return tuple(t == "linear_attention" for t in types)


def parse_config(hf: dict[str, Any]) -> ModelConfig:
    check_silu(hf)
    layers = int(require(hf, "num_hidden_layers"))
    bias = bool(get(hf, "attention_bias", False))
    linear = LinearAttentionConfig(
        layers=layer_types(hf, layers),
        k_heads=int(get(hf, "linear_num_key_heads", 16)),
        v_heads=int(get(hf, "linear_num_value_heads", 32)),
        k_head_dim=int(get(hf, "linear_key_head_dim", 128)),
        v_head_dim=int(get(hf, "linear_value_head_dim", 128)),
        conv_kernel=int(get(hf, "linear_conv_kernel_dim", 4)),
    )
    if linear.v_heads % linear.k_heads:
        raise ValueError(
            f"linear_num_value_heads {linear.v_heads} is not a multiple of "
            f"linear_num_key_heads {linear.k_heads}"
        )
    if linear.conv_kernel < 1:
        raise ValueError(f"linear_conv_kernel_dim must be >= 1, got {linear.conv_kernel}")
    return ModelConfig(
        family="qwen3_next",
        **common_fields(hf, 1e-6, 10000.0, partial_rotary=0.25),
        qkv_bias=bias,
        o_bias=bias,
        qk_norm="per_head",
        clip_qkv=None,
        moe_intermediate_size=int(require(hf, "moe_intermediate_size")),
        norm_topk_prob=bool(get(hf, "norm_topk_prob", True)),
        router_weights_fp32=False,
        shared_expert_intermediate_size=int(require(hf, "shared_expert_intermediate_size")),
        sparse_layers=sparse_layers(hf, layers),
        moe_prefix="mlp",
        norm_offset=True,
        attn_output_gate=True,
        linear_attention=linear,
    )


def cache_slots(config: ModelConfig) -> tuple[list[int], list[int]]:
    """Per layer, its index among the full-attention layers (its KV cache slot) and among
    the linear-attention layers (its state slot); -1 where it is the other kind."""
    la = config.linear_attention
    linear = la.layers if la is not None else (False,) * config.num_layers
    kv, lin, n_kv, n_lin = [], [], 0, 0
    for is_linear in linear:
        kv.append(-1 if is_linear else n_kv)
        lin.append(n_lin if is_linear else -1)
        n_lin += is_linear
        n_kv += not is_linear
    return kv, lin


# Chat-template tokens after which the linear-attention states are checkpointed (the
# end of a thinking block, a tool call, a tool result, a turn): an edit after one of
# them resumes from its checkpoint instead of prefilling from the start.
ANCHOR_TOKENS = ("</think>", "</tool_call>", "</tool_response>", "<|im_end|>")
MAX_CHECKPOINTS = 16  # the deepest ones are kept


class LinearStates:
    """The conv inputs [L, C, K-1] (model dtype) and delta-rule states [L, Hv, Dk, Dv]
    (fp32, or the model's dtype if wider) of the L linear-attention layers, after the
    last cached position; and copies of both after earlier positions (checkpoints,
    position -> per part (conv, recurrent)), taken during the forward that passes them.
    With the layers split across GPUs, each device holds its own layers' states (one
    part per device; ``slot_devices[s]``: where state slot s's layer lives)."""

    def __init__(
        self,
        config: ModelConfig,
        place: Placement,
        slot_devices: list[torch.device] | None = None,
    ) -> None:
        la = config.linear_attention
        assert la is not None
        layers = sum(la.layers)
        devices = slot_devices if slot_devices is not None else [place.device] * layers
        channels = 2 * la.k_heads * la.k_head_dim + la.v_heads * la.v_head_dim
        self.wide = torch.promote_types(place.dtype, torch.float32)
        self.parts: list[tuple[torch.Tensor, torch.Tensor]] = []  # per device (conv, rec)
        self.where: list[tuple[int, int]] = []  # slot -> (part, row)
        order = list(dict.fromkeys(devices))
        for device in order:
            n = devices.count(device)
            self.parts.append(
                (
                    torch.zeros(
                        (n, channels, la.conv_kernel - 1), dtype=place.dtype, device=device
                    ),
                    torch.zeros(
                        (n, la.v_heads, la.k_head_dim, la.v_head_dim),
                        dtype=self.wide,
                        device=device,
                    ),
                )
            )
        rows = [0] * len(order)
        for device in devices:
            part = order.index(device)
            self.where.append((part, rows[part]))
            rows[part] += 1
        self.checkpoints: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}
        self.marks: tuple[int, ...] = ()  # positions the running forward checkpoints
        self._pending: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}

    @property
    def conv(self) -> torch.Tensor:
        """Every layer's conv inputs [L, C, K-1] (a copy on the first device if split)."""
        return self._whole(0)

    @property
    def recurrent(self) -> torch.Tensor:
        """Every layer's delta-rule state [L, Hv, Dk, Dv] (a copy if split)."""
        return self._whole(1)

    def _whole(self, i: int) -> torch.Tensor:
        if len(self.parts) == 1:
            return self.parts[0][i]
        first = self.parts[0][i].device
        return torch.cat([part[i].to(first) for part in self.parts])

    def conv_of(self, slot: int) -> torch.Tensor:
        part, row = self.where[slot]
        return self.parts[part][0][row]

    def recurrent_of(self, slot: int) -> torch.Tensor:
        part, row = self.where[slot]
        return self.parts[part][1][row]

    def clear(self) -> None:
        for conv, recurrent in self.parts:
            conv.zero_()
            recurrent.zero_()
        self.checkpoints.clear()

    def begin(self, marks: list[int]) -> None:
        """Before a forward: checkpoint the states after each of these positions (the
        deepest ``MAX_CHECKPOINTS``) once the forward completes (``commit``)."""
        self.marks = tuple(sorted(marks)[-MAX_CHECKPOINTS:])
        self._pending = {
            p: [(torch.empty_like(c), torch.empty_like(r)) for c, r in self.parts]
            for p in self.marks
        }

    def keep(self, slot: int, position: int, conv: torch.Tensor, recurrent: torch.Tensor) -> None:
        """Layer ``slot``'s states after ``position`` (one of ``marks``)."""
        part, row = self.where[slot]
        self._pending[position][part][0][row].copy_(conv)
        self._pending[position][part][1][row].copy_(recurrent)

    def commit(self) -> None:
        """After a forward: its checkpoints join the earlier ones."""
        self.checkpoints.update(self._pending)
        for p in sorted(self.checkpoints)[:-MAX_CHECKPOINTS]:
            del self.checkpoints[p]
        self.marks, self._pending = (), {}

    def rewind(self, length: int) -> bool:
        """Restores the states after ``length`` positions from its checkpoint (False:
        none); drops the checkpoints past it."""
        if length not in self.checkpoints:
            return False
        for (conv, recurrent), (c, r) in zip(self.parts, self.checkpoints[length], strict=True):
            conv.copy_(c)
            recurrent.copy_(r)
        for p in [p for p in self.checkpoints if p > length]:
            del self.checkpoints[p]
        return True


class GatedAttention:
    """Full attention with q/k norms (1 + w), partial rotary and a sigmoid output gate
    from the second half of each query head's q_proj rows; keys and values in KV cache
    slot ``slot``."""

    def __init__(
        self, config: ModelConfig, layer: int, slot: int, source: WeightSource, place: Placement
    ) -> None:
        p = f"model.layers.{layer}.self_attn."
        self.cfg, self.slot = config, slot
        w = {n: place.load(source, p + n + ".weight") for n in ("q_proj", "k_proj", "v_proj")}
        self.q_w, self.k_w, self.v_w = w["q_proj"], w["k_proj"], w["v_proj"]
        self.o_w = place.load(source, p + "o_proj.weight")
        bias = {n: place.load(source, p + n + ".bias") if config.qkv_bias else None for n in w}
        self.q_b, self.k_b, self.v_b = bias["q_proj"], bias["k_proj"], bias["v_proj"]
        self.o_b = place.load(source, p + "o_proj.bias") if config.o_bias else None
        self.q_norm = place.load(source, p + "q_norm.weight")
        self.k_norm = place.load(source, p + "k_norm.weight")

    def __call__(
        self,
        x: torch.Tensor,  # [T, H]
        start: int,
        cache: KVCache,
        cos: torch.Tensor,  # [T, Dr]
        sin: torch.Tensor,  # [T, Dr]
        mask: torch.Tensor | None,  # [T, S] bool, None for one new token
    ) -> torch.Tensor:
        cfg, tokens, d = self.cfg, x.shape[0], self.cfg.head_dim
        eps = cfg.rms_norm_eps
        qg = F.linear(x, self.q_w, self.q_b).view(tokens, cfg.num_heads, 2 * d)  # [T, N, 2D]
        q, gate = qg[..., :d], qg[..., d:].reshape(tokens, -1)  # [T, N, D], [T, N*D]
        q = apply_rope(rms_norm_offset(q, self.q_norm, eps).transpose(0, 1), cos, sin)
        k = F.linear(x, self.k_w, self.k_b).view(tokens, -1, d)  # [T, Nkv, D]
        k = apply_rope(rms_norm_offset(k, self.k_norm, eps).transpose(0, 1), cos, sin)
        v = F.linear(x, self.v_w, self.v_b).view(tokens, -1, d).transpose(0, 1)
        keys, values = cache.write(self.slot, start, k, v)  # [Nkv, S, D]
        gqa = cfg.num_heads != cfg.num_kv_heads
        out = F.scaled_dot_product_attention(
            q.unsqueeze(0), keys.unsqueeze(0), values.unsqueeze(0), attn_mask=mask, enable_gqa=gqa
        )  # [1, N, T, D]
        out = out[0].transpose(0, 1).reshape(tokens, -1) * torch.sigmoid(gate)  # [T, N*D]
        return F.linear(out, self.o_w, self.o_b)


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """x / sqrt(sum(x^2) + eps) over the last dim, as the FLA kernels (and transformers)."""
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def gated_delta_rule(
    q: torch.Tensor,  # [T, Hk, Dk]
    k: torch.Tensor,  # [T, Hk, Dk]
    v: torch.Tensor,  # [T, Hv, Dv]
    g: torch.Tensor,  # [T, Hv] log decay (<= 0)
    beta: torch.Tensor,  # [T, Hv]
    state: torch.Tensor,  # [Hv, Dk, Dv] fp32, updated in place
    block: int = DELTA_BLOCK,
    cuts: Sequence[int] = (),
    on_cut: Callable[[int, torch.Tensor], None] | None = None,
) -> torch.Tensor:
    """The gated delta rule, in fp32 with L2-normalised q and k and q scaled by
    Dk^-1/2, per value head h and token t:
    ``S = exp(g_t) S; S += k_t (beta_t (v_t - S^T k_t))^T; o_t = S^T q_t``
    (in fp32, or the state's wider dtype).
    One token steps the recurrence; more run in blocks of ``block`` tokens (the
    WY/UT form: one triangular solve per block, then one state update); a block also
    ends after each of ``cuts`` tokens, where ``on_cut(cut, state)`` sees the state.
    Returns the
    outputs [T, Hv, Dv] in the state's dtype."""
    tokens, k_heads, dk = k.shape
    rep = v.shape[1] // k_heads
    wide = state.dtype  # fp32 (fp64 for an fp64 model)
    q = (l2norm(q.to(wide)) * dk**-0.5).repeat_interleave(rep, dim=1).transpose(0, 1)
    k = l2norm(k.to(wide)).repeat_interleave(rep, dim=1).transpose(0, 1)  # [Hv, T, Dk]
    v = v.to(wide).transpose(0, 1)  # [Hv, T, Dv]
    g, beta = g.to(wide).t(), beta.to(wide).t()  # [Hv, T]
    if tokens == 1:
        s = state * g.exp()[..., None]  # [Hv, Dk, Dv]
        kv = (s * k.transpose(1, 2)).sum(dim=1)  # [Hv, Dv] = S^T k
        delta = (v[:, 0] - kv) * beta  # [Hv, Dv]
        s = s + k.transpose(1, 2) * delta[:, None, :]
        state.copy_(s)
        if on_cut is not None and 1 in cuts:
            on_cut(1, state)
        return (s * q.transpose(1, 2)).sum(dim=1)[None]  # [1, Hv, Dv]
    out = torch.empty_like(v)  # [Hv, T, Dv]
    ends = sorted({*range(block, tokens, block), *(c for c in cuts if 0 < c < tokens), tokens})
    for s0, e in zip([0, *ends[:-1]], ends, strict=True):
        qb, kb, vb = q[:, s0:e], k[:, s0:e], v[:, s0:e]  # [Hv, B, D]
        bb = beta[:, s0:e, None]  # [Hv, B, 1]
        gam = g[:, s0:e].cumsum(dim=-1)  # [Hv, B] log decay from the block start
        n = e - s0
        causal = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
        decay = (gam[:, :, None] - gam[:, None, :]).masked_fill(~causal, float("-inf")).exp()
        # (I + A) U = beta V - beta exp(gam) K S0, A[t, s] = beta_t (k_t.k_s) decay[t, s], s < t
        a = ((kb * bb) @ kb.transpose(1, 2)) * decay  # [Hv, B, B]; diagonal unused
        rhs = torch.cat((vb * bb, kb * bb * gam.exp()[..., None]), dim=-1)  # [Hv, B, Dv+Dk]
        solved = torch.linalg.solve_triangular(a, rhs, upper=False, unitriangular=True)
        u = solved[..., : vb.shape[-1]] - solved[..., vb.shape[-1] :] @ state  # [Hv, B, Dv]
        inter = (qb * gam.exp()[..., None]) @ state  # [Hv, B, Dv]
        out[:, s0:e] = inter + ((qb @ kb.transpose(1, 2)) * decay) @ u
        last = gam[:, -1:]  # [Hv, 1]
        k_to_end = kb * (last - gam).exp()[..., None]  # [Hv, B, Dk]
        state.copy_(state * last.exp()[..., None] + k_to_end.transpose(1, 2) @ u)
        if on_cut is not None and e in cuts:
            on_cut(e, state)
    return out.transpose(0, 1)  # [T, Hv, Dv]


class GatedDeltaNet:
    """One linear-attention layer (``model.layers.N.linear_attn.*``); its states are
    slot ``slot`` of ``states``."""

    def __init__(
        self,
        config: ModelConfig,
        layer: int,
        slot: int,
        source: WeightSource,
        place: Placement,
        states: LinearStates,
    ) -> None:
        la = config.linear_attention
        assert la is not None
        p = f"model.layers.{layer}.linear_attn."
        self.la, self.slot, self.states, self.eps = la, slot, states, config.rms_norm_eps
        self.qkvz_w = place.load(source, p + "in_proj_qkvz.weight")  # [2HkDk + 2HvDv, H]
        self.ba_w = place.load(source, p + "in_proj_ba.weight")  # [2Hv, H]
        self.conv_w = place.load(source, p + "conv1d.weight")  # [C, 1, K]
        self.conv_b = place.load_optional(source, p + "conv1d.bias")  # [C] (absent: none)
        self.dt_bias = place.load(source, p + "dt_bias")  # [Hv]
        self.a_log = place.load(source, p + "A_log")  # [Hv]
        self.norm = place.load(source, p + "norm.weight")  # [Dv]
        self.out_w = place.load(source, p + "out_proj.weight")  # [H, HvDv]
        channels = 2 * la.k_heads * la.k_head_dim + la.v_heads * la.v_head_dim
        if tuple(self.conv_w.shape) != (channels, 1, la.conv_kernel):
            raise ValueError(f"{p}conv1d.weight is not [{channels}, 1, {la.conv_kernel}]")

    def _conv(
        self, mixed: torch.Tensor, cuts: list[int]
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Causal depthwise conv + SiLU over mixed [C, T], continuing from the stored last
        K-1 inputs (zeros at the start), which it then replaces. Also returns the conv
        inputs as they stood after each of ``cuts`` tokens."""
        conv = self.states.conv_of(self.slot)  # [C, K-1]
        width = conv.shape[1]
        full = torch.cat((conv, mixed), dim=-1)  # [C, K-1+T]
        at_cuts = [full[:, c : c + width].clone() for c in cuts]
        conv.copy_(full[:, full.shape[1] - width :])
        out = F.conv1d(full.unsqueeze(0), self.conv_w, self.conv_b, groups=full.shape[0])
        return F.silu(out[0]), at_cuts  # [C, T]

    def __call__(
        self,
        x: torch.Tensor,  # [T, H]
        start: int,
        cache: KVCache,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor | None,
    ) -> torch.Tensor:
        """Runs the T tokens after the stored state (start, cache, cos, sin and mask are
        the attention interface's; a recurrent layer needs none of them)."""
        la, tokens = self.la, x.shape[0]
        rep, dk, dv = la.v_heads // la.k_heads, la.k_head_dim, la.v_head_dim
        # in_proj_qkvz rows come grouped per key head: q, k, then its rep value heads' v, z
        qkvz = F.linear(x, self.qkvz_w).view(tokens, la.k_heads, 2 * dk + 2 * rep * dv)
        q, k, v, z = torch.split(qkvz, [dk, dk, rep * dv, rep * dv], dim=2)
        ba = F.linear(x, self.ba_w).view(tokens, la.k_heads, 2 * rep)
        b, a = ba[..., :rep].reshape(tokens, -1), ba[..., rep:].reshape(tokens, -1)  # [T, Hv]
        mixed = torch.cat((q.reshape(tokens, -1), k.reshape(tokens, -1), v.reshape(tokens, -1)), -1)
        # checkpoints this call passes: after `cut` of its tokens
        cuts = [p - start for p in self.states.marks if start < p <= start + tokens]
        mixed, conv_at = self._conv(mixed.t(), cuts)
        mixed = mixed.t()  # [T, C]
        convs = dict(zip(cuts, conv_at, strict=True))

        def keep(cut: int, state: torch.Tensor) -> None:
            self.states.keep(self.slot, start + cut, convs[cut], state)

        key_dim = la.k_heads * dk
        q, k, v = torch.split(mixed, [key_dim, key_dim, la.v_heads * dv], dim=-1)
        beta = torch.sigmoid(b)
        wide = self.states.wide
        g = -self.a_log.to(wide).exp() * F.softplus(a.to(wide) + self.dt_bias)  # [T, Hv]
        out = gated_delta_rule(
            q.reshape(tokens, la.k_heads, dk),
            k.reshape(tokens, la.k_heads, dk),
            v.reshape(tokens, la.v_heads, dv),
            g,
            beta,
            self.states.recurrent_of(self.slot),
            cuts=cuts,
            on_cut=keep,
        ).to(x.dtype)  # [T, Hv, Dv]
        out = gated_rms_norm(out.reshape(-1, dv), z.reshape(-1, dv), self.norm, self.eps)
        return F.linear(out.reshape(tokens, -1), self.out_w)  # [T, H]
