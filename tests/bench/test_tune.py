"""``flint tune`` writes a per-machine profile; run and bench load it (one line), flags
override it, and a pick the paired bench shows slower is not kept."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

import flint.cli.runtime_options as runtime_options
from flint.cli import app
from flint.synth import synth
from flint.tune import measure, tuner
from flint.tune.profile import (
    Profile,
    load_profile,
    machine_key,
    model_key,
    profile_path,
    save_profile,
)

runner = CliRunner()
FAST = ["--workers", "1,2", "-n", "4", "-r", "1", "--device", "cpu"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tune") / "tiny.ftw"
    synth("tiny", "none", out)
    return out


@pytest.fixture(autouse=True)
def _cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def _write(model: Path, workers: int = 3, lookahead: int = 1) -> Path:
    path = profile_path(model)
    save_profile(Profile(workers, lookahead, machine_key(model), model_key(model)), path)
    return path


def test_tune_measures_and_writes_a_profile(tiny: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Picks equal to the defaults: nothing to pair, so the profile is always kept.
    monkeypatch.setattr(measure, "pick_workers", lambda points: 8)
    monkeypatch.setattr(measure, "pick_lookahead", lambda read_us, layer_ms: 2)
    r = runner.invoke(app, ["tune", str(tiny), *FAST, "--workers", "2,8", "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["kept"] is True and Path(doc["path"]) == profile_path(tiny)
    m = doc["profile"]["measured"]
    assert [p["workers"] for p in m["direct_reads"]] == [2, 8]
    assert all(p["gb_s"] > 0 for p in m["direct_reads"])
    assert m["expert_compute_gb_s"] > 0 and m["layer_ms"] > 0 and m["idle_read_us"] > 0
    if torch.cuda.is_available():  # measured only where CUDA is
        assert m["pinned_h2d_gb_s"] > 0
    else:
        assert m["pinned_h2d_gb_s"] is None
    found = load_profile(tiny)
    assert found is not None and found[0].io_workers == 8 and found[0].lookahead == 2


def test_a_pick_is_kept_only_if_the_paired_bench_is_not_slower(
    tiny: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(measure, "pick_workers", lambda points: 2)
    slower = tuner.Paired(default=[100.0, 102.0], tuned=[90.0, 91.0])
    monkeypatch.setattr(tuner, "paired_bench", lambda *a: slower)
    stale = _write(tiny)
    r = runner.invoke(app, ["tune", str(tiny), *FAST])
    assert r.exit_code == 0, r.output
    assert "defaults 101.00 tok/s, tuned 90.50 tok/s" in r.stdout
    assert "not kept" in r.stderr and not stale.exists()
    monkeypatch.setattr(tuner, "paired_bench", lambda *a: tuner.Paired([90.0], [90.0]))
    r = runner.invoke(app, ["tune", str(tiny), *FAST])
    assert r.exit_code == 0 and "kept the tuned profile" in r.stderr
    found = load_profile(tiny)
    assert found is not None and found[0].io_workers == 2


def test_paired_bench_runs_both_setups_interleaved(tiny: Path) -> None:
    from flint.bench.modes import Engine, Setup

    base = Setup(tiny, device="cpu", context_length=64, engine=Engine(ram_budget=0.0))
    picked = Setup(tiny, device="cpu", context_length=64, engine=Engine(0.0, 1, 2))
    steps: list[str] = []
    out = tuner.paired_bench(base, picked, tuner.TuneOptions(tokens=3, reps=2), steps.append)
    assert len(out.default) == len(out.tuned) == 2
    assert [s.split(" · ")[1] for s in steps] == ["defaults", "tuned"] * 2


class _Capture:
    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.kwargs: dict[str, Any] = {}
        real = runtime_options.LLM

        def fake(model: Any, **kwargs: Any) -> Any:
            self.kwargs = kwargs
            return real(model, **kwargs)

        monkeypatch.setattr(runtime_options, "LLM", fake)


RUN = ["-p", "ab", "-n", "2", "--temp", "0", "--device", "cpu", "--ctx", "32"]


def test_run_loads_the_profile_and_flags_override_it(
    tiny: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _write(tiny, workers=3, lookahead=1)
    cap = _Capture(monkeypatch)
    r = runner.invoke(app, ["run", str(tiny), *RUN, "--ram-budget", "0.001"])
    assert r.exit_code == 0, r.output
    assert r.stderr.count("tuned profile") == 1 and "3 I/O workers, lookahead 1" in r.stderr
    assert cap.kwargs["io_workers"] == 3 and cap.kwargs["lookahead"] == 1
    r = runner.invoke(app, ["run", str(tiny), *RUN, "--ram-budget", "0.001", "--lookahead", "2"])
    assert r.exit_code == 0 and "flags override the rest" in r.stderr
    assert cap.kwargs["io_workers"] == 3 and cap.kwargs["lookahead"] == 2
    r = runner.invoke(app, ["run", str(tiny), *RUN, "--ram-budget", "0.001", "--no-profile"])
    assert "tuned profile" not in r.stderr
    assert cap.kwargs["io_workers"] == 8 and cap.kwargs["lookahead"] == 2
    r = runner.invoke(app, ["run", str(tiny), *RUN])  # resident: the profile does not apply
    assert r.exit_code == 0 and "tuned profile" not in r.stderr


def test_bench_uses_the_profile(tiny: Path) -> None:
    _write(tiny, workers=5, lookahead=3)
    args = ["bench", str(tiny), "-p", "0", "-n", "2", "-r", "1", "--mode", "full", "-o", "json"]
    r = runner.invoke(app, [*args, "--device", "cpu"])
    assert r.exit_code == 0, r.output
    assert "tuned profile" in r.stderr
    assert json.loads(r.stdout)["engine"] == {
        "lookahead": 3,
        "lookahead_from": "output",
        "io_workers": 5,
        "chunking": True,
        "policy": "decay",
    }
    r = runner.invoke(app, [*args, "--device", "cpu", "--io-workers", "4", "--lookahead", "0"])
    assert "tuned profile" not in r.stderr
    assert json.loads(r.stdout)["engine"]["io_workers"] == 4


def test_a_broken_profile_is_ignored(tiny: Path) -> None:
    path = _write(tiny)
    path.write_text("{not json")
    assert load_profile(tiny) is None
    path.write_text(
        json.dumps({"version": 1, "io_workers": 0, "lookahead": 1, "machine": "m", "model": "x"})
    )
    assert load_profile(tiny) is None, "out-of-range values are not used"


@pytest.mark.gpu
def test_pinned_host_to_device_is_measured_with_cuda() -> None:
    rate = measure.pinned_h2d_gb_s()
    assert rate is not None and rate > 0


@pytest.mark.gpu
def test_bench_on_cuda_checks_full_against_resident(tiny: Path) -> None:
    args = ["bench", str(tiny), "-p", "8", "-n", "4", "-r", "1", "--device", "cuda"]
    r = runner.invoke(app, [*args, "--mode", "resident,full", "--ram-budget", "0.0", "-o", "json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["exact"] is True
