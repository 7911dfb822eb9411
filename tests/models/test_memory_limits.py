"""The memory planner under cgroup limits: it reads this process's own cgroup (v1 or
v2, parents included), and a model larger than the cgroup's memory limit still runs,
streaming, with the output of an unlimited run (skipped where no cgroup can be made)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from flint.stream.plan import cgroup_available

MIB = 1 << 20


def _write(d: Path, files: dict[str, str]) -> None:
    d.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (d / name).write_text(text)


def test_cgroup_v2_limit_of_own_group_and_parents(tmp_path: Path) -> None:
    root, proc = tmp_path / "cg", tmp_path / "cgroup"
    proc.write_text("0::/user.slice/job\n")
    _write(root / "user.slice", {"memory.max": str(900 * MIB), "memory.current": str(100 * MIB)})
    _write(root / "user.slice/job", {"memory.max": "max", "memory.current": str(50 * MIB)})
    assert cgroup_available(root, proc) == 800 * MIB, "the parent's limit binds"
    _write(root / "user.slice/job", {"memory.max": str(300 * MIB)})
    assert cgroup_available(root, proc) == 250 * MIB, "the tightest of them"


def test_cgroup_v1_memory_controller_and_no_limit(tmp_path: Path) -> None:
    root, proc = tmp_path / "cg", tmp_path / "cgroup"
    proc.write_text("5:cpu,cpuacct:/x\n4:memory:/api/abc\n0::/\n")
    unlimited = {"memory.limit_in_bytes": "9223372036854771712", "memory.usage_in_bytes": "1"}
    _write(root / "memory", unlimited)
    _write(root / "memory/api", unlimited)
    _write(
        root / "memory/api/abc",
        {"memory.limit_in_bytes": str(512 * MIB), "memory.usage_in_bytes": str(12 * MIB)},
    )
    assert cgroup_available(root, proc) == 500 * MIB
    _write(root / "memory/api/abc", unlimited)
    assert cgroup_available(root, proc) is None
    assert cgroup_available(root, tmp_path / "missing") is None


def _own_v1_memory_cgroup() -> Path | None:
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            return Path("/sys/fs/cgroup/memory") / path.lstrip("/")
    return None


@pytest.fixture
def limited_cgroup() -> Iterator[tuple[Path, int]]:
    """A fresh cgroup v1 memory group under this process's own, limited to 900 MiB."""
    parent = _own_v1_memory_cgroup()
    if parent is None or not os.access(parent, os.W_OK):
        pytest.skip("no writable cgroup v1 memory controller on this machine")
    group = parent / f"flint-test-{uuid.uuid4().hex[:8]}"
    limit = 900 * MIB
    try:
        group.mkdir()
        (group / "memory.limit_in_bytes").write_text(str(limit))
    except OSError as err:
        pytest.skip(f"cannot make a limited cgroup here: {err}")
    try:
        yield group, limit
    finally:
        group.rmdir()


def _flint(model: Path, *args: str, cgroup: Path | None = None) -> dict[str, object]:
    cmd = [sys.executable, "-m", "flint", "run", str(model), "-p", "ab", "-n", "6"]
    cmd += ["--ignore-eos", "--json", "--device", "cpu", *args]
    if cgroup is not None:  # join the group, then become flint
        cmd = ["sh", "-c", f'echo $$ > {cgroup}/cgroup.procs && exec "$@"', "sh", *cmd]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    out: dict[str, object] = json.loads(done.stdout)
    out["stderr"] = done.stderr
    return out


def test_a_model_larger_than_the_cgroup_limit_runs_streamed(
    limited_cgroup: tuple[Path, int], tmp_path: Path
) -> None:
    from flint.synth import synth

    group, limit = limited_cgroup
    model = tmp_path / "big.ftw"
    synth("demo", "bf16", model, n_layers=6)
    assert model.stat().st_size > limit * 1.2, "the model must not fit the limit"
    free = _flint(model, "--stream", "--lookahead", "0")
    limited = _flint(model, "--stream", cgroup=group)
    assert limited["token_ids"] == free["token_ids"]
    stats = limited["stats"]
    assert isinstance(stats, dict)
    streaming = stats["streaming"]
    assert isinstance(streaming, dict) and streaming["demands"] > 0
    free_stats = free["stats"]
    assert isinstance(free_stats, dict)
    unlimited_slots = free_stats["streaming"]["slots_per_layer"]  # type: ignore[index]
    assert streaming["slots_per_layer"] < unlimited_slots, "the plan saw the limit"
    peak = int((group / "memory.max_usage_in_bytes").read_text())
    assert peak <= limit
