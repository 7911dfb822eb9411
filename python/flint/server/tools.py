"""Tool calls in the model's output, in the syntax its chat template teaches.

A ``ToolSyntax`` knows the markers around one call and how to read the text between
them; ``ToolStream`` finds calls in streamed text with any syntax. Qwen/Hermes
(``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``) is the first syntax;
another one plugs in by adding it to ``SYNTAXES``.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Protocol

from flint.server.reasoning import _partial_suffix


@dataclass(slots=True, frozen=True)
class ToolCall:
    """A parsed call: ``arguments`` is a JSON object as text."""

    name: str
    arguments: str
    id: str

    def as_openai(self) -> dict[str, object]:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


class ToolSyntax(Protocol):
    start: str
    end: str

    def parse(self, body: str) -> ToolCall | None:
        """The call written between the markers, or None when it is not one."""
        ...


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


class QwenToolSyntax:
    """``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`` (Qwen, Hermes)."""

    start = "<tool_call>"
    end = "</tool_call>"

    def parse(self, body: str) -> ToolCall | None:
        try:
            obj = json.loads(body)
        except ValueError:
            return None
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            return None
        args = obj.get("arguments", obj.get("parameters", {}))
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except ValueError:
                return None
        if not isinstance(args, dict):
            return None
        return ToolCall(obj["name"], json.dumps(args, ensure_ascii=False), new_call_id())


SYNTAXES: dict[str, ToolSyntax] = {"qwen": QwenToolSyntax()}


def detect_syntax(template: str | None) -> ToolSyntax | None:
    """The syntax a chat template teaches, found by its markers."""
    for syntax in SYNTAXES.values():
        if template is not None and syntax.start in template:
            return syntax
    return None


class ToolStream:
    """Separates content from tool calls in streamed text.

    ``feed`` returns content text and finished calls in order. Text that could still
    become a start marker is held back, and so is trailing whitespace: whitespace
    next to a call only separates calls and is dropped. A call that does not parse
    is passed on as content, markers included.
    """

    def __init__(self, syntax: ToolSyntax) -> None:
        self.syntax = syntax
        self.buf = ""
        self.in_call = False
        self.calls = 0
        self.after_call = False  # drop whitespace that follows a call
        self.gap = ""  # whitespace before the open call: dropped unless the call is bad

    def feed(self, text: str) -> list[str | ToolCall]:
        self.buf += text
        out: list[str | ToolCall] = []
        while True:
            marker = self.syntax.end if self.in_call else self.syntax.start
            at = self.buf.find(marker)
            if at < 0:
                break
            before, self.buf = self.buf[:at], self.buf[at + len(marker) :]
            if self.in_call:
                self._call(before, out, self.syntax.end)
            else:
                kept = before.rstrip()
                self._text(kept, out)
                self.gap = before[len(kept) :]
            self.in_call = not self.in_call
        if not self.in_call:
            partial = _partial_suffix(self.buf, self.syntax.start)
            head = self.buf[: len(self.buf) - partial].rstrip()
            if head:
                self._text(head, out)
                self.buf = self.buf[len(head) :]
        return out

    def flush(self) -> list[str | ToolCall]:
        out: list[str | ToolCall] = []
        buf, self.buf = self.buf, ""
        if self.in_call:
            self.in_call = False
            self._call(buf, out, "")
        else:
            self._text(buf if self.calls == 0 else buf.rstrip(), out)
        return out

    def _text(self, text: str, out: list[str | ToolCall]) -> None:
        if self.after_call:
            text = text.lstrip()
        if text:
            out.append(text)
            self.after_call = False

    def _call(self, body: str, out: list[str | ToolCall], end: str) -> None:
        call = self.syntax.parse(body)
        gap, self.gap = self.gap, ""
        if call is None:
            self._text(gap + self.syntax.start + body + end, out)
            return
        self.calls += 1
        self.after_call = True
        out.append(call)


def parse_tool_calls(syntax: ToolSyntax, text: str) -> tuple[str, list[ToolCall]]:
    """Content and calls of a whole output (same rules as streaming)."""
    stream = ToolStream(syntax)
    parts = stream.feed(text) + stream.flush()
    content = "".join(p for p in parts if isinstance(p, str))
    return content, [p for p in parts if isinstance(p, ToolCall)]
