"""Kimi K2: DeepSeek-V3's architecture under ``model_type`` kimi_k2. A tiny DeepSeek-V3
whose config.json says kimi_k2 (as Kimi K2's does) loads, converts and computes as the
DeepSeek-V3 it is."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from tiny import build, deepseek_v3_config, save_tokenizer

import flint
from flint.convert import ConvertOptions, convert
from flint.models import parse_config

PROMPTS = ([5, 17, 250, 3, 99], list(range(40, 77)))


@pytest.fixture(scope="module")
def kimi(tmp_path_factory: pytest.TempPathFactory, tiny_tokenizer_json: str) -> tuple[Path, Any]:
    """(a kimi_k2 checkpoint directory, the DeepSeek-V3 transformers model it holds)."""
    ds = tmp_path_factory.mktemp("ds")
    model = build("deepseek_v3", ds, seed=0, config=deepseek_v3_config())
    save_tokenizer(ds, tiny_tokenizer_json)
    path = tmp_path_factory.mktemp("kimi")
    for f in ds.iterdir():
        shutil.copy(f, path / f.name)
    config = json.loads((ds / "config.json").read_text())
    config.update(model_type="kimi_k2", architectures=["DeepseekV3ForCausalLM"])
    (path / "config.json").write_text(json.dumps(config))
    return path, model


def test_kimi_k2_config_is_deepseek_v3() -> None:
    hf = deepseek_v3_config().to_dict()
    assert parse_config({**hf, "model_type": "kimi_k2"}) == parse_config(hf)
    assert parse_config({**hf, "model_type": "kimi_k2"}).family == "deepseek_v3"


def _assert_logits(llm: flint.LLM, ref: Any) -> None:
    for ids in PROMPTS:
        llm.model.reset()
        got = llm.model.forward(torch.tensor(ids), all_logits=True)
        with torch.no_grad():
            want = ref(torch.tensor([ids])).logits[0]
        assert (got - want).abs().max().item() <= 1e-4
        assert want.abs().max().item() > 1.0


def test_kimi_k2_directory_and_converted_file(kimi: tuple[Path, Any], tmp_path: Path) -> None:
    path, ref = kimi
    with flint.LLM(path, device="cpu", context_length=64) as llm:
        assert llm.model.config.family == "deepseek_v3"
        _assert_logits(llm, ref)
    ftw = tmp_path / "kimi.ftw"
    assert convert(str(path), ftw, ConvertOptions(quant="none"))["arch"] == "kimi_k2"
    with flint.LLM(ftw, device="cpu", context_length=64) as llm:
        _assert_logits(llm, ref)
