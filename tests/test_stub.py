"""The hand-written ``_core.pyi`` must describe the built extension exactly."""

from __future__ import annotations

import subprocess
import sys


def test_core_stub_matches_extension() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "mypy.stubtest", "flint._core"],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stdout + out.stderr
