"""Splitting ``<think>...</think>`` reasoning from the answer, also while streaming.

The splitter is fed text as it is generated and returns (reasoning, content) pieces.
It holds back only what could still be part of a tag or trailing whitespace, so
feeding the whole text at once and feeding it piece by piece give the same result.
A prompt that already opened the think block (some templates end with ``<think>``)
starts the splitter inside it.
"""

from __future__ import annotations

OPEN, CLOSE = "<think>", "</think>"


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``tag``."""
    for n in range(min(len(text), len(tag) - 1), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


def prompt_opens_think(prompt: str) -> bool:
    """Whether the rendered prompt leaves the model inside a think block."""
    return prompt.rfind(OPEN) > prompt.rfind(CLOSE)


class ReasoningSplitter:
    """States: start (may open a think block), reasoning, gap (whitespace after
    ``</think>``), content."""

    def __init__(self, in_reasoning: bool = False) -> None:
        self.state = "reasoning" if in_reasoning else "start"
        self.buf = ""
        self.lead = True  # leading whitespace of the reasoning is dropped

    def feed(self, text: str) -> tuple[str, str]:
        """Returns the (reasoning, content) that ``text`` completes."""
        self.buf += text
        reasoning, content = "", ""
        while True:
            if self.state == "start":
                stripped = self.buf.lstrip()
                if stripped.startswith(OPEN):
                    self.state, self.buf = "reasoning", stripped[len(OPEN) :]
                    continue
                if not stripped or OPEN.startswith(stripped):
                    return reasoning, content  # not decided yet
                self.state = "content"
            if self.state == "reasoning":
                if self.lead:
                    self.buf = self.buf.lstrip()
                    self.lead = not self.buf
                end = self.buf.find(CLOSE)
                if end < 0:
                    keep = _partial_suffix(self.buf, CLOSE)
                    head = self.buf[: len(self.buf) - keep]
                    out = head.rstrip()
                    reasoning += out
                    self.buf = self.buf[len(out) :]
                    return reasoning, content
                reasoning += self.buf[:end].rstrip()
                self.state, self.buf = "gap", self.buf[end + len(CLOSE) :]
            if self.state == "gap":
                self.buf = self.buf.lstrip()
                if not self.buf:
                    return reasoning, content
                self.state = "content"
            content += self.buf
            self.buf = ""
            return reasoning, content

    def flush(self) -> tuple[str, str]:
        """Whatever is held back, at the end of generation."""
        buf, self.buf = self.buf, ""
        if self.state == "reasoning":
            return buf.rstrip(), ""
        if self.state == "gap":
            return "", ""
        return "", buf
