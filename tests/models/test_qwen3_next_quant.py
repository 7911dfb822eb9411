"""Qwen3-Next converted with quantized weights: ``--dense-quant int8`` now includes the
gated-DeltaNet projections (``in_proj_qkvz``, ``in_proj_ba``, ``out_proj``), and
``--quant int8`` quantizes the experts as for every family.

A tiny random Qwen3-Next is very sensitive to its DeltaNet projections (1% noise on
``in_proj_qkvz`` moves its logits by up to 7.5 here), so the quantized file is checked
two ways: exactly, against transformers run on the same dequantized weights, and
loosely, against the unquantized model (bounds set from the measured values)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch
from tiny import build, qwen3_next_config, save_tokenizer

from flint.convert import ConvertOptions, convert
from flint.format.quant import quantize_int8
from flint.models import FtwSource, load_model

CPU = torch.device("cpu")
PROMPT = torch.randint(0, 320, (100,), generator=torch.Generator().manual_seed(1))
DELTANET = ("in_proj_qkvz", "in_proj_ba", "out_proj")


@pytest.fixture(scope="module")
def qwen3_next(
    tmp_path_factory: pytest.TempPathFactory, tiny_tokenizer_json: str
) -> tuple[Path, Any]:
    path = tmp_path_factory.mktemp("qwen3_next_quant")
    model = build("qwen3_next", path, seed=2, config=qwen3_next_config())
    save_tokenizer(path, tiny_tokenizer_json)
    return path, model


def _logits(ftw: Path) -> torch.Tensor:
    model = load_model(FtwSource(ftw), CPU, torch.float32, context_length=160)
    return model.forward(PROMPT, all_logits=True)


def _reference(model: Any, quantized: set[str]) -> torch.Tensor:
    """transformers' logits with the named weights rounded through int8 as the file is."""
    model = copy.deepcopy(model)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name in quantized:
                q, scale = quantize_int8(param.data)
                param.data = q.float() * scale[:, None]
        return model(PROMPT[None]).logits[0]


def test_dense_int8_includes_the_deltanet_projections(
    qwen3_next: tuple[Path, Any], tmp_path: Path
) -> None:
    path, ref = qwen3_next
    ftw = tmp_path / "dense.ftw"
    convert(str(path), ftw, ConvertOptions(quant="none", dense_quant="int8"))
    quantized = set(FtwSource(ftw)._int8_dense)
    linear = [n for n in quantized if ".linear_attn." in n]
    assert {n.split(".")[-2] for n in linear} == set(DELTANET)
    assert len(linear) == 3 * ref.config.layer_types.count("linear_attention")
    assert not any("conv1d" in n or "norm" in n for n in quantized)
    got = _logits(ftw)
    assert (got - _reference(ref, quantized)).abs().max().item() <= 1e-4  # the exact path
    with torch.no_grad():
        want = ref(PROMPT[None]).logits[0]
    top1 = (got.argmax(-1) == want.argmax(-1)).float().mean().item()
    diff = (got - want).abs()
    # measured: top-1 0.86, mean |diff| 0.11, max 4.4 (DeltaNet projections left
    # unquantized: 0.95, 0.029, 0.61)
    assert top1 >= 0.8 and diff.mean().item() <= 0.2, (top1, diff.mean().item())


def test_int8_experts_stay_close(qwen3_next: tuple[Path, Any], tmp_path: Path) -> None:
    path, ref = qwen3_next
    ftw = tmp_path / "experts.ftw"
    convert(str(path), ftw, ConvertOptions(quant="int8"))
    got = _logits(ftw)
    with torch.no_grad():
        want = ref(PROMPT[None]).logits[0]
    # measured: top-1 0.98, mean |diff| 0.009, max 0.12
    assert (got.argmax(-1) == want.argmax(-1)).float().mean().item() >= 0.95
    assert (got - want).abs().max().item() <= 0.3
