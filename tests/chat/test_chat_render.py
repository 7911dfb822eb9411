"""The reply view: plain streaming off a terminal, live markdown on one, reasoning
dimmed then collapsed, or hidden."""

from __future__ import annotations

import io

import pytest
from rich.console import Console
from rich.text import Text

from flint.chat.render import ReplyView, _Tail

REPLY = [
    "<thi",
    "nk>\nThe user wants code",
    ".\n</think>\n\nHere:\n\n```py",
    "thon\nprint('hi')\n```\n\n**Done**.",
]


def plain() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, width=80, color_system=None), out


def terminal() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, width=60, height=12, force_terminal=True), out


def stream(console: Console, pieces: list[str], **kw: bool) -> ReplyView:
    with ReplyView(console, markdown=True, hide_thinking=kw.get("hide", False)) as view:
        for piece in pieces:
            view.feed(piece)
    return view


@pytest.mark.parametrize("hide", [False, True])
def test_plain_output_streams_the_text(hide: bool) -> None:
    console, out = plain()
    view = stream(console, REPLY, hide=hide)
    text = out.getvalue()
    assert view.text == "Here:\n\n```python\nprint('hi')\n```\n\n**Done**."
    assert text.endswith(view.text + "\n")
    assert ("The user wants code." in text) is not hide


def test_terminal_output_ends_with_the_whole_reply_as_markdown() -> None:
    console, out = terminal()
    view = stream(console, REPLY)
    final, final_out = terminal()
    final.print(view._final())
    text = out.getvalue()
    assert text.endswith(final_out.getvalue())
    shown = Text.from_ansi(final_out.getvalue()).plain
    assert "▸ thought for" in shown and "/think show" in shown
    assert "print('hi')" in shown and "```" not in shown and "**" not in shown
    assert "The user wants code" not in shown  # collapsed to one line


def test_hidden_reasoning_leaves_a_note() -> None:
    console, _ = terminal()
    view = stream(console, REPLY, hide=True)
    out = io.StringIO()
    Console(file=out, width=60, color_system=None).print(view._final())
    assert "thought for" in out.getvalue() and "(hidden)" in out.getvalue()


def test_interrupt_is_reported_and_the_partial_text_kept() -> None:
    console, out = plain()
    view = ReplyView(console, markdown=True, hide_thinking=False)
    with pytest.raises(KeyboardInterrupt), view:
        view.feed("Partial ans")
        raise KeyboardInterrupt
    assert view.text == "Partial ans"
    assert "Partial ans\n[interrupted: the partial reply is kept]" in out.getvalue()


def test_raw_text_is_not_markdown() -> None:
    console, _ = terminal()
    with ReplyView(console, markdown=False, hide_thinking=False) as view:
        view.feed("def __init__(self):\n    # not a header\n")
    out = io.StringIO()
    Console(file=out, width=60, color_system=None).print(view._final())
    assert "def __init__(self):\n    # not a header" in out.getvalue()


def test_tail_keeps_the_last_lines() -> None:
    out = io.StringIO()
    console = Console(file=out, width=40, color_system=None)
    console.print(_Tail(Text("\n".join(f"line {i}" for i in range(50))), 5))
    assert out.getvalue().split() == [w for i in range(45, 50) for w in ("line", str(i))]


@pytest.mark.parametrize("hide", [False, True])
def test_harmony_reply_shows_channels_not_markers(hide: bool) -> None:
    """GPT-OSS: the analysis channel is the reasoning, the final channel the answer."""
    console, out = plain()
    text = (
        "<|channel|>analysis<|message|>Greet back.<|end|>"
        "<|start|>assistant<|channel|>final<|message|>Hi **there**."
    )
    with ReplyView(console, markdown=True, hide_thinking=hide, harmony=True) as view:
        for i in range(0, len(text), 3):
            view.feed(text[i : i + 3])
    assert view.text == "Hi **there**."
    assert "<|" not in out.getvalue()
    assert ("Greet back." in out.getvalue()) is not hide
