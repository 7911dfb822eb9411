"""``flint chat`` in a pseudo-terminal (pexpect): what a user at a terminal gets,
live rendering and Ctrl-C included."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pexpect
import pytest

from conftest import TINY_CODE_MOE

PROMPT = ">>> "


def spawn(args: list[str], tmp_path: Path) -> pexpect.spawn:
    env = {
        **os.environ,
        "XDG_DATA_HOME": str(tmp_path / "data"),
        "TERM": "xterm-256color",
        "PROMPT_TOOLKIT_NO_CPR": "1",  # no cursor-position queries: pexpect does not answer
        "COLUMNS": "100",
        "LINES": "30",
    }
    child = pexpect.spawn(
        sys.executable,
        ["-m", "flint", "chat", "--device", "cpu", *args],
        env=env,
        encoding="utf-8",
        dimensions=(30, 100),
        timeout=60,
    )
    child.expect_exact(PROMPT)
    return child


def quit_and_wait(child: pexpect.spawn) -> None:
    child.expect_exact("Send a message")  # the prompt is up: Ctrl-D reaches it
    child.sendcontrol("d")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


@pytest.mark.slow
def test_ctrl_c_stops_a_reply_and_keeps_the_conversation(tmp_path: Path) -> None:
    child = spawn([str(TINY_CODE_MOE)], tmp_path)  # greedy, no -n: runs to a full context
    child.send("def fibonacci(n):\r")
    child.expect_exact("fibonacci value")  # streaming has started
    child.sendcontrol("c")
    child.expect_exact("interrupted: the partial reply is kept")
    child.expect_exact(PROMPT)
    child.send("typed, then dropped")
    child.expect_exact("dropped")
    child.sendcontrol("c")  # at the prompt: drops the line
    child.expect_exact("Send a message")  # a new, empty prompt
    out = tmp_path / "after.json"
    child.send(f"/save {out}\r")
    child.expect_exact("saved 2 messages")
    quit_and_wait(child)
    messages = json.loads(out.read_text("utf-8"))["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant"]
    assert messages[0]["content"] == "def fibonacci(n):"
    assert "fibonacci value" in messages[1]["content"]


@pytest.mark.slow
def test_two_turns_at_a_terminal(chat_model: Path, tmp_path: Path) -> None:
    child = spawn([str(chat_model), "-c", "512", "-n", "8", "--temp", "0"], tmp_path)
    for message in ("Hello!", "Weather in Tokyo?"):
        child.send(message + "\r")
        child.expect(r"\d+ tokens · [\d.]+ tok/s · TTFT [\d.]+ m?s · ctx \d+/512")
        child.expect_exact(PROMPT)
    child.send("/stats\r")
    child.expect_exact("time to first token")
    child.expect_exact(PROMPT)
    quit_and_wait(child)
