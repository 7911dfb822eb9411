"""Layer-major prefill: a prompt runs as one forward (every layer over all its tokens
before the next layer), so each MoE layer meets each selected expert once per prompt
and a streamed model reads each of a layer's experts about once per prompt.

The forward bounds attention and dense-MLP intermediates itself (chunks of
``ATTENTION_CHUNK`` tokens); what grows with the prompt is the residual stream and the
MoE layer's per-(token, rank) expert outputs. When those would not fit the activation
budget (free GPU memory on CUDA, free RAM on the CPU, or the caller's), the prompt is
split into the fewest forwards that fit, with one printed line: each extra forward
reads the layers' experts again. Before splitting, a streamed model's RAM expert cache
lends the shortfall (``MoEModel.prompt_memory``: slots given back to the OS until the
first decode token) when the budget is the default one taken from free memory.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass

import torch

from flint.models.config import ModelConfig
from flint.models.transformer import ATTENTION_CHUNK, MoEModel

# T = prompt tokens, H = hidden, K = top-k, E = experts, I = expert intermediate,
# S = positions attended to, C = tokens per chunk

GIB = 1 << 30
FREE_SHARE = 0.5  # of the free memory a prompt's activations may take by default


def activation_bytes(
    cfg: ModelConfig, tokens: int, positions: int, dtype: torch.dtype, chunk: int
) -> int:
    """Peak bytes of one layer of a forward of ``tokens`` tokens attending to
    ``positions`` positions: the largest of the attention step and the MoE step, plus
    the residual stream around them. An estimate from the shapes, on the high side."""
    b = torch.finfo(dtype).bits // 8
    t, h, c = tokens, cfg.hidden_size, min(chunk, tokens)
    residual = 4 * t * h * b  # x, h, the normed input, the layer's output [T, H]
    heads = cfg.num_heads + 2 * cfg.num_kv_heads
    attention = c * heads * cfg.head_dim * b * 2 + cfg.num_heads * c * positions * 4
    if cfg.mla is not None:  # every position's latent expanded to per-head keys and values
        m = cfg.mla
        per_head = 2 * m.qk_nope_head_dim + m.qk_rope_head_dim + m.v_head_dim
        attention += cfg.num_heads * positions * per_head * b * 2
    dense = 3 * c * max(cfg.intermediate_size, cfg.shared_expert_intermediate_size) * b
    moe = 0
    if any(cfg.sparse_layers):
        routed = t * cfg.top_k
        moe = routed * h * 4 + routed * h * b  # [T*K, H] fp32 outputs + gathered rows
        moe += 3 * t * cfg.num_experts * 4 + 2 * t * h * 4  # router, weighted sum [T, H]
        moe += 3 * t * cfg.moe_intermediate_size * b  # one expert on up to T rows
    return residual + max(attention, dense, moe)


def free_activation_memory(device: torch.device) -> int:
    """Bytes a prompt's activations may take by default: a share of free memory."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free * FREE_SHARE)
    from flint.stream.plan import available_memory

    return int(available_memory() * FREE_SHARE)


@dataclass(slots=True, frozen=True)
class PrefillSplit:
    """Tokens per forward, and the line to print when the prompt had to be split."""

    piece: int
    note: str | None = None


def split_prompt(
    cfg: ModelConfig,
    tokens: int,
    start: int,
    dtype: torch.dtype,
    budget: int,
    chunk: int = ATTENTION_CHUNK,
) -> PrefillSplit:
    """The fewest equal forwards whose activations fit ``budget`` bytes (at least one
    token each: a budget below that is ignored, the one forward then runs anyway)."""
    need = activation_bytes(cfg, tokens, start + tokens, dtype, chunk)
    if need <= budget:
        return PrefillSplit(tokens)
    pieces = 2
    while pieces < tokens:
        piece = -(-tokens // pieces)
        if activation_bytes(cfg, piece, start + tokens, dtype, chunk) <= budget:
            break
        pieces += 1
    piece = -(-tokens // pieces)
    note = (
        f"prompt of {tokens} tokens needs ~{need / GIB:.2f} GiB of activations, more than "
        f"the {budget / GIB:.2f} GiB budget: prefilled in {-(-tokens // piece)} passes "
        f"of <= {piece} tokens (each reads the layers' experts again)"
    )
    return PrefillSplit(piece, note)


def _stderr(line: str) -> None:
    print(f"flint: {line}", file=sys.stderr)


def prefill(
    model: MoEModel,
    ids: torch.Tensor,  # [T]
    budget: int | None = None,
    chunk: int = ATTENTION_CHUNK,
    notice: Callable[[str], None] = _stderr,
) -> torch.Tensor:
    """Runs the prompt ids [T] after the cached positions, layer-major, in as few
    forwards as the activation budget allows (bytes; None: ``model.activation_budget``,
    else a share of free memory); returns the last position's logits [V] (fp32).
    With the budget from free memory, a prompt that would not fit first asks the
    expert backend to lend the shortfall from its cache (``model.prompt_memory``)."""
    tokens = ids.shape[0]
    if tokens == 0:
        raise ValueError("the prompt is empty")
    if budget is None:
        budget = model.activation_budget
    start = model.cache.length
    if budget is None:
        budget = free_activation_memory(model.place.device)
        need = activation_bytes(model.config, tokens, start + tokens, model.place.dtype, chunk)
        if need > budget and model.prompt_memory is not None:
            budget += model.prompt_memory(need - budget)
    split = split_prompt(model.config, tokens, start, model.place.dtype, budget, chunk)
    if split.note is not None:
        notice(split.note)
    logits = torch.empty(0)
    for s in range(0, tokens, split.piece):
        logits = model.forward(ids[s : s + split.piece], chunk=chunk)
    return logits[-1]
