"""Checks every extra model variant runs (beyond the shared FAMILY_NAMES suites): its
logits against transformers' forward, and its streamed output against resident."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

import flint
from flint.convert import ConvertOptions, convert
from flint.models import SafetensorsSource, load_model
from flint.models.transformer import MoEModel

CPU = torch.device("cpu")


def assert_logits_match(path: Path, ref: Any, prompts: Sequence[list[int]]) -> MoEModel:
    """flint's fp32 logits of each prompt within 1e-4 of transformers' (``ref``), and
    of a real size; returns the loaded model for further checks."""
    model = load_model(SafetensorsSource(path), CPU, torch.float32, context_length=64)
    for prompt in prompts:
        with torch.no_grad():
            want = ref(torch.tensor([prompt])).logits[0]
        model.reset()
        got = model.forward(torch.tensor(prompt), all_logits=True)
        assert (got - want).abs().max().item() <= 1e-4
        assert want.abs().max().item() > 1.0  # logits of a real size, not all ~0
    return model


def assert_incremental_equals_full(model: MoEModel, ids: list[int], first: int = 5) -> None:
    """A prompt of ``first`` tokens then one token at a time (through the model's
    cache) gives the logits of one forward of all ``ids``, within 1e-4."""
    x = torch.tensor(ids)
    model.reset()
    full = model.forward(x, all_logits=True)
    model.reset()
    steps = [model.forward(x[:first], all_logits=True)]
    steps += [model.forward(x[i : i + 1], all_logits=True) for i in range(first, len(ids))]
    assert (torch.cat(steps) - full).abs().max().item() <= 1e-4


def assert_streamed_equals_resident(
    path: Path, tmp_path: Path, prompts: Sequence[list[int]], steps: Sequence[int]
) -> dict[str, Any]:
    """The checkpoint converted (--quant none), streamed through 1 slot per layer with
    lookahead 2: every prompt's logits and each decode step's bit-identical to
    resident. Returns the streaming statistics."""
    ftw = tmp_path / "m.ftw"
    convert(str(path), ftw, ConvertOptions(quant="none"))
    with (
        flint.LLM(ftw, device="cpu", context_length=64) as resident,
        flint.LLM(ftw, device="cpu", context_length=64, ram_budget=1e-6, lookahead=2) as s,
    ):
        for ids in prompts:
            resident.model.reset()
            s.model.reset()
            want = resident.model.forward(torch.tensor(ids), all_logits=True)
            assert torch.equal(s.model.forward(torch.tensor(ids), all_logits=True), want)
            for step in steps:
                want = resident.model.forward(torch.tensor([step]))
                assert torch.equal(s.model.forward(torch.tensor([step])), want)
        stats = s.stats()
    assert stats is not None
    return stats
