"""``flint bench``: rows and columns in md and json, the token check against the resident
control (and its exit status), and clear errors for bad flags."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import flint.bench.suite as suite
from flint.bench import Case, Plan, Setup, run_plan
from flint.bench.runner import Sample
from flint.cli import app
from flint.stream.plan import GIB
from flint.synth import synth

runner = CliRunner()
SMALL = ["-p", "8", "-n", "4", "-r", "1", "--device", "cpu", "--threads", "1"]
TWO_SLOTS = 2 * 4 * 3 * 64 * 128 * 2 / GIB  # tiny: 4 layers, 3 projections of 64 x 128 bf16


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("bench") / "tiny.ftw"
    synth("tiny", "none", out)
    return out


@pytest.fixture(autouse=True)
def _no_user_profile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def _bench(model: Path, *args: str) -> Any:
    return runner.invoke(app, ["bench", str(model), *SMALL, *args])


def test_json_has_a_row_per_mode_and_test_with_streaming_columns(tiny: Path) -> None:
    modes = "--mode", "resident,full,naive"
    r = _bench(tiny, *modes, "--ram-budget", str(TWO_SLOTS), "-o", "json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["exact"] is True and doc["control"] == "resident" and doc["mismatches"] == []
    assert doc["slots_per_layer"] == 2 and doc["n_experts"] == 16 and doc["threads"] == 1
    rows = {(row["mode"], row["test"]): row for row in doc["results"]}
    assert list(rows) == [
        ("resident", "pp8"),
        ("full", "pp8"),
        ("naive", "pp8"),
        ("resident", "tg4"),
        ("full", "tg4"),
        ("naive", "tg4"),
    ]
    for row in rows.values():
        assert row["tok_s"]["mean"] > 0 and len(row["tok_s"]["values"]) == 1
    assert rows[("resident", "tg4")]["demand_reads"] is None
    assert rows[("resident", "tg4")]["exact"] is None
    full, naive = rows[("full", "tg4")], rows[("naive", "tg4")]
    assert full["exact"] is True and naive["exact"] is True
    # 2 slots for top-4 of 16 experts: every decode step must read.
    assert full["demand_reads"]["mean"] + full["prefetch_reads"]["mean"] > 0
    assert naive["demand_reads"]["mean"] > 0 and naive["prefetch_reads"]["mean"] == 0
    assert naive["recall_d1"] is None and full["recall_d1"] is not None
    assert 0 <= full["ram_hit_rate"]["mean"] <= 1
    # the decode path of each kind of mode, and why there is no graph step (the CPU)
    assert doc["decode"] != "streamed CUDA graphs" and doc["streamed_decode"] == "layer loop"
    assert doc["graphs"] == "auto" and doc["no_graphs"] == "CUDA graphs need a CUDA device"


def test_a_mode_may_name_its_host_split(tiny: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``full:cpu,full:fill``: the same mode with two host splits, interleaved, each
    row checked against resident; each run's model gets its own split."""
    import flint.bench.modes as modes

    splits: list[str] = []
    real = modes.streamed_backend

    def spy(*args: Any, **kw: Any) -> Any:
        splits.append(kw["host_split"])
        return real(*args, **kw)

    monkeypatch.setattr(modes, "streamed_backend", spy)
    spec = "resident,full:cpu,full:fill"
    r = _bench(tiny, "--mode", spec, "--ram-budget", str(TWO_SLOTS), "-o", "json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    rows = {(row["mode"], row["test"]): row for row in doc["results"]}
    assert [m for m, t in rows if t == "tg4"] == ["resident", "full:cpu", "full:fill"]
    assert rows[("full:fill", "tg4")]["exact"] is True and doc["exact"] is True
    assert splits == ["cpu", "fill", "cpu", "fill"], "pp8 then tg4, each split in turn"


def test_markdown_table_has_the_columns_and_a_verdict(tiny: Path) -> None:
    r = _bench(tiny, "--mode", "resident,full", "--ram-budget", str(TWO_SLOTS))
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    head = next(line for line in lines if line.startswith("| model"))
    cols = [c.strip() for c in head.strip("|").split("|")]
    assert cols[:5] == ["model", "mode", "test", "t/s", "ttft ms"]
    assert {"stall ms/tok", "demand rd/tok", "RAM hit", "recall/prec d1", "exact"} <= set(cols)
    rows = [line for line in lines if line.startswith("| tiny.ftw")]
    assert len(rows) == 4 and all(len(row.strip("|").split("|")) == len(cols) for row in rows)
    assert " ± " in rows[0]
    assert "2/16 slots/layer" in r.stdout and "identical to resident" in r.stdout
    assert "streamed decode: layer loop" in r.stdout
    assert "no CUDA graph step: CUDA graphs need a CUDA device" in r.stdout


def test_the_header_names_the_resident_kernels_and_decode(tiny: Path) -> None:
    """On the CPU the default kernels are the fused ones, decoding through the Rust
    step; --expert-kernels torch names torch's path and the layer loop."""
    r = _bench(tiny, "--mode", "resident")
    assert r.exit_code == 0, r.output
    assert "resident experts: flint fused CPU kernels (" in r.stdout
    assert "resident decode: Rust CPU decode step" in r.stdout
    r = _bench(tiny, "--mode", "resident", "--expert-kernels", "torch", "-o", "json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["expert_kernel"] == "matmul" and doc["decode"] == "layer loop"


def test_nowait_reads_nothing_and_is_not_checked(tiny: Path) -> None:
    r = _bench(tiny, "--mode", "resident,nowait", "--ram-budget", str(TWO_SLOTS), "-o", "json")
    assert r.exit_code == 0, r.output
    rows = {(x["mode"], x["test"]): x for x in json.loads(r.stdout)["results"]}
    nowait = rows[("nowait", "tg4")]
    assert nowait["exact"] is None
    assert nowait["demand_reads"]["mean"] == 0 and nowait["read_mib"]["mean"] == 0


@pytest.mark.parametrize(("kernels", "fused_calls"), [("auto", True), ("torch", False)])
def test_nowait_computes_with_the_kernels_full_uses(
    tiny: Path, kernels: str, fused_calls: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The compute ceiling goes through the same kernels as the modes it caps: the
    fused call on the CPU by default, torch's path with --expert-kernels torch."""
    from flint.models.cpu_kernels import FusedKernel

    calls = []
    real = FusedKernel.expert_outputs

    def spy(self: FusedKernel, *args: Any, **kwargs: Any) -> None:
        calls.append(1)
        real(self, *args, **kwargs)

    monkeypatch.setattr(FusedKernel, "expert_outputs", spy)
    r = _bench(
        tiny, "--mode", "nowait", "-p", "0", "--ram-budget", str(TWO_SLOTS),
        "--expert-kernels", kernels,
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    assert bool(calls) == fused_calls


def test_a_mismatch_is_loud_and_exits_nonzero(tiny: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = suite.run_test

    def corrupt_streamed(llm: Any, test: Case) -> Sample:
        sample = real(llm, test)
        if llm.expert_backend is not None:  # a streamed mode: flip its last token
            sample.tokens[-1] += 1
        return sample

    monkeypatch.setattr(suite, "run_test", corrupt_streamed)
    r = _bench(tiny, "--mode", "resident,naive", "-o", "json")
    assert r.exit_code == 3
    doc = json.loads(r.stdout)
    assert doc["exact"] is False and len(doc["mismatches"]) == 2  # pp8 and tg4
    tg = next(m for m in doc["mismatches"] if m["test"] == "tg4")
    assert tg["index"] == 4 and tg["got"] == tg["want"] + 1
    assert "MISMATCH" in r.stderr and "mode naive, tg4" in r.stderr
    # the resident control decoded through the Rust step: the hint says what is exact
    assert doc["decode"] != "layer loop" and "FLINT_CPU_DECODE_STEP=0" in r.stderr


def test_without_resident_nothing_is_checked_and_it_says_so(tiny: Path) -> None:
    r = _bench(tiny, "--mode", "naive", "-n", "0")
    assert r.exit_code == 0, r.output
    assert "outputs were not checked" in r.stdout and "not checked" in r.stderr
    assert "pp8" in r.stdout and "tg" not in r.stdout.split("| model")[1].split("peak")[0]


def test_warm_runs_reuse_one_model_per_mode(tiny: Path) -> None:
    plan = Plan(("resident", "full"), (Case("tg", 3),), reps=2, warm=True)
    loads: list[str] = []
    real = suite.load

    def counting(mode: str, setup: Setup, note: Any) -> Any:
        loads.append(mode)
        return real(mode, setup, note)

    setup = Setup(tiny, device="cpu", context_length=80)
    mp = pytest.MonkeyPatch()
    mp.setattr(suite, "load", counting)
    try:
        out = run_plan(plan, setup, notice=lambda _: None, step=lambda _: None)
    finally:
        mp.undo()
    assert loads == ["resident", "full"]
    assert len(out.samples[("full", "tg3")]) == 2 and not out.mismatches


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-o", "xml"], "-o must be md or json"),
        (["--mode", "resident,fast"], "unknown mode 'fast'"),
        (["--mode", "full,full"], "lists a mode twice"),
        (["--mode", "full:gpu"], "the host split must be one of auto, cpu, fill, q"),
        (["--mode", "resident:fill"], "resident computes every expert where it lives"),
        (["-p", "abc"], "-p takes token counts"),
        (["-p", "0", "-n", "0"], "nothing to run"),
        (["-n", "-3"], "counts must be >= 0"),
        (["-r", "0"], "-r must be >= 1"),
        (["--policy", "fifo"], "--policy must be one of decay, lru, lfu"),
        (["--lookahead", "5"], "--lookahead must be 0..3"),
        (["--io-workers", "0"], "--io-workers must be 1..256"),
        (["--threads", "0"], "--threads must be >= 1"),
    ],
)
def test_bad_flags_give_one_line_errors(tiny: Path, args: list[str], message: str) -> None:
    r = runner.invoke(app, ["bench", str(tiny), "-r", "1", *args])
    assert r.exit_code == 2, r.output
    assert message in r.stderr and "Traceback" not in r.output


def test_missing_model_is_an_error(tmp_path: Path) -> None:
    r = runner.invoke(app, ["bench", str(tmp_path / "nope.ftw"), *SMALL])
    assert r.exit_code == 2 and "does not exist" in r.stderr


def test_the_cpu_expert_time_per_token_comes_from_the_backend_counters(tiny: Path) -> None:
    """The CUDA columns' CPU ms/tok: the host expert calls' time between two snapshots
    (a CPU model has no host share; its counters are moved by hand here)."""
    from flint.bench.modes import Engine, load
    from flint.bench.runner import _counters, per_token

    setup = Setup(model=tiny, device="cpu", engine=Engine(ram_budget=TWO_SLOTS))
    llm = load("full", setup, lambda _: None)
    try:
        before = _counters(llm)
        c = llm.expert_backend.counters  # type: ignore[union-attr]
        c.host_experts, c.gpu_experts, c.host_s = c.host_experts + 6, c.gpu_experts + 2, 0.012
        after = _counters(llm)
    finally:
        llm.close()
    assert before is not None and after is not None
    row = per_token(before, after, 4)
    assert row["cpu_share"] == 0.75 and row["cpu_ms"] == pytest.approx(3.0)


def test_the_header_names_how_torchs_openmp_threads_wait(
    tiny: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The OpenMP wait changes CPU decode several-fold, so the header says which one ran."""
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    monkeypatch.setenv("GOMP_SPINCOUNT", "1000")
    r = _bench(tiny, "--mode", "resident", "-p", "0")
    assert r.exit_code == 0, r.output
    assert "1 threads, OpenMP wait PASSIVE, GOMP_SPINCOUNT=1000" in r.stdout


def test_streamed_decode_rows_carry_the_belady_bound(tiny: Path) -> None:
    """tg rows of streamed modes: the bytes Belady-optimal caching would still read in
    that run (never more than the run read) and the stall they cost at the drive's
    direct-read rate, measured once at start."""
    r = _bench(tiny, "--mode", "full,naive", "--ram-budget", str(3 * TWO_SLOTS), "-o", "json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["disk_gb_s"] > 0
    tg = [row for row in doc["results"] if row["test"] == "tg4"]
    assert len(tg) == 2
    for row in tg:
        bound, read = row["belady_mib"]["mean"], row["read_mib"]["mean"]
        assert 0 < bound <= read + 1e-9, (bound, read)  # a cold 6-slot cache must read
        want = bound * (1 << 20) / (doc["disk_gb_s"] * 1e9) * 1000
        assert abs(row["belady_stall_ms"]["mean"] - want) < 1e-9
    assert all(row["belady_mib"] is None for row in doc["results"] if row["test"] == "pp8")


def test_the_header_names_the_streamed_gpu_experts_kernels() -> None:
    """On CUDA the streamed GPU share runs the slab kernels or torch's: the header says
    which (a run of this project's once measured the one it did not name)."""
    from flint.bench.report import _header

    doc = {
        "model": "q30.ftw", "experts": "int4", "device": "cuda:0", "dtype": "bfloat16",
        "threads": 14, "slots_per_layer": None, "warm": False, "reps": 1, "commit": "x",
        "date": "2026-11-30",
        "streamed_gpu_experts": "slab kernels (Triton)",
    }  # fmt: skip
    assert "streamed GPU experts: slab kernels (Triton)" in _header(doc)


def test_the_header_names_what_auto_resolved_to() -> None:
    from flint.bench import report

    assert report._split({"host_split": "auto", "host_split_resolved": "fill"}) == (
        "auto, here copied up (fill)"
    )
    assert report._split({"host_split": "auto", "host_split_resolved": None}).startswith("auto (")
    assert report._split({"host_split": "cpu", "host_split_resolved": "cpu"}) == "on the CPU"


def test_gpu_rows_carry_the_pcie_bound() -> None:
    """Issue 8's PCIe bound from a row's PCIe bytes per token and the pinned rate: P8's
    1.41 MiB per prompt token at 55 GB/s is ~37,000 tok/s (docs/benchmarks.md); rows that
    copied nothing, or a run with no measured rate, have none; the table shows it."""
    from flint.bench.report import pcie_bound, to_markdown

    bound = pcie_bound({"mean": 1.41, "sd": 0.0}, 55.0)
    assert bound is not None and 37_000 < bound["mean"] < 37_300
    assert pcie_bound({"mean": 0.0, "sd": 0.0}, 55.0) is None
    assert pcie_bound({"mean": 1.41, "sd": 0.0}, None) is None
    assert pcie_bound(None, 55.0) is None
    keys = (
        "stall_ms", "demand_reads", "prefetch_reads", "read_mib", "ram_hit_rate",
        "recall_d1", "precision_d1", "recall_d2", "precision_d2", "vram_hit_rate",
    )  # fmt: skip
    row = dict.fromkeys(keys) | {
        "mode": "full", "test": "pp8192", "tok_s": {"mean": 15540.4, "sd": 157.7},
        "ttft_ms": {"mean": 527.2, "sd": 0.0}, "exact": None, "cpu_share": {"mean": 0.0},
        "pcie_mib": {"mean": 1.41, "sd": 0.0}, "pcie_bound_tok_s": bound,
    }  # fmt: skip
    doc = {
        "model": "q30.ftw", "experts": "int4", "device": "cuda:0", "dtype": "bfloat16",
        "threads": 14, "slots_per_layer": None, "warm": True, "reps": 2, "commit": "x",
        "date": "2026-11-30", "results": [row], "peak_rss_mib": 1.0, "control": None,
    }  # fmt: skip
    table = to_markdown(doc)
    assert "| PCIe bound t/s |" in table and "| 1.41 | 37" in table
