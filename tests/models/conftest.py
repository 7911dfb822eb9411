"""Fixtures: one tiny random checkpoint per family and .ftw files made from them (built
once per session)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tiny import (
    FAMILY_NAMES,
    SEEDS,
    SPECIAL_TOKENS,
    build,
    save_tokenizer,
    save_wide_qwen3,
    tokenizer_json,
)


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
    from flint.convert import ConvertOptions, convert

    root = tmp_path_factory.mktemp("wide")
    vocab = len(SPECIAL_TOKENS) + 300
    save_wide_qwen3(root / "ckpt", tiny_tokenizer_json, vocab, positions=64, seed=0)
    files = {}
    for quant in ("none", "int8", "int4"):
        files[quant] = root / f"{quant}.ftw"
        convert(str(root / "ckpt"), files[quant], ConvertOptions(quant=quant))
    files["dense-int8"] = root / "dense-int8.ftw"
    convert(str(root / "ckpt"), files["dense-int8"], ConvertOptions(dense_quant="int8"))
    return files
