"""GPT-OSS attention: grouped-query attention whose softmax also sees one learned "sink"
logit per head (a key nobody can attend to: it only takes probability mass away), over
all positions or a sliding window of the last ``window`` (the query's own included).

The math is transformers' ``eager_attention_forward`` of GPT-OSS, op for op: scores
scaled after the matmul, masked, the sink appended, the row maximum subtracted, softmax,
the sink's column dropped, times the values. Scores are materialised, so long prompts
are split by query rows to keep them under ``SCORE_BYTES``; a sliding layer only ever
looks at the keys its window can reach.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from flint.models.attention import Attention
from flint.models.config import ModelConfig
from flint.models.kv_cache import KVCache
from flint.models.loading import Placement
from flint.models.rope import apply_rope
from flint.models.weights import WeightSource

# T = new tokens, C = query rows in one piece, S = keys seen, Nq / Nkv = query / kv
# heads, G = Nq / Nkv, D = head dim

SCORE_BYTES = 256 << 20  # largest [Nq, C, S] score tensor of one piece


class SinkAttention(Attention):
    """One GPT-OSS layer's self-attention (weights as ``Attention``'s, plus ``sinks``)."""

    def __init__(
        self, config: ModelConfig, layer: int, source: WeightSource, place: Placement
    ) -> None:
        super().__init__(config, layer, source, place)
        self.sinks = place.load(source, f"model.layers.{layer}.self_attn.sinks")  # [Nq]
        self.window = config.layer_windows[layer] if config.layer_windows else 0
        self.scale = config.head_dim**-0.5

    def __call__(
        self,
        x: torch.Tensor,  # [T, H]
        start: int,
        cache: KVCache,
        cos: torch.Tensor,  # [T, D]
        sin: torch.Tensor,  # [T, D]
        mask: torch.Tensor | None,  # unused: the mask depends on the layer's window
    ) -> torch.Tensor:
        q = apply_rope(self._project(x, self.q_w, self.q_b, None), cos, sin)  # [Nq, T, D]
        k = apply_rope(self._project(x, self.k_w, self.k_b, None), cos, sin)  # [Nkv, T, D]
        v = self._project(x, self.v_w, self.v_b, None)  # [Nkv, T, D]
        keys, values = cache.write(self.layer, start, k, v)  # [Nkv, start+T, D]
        tokens, seen = x.shape[0], keys.shape[1]
        if self.window:
            seen = min(seen, tokens + self.window - 1)
        rows = max(1, SCORE_BYTES // (q.shape[0] * seen * q.element_size()))
        parts = [
            self._attend(q[:, s : s + rows], start + s, keys, values)
            for s in range(0, tokens, rows)
        ]
        out = parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)  # [Nq, T, D]
        return F.linear(out.transpose(0, 1).reshape(tokens, -1), self.o_w, self.o_b)  # [T, H]

    def _attend(
        self,
        q: torch.Tensor,  # [Nq, C, D], positions start..start+C-1
        start: int,
        keys: torch.Tensor,  # [Nkv, >= start+C, D]
        values: torch.Tensor,  # [Nkv, >= start+C, D]
    ) -> torch.Tensor:
        rows, end = q.shape[1], start + q.shape[1]
        first = max(0, start - self.window + 1) if self.window else 0
        k, v = keys[:, first:end], values[:, first:end]  # [Nkv, S, D]
        visible = self._visible(start, rows, first, end, q.device)  # [C, S] or None
        return self.attend_keys(q, k, v, visible)

    def attend_keys(
        self,
        q: torch.Tensor,  # [Nq, C, D]
        k: torch.Tensor,  # [Nkv, S, D]
        v: torch.Tensor,  # [Nkv, S, D]
        visible: torch.Tensor | None,  # bool, broadcast to [C, S]; None: every key
    ) -> torch.Tensor:
        """The queries against keys ``k`` where ``visible``, each head's sink logit in
        the softmax (and dropped after): [Nq, C, D]. Shared with the graph decode step."""
        rows, nkv, dim = q.shape[1], k.shape[0], k.shape[2]
        qg = q.view(nkv, -1, rows, dim)  # [Nkv, G, C, D]: query head h uses kv head h // G
        scores = torch.matmul(qg, k.unsqueeze(1).transpose(2, 3)) * self.scale  # [Nkv, G, C, S]
        if visible is not None:
            scores = scores.masked_fill(~visible, float("-inf"))
        sinks = self.sinks.view(nkv, -1, 1, 1).expand(-1, -1, rows, 1)  # [Nkv, G, C, 1]
        logits = torch.cat([scores, sinks], dim=-1)
        logits = logits - logits.max(dim=-1, keepdim=True).values
        probs = F.softmax(logits, dim=-1, dtype=logits.dtype)[..., :-1].to(v.dtype)
        return torch.matmul(probs, v.unsqueeze(1)).view(-1, rows, dim)  # [Nq, C, D]

    def _visible(
        self, start: int, rows: int, first: int, end: int, device: torch.device
    ) -> torch.Tensor | None:
        """[C, S] bool: query at start+i sees key at first+j (causal, within the window);
        None for one query, which sees every key from ``first`` on."""
        if rows == 1:
            return None
        q_pos = torch.arange(start, end, device=device)[:, None]
        k_pos = torch.arange(first, end, device=device)[None, :]
        visible = k_pos <= q_pos
        if self.window:
            visible &= k_pos > q_pos - self.window
        return visible
