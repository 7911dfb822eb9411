"""Fixtures: one tiny random checkpoint per family (built once per session)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tiny import FAMILY_NAMES, SEEDS, build, save_tokenizer, tokenizer_json


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
