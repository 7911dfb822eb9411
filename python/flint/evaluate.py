"""Perplexity of a model on a token sequence, and its distance to a reference model.

The text is cut into non-overlapping windows; each window is run from an empty KV
cache and every position that has a next token inside the window is scored (the
usual non-overlapping-window perplexity). With a reference model (e.g. the bf16 file
of the same model), each scored position also gives KL(reference || model) and
whether both put the same token first.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from flint.models.transformer import MoEModel

# P = positions in one piece, V = vocabulary

PIECE = 128  # positions run per forward: bounds the [P, V] logits kept at once


@dataclass(slots=True, frozen=True)
class EvalResult:
    """Scores over ``tokens`` predicted positions (nats per token)."""

    tokens: int
    windows: int
    nll: float
    ref_nll: float | None = None
    kl: float | None = None  # mean KL(reference || model)
    top1: float | None = None  # share of positions where both argmaxes agree

    @property
    def perplexity(self) -> float:
        return math.exp(self.nll)

    @property
    def ref_perplexity(self) -> float | None:
        return None if self.ref_nll is None else math.exp(self.ref_nll)


@dataclass(slots=True)
class _Sums:
    tokens: int = 0
    nll: float = 0.0
    ref_nll: float = 0.0
    kl: float = 0.0
    top1: int = 0
    windows: int = 0


def _pieces(
    model: MoEModel, window: Sequence[int], device: torch.device
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """(logits [P, V] fp32, targets [P]) over the window's scored positions, from an
    empty cache."""
    model.reset()
    ids = torch.tensor(list(window), dtype=torch.int64, device=device)
    for start in range(0, len(window) - 1, PIECE):
        end = min(start + PIECE, len(window) - 1)
        yield model.forward(ids[start:end], all_logits=True), ids[start + 1 : end + 1]


def _score(
    sums: _Sums, logits: torch.Tensor, targets: torch.Tensor, ref: torch.Tensor | None
) -> None:
    sums.tokens += targets.shape[0]
    sums.nll += F.cross_entropy(logits, targets, reduction="sum").item()
    if ref is None:
        return
    lp, lr = logits.log_softmax(-1), ref.log_softmax(-1)  # [P, V]
    sums.ref_nll += F.nll_loss(lr, targets, reduction="sum").item()
    sums.kl += (lr.exp() * (lr - lp)).sum().item()
    sums.top1 += int((lp.argmax(-1) == lr.argmax(-1)).sum().item())


def scored_positions(n_tokens: int, window: int) -> int:
    """How many positions ``evaluate`` scores in ``n_tokens`` tokens cut into windows."""
    full, rest = divmod(n_tokens, window)
    return full * (window - 1) + max(rest - 1, 0)


def check_inputs(model: MoEModel, n_tokens: int, window: int, ref: MoEModel | None) -> None:
    """ValueError unless ``evaluate`` can score ``n_tokens`` tokens in such windows."""
    ctx = model.context_length if ref is None else min(model.context_length, ref.context_length)
    if window < 2 or window > ctx:
        raise ValueError(f"window must be in [2, {ctx}] tokens (the context length), got {window}")
    if ref is not None and ref.config.vocab_size != model.config.vocab_size:
        raise ValueError("the reference model has a different vocabulary")
    if n_tokens < 2:
        raise ValueError("the text is too short: at least 2 tokens are needed")


def evaluate(
    model: MoEModel,
    ids: Sequence[int],
    window: int,
    ref: MoEModel | None = None,
    progress: Callable[[int], None] | None = None,
) -> EvalResult:
    """Scores ``model`` on ``ids`` in windows of ``window`` tokens; ``progress`` gets the
    number of positions scored after each window."""
    check_inputs(model, len(ids), window, ref)
    sums = _Sums()
    device = model.place.device
    for start in range(0, len(ids) - 1, window):
        chunk = ids[start : start + window]
        if len(chunk) < 2:
            break
        ref_pieces = _pieces(ref, chunk, ref.place.device) if ref is not None else None
        for logits, targets in _pieces(model, chunk, device):
            ref_logits = next(ref_pieces)[0].to(device) if ref_pieces is not None else None
            _score(sums, logits, targets, ref_logits)
        sums.windows += 1
        if progress is not None:
            progress(len(chunk) - 1)
    n = sums.tokens
    if ref is None:
        return EvalResult(n, sums.windows, sums.nll / n)
    return EvalResult(n, sums.windows, sums.nll / n, sums.ref_nll / n, sums.kl / n, sums.top1 / n)
