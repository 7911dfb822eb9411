from __future__ import annotations

import subprocess
import sys

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
