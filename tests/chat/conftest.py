"""Fixtures: a tiny random Qwen3-MoE checkpoint with the Qwen3 chat template, the same
model without a template (a base model), and a driver for ``flint chat`` that types
into prompt_toolkit's pipe input."""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import Result
from prompt_toolkit.application import create_app_session
from prompt_toolkit.input import create_pipe_input
from prompt_toolkit.output import DummyOutput
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))
from tiny import SEEDS, SHARED, build, save_tokenizer, tokenizer_json

from flint.cli import app

TINY_CODE_MOE = SHARED / "models" / "tiny-code-moe"
Chat = Callable[..., Result]


@pytest.fixture(scope="session")
def chat_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random qwen3_moe checkpoint whose tokenizer carries the Qwen3 template."""
    path = tmp_path_factory.mktemp("chat-qwen3")
    build("qwen3_moe", path, seed=SEEDS["qwen3_moe"])
    save_tokenizer(path, tokenizer_json())
    return path


@pytest.fixture(scope="session")
def base_model(chat_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same weights and tokenizer with no chat template."""
    path = tmp_path_factory.mktemp("chat-base")
    for name in ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json"):
        shutil.copy(chat_model / name, path / name)
    config = json.loads((chat_model / "tokenizer_config.json").read_text("utf-8"))
    del config["chat_template"]
    (path / "tokenizer_config.json").write_text(json.dumps(config), "utf-8")
    return path


@pytest.fixture
def chat(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Chat:
    """``chat(args, keys)`` runs ``flint chat ARGS`` with ``keys`` typed in (then Ctrl-D),
    history under tmp_path; returns the click Result (output = what was printed)."""
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    runner = CliRunner()

    def run(args: list[str], keys: str = "") -> Result:
        with create_pipe_input() as pipe, create_app_session(input=pipe, output=DummyOutput()):
            pipe.send_text(keys)
            pipe.close()
            return runner.invoke(app, ["chat", "--device", "cpu", *args])

    return run
