"""GPT-OSS's harmony output: reasoning, answer and tool calls, also while streaming.

After the prompt's ``<|start|>assistant`` the model writes messages, each a header,
``<|message|>`` and a body:

    <|channel|>analysis<|message|>REASONING<|end|>
    <|start|>assistant<|channel|>final<|message|>ANSWER<|return|>
    <|start|>assistant<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>
        {...}<|call|>            (a call: one line, split here)

(the recipient may also follow the role: ``assistant to=functions.NAME<|channel|>...``).
The analysis channel is reasoning, a message to ``functions.NAME`` a tool call, any
other body (final, commentary preambles) content. ``<|return|>`` and ``<|call|>`` end
generation, so the last body usually ends with the output. Text that does not start
with a header is content. The markers are special tokens the tokenizer keeps for this
family (``flint.markup``); none of them reaches the content.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from flint.markup import HARMONY_MARKERS

START, CHANNEL, MESSAGE, CONSTRAIN, END, RETURN, CALL = HARMONY_MARKERS
REASONING, CONTENT = "reasoning", "content"
_BODY_ENDS = (END, RETURN, CALL, START)  # a missing <|end|> still ends at <|start|>
_CHANNEL = re.compile(re.escape(CHANNEL) + r"\s*(\w+)")
_RECIPIENT = re.compile(r"\bto=functions\.([^\s<]+)")


def is_harmony(template: str | None) -> bool:
    """Whether a chat template writes harmony (GPT-OSS's)."""
    return template is not None and CHANNEL in template and MESSAGE in template


@dataclass(slots=True, frozen=True)
class HarmonyCall:
    """A call to ``functions.NAME``; ``arguments`` is a JSON object as text."""

    name: str
    arguments: str


Event = tuple[str, str] | HarmonyCall  # (REASONING or CONTENT, text), or a call


def _partial(text: str, markers: tuple[str, ...]) -> int:
    """Length of the longest suffix of ``text`` that could still become a marker."""
    best = 0
    for m in markers:
        for n in range(min(len(text), len(m) - 1), best, -1):
            if text.endswith(m[:n]):
                best = n
                break
    return best


class HarmonyParser:
    """Feed text pieces, get events back in order; feeding the whole text at once and
    piece by piece give the same events (joined). ``tools``: read messages to
    functions as calls (else their bodies are content)."""

    def __init__(self, tools: bool = True) -> None:
        self.tools = tools
        self.buf = ""
        self.in_body = False
        self.kind = CONTENT  # of the open body
        self.function = ""  # the open body's recipient, when it is a call
        self.args = ""  # the open call's body so far

    def feed(self, text: str) -> list[Event]:
        self.buf += text
        out: list[Event] = []
        while self.in_body or self._header():
            at, marker = self._body_end()
            if at < 0:
                keep = _partial(self.buf, _BODY_ENDS)
                self._body(self.buf[: len(self.buf) - keep], out)
                self.buf = self.buf[len(self.buf) - keep :]
                break
            self._body(self.buf[:at], out)
            self._close(out)
            self.buf = self.buf[at if marker == START else at + len(marker) :]
        return out

    def flush(self) -> list[Event]:
        """The rest at the end of the output (an unfinished header is dropped)."""
        out: list[Event] = []
        if self.in_body:
            self._body(self.buf, out)
            self._close(out)
        self.buf = ""
        return out

    def _header(self) -> bool:
        """Opens a body when the buffer holds a whole header (or plain text)."""
        head = self.buf.lstrip()
        if not head or any(m.startswith(head) for m in (START, CHANNEL)):
            return False  # not decided yet
        if not head.startswith((START, CHANNEL)):
            self.in_body, self.kind, self.function = True, CONTENT, ""  # not harmony
            return True
        at = self.buf.find(MESSAGE)
        if at < 0:
            return False
        header, self.buf = self.buf[:at], self.buf[at + len(MESSAGE) :]
        channel = _CHANNEL.search(header)
        recipient = _RECIPIENT.search(header)
        self.in_body, self.function, self.args = True, "", ""
        if recipient and self.tools:
            self.kind, self.function = CONTENT, recipient[1]
        else:
            self.kind = REASONING if channel and channel[1] == "analysis" else CONTENT
        return True

    def _body_end(self) -> tuple[int, str]:
        found = [(at, m) for m in _BODY_ENDS if (at := self.buf.find(m)) >= 0]
        return min(found) if found else (-1, "")

    def _body(self, text: str, out: list[Event]) -> None:
        if self.function:
            self.args += text
        elif text:
            out.append((self.kind, text))

    def _close(self, out: list[Event]) -> None:
        self.in_body = False
        if not self.function:
            return
        try:
            args = json.loads(self.args)
        except ValueError:
            args = None
        if isinstance(args, dict):
            out.append(HarmonyCall(self.function, json.dumps(args, ensure_ascii=False)))
        elif self.args:
            out.append((CONTENT, self.args))  # not a call after all: shown as it is
        self.function = ""


def split_harmony(text: str, tools: bool = False) -> tuple[str, str, list[HarmonyCall]]:
    """(reasoning, content, calls) of a whole output."""
    parser = HarmonyParser(tools)
    events = parser.feed(text) + parser.flush()
    texts = {REASONING: "", CONTENT: ""}
    calls: list[HarmonyCall] = []
    for e in events:
        if isinstance(e, HarmonyCall):
            calls.append(e)
        else:
            texts[e[0]] += e[1]
    return texts[REASONING], texts[CONTENT], calls
