"""The message reader: Enter sends; Esc+Enter, triple-quote blocks and pastes keep newlines;
history goes to a file."""

from __future__ import annotations

from pathlib import Path

import pytest
from prompt_toolkit.application import create_app_session
from prompt_toolkit.input import create_pipe_input
from prompt_toolkit.output import DummyOutput

from flint.chat.input import MessageReader, open_block, unfence


def read_all(keys: str, history: Path | None = None) -> list[str]:
    messages = []
    with create_pipe_input() as pipe, create_app_session(input=pipe, output=DummyOutput()):
        pipe.send_text(keys)
        pipe.close()
        reader = MessageReader(history)
        with pytest.raises(EOFError):
            while True:
                messages.append(reader.read())
    return messages


def test_multiline_input(tmp_path: Path) -> None:
    keys = (
        "hello\r"
        '"""\rline a\r\rline b\r"""\r'  # a triple-quoted block, blank line included
        "x\x1b\ry\r"  # Esc+Enter
        "\x1b[200~pasted 1\npasted 2\x1b[201~\r"  # bracketed paste
    )
    history = tmp_path / "sub" / "history"
    assert read_all(keys, history) == [
        "hello",
        "line a\n\nline b",
        "x\ny",
        "pasted 1\npasted 2",
    ]
    assert "pasted 2" in history.read_text("utf-8")
    assert read_all("\x1b[A\r", history) == ["pasted 1\npasted 2"]  # Up recalls the last one


def test_blocks() -> None:
    assert open_block('"""') and open_block('"""\nabc') and not open_block('"""abc"""')
    assert not open_block("abc") and not open_block('""""""')
    assert unfence('"""\nabc\n"""') == "abc" and unfence('say """hi"""') == 'say """hi"""'
