"""Slash commands on a chat state, without a model."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from flint.chat.commands import Action, ChatState, parse_setting, run_command
from flint.chat.config import Settings
from flint.chat.session import Conversation
from flint.chat.stats import ReplyStats


def make_state() -> tuple[ChatState, io.StringIO]:
    out = io.StringIO()
    console = Console(file=out, width=120, color_system=None)
    conv = Conversation(system="Be brief.")
    conv.add("user", "Hi")
    conv.add("assistant", "<think>\nsay hi\n</think>\n\nHello!")
    return ChatState(console, conv, Settings(), templated=True, reasoning="say hi"), out


@pytest.mark.parametrize(
    ("name", "value", "expected"),
    [
        ("temp", "0.7", ("temperature", 0.7)),
        ("temperature", "0", ("temperature", 0.0)),
        ("top_p", "0.9", ("top_p", 0.9)),
        ("TOP_K", "40", ("top_k", 40)),
        ("n", "128", ("max_tokens", 128)),
        ("seed", "7", ("seed", 7)),
        ("seed", "random", ("seed", None)),
        ("max_tokens", "default", ("max_tokens", None)),
    ],
)
def test_parse_setting(name: str, value: str, expected: tuple[str, object]) -> None:
    assert parse_setting(name, value) == expected


@pytest.mark.parametrize(
    ("name", "value", "error"),
    [
        ("temperature", "-1", "temperature must be"),
        ("top_p", "0", "top_p must be"),
        ("top_k", "1.5", "top_k needs a number"),
        ("max_tokens", "0", "max_tokens must be"),
        ("min_p", "0.1", "cannot set 'min_p'"),
    ],
)
def test_parse_setting_rejects(name: str, value: str, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        parse_setting(name, value)


def test_set_changes_settings_and_bad_input_changes_nothing() -> None:
    state, out = make_state()
    assert run_command(state, "/set temp 0.5") is Action.NONE
    assert run_command(state, "/set top_k 0") is Action.NONE
    assert state.settings == Settings(temperature=0.5, top_k=0)
    run_command(state, "/set temp hot")
    run_command(state, "/set temp")
    assert state.settings == Settings(temperature=0.5, top_k=0)
    run_command(state, "/set")
    text = out.getvalue()
    assert "temperature needs a number, got 'hot'" in text and "usage: /set" in text
    assert "temperature=0.5 top_p=default top_k=0" in text


def test_system_clear_and_think() -> None:
    state, out = make_state()
    run_command(state, "/system")
    run_command(state, "/system You are a pirate.")
    assert state.conv.system == "You are a pirate." and len(state.conv.messages) == 2
    run_command(state, "/think show")
    run_command(state, "/think off")
    assert state.settings.thinking is False
    run_command(state, "/think maybe")
    run_command(state, "/clear")
    assert state.conv.messages == [] and state.conv.system == "You are a pirate."
    run_command(state, "/system none")
    assert state.conv.system is None
    text = out.getvalue()
    assert "system prompt: Be brief." in text and "say hi" in text
    assert "usage: /think on|off|show" in text and "conversation cleared" in text


def test_retry_exit_help_and_unknown() -> None:
    state, out = make_state()
    assert run_command(state, "/retry") is Action.REPLY
    assert [m["role"] for m in state.conv.messages] == ["user"]
    state.conv.clear()
    assert run_command(state, "/retry") is Action.NONE
    assert run_command(state, "/exit") is Action.EXIT
    assert run_command(state, "/quit") is Action.EXIT
    assert run_command(state, "/help") is Action.NONE
    assert run_command(state, "/frobnicate now") is Action.NONE
    text = out.getvalue()
    assert "nothing to retry" in text and "unknown command /frobnicate" in text
    for name in ("/clear", "/system", "/set", "/think", "/save", "/load", "/stats", "/retry"):
        assert name in text


def test_save_and_load(tmp_path: Path) -> None:
    state, out = make_state()
    path = tmp_path / "chat.json"
    run_command(state, f"/save {path}")
    saved = state.conv
    state.conv = Conversation()
    run_command(state, f"/load {path}")
    assert state.conv == saved and state.conv is not saved
    run_command(state, "/load")
    run_command(state, f"/load {tmp_path / 'nope.json'}")
    text = out.getvalue()
    assert "saved 2 messages" in text and "loaded 2 messages" in text
    assert "usage: /load FILE" in text and "cannot read" in text


def test_stats_before_and_after_a_reply() -> None:
    state, out = make_state()
    run_command(state, "/stats")
    assert "no reply yet" in out.getvalue()
    state.last = ReplyStats(100, 21, 0.5, 2.5, 512, "stop", 2, None)
    run_command(state, "/stats")
    text = out.getvalue()
    assert "121 / 512" in text and "10.0 tok/s" in text and "200.0 tok/s" in text
    assert "n/a (all experts resident)" in text
