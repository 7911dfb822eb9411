"""Reading the user's messages with prompt_toolkit.

Enter sends; Esc+Enter (or Alt+Enter) inserts a new line; a message that starts with
triple quotes continues over several lines until a line ends with triple quotes. Pasted text is
inserted as it is (bracketed paste), newlines included, and sent only on Enter.
History is kept in a file across runs.
"""

from __future__ import annotations

from pathlib import Path

from prompt_toolkit import PromptSession
from prompt_toolkit.application import get_app
from prompt_toolkit.formatted_text import HTML, AnyFormattedText
from prompt_toolkit.history import FileHistory, History, InMemoryHistory
from prompt_toolkit.key_binding import KeyBindings, KeyPressEvent

FENCE = '"""'
PROMPT = HTML("<b><ansigreen>&gt;&gt;&gt; </ansigreen></b>")
PLACEHOLDER = HTML("<style fg='#888888'>Send a message (/help for commands)</style>")


def open_block(text: str) -> bool:
    """True while a triple-quoted block is not closed yet."""
    stripped = text.strip()
    return stripped.startswith(FENCE) and (len(stripped) < 6 or not stripped.endswith(FENCE))


def unfence(text: str) -> str:
    """The message inside a triple-quoted block (or the text as it is)."""
    stripped = text.strip()
    if stripped.startswith(FENCE) and stripped.endswith(FENCE) and len(stripped) >= 6:
        return stripped[3:-3].strip("\n")
    return text


def _placeholder() -> AnyFormattedText:
    """The hint in an empty prompt, left out of the line kept in the scrollback."""
    return "" if get_app().is_done else PLACEHOLDER


def _bindings() -> KeyBindings:
    keys = KeyBindings()

    @keys.add("escape", "enter")
    def _newline(event: KeyPressEvent) -> None:
        event.current_buffer.insert_text("\n")

    @keys.add("enter")
    def _enter(event: KeyPressEvent) -> None:
        buffer = event.current_buffer
        if open_block(buffer.text):
            buffer.insert_text("\n")
        else:
            buffer.validate_and_handle()

    return keys


def history(path: Path | None) -> History:
    """A file history at ``path`` (created with its folder), or one in memory."""
    if path is None:
        return InMemoryHistory()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch(exist_ok=True)
    except OSError:
        return InMemoryHistory()  # a read-only home must not stop the chat
    return FileHistory(str(path))


class MessageReader:
    """``read()`` returns the next message; KeyboardInterrupt on Ctrl-C, EOFError on Ctrl-D."""

    def __init__(self, history_file: Path | None) -> None:
        self.session: PromptSession[str] = PromptSession(
            history=history(history_file),
            key_bindings=_bindings(),
            multiline=True,  # Enter is bound above, so paste and Esc+Enter keep newlines
            prompt_continuation=lambda width, line, wrap: "... ".rjust(width),
            placeholder=_placeholder,
            enable_history_search=False,
        )

    def read(self) -> str:
        return unfence(self.session.prompt(PROMPT))
