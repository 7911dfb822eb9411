"""Splitting a streamed reply into reasoning (``<think>...</think>``) and answer.

Tags may arrive split across chunks, so text that could still become a tag is held
back. An opening tag counts only at the very start of the reply (after whitespace),
as reasoning models emit it; later it is ordinary text (a reply about HTML may write it).
"""

from __future__ import annotations

from flint.harmony import REASONING, HarmonyCall, HarmonyParser

OPEN, CLOSE = "<think>", "</think>"
THINK, ANSWER = "think", "answer"
Segment = tuple[str, str]  # (THINK or ANSWER, text)


class ThinkSplitter:
    """Feed text pieces, get (kind, text) segments back, in order."""

    def __init__(self, in_think: bool = False) -> None:
        self.state = THINK if in_think else "start"
        self.pending = ""
        self._strip_newlines = in_think  # drop the newlines that follow a tag

    @property
    def thinking(self) -> bool:
        return self.state == THINK

    def feed(self, text: str) -> list[Segment]:
        self.pending += text
        out: list[Segment] = []
        if self.state == "start":
            self._start()
        if self.state == THINK:
            self._think(out)
        if self.state == ANSWER:
            self._answer(out)
        return out

    def flush(self) -> list[Segment]:
        """The held-back text at the end of the reply."""
        text, self.pending = self.pending, ""
        if not text:
            return []
        return [(THINK if self.state == THINK else ANSWER, text)]

    def _start(self) -> None:
        head = self.pending.lstrip()
        if head.startswith(OPEN):
            self.pending = head[len(OPEN) :]
            self.state, self._strip_newlines = THINK, True
        elif not (OPEN.startswith(head) and head):
            self.state = ANSWER if head else "start"

    def _think(self, out: list[Segment]) -> None:
        self._lstrip()
        end = self.pending.find(CLOSE)
        if end >= 0:
            _emit(out, THINK, self.pending[:end].rstrip("\n"))
            self.pending = self.pending[end + len(CLOSE) :]
            self.state, self._strip_newlines = ANSWER, True
            return
        # hold back a partial tag, and newlines that may turn out to precede the tag
        cut = len(self.pending) - _overlap(self.pending, CLOSE)
        body = self.pending[:cut].rstrip("\n")
        _emit(out, THINK, body)
        self.pending = self.pending[len(body) :]

    def _answer(self, out: list[Segment]) -> None:
        self._lstrip()
        _emit(out, ANSWER, self.pending)
        self.pending = ""

    def _lstrip(self) -> None:
        if self._strip_newlines:
            self.pending = self.pending.lstrip("\n")
            self._strip_newlines = not self.pending


def _emit(out: list[Segment], kind: str, text: str) -> None:
    if text:
        out.append((kind, text))


def _overlap(text: str, tag: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``tag``."""
    for n in range(min(len(text), len(tag) - 1), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


class HarmonySplitter:
    """GPT-OSS's harmony channels as segments: analysis is THINK, the rest ANSWER (the
    chat offers no tools, so a call the model writes anyway is shown as text)."""

    def __init__(self) -> None:
        self.parser = HarmonyParser(tools=False)
        self.thinking = False

    def feed(self, text: str) -> list[Segment]:
        return self._segments(self.parser.feed(text))

    def flush(self) -> list[Segment]:
        return self._segments(self.parser.flush())

    def _segments(self, events: list[tuple[str, str] | HarmonyCall]) -> list[Segment]:
        # with tools=False every event is text
        out = [
            (THINK if e[0] == REASONING else ANSWER, e[1]) for e in events if isinstance(e, tuple)
        ]
        if out:
            self.thinking = out[-1][0] == THINK
        return out


def split_reply(text: str, in_think: bool = False, harmony: bool = False) -> tuple[str, str]:
    """(reasoning, answer) of a whole reply; ``harmony``: GPT-OSS's channels."""
    splitter: ThinkSplitter | HarmonySplitter = (
        HarmonySplitter() if harmony else ThinkSplitter(in_think)
    )
    parts: dict[str, list[str]] = {THINK: [], ANSWER: []}
    for kind, piece in splitter.feed(text) + splitter.flush():
        parts[kind].append(piece)
    return "".join(parts[THINK]), "".join(parts[ANSWER])
