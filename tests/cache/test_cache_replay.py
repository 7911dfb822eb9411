"""Replay on the real held-out trace reproduces the model README's cache table."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from flint.cache import ReplayConfig, load_trace, run_replay

# The repository is cloned next to shared/ (also in CI).
TRACE = Path(__file__).resolve().parents[2].parent / "shared/traces/tiny-code-moe-heldout.npz"

# shared/models/tiny-code-moe/README.md, "Routing statistics", mean row of the
# per-layer hit-rate table.
README_MEAN_HIT_RATE = {("lru", 16): 0.568, ("belady", 16): 0.720}


def test_lru_and_belady_match_the_readme_table() -> None:
    trace = load_trace(TRACE)
    assert (trace.n_tokens, trace.n_layers, trace.top_k, trace.n_experts) == (24576, 8, 8, 64)
    rows = run_replay(trace, ReplayConfig(capacities=(16,), policies=("lru", "belady")))
    for row in rows:
        expected = README_MEAN_HIT_RATE[(row.policy, row.capacity)]
        assert row.hit_rate == pytest.approx(expected, abs=0.002), row.policy
        assert float(np.mean(row.layer_hit_rate)) == pytest.approx(row.hit_rate)
    lru, belady = rows
    assert belady.ratio_to_belady == 1.0
    assert lru.ratio_to_belady > 1.0


def _synthetic(tmp_path: Path) -> Path:
    rng = np.random.default_rng(0)
    experts = np.stack(
        [[rng.choice(16, size=4, replace=False) for _ in range(3)] for _ in range(200)]
    ).astype(np.int16)  # [T=200, L=3, K=4]
    path = tmp_path / "trace.npz"
    np.savez(path, experts=experts)
    return path


def test_predictor_helps_and_is_seeded(tmp_path: Path) -> None:
    trace = load_trace(_synthetic(tmp_path))
    base = dict(capacities=(6,), policies=("decay",))
    blind, good = (run_replay(trace, ReplayConfig(**base, predict_recall=r))[0] for r in (0.0, 1.0))  # type: ignore[arg-type]
    assert good.hit_rate > blind.hit_rate and good.prefetch_reads > 0
    again = run_replay(trace, ReplayConfig(**base, predict_recall=1.0))[0]  # type: ignore[arg-type]
    assert again == good


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"capacities": ()}, "capacities"),
        ({"capacities": (0,)}, "capacities"),
        ({"capacities": (8,), "policies": ("fifo",)}, "policies"),
        ({"capacities": (8,), "predict_recall": 1.5}, "recall"),
    ],
)
def test_bad_config_is_a_value_error(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ReplayConfig(**kwargs)  # type: ignore[arg-type]


def test_capacity_below_top_k_is_a_clear_error(tmp_path: Path) -> None:
    trace = load_trace(_synthetic(tmp_path))
    with pytest.raises(ValueError, match="below the trace's top-k 4"):
        run_replay(trace, ReplayConfig(capacities=(3, 8)))


def test_bad_trace_files_are_value_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="does not exist"):
        load_trace(tmp_path / "missing.npz")
    junk = tmp_path / "junk.npz"
    junk.write_bytes(b"not a zip")
    with pytest.raises(ValueError, match="not a readable"):
        load_trace(junk)
    np.savez(tmp_path / "other.npz", weights=np.zeros((2, 2, 2)))
    with pytest.raises(ValueError, match="no 'experts'"):
        load_trace(tmp_path / "other.npz")
    np.savez(tmp_path / "flat.npz", experts=np.zeros((4, 2), dtype=np.int16))
    with pytest.raises(ValueError, match=r"\[tokens, layers, top_k\]"):
        load_trace(tmp_path / "flat.npz")
    np.savez(tmp_path / "neg.npz", experts=-np.ones((1, 1, 2), dtype=np.int16))
    with pytest.raises(ValueError, match=r"0\.\.32767"):
        load_trace(tmp_path / "neg.npz")
    with pytest.raises(ValueError, match="n_experts=8"):
        load_trace(_synthetic(tmp_path), n_experts=8)
