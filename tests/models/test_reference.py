"""flint's models against transformers' on tiny random checkpoints, every family, fp32."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from tiny import FAMILY_NAMES, VOCAB

import flint
from flint.models import SafetensorsSource, load_model

CPU = torch.device("cpu")
PROMPTS = ([5, 17, 250, 3, 99], list(range(40, 77)), [7] * 3 + [120, 121, 122] * 9, [11])


@pytest.fixture(params=FAMILY_NAMES)
def family(request: pytest.FixtureRequest, tiny_models: dict[str, Any]) -> tuple[Path, Any]:
    return tiny_models[request.param]  # type: ignore[no-any-return]


def test_logits_match_transformers(family: tuple[Path, Any]) -> None:
    path, ref = family
    model = load_model(SafetensorsSource(path), CPU, torch.float32, context_length=64)
    for prompt in PROMPTS:
        with torch.no_grad():
            want = ref(torch.tensor([prompt])).logits[0]
        model.reset()
        got = model.forward(torch.tensor(prompt), all_logits=True)
        assert got.shape == (len(prompt), VOCAB)
        assert (got - want).abs().max().item() <= 1e-4
        assert want.abs().max().item() > 1.0  # logits of a real size, not all ~0


def test_greedy_generation_matches_transformers(family: tuple[Path, Any]) -> None:
    path, ref = family
    prompt = [5, 17, 250, 3, 99, 42]
    ref.generation_config.eos_token_id = None
    with torch.no_grad():
        out = ref.generate(
            torch.tensor([prompt]), max_new_tokens=32, do_sample=False, pad_token_id=0
        )
    want = out[0, len(prompt) :].tolist()
    with flint.LLM(path, device="cpu", context_length=64) as llm:
        got = llm.generate(prompt, max_tokens=32, temperature=0.0, ignore_eos=True)
    assert list(got.token_ids) == want
    assert got.finish_reason == "length"
    assert len(set(want)) > 3  # the tokens are not one repeated token


def test_incremental_decoding_equals_full_forward(family: tuple[Path, Any]) -> None:
    path, _ = family
    model = load_model(SafetensorsSource(path), CPU, torch.float32, context_length=64)
    ids = torch.tensor(PROMPTS[1][:30])
    full = model.forward(ids, all_logits=True)
    model.reset()
    pieces = [model.forward(ids[:7], all_logits=True)]
    pieces += [model.forward(ids[i : i + 1], all_logits=True) for i in range(7, 20)]
    pieces.append(model.forward(ids[20:], all_logits=True))
    assert model.cache.length == 30
    assert (torch.cat(pieces) - full).abs().max().item() <= 1e-4


def test_reset_keeps_a_prefix(family: tuple[Path, Any]) -> None:
    path, _ = family
    model = load_model(SafetensorsSource(path), CPU, torch.float32, context_length=64)
    ids = torch.tensor(PROMPTS[1][:12])
    full = model.forward(ids, all_logits=True)
    model.reset(8)
    again = model.forward(ids[8:], all_logits=True)
    assert (again - full[8:]).abs().max().item() <= 1e-4


def test_context_length_is_enforced(family: tuple[Path, Any]) -> None:
    path, _ = family
    model = load_model(SafetensorsSource(path), CPU, torch.float32, context_length=8)
    model.forward(torch.tensor([1, 2, 3, 4, 5, 6]))
    with pytest.raises(ValueError, match="context length"):
        model.forward(torch.tensor([1, 2, 3]))
