"""Fixtures: one tiny random checkpoint per family and .ftw files made from them (built
once per session)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from tiny import FAMILY_NAMES, SEEDS, SPECIAL_TOKENS, build, save_tokenizer, tokenizer_json


@pytest.fixture(scope="session")
def tiny_tokenizer_json() -> str:
    return tokenizer_json()


@pytest.fixture(scope="session")
def tiny_models(
    tmp_path_factory: pytest.TempPathFactory, tiny_tokenizer_json: str
) -> dict[str, tuple[Path, Any]]:
    """family -> (checkpoint directory, the transformers model in fp32)."""
    out: dict[str, tuple[Path, Any]] = {}
    for family in FAMILY_NAMES:
        path = tmp_path_factory.mktemp(family)
        model = build(family, path, seed=SEEDS[family])
        save_tokenizer(path, tiny_tokenizer_json)
        out[family] = (path, model)
    return out


@pytest.fixture(scope="session")
def tiny_ftw(
    tiny_models: dict[str, tuple[Path, Any]], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Path]:
    """family -> its tiny checkpoint converted to .ftw with --quant none."""
    from flint.convert import ConvertOptions, convert

    out = tmp_path_factory.mktemp("ftw")
    files = {}
    for family, (path, _) in tiny_models.items():
        files[family] = out / f"{family}.ftw"
        convert(str(path), files[family], ConvertOptions(quant="none"))
    return files


@pytest.fixture(scope="session")
def wide_files(
    tiny_tokenizer_json: str, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Path]:
    """A tiny random Qwen3-MoE whose experts fit torch's int4 kernels (K % 32 == 0,
    N % 16 == 0), converted with --quant none, int8 and int4, and ("dense-int8") with
    --quant none --dense-quant int8 (its LM head is not tied: stored int8 too)."""
    import transformers as tf

    from flint.convert import ConvertOptions, convert

    torch.manual_seed(0)
    config = tf.Qwen3MoeConfig(
        vocab_size=len(SPECIAL_TOKENS) + 300,
        hidden_size=64,
        head_dim=16,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        moe_intermediate_size=32,
        num_experts=8,
        num_experts_per_tok=2,
        max_position_embeddings=64,
        eos_token_id=2,
    )
    model = tf.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("mlp.gate.weight"):
                param.normal_(0.0, 1.0)  # routers far from near-ties
    root = tmp_path_factory.mktemp("wide")
    model.save_pretrained(root / "ckpt")
    save_tokenizer(root / "ckpt", tiny_tokenizer_json)
    files = {}
    for quant in ("none", "int8", "int4"):
        files[quant] = root / f"{quant}.ftw"
        convert(str(root / "ckpt"), files[quant], ConvertOptions(quant=quant))
    files["dense-int8"] = root / "dense-int8.ftw"
    convert(str(root / "ckpt"), files["dense-int8"], ConvertOptions(dense_quant="int8"))
    return files
