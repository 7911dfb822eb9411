"""Tool-call syntaxes that write a block of calls between two markers: DeepSeek
V3/R1/V3.1 and Kimi K2 (each call between its own markers inside the block)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable

from flint.markup import KIMI_TOOL_MARKERS
from flint.server.tool_call import ToolCall, new_call_id

# DeepSeek's markers, with fullwidth bars (U+FF5C) and lower one-eighth blocks (U+2581);
# written below with ASCII | and _ for them.
_BAR, _SP = "\uff5c", "\u2581"


def _ds(name: str) -> str:
    return f"<{_BAR}{name.replace('_', _SP)}{_BAR}>"


DS_CALLS_BEGIN, DS_CALLS_END = _ds("tool_calls_begin"), _ds("tool_calls_end")
DS_CALL_BEGIN, DS_CALL_END, DS_SEP = _ds("tool_call_begin"), _ds("tool_call_end"), _ds("tool_sep")
_DS_FENCED = re.compile(r"^(.+?)\n```(?:json)?\n(.*)\n```$", re.DOTALL)


class DeepSeekToolSyntax:
    """DeepSeek's block of calls ``<|tool_calls_begin|>CALL(\nCALL)...<|tool_calls_end|>``
    (DeepSeek-V3 and R1's templates), each CALL either V3/R1's
    ``<|tool_call_begin|>function<|tool_sep|>NAME\n```json\nARGS\n```<|tool_call_end|>``
    or V3.1's ``<|tool_call_begin|>NAME<|tool_sep|>ARGS<|tool_call_end|>`` (bars and
    underscores stand for U+FF5C and U+2581). The block's calls come out together when
    it closes (or at the end of the output)."""

    start = DS_CALLS_BEGIN
    end = DS_CALLS_END
    arguments_as_text = True  # the templates concatenate the arguments as a string

    def parse(self, body: str) -> list[ToolCall] | None:
        return _block(body, DS_CALL_BEGIN, DS_CALL_END, self._one)

    @staticmethod
    def _one(inner: str) -> ToolCall | None:
        head, sep, tail = inner.partition(DS_SEP)
        if not sep:
            return None
        fenced = _DS_FENCED.match(tail.strip("\n")) if head.strip() == "function" else None
        name, args_text = (fenced[1], fenced[2]) if fenced else (head, tail)
        name = name.strip()
        try:
            args = json.loads(args_text)
        except ValueError:
            return None
        if not name or not isinstance(args, dict):
            return None
        return ToolCall(name, json.dumps(args, ensure_ascii=False), new_call_id())


def _block(
    body: str, begin: str, end: str, one: Callable[[str], ToolCall | None]
) -> list[ToolCall] | None:
    """The calls ``begin INNER end`` (whitespace between them) of a block, each INNER
    read by ``one``; the last may lack its end (the output stopped); None if any fails."""
    calls: list[ToolCall] = []
    rest = body.strip()
    while rest:
        if not rest.startswith(begin):
            return None
        at = rest.find(end)
        call = one(rest[len(begin) : at if at >= 0 else len(rest)])
        if call is None:
            return None
        calls.append(call)
        rest = "" if at < 0 else rest[at + len(end) :].strip()
    return calls or None


(
    KIMI_SECTION_BEGIN,
    KIMI_SECTION_END,
    KIMI_CALL_BEGIN,
    KIMI_ARGS_BEGIN,
    KIMI_CALL_END,
) = KIMI_TOOL_MARKERS
_KIMI_ID = re.compile(r"(?:functions\.)?([^\s:]+)(?::\d+)?")


class KimiToolSyntax:
    """Kimi K2's block ``<|tool_calls_section_begin|>CALL...<|tool_calls_section_end|>``,
    each CALL ``<|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>ARGS
    <|tool_call_end|>``. The id the model writes is the call's id: Kimi's template
    writes ids back as they are, so its next turn sees its own."""

    start = KIMI_SECTION_BEGIN
    end = KIMI_SECTION_END
    arguments_as_text = True  # the template writes string arguments as they are

    def parse(self, body: str) -> list[ToolCall] | None:
        return _block(body, KIMI_CALL_BEGIN, KIMI_CALL_END, self._one)

    @staticmethod
    def _one(inner: str) -> ToolCall | None:
        ident, sep, args_text = inner.partition(KIMI_ARGS_BEGIN)
        named = _KIMI_ID.fullmatch(ident.strip())
        if not sep or named is None:
            return None
        try:
            args = json.loads(args_text)
        except ValueError:
            return None
        if not isinstance(args, dict):
            return None
        call_id = ident.strip() if ":" in ident else new_call_id()
        return ToolCall(named[1], json.dumps(args, ensure_ascii=False), call_id)
