"""``flint replay`` from the command line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from typer.testing import CliRunner

from flint.cli import app

runner = CliRunner()


def _trace(tmp_path: Path) -> Path:
    rng = np.random.default_rng(1)
    experts = np.stack(
        [[rng.choice(12, size=2, replace=False) for _ in range(2)] for _ in range(100)]
    ).astype(np.int16)  # [T=100, L=2, K=2]
    path = tmp_path / "t.npz"
    np.savez(path, experts=experts)
    return path


def test_help_explains_the_command() -> None:
    result = runner.invoke(app, ["replay", "--help"])
    assert result.exit_code == 0
    for word in ("--capacity", "--policy", "--predict-recall", "--json", "Belady"):
        assert word in result.output


def test_json_output_has_every_policy_and_capacity(tmp_path: Path) -> None:
    result = runner.invoke(app, ["replay", str(_trace(tmp_path)), "-c", "2,4", "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert (out["tokens"], out["layers"], out["top_k"], out["n_experts"]) == (100, 2, 2, 12)
    got = {(r["policy"], r["capacity"]) for r in out["rows"]}
    assert got == {(p, c) for p in ("lru", "lfu", "decay", "belady") for c in (2, 4)}
    for row in out["rows"]:
        assert 0.0 <= row["hit_rate"] <= 1.0 and row["ratio_to_belady"] >= 1.0


def test_table_output_with_predictor(tmp_path: Path) -> None:
    args = [
        "replay",
        str(_trace(tmp_path)),
        "-c",
        "4",
        "-p",
        "lru,decay",
        "--predict-recall",
        "0.5",
    ]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "prefetches/token" in result.output and "decay" in result.output


def test_bad_values_are_clear_errors(tmp_path: Path) -> None:
    trace = str(_trace(tmp_path))
    cases = [
        (["-c", "8,x"], "comma-separated positive integers"),
        (["-c", "0"], "at least 1"),
        (["-p", "lru,fifo"], "unknown policy 'fifo'"),
        (["--predict-recall", "2"], "predict-recall"),
    ]
    for extra, message in cases:
        result = runner.invoke(app, ["replay", trace, *extra])
        assert result.exit_code == 2, (extra, result.output)
        assert message in result.output, (extra, result.output)
    result = runner.invoke(app, ["replay", trace, "-c", "1"])
    assert result.exit_code == 1 and "below the trace's top-k" in result.output
    result = runner.invoke(app, ["replay", str(tmp_path / "nope.npz")])
    assert result.exit_code == 1 and "does not exist" in result.output
