"""Sampler properties: masks, penalties, seeds, greedy, validation."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from flint.sampling import (
    Sampler,
    SamplingParams,
    apply_penalties,
    draw,
    min_p_mask,
    top_k_mask,
    top_p_mask,
)

CPU = torch.device("cpu")


def _logits(seed: int = 0, vocab: int = 50) -> torch.Tensor:
    return torch.randn(vocab, generator=torch.Generator().manual_seed(seed)) * 3


@pytest.mark.parametrize("k", [1, 3, 17])
def test_top_k_keeps_exactly_the_k_largest(k: int) -> None:
    x = _logits(k)
    kept = torch.isfinite(top_k_mask(x, k))
    assert int(kept.sum()) == k
    assert x[kept].min() > x[~kept].max()
    assert torch.equal(top_k_mask(x, 0), x)


@pytest.mark.parametrize("p", [0.05, 0.5, 0.9, 0.999])
def test_top_p_keeps_the_smallest_set_reaching_p(p: float) -> None:
    x = _logits(int(p * 100))
    kept = torch.isfinite(top_p_mask(x, p))
    probs = torch.softmax(x, -1)
    assert probs[kept].min() > probs[~kept].max()  # the most likely tokens
    assert probs[kept].sum() >= p  # reach p
    assert probs[kept].sum() - probs[kept].min() < p  # and no smaller set would


def test_min_p_drops_tokens_below_fraction_of_the_top() -> None:
    x = _logits(7)
    probs = torch.softmax(x, -1)
    kept = torch.isfinite(min_p_mask(x, 0.2))
    assert torch.equal(kept, probs >= 0.2 * probs.max())


def test_penalties() -> None:
    x = torch.tensor([2.0, -2.0, 1.0, 0.5])
    seen = torch.tensor([True, True, False, False])
    counts = torch.tensor([0.0, 0.0, 3.0, 0.0])
    params = SamplingParams(repetition_penalty=2.0)
    assert apply_penalties(x, params, seen, counts).tolist() == [1.0, -4.0, 1.0, 0.5]
    params = SamplingParams(frequency_penalty=0.5, presence_penalty=0.25)
    assert apply_penalties(x, params, seen, counts).tolist() == [2.0, -2.0, -0.75, 0.5]


def test_greedy_takes_argmax_and_penalties_change_it() -> None:
    x = torch.tensor([0.0, 5.0, 4.9, 1.0])
    assert Sampler(SamplingParams(temperature=0.0), 4, CPU, [])(x) == 1
    assert Sampler(SamplingParams(temperature=0.0, repetition_penalty=1.5), 4, CPU, [1])(x) == 2
    sampler = Sampler(SamplingParams(temperature=0.0, frequency_penalty=2.0), 4, CPU, [])
    assert [sampler(x) for _ in range(3)] == [1, 2, 1]


def test_same_seed_same_tokens_other_seed_other_tokens() -> None:
    x = torch.zeros(1000)  # uniform: every draw is up to the generator

    def draw(seed: int) -> list[int]:
        sampler = Sampler(SamplingParams(seed=seed), 1000, CPU, [])
        return [sampler(x) for _ in range(20)]

    assert draw(1) == draw(1)
    assert draw(1) != draw(2)


def test_sampling_respects_top_k() -> None:
    x = _logits(3)
    allowed = set(torch.topk(x, 4).indices.tolist())
    sampler = Sampler(SamplingParams(top_k=4, temperature=1.5, seed=0), 50, CPU, [])
    drawn = {sampler(x) for _ in range(200)}
    assert drawn <= allowed and len(drawn) > 1


def test_draw_follows_the_probabilities() -> None:
    """40,000 draws from [0.5, 0, 0.3, 0.2, 0]: each share within 0.01 (about 4 sd) of
    its probability, the zero-probability tokens never, at either end or inside."""
    probs = torch.tensor([0.5, 0.0, 0.3, 0.2, 0.0])
    gen = torch.Generator().manual_seed(0)
    counts = torch.bincount(torch.tensor([draw(probs, gen) for _ in range(40_000)]), minlength=5)
    share = counts.float() / counts.sum()
    assert counts[1] == 0 and counts[4] == 0
    assert (share - probs).abs().max().item() < 0.01


def test_draw_at_the_top_of_the_cumulative_sum_takes_the_last_possible_token(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A uniform draw that rounds up to the total (u = total) is the last token with a
    probability, not the zero-probability tail."""
    monkeypatch.setattr(torch, "rand", lambda *a, **k: torch.ones(1))
    assert draw(torch.tensor([0.25, 0.75, 0.0, 0.0]), torch.Generator()) == 1


BAD: list[tuple[dict[str, Any], str]] = [
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": 2.5}, "max_tokens"),
    ({"temperature": -0.1}, "temperature"),
    ({"temperature": math.nan}, "temperature"),
    ({"top_k": -1}, "top_k"),
    ({"top_p": 0.0}, "top_p"),
    ({"top_p": 1.5}, "top_p"),
    ({"min_p": 2.0}, "min_p"),
    ({"repetition_penalty": 0.0}, "repetition_penalty"),
    ({"presence_penalty": 3.0}, "presence_penalty"),
    ({"frequency_penalty": -2.5}, "frequency_penalty"),
    ({"seed": -1}, "seed"),
    ({"seed": True}, "seed"),
    ({"stop": ("",)}, "stop"),
    ({"ignore_eos": 1}, "ignore_eos"),
]


@pytest.mark.parametrize(("kwargs", "field"), BAD, ids=[f"{b[1]}={b[0][b[1]]}" for b in BAD])
def test_invalid_params_raise_value_error(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kwargs)


def test_build_from_generation_config() -> None:
    assert SamplingParams.build({"do_sample": False, "temperature": 0.7}).greedy
    params = SamplingParams.build({"do_sample": True, "temperature": 0.7, "top_k": 20}, top_p=0.9)
    assert (params.temperature, params.top_k, params.top_p) == (0.7, 20, 0.9)
    assert SamplingParams.build({}, stop="\n").stop == ("\n",)
    with pytest.raises(ValueError, match="unknown sampling option"):
        SamplingParams.build({}, temprature=0.5)
