"""Tool calls in the model's output, in the syntax its chat template teaches.

A ``ToolSyntax`` knows the markers around one call (or one block of calls) and how to
read the text between them; ``ToolStream`` finds calls in streamed text with any
syntax. Syntaxes: Qwen/Hermes (``<tool_call>{"name": ..., "arguments": {...}}
</tool_call>``), GLM-4.5 (``<tool_call>name<arg_key>..</arg_key><arg_value>..
</arg_value></tool_call>``), DeepSeek V3/R1/V3.1 (``<|tool_calls_begin|>`` ...) and
Kimi K2 (``<|tool_calls_section_begin|>`` ...);
another one plugs in by adding it to ``SYNTAXES``.
"""

from __future__ import annotations

import json
import re
from typing import Any

from flint.server.reasoning import _partial_suffix
from flint.server.tool_blocks import (
    DS_CALL_BEGIN,
    DS_CALL_END,
    DS_CALLS_BEGIN,
    DS_CALLS_END,
    DS_SEP,
    DeepSeekToolSyntax,
    KimiToolSyntax,
)
from flint.server.tool_call import ToolCall, ToolSyntax, new_call_id

__all__ = [
    "DS_CALLS_BEGIN",
    "DS_CALLS_END",
    "DS_CALL_BEGIN",
    "DS_CALL_END",
    "DS_SEP",
    "SYNTAXES",
    "DeepSeekToolSyntax",
    "GlmToolSyntax",
    "KimiToolSyntax",
    "QwenToolSyntax",
    "ToolCall",
    "ToolStream",
    "ToolSyntax",
    "detect_syntax",
    "for_request",
    "new_call_id",
    "parse_tool_calls",
]


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


def _argument_types(tools: list[dict[str, Any]] | None) -> dict[str, dict[str, Any]]:
    """tool name -> argument name -> its JSON-schema type, from the request's tools."""
    out: dict[str, dict[str, Any]] = {}
    for tool in tools or ():
        fn = tool.get("function") or {}
        props = (fn.get("parameters") or {}).get("properties") or {}
        if isinstance(fn.get("name"), str) and isinstance(props, dict):
            out[fn["name"]] = {k: v.get("type") for k, v in props.items() if isinstance(v, dict)}
    return out


_GLM_PAIR = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.DOTALL)


class GlmToolSyntax:
    """GLM-4.5's ``<tool_call>name\n<arg_key>k</arg_key>\n<arg_value>v</arg_value>\n
    ...</tool_call>`` (its chat template writes string values as they are, others as
    JSON). A value is kept as text when the request's tool schema types it "string",
    else read as JSON when it is JSON (``bind`` gives the schema)."""

    start = "<tool_call>"
    end = "</tool_call>"
    marker = "<arg_key>"  # what tells GLM's template from Qwen's

    def __init__(self, types: dict[str, dict[str, Any]] | None = None) -> None:
        self.types = types or {}  # tool -> argument -> schema type

    def bind(self, tools: list[dict[str, Any]] | None) -> GlmToolSyntax:
        return GlmToolSyntax(types=_argument_types(tools))

    def parse(self, body: str) -> ToolCall | None:
        at = body.find("<arg_key>")
        name = (body if at < 0 else body[:at]).strip()
        if not name or any(c.isspace() or c in "<>{}" for c in name):
            return None
        rest = "" if at < 0 else body[at:]
        if _GLM_PAIR.sub("", rest).strip():
            return None  # something besides key/value pairs
        types = self.types.get(name, {})
        args = {k.strip(): self._value(v, types.get(k.strip())) for k, v in _GLM_PAIR.findall(rest)}
        return ToolCall(name, json.dumps(args, ensure_ascii=False), new_call_id())

    @staticmethod
    def _value(text: str, kind: Any) -> Any:
        if kind == "string":
            return text
        try:
            return json.loads(text)
        except ValueError:
            return text


# Order matters for detection: GLM's template also names <tool_call>.
SYNTAXES: dict[str, ToolSyntax] = {
    "glm4": GlmToolSyntax(),
    "deepseek": DeepSeekToolSyntax(),
    "kimi": KimiToolSyntax(),
    "qwen": QwenToolSyntax(),
}


def detect_syntax(template: str | None) -> ToolSyntax | None:
    """The syntax a chat template teaches, found by its markers."""
    for syntax in SYNTAXES.values():
        marker = getattr(syntax, "marker", syntax.start)
        if template is not None and marker in template:
            return syntax
    return None


def for_request(syntax: ToolSyntax, tools: list[dict[str, Any]] | None) -> ToolSyntax:
    """``syntax`` bound to the request's tool schemas, where it reads them."""
    bind = getattr(syntax, "bind", None)
    return syntax if bind is None else bind(tools)


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
        calls = call if isinstance(call, list) else [call]
        self.calls += len(calls)
        self.after_call = True
        out.extend(calls)


def parse_tool_calls(syntax: ToolSyntax, text: str) -> tuple[str, list[ToolCall]]:
    """Content and calls of a whole output (same rules as streaming)."""
    stream = ToolStream(syntax)
    parts = stream.feed(text) + stream.flush()
    content = "".join(p for p in parts if isinstance(p, str))
    return content, [p for p in parts if isinstance(p, ToolCall)]
