from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

import flint
from flint.cli import app

runner = CliRunner()


def test_help_lists_usage() -> None:
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    assert "Mixture-of-Experts" in result.output


def test_version_shows_package_and_core() -> None:
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.output.strip() == f"flint {flint.__version__} (core {flint.core_version()})"


def test_console_script_runs_as_module() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "flint", "--version"], capture_output=True, text=True, check=True
    )
    assert "core" in out.stdout


def test_cli_loads_without_the_optional_ui_and_server_packages() -> None:
    """chat's prompt_toolkit and serve's FastAPI are imported only by their commands."""
    code = (
        "import builtins; real = builtins.__import__\n"
        "def imp(name, *a, **k):\n"
        "    if name.split('.')[0] in ('prompt_toolkit', 'fastapi', 'uvicorn'):\n"
        "        raise ImportError(name)\n"
        "    return real(name, *a, **k)\n"
        "builtins.__import__ = imp\n"
        "from flint.cli import app\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_demo_drops_models_an_older_flint_or_synth_left(tmp_path: Path) -> None:
    from rich.console import Console

    from flint.cli.demo import drop_stale_demos

    keep = tmp_path / "demo-9.9.9-w2.ftw"
    stale = [tmp_path / "demo-0.1.0.ftw", tmp_path / "demo-0.1.0.ftw.usage"]
    other = tmp_path / "mine.ftw"
    for f in (keep, *stale, other):
        f.write_bytes(b"x")
    console = Console(record=True, width=200)
    drop_stale_demos(keep, console)
    assert keep.exists() and other.exists() and not any(f.exists() for f in stale)
    assert "removed an outdated demo model" in console.export_text()
