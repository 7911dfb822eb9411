"""Slash commands: ``/help``, ``/set``, ``/system``, ``/save`` ... Each one takes the chat
state and the text after the command name, and says what the loop does next."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table
from rich.text import Text

from flint.chat.config import Settings
from flint.chat.render import print_reasoning
from flint.chat.session import Conversation
from flint.chat.stats import ReplyStats, stats_rows
from flint.sampling import SamplingParams


class Action(enum.Enum):
    NONE = "none"  # back to the prompt
    REPLY = "reply"  # generate a reply to the last user message
    EXIT = "exit"


@dataclass(slots=True)
class ChatState:
    """What commands read and change."""

    console: Console
    conv: Conversation
    settings: Settings
    templated: bool  # False: a base model, text is continued raw
    last: ReplyStats | None = None
    reasoning: str = ""  # the last reply's <think> text


def _note(state: ChatState, text: str) -> None:
    """A dim one-line message (no markup, no highlighting)."""
    state.console.print(Text(text, style="dim"))


Handler = Callable[[ChatState, str], Action]

# /set NAME: the Settings field it changes ("temp" and "n" as in llama.cpp).
SET_NAMES = {
    "temperature": "temperature",
    "temp": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "max_tokens": "max_tokens",
    "n": "max_tokens",
    "seed": "seed",
}
_UNSET = ("default", "none", "random")


def parse_setting(name: str, value: str) -> tuple[str, float | int | None]:
    """(Settings field, value) for ``/set NAME VALUE``; ValueError with the reason."""
    field = SET_NAMES.get(name.lower())
    if field is None:
        raise ValueError(f"cannot set {name!r}: use one of {', '.join(sorted(set(SET_NAMES)))}")
    if value.lower() in _UNSET:
        return field, None
    try:
        number: float | int = float(value) if field in ("temperature", "top_p") else int(value)
    except ValueError:
        raise ValueError(f"{field} needs a number, got {value!r}") from None
    SamplingParams.build(None, **{field: number})  # same checks as the API
    return field, number


def _help(state: ChatState, arg: str) -> Action:
    table = Table(show_header=False, box=None, padding=(0, 2))
    for name, (_, usage, text) in COMMANDS.items():
        table.add_row(f"[bold]/{name}[/] {usage}", text)
    state.console.print(table)
    state.console.print(
        '[dim]Esc+Enter: new line · """ starts and ends a multi-line block · pasted text '
        "stays one message · //text sends /text · Ctrl-C stops a reply · Ctrl-D quits[/]"
    )
    return Action.NONE


def _clear(state: ChatState, arg: str) -> Action:
    state.conv.clear()
    state.last, state.reasoning = None, ""
    _note(state, "conversation cleared (the system prompt stays)")
    return Action.NONE


def _system(state: ChatState, arg: str) -> Action:
    if not arg:
        shown = state.conv.system if state.conv.system else "(none)"
        state.console.print(Text(f"system prompt: {shown}"))
        return Action.NONE
    state.conv.system = None if arg.lower() == "none" else arg
    _note(state, "system prompt set; it applies to the next reply")
    return Action.NONE


def _set(state: ChatState, arg: str) -> Action:
    parts = arg.split()
    if not parts:
        state.console.print(Text(state.settings.describe()))
        return Action.NONE
    if len(parts) != 2:
        raise ValueError("usage: /set temperature|top_p|top_k|max_tokens|seed VALUE")
    field, value = parse_setting(*parts)
    state.settings = state.settings.updated(field, value)
    _note(state, f"{field} = {'default' if value is None else value}")
    return Action.NONE


def _think(state: ChatState, arg: str) -> Action:
    choice = arg.strip().lower()
    if choice == "show":
        print_reasoning(state.console, state.reasoning)
    elif choice in ("on", "off"):
        state.settings = dataclasses.replace(state.settings, thinking=choice == "on")
        _note(state, f"thinking {choice} (for templates that support it)")
    else:
        raise ValueError("usage: /think on|off|show")
    return Action.NONE


def _save(state: ChatState, arg: str) -> Action:
    if not arg:
        raise ValueError("usage: /save FILE")
    state.conv.save(Path(arg).expanduser())
    _note(state, f"saved {len(state.conv.messages)} messages to {arg}")
    return Action.NONE


def _load(state: ChatState, arg: str) -> Action:
    if not arg:
        raise ValueError("usage: /load FILE")
    state.conv = Conversation.load(Path(arg).expanduser())
    state.last, state.reasoning = None, ""
    _note(state, f"loaded {len(state.conv.messages)} messages from {arg}")
    return Action.NONE


def _stats(state: ChatState, arg: str) -> Action:
    if state.last is None:
        _note(state, "no reply yet")
        return Action.NONE
    table = Table(title="last reply", show_header=False)
    for name, value in stats_rows(state.last):
        table.add_row(name, value)
    state.console.print(table)
    return Action.NONE


def _retry(state: ChatState, arg: str) -> Action:
    if not state.conv.undo_reply():
        raise ValueError("nothing to retry: send a message first")
    return Action.REPLY


def _exit(state: ChatState, arg: str) -> Action:
    return Action.EXIT


COMMANDS: dict[str, tuple[Handler, str, str]] = {
    "help": (_help, "", "this list"),
    "clear": (_clear, "", "forget the conversation (keeps the system prompt)"),
    "system": (_system, "[TEXT|none]", "show or set the system prompt"),
    "set": (_set, "[NAME VALUE]", "temperature|top_p|top_k|max_tokens|seed; none = default"),
    "think": (_think, "on|off|show", "reasoning on or off; show the last reply's reasoning"),
    "save": (_save, "FILE", "save the conversation as JSON"),
    "load": (_load, "FILE", "load a conversation saved with /save"),
    "stats": (_stats, "", "last reply: TTFT, tok/s, context used, expert cache, stall"),
    "retry": (_retry, "", "answer the last message again"),
    "exit": (_exit, "", "quit (also Ctrl-D)"),
}
ALIASES = {"quit": "exit", "q": "exit", "?": "help", "reset": "clear"}


def run_command(state: ChatState, line: str) -> Action:
    """Runs ``/name args``; a ValueError is shown as one line and the chat goes on."""
    name, _, arg = line[1:].strip().partition(" ")
    name = ALIASES.get(name.lower(), name.lower())
    entry = COMMANDS.get(name)
    try:
        if entry is None:
            raise ValueError(f"unknown command /{name}: /help lists the commands")
        return entry[0](state, arg.strip())
    except ValueError as err:
        state.console.print(Text(str(err), style="red"))
        return Action.NONE
