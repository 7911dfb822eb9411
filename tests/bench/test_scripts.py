"""Every benchmark script under benches/ imports and explains itself (``--help``), so a
script broken by a change fails here, on the CPU, before a GPU run is spent on it."""

from __future__ import annotations

import contextlib
import io
import os
import runpy
import sys
from pathlib import Path

import pytest

BENCHES = Path(__file__).resolve().parents[2] / "benches"
SCRIPTS = sorted(BENCHES.glob("*.py"))
OPTIONAL = {"matplotlib"}  # plots only; not a dependency of flint's dev tools


def test_the_scripts_are_found() -> None:
    assert len(SCRIPTS) >= 20, SCRIPTS


@pytest.mark.parametrize("script", SCRIPTS, ids=[s.stem for s in SCRIPTS])
def test_a_bench_script_answers_help(script: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """... and leaves the environment's variables as it found them: the scripts run
    here in the test process, so one that changed one at import (kernel_asm.py once
    dropped TRITON_INTERPRET, and every Triton test after it failed) would change later
    tests."""
    environment = dict(os.environ)
    monkeypatch.setattr(sys, "argv", [str(script), "--help"])
    monkeypatch.syspath_prepend(str(BENCHES))  # scripts import their siblings
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            runpy.run_path(str(script), run_name="__main__")
        except SystemExit as done:
            assert done.code in (0, None), out.getvalue()
        except ModuleNotFoundError as err:
            if err.name not in OPTIONAL:
                raise
            pytest.skip(f"needs {err.name}")
        else:
            pytest.fail(f"{script.name} --help ran without exiting")
    assert "usage" in out.getvalue().lower()
    # (libraries imported for the first time may add variables: torch's inductor does)
    changed = sorted(k for k, v in environment.items() if os.environ.get(k) != v)
    assert not changed, f"{script.name} changed or removed {changed}"
