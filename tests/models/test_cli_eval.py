"""``flint eval`` and ``flint.evaluate``: perplexity, KL and top-1 against a reference."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from typer.testing import CliRunner

import flint
from flint.cli import app
from flint.evaluate import evaluate, scored_positions

runner = CliRunner()
TEXT = (
    "def main(argv):\n    return sorted(set(argv))\n\n"
    "import os\nimport sys\nprint(os.path.join('a', 'b'))\n"
) * 3
CPU = ["--device", "cpu", "--ctx", "64"]


@pytest.fixture(scope="module")
def text_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path: Path = tmp_path_factory.mktemp("text") / "code.py"
    path.write_text(TEXT, "utf-8")
    return path


def _eval(*args: str | Path) -> Any:
    return runner.invoke(app, ["eval", *map(str, args)])


def test_perplexity_is_the_mean_nll_of_each_window(tiny_ftw: dict[str, Path]) -> None:
    with flint.LLM(tiny_ftw["olmoe"], device="cpu", context_length=64) as llm:
        ids = llm.tokenizer.encode(TEXT)
        result = evaluate(llm.model, ids, 40)
        nll, n, windows = 0.0, 0, 0
        for start in range(0, len(ids), 40):
            window = ids[start : start + 40]
            if len(window) < 2:
                continue
            windows += 1
            llm.model.reset()
            logits = llm.model.forward(torch.tensor(window), all_logits=True)
            nll += F.cross_entropy(logits[:-1], torch.tensor(window[1:]), reduction="sum").item()
            n += len(window) - 1
    assert result.tokens == n == scored_positions(len(ids), 40)
    assert result.windows == windows and result.kl is None
    assert math.isclose(result.nll, nll / n, rel_tol=1e-5)


def test_cli_json_and_text_output(tiny_ftw: dict[str, Path], text_file: Path) -> None:
    model = tiny_ftw["olmoe"]
    result = _eval(model, text_file, "--window", "40", "--json", *CPU)
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    with flint.LLM(model, device="cpu", context_length=64) as llm:
        want = evaluate(llm.model, llm.tokenizer.encode(TEXT), 40)
    assert out["tokens"] == want.tokens and out["windows"] == want.windows
    assert math.isclose(out["perplexity"], want.perplexity, rel_tol=1e-4)
    assert "evaluating" in result.stderr  # the progress bar
    text = _eval(model, text_file, "--window", "40", "--max-tokens", "30", *CPU)
    assert text.exit_code == 0 and text.stdout.startswith("perplexity ")
    assert "over 29 tokens" in text.stdout


def test_ref_against_itself_is_zero_kl(tiny_ftw: dict[str, Path], text_file: Path) -> None:
    model = tiny_ftw["qwen2_moe"]
    result = _eval(model, text_file, "--ref", model, "--json", *CPU)
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["top1_agreement"] == 1.0 and abs(out["mean_kl"]) < 1e-6
    assert out["ref_perplexity"] == out["perplexity"]
    human = _eval(model, text_file, "--ref", model, *CPU)
    assert "mean KL(ref || model)" in human.stdout and "top-1 agreement 100.00%" in human.stdout


def test_kl_against_a_different_model_is_refused(
    tiny_ftw: dict[str, Path], text_file: Path
) -> None:
    result = _eval(tiny_ftw["olmoe"], text_file, "--ref", tiny_ftw["qwen3_moe"], *CPU)
    assert result.exit_code == 2 and "not the same model" in result.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("MODEL", "MISSING"), "no such text file"),
        (("MODEL", "SHORT"), "too short"),
        (("MODEL", "TEXT", "--window", "1"), "window must be in [2, 64]"),
        (("MODEL", "TEXT", "--window", "65"), "window must be in [2, 64]"),
        (("MODEL", "TEXT", "--max-tokens", "1"), "--max-tokens"),
        (("MISSING", "TEXT"), "does not exist"),
    ],
)
def test_errors_are_one_line(
    args: tuple[str, ...], message: str, tiny_ftw: dict[str, Path], text_file: Path, tmp_path: Path
) -> None:
    short = tmp_path / "short.txt"
    short.write_text("d", "utf-8")
    paths = {"MODEL": tiny_ftw["olmoe"], "TEXT": text_file, "SHORT": short}
    result = _eval(*(paths.get(a, tmp_path / "nope" if a == "MISSING" else a) for a in args), *CPU)
    assert result.exit_code == 2
    assert result.stderr.startswith("error:") and message in result.stderr
    assert "Traceback" not in result.output
