"""Turning logits into the next token: penalties, temperature, top-k, top-p, min-p.

Order as in vLLM and transformers: penalties -> temperature -> top-k -> top-p -> min-p
-> draw. The repetition penalty (CTRL style) covers prompt and output tokens;
presence and frequency penalties (OpenAI style) cover output tokens only.
Temperature 0 is greedy (argmax after penalties).
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

# V = vocabulary


@dataclass(slots=True, frozen=True)
class SamplingParams:
    """How to pick tokens and when to stop. Every field is validated at construction."""

    max_tokens: int = 256
    temperature: float = 1.0
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 = off
    min_p: float = 0.0  # 0 = off
    repetition_penalty: float = 1.0  # 1 = off
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None  # None = a fresh random seed per request
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        _check_int("max_tokens", self.max_tokens, low=1)
        _check_float("temperature", self.temperature, low=0.0)
        _check_int("top_k", self.top_k, low=0)
        _check_float("top_p", self.top_p, low=0.0, low_open=True, high=1.0)
        _check_float("min_p", self.min_p, low=0.0, high=1.0)
        _check_float("repetition_penalty", self.repetition_penalty, low=0.0, low_open=True)
        _check_float("presence_penalty", self.presence_penalty, low=-2.0, high=2.0)
        _check_float("frequency_penalty", self.frequency_penalty, low=-2.0, high=2.0)
        if self.seed is not None:
            _check_int("seed", self.seed, low=0)
        if isinstance(self.stop, str) or not all(isinstance(s, str) and s for s in self.stop):
            raise ValueError(f"stop must be a sequence of non-empty strings, got {self.stop!r}")
        if not isinstance(self.ignore_eos, bool):
            raise ValueError(f"ignore_eos must be a bool, got {self.ignore_eos!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @classmethod
    def build(cls, defaults: Mapping[str, Any] | None = None, **overrides: Any) -> SamplingParams:
        """Params from a model's ``generation_config`` (sampling only if ``do_sample``),
        then the caller's overrides (None values ignored; unknown names: ValueError)."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(overrides) - names)
        if unknown:
            raise ValueError(f"unknown sampling option(s) {unknown}; valid: {sorted(names)}")
        values: dict[str, Any] = _from_generation_config(defaults or {})
        values.update({k: v for k, v in overrides.items() if v is not None})
        if isinstance(values.get("stop"), str):
            values["stop"] = (values["stop"],)
        elif "stop" in values:
            values["stop"] = tuple(values["stop"])
        return cls(**values)


def _from_generation_config(gen: Mapping[str, Any]) -> dict[str, Any]:
    if not gen.get("do_sample", False):
        return {"temperature": 0.0}
    out: dict[str, Any] = {}
    for key in ("temperature", "top_k", "top_p", "min_p", "repetition_penalty"):
        if gen.get(key) is not None:
            out[key] = gen[key]
    return out


def _check_int(name: str, value: Any, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")


def _check_float(
    name: str,
    value: Any,
    low: float,
    high: float = math.inf,
    low_open: bool = False,
) -> None:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (value > low if low_open else value >= low) and value <= high
    if not ok:
        bound = f"{'>' if low_open else '>='} {low}" + (
            f" and <= {high}" if high < math.inf else ""
        )
        raise ValueError(f"{name} must be a finite number {bound}, got {value!r}")


def top_k_mask(logits: torch.Tensor, k: int) -> torch.Tensor:
    """logits [V] with all but the k largest set to -inf (k = 0 or >= V: unchanged)."""
    if k <= 0 or k >= logits.shape[-1]:
        return logits
    kth = torch.topk(logits, k).values[-1]
    return logits.masked_fill(logits < kth, -math.inf)


def top_p_mask(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Keeps the smallest set of most likely tokens whose probability reaches p."""
    if p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, descending=True)
    probs = torch.softmax(sorted_logits, dim=-1)
    before = torch.cumsum(probs, dim=-1) - probs  # mass of strictly more likely tokens
    drop_sorted = before >= p
    drop_sorted[0] = False  # the most likely token always stays
    drop = torch.zeros_like(drop_sorted).scatter(0, order, drop_sorted)
    return logits.masked_fill(drop, -math.inf)


def min_p_mask(logits: torch.Tensor, min_p: float) -> torch.Tensor:
    """Drops tokens whose probability is below ``min_p`` times the top probability."""
    if min_p <= 0.0:
        return logits
    probs = torch.softmax(logits, dim=-1)
    return logits.masked_fill(probs < min_p * probs.max(), -math.inf)


def apply_penalties(
    logits: torch.Tensor,  # [V]
    params: SamplingParams,
    seen: torch.Tensor,  # [V] bool: in prompt or output
    output_counts: torch.Tensor,  # [V] float: times generated
) -> torch.Tensor:
    if params.repetition_penalty != 1.0:
        penalised = torch.where(
            logits > 0, logits / params.repetition_penalty, logits * params.repetition_penalty
        )
        logits = torch.where(seen, penalised, logits)
    if params.frequency_penalty != 0.0:
        logits = logits - params.frequency_penalty * output_counts
    if params.presence_penalty != 0.0:
        logits = logits - params.presence_penalty * (output_counts > 0).to(logits.dtype)
    return logits


def draw(probs: torch.Tensor, generator: torch.Generator) -> int:
    """One index of probs [V] (non-negative, summing to about 1) with those
    probabilities: the first whose cumulative sum passes a uniform draw. A zero
    probability is never drawn. ~8 us on a 4k vocabulary on the CPU box, against
    ~96 us for ``torch.multinomial`` (docs/benchmarks.md), a quarter of a small
    model's decode step."""
    cdf = torch.cumsum(probs, dim=0)  # [V]
    u = torch.rand(1, generator=generator, device=probs.device, dtype=cdf.dtype) * cdf[-1]
    index = int(torch.searchsorted(cdf, u, right=True))
    if index >= probs.shape[0]:  # u rounded up to the total: the last possible token
        index = int(torch.nonzero(probs).max())
    return index


class Sampler:
    """Per-request sampling state: the seeded generator and the token counts."""

    def __init__(
        self, params: SamplingParams, vocab_size: int, device: torch.device, prompt: Iterable[int]
    ) -> None:
        self.params = params
        seed = params.seed if params.seed is not None else random.getrandbits(63)
        self.generator = torch.Generator(device=device).manual_seed(seed)
        self.seen = torch.zeros(vocab_size, dtype=torch.bool, device=device)
        self.counts = torch.zeros(vocab_size, dtype=torch.float32, device=device)
        prompt_ids = torch.tensor(list(prompt), dtype=torch.int64, device=device)
        self.seen[prompt_ids[prompt_ids < vocab_size]] = True
        self.vocab_size = vocab_size

    def __call__(self, logits: torch.Tensor) -> int:
        """Picks the next token from logits [V'] (V' >= V: padded heads are cut)."""
        p = self.params
        x = apply_penalties(logits[: self.vocab_size].float(), p, self.seen, self.counts)
        if p.greedy:
            token = int(torch.argmax(x))
        else:
            x = min_p_mask(top_p_mask(top_k_mask(x / p.temperature, p.top_k), p.top_p), p.min_p)
            token = draw(torch.softmax(x, dim=-1), self.generator)
        self.seen[token] = True
        self.counts[token] += 1
        return token
