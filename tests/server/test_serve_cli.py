"""``flint serve`` as users run it: a subprocess on a free port."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest
from typer.testing import CliRunner

from flint.cli import app


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _said(result: object) -> str:
    """The command's output with rich's line wrapping undone."""
    return " ".join(str(getattr(result, "output", "")).split())


def test_bad_input_exits_2(tmp_path: Path) -> None:
    runner = CliRunner()
    missing = runner.invoke(app, ["serve", str(tmp_path / "nope.ftw")])
    assert missing.exit_code == 2 and "does not exist" in _said(missing)
    bad = tmp_path / "t.jinja"
    bad.write_text("{% for %}")
    broken = runner.invoke(app, ["serve", str(tmp_path), "--chat-template", str(bad)])
    assert broken.exit_code == 2 and "does not compile" in _said(broken)
    parser = runner.invoke(app, ["serve", str(tmp_path), "--tool-parser", "xml"])
    assert parser.exit_code == 2 and "tool parser" in _said(parser)


def test_not_a_model_exits_2_after_start(tmp_path: Path) -> None:
    port = str(_free_port())
    result = CliRunner().invoke(app, ["serve", str(tmp_path), "--port", port, "--device", "cpu"])
    assert result.exit_code == 2 and "cannot load" in _said(result)


@pytest.mark.slow
def test_serve_subprocess(tiny_dir: Path) -> None:
    port = _free_port()
    cmd = [
        sys.executable,
        "-c",
        "from flint.cli import main; main()",
        "serve",
        str(tiny_dir),
        "--port",
        str(port),
        "--alias",
        "tiny-cli",
        "--api-key",
        "k",
        "--device",
        "cpu",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.communicate()[0]
            try:
                if httpx.get(url + "/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "server did not become healthy"
            time.sleep(0.2)
        with openai.OpenAI(base_url=url + "/v1", api_key="k", max_retries=0) as client:
            assert [m.id for m in client.models.list().data] == ["tiny-cli"]
            out = client.chat.completions.create(
                model="tiny-cli", messages=[{"role": "user", "content": "hi"}], max_tokens=4
            )
            assert out.model == "tiny-cli" and out.usage is not None
    finally:
        proc.terminate()
        output = proc.communicate(timeout=20)[0]
    assert "flint serve: ready" in output
