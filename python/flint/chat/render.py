"""Showing a reply while it streams: reasoning dimmed (then collapsed to one line, or
hidden), the answer as markdown with highlighted code.

On a terminal a ``rich.live.Live`` region redraws the reply at ~12 frames/s and shows
only its last screenful, so redraws stay smooth however long the reply gets; when the
reply ends the region is replaced by the whole reply, printed once, so the scrollback
holds it complete. Elsewhere (a pipe, a file) the text is written as it comes.
"""

from __future__ import annotations

import time
from types import TracebackType

from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.live import Live
from rich.markdown import Markdown
from rich.segment import Segment
from rich.spinner import Spinner
from rich.text import Text

from flint.chat.think import ANSWER, THINK, HarmonySplitter, ThinkSplitter

THINK_STYLE = "dim italic"
REFRESH_PER_SECOND = 12


class _Tail:
    """The last ``lines`` lines of a renderable (what fits on the screen)."""

    def __init__(self, renderable: RenderableType, lines: int) -> None:
        self.renderable, self.lines = renderable, lines

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        rendered = console.render_lines(self.renderable, options, pad=False)
        for line in rendered[-self.lines :]:
            yield from line
            yield Segment.line()


class ReplyView:
    """One reply on the console. Use as a context manager; ``feed`` the text pieces."""

    def __init__(
        self,
        console: Console,
        *,
        markdown: bool,
        hide_thinking: bool,
        in_think: bool = False,
        harmony: bool = False,
    ) -> None:
        self.console, self.markdown, self.hide_thinking = console, markdown, hide_thinking
        self.splitter: ThinkSplitter | HarmonySplitter = (
            HarmonySplitter() if harmony else ThinkSplitter(in_think)
        )
        self.think: list[str] = []
        self.answer: list[str] = []
        self.t0 = time.perf_counter()
        self.think_s: float | None = None  # how long the reasoning took, once it ended
        self.live: Live | None = None
        self.done = False
        if console.is_terminal:
            self.live = Live(
                self, console=console, refresh_per_second=REFRESH_PER_SECOND, transient=True
            )

    def __enter__(self) -> ReplyView:
        if self.live is not None:
            self.live.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.finish(interrupted=exc_type is not None)

    def feed(self, text: str) -> None:
        for kind, piece in self.splitter.feed(text):
            self._add(kind, piece)

    def _add(self, kind: str, piece: str) -> None:
        if kind == ANSWER and self.think and self.think_s is None:
            self.think_s = time.perf_counter() - self.t0
            if self.live is None and not self.hide_thinking:
                self.console.print()
        (self.think if kind == THINK else self.answer).append(piece)
        if self.live is None and (kind == ANSWER or not self.hide_thinking):
            style = THINK_STYLE if kind == THINK else None
            self.console.print(piece, end="", style=style, markup=False, highlight=False)

    def finish(self, interrupted: bool = False) -> None:
        """Ends the reply: flushes held-back text and prints the reply in full."""
        if self.done:
            return
        self.done = True
        for kind, piece in self.splitter.flush():
            self._add(kind, piece)
        if self.think and self.think_s is None:
            self.think_s = time.perf_counter() - self.t0
        if self.live is not None:
            self.live.stop()
            self.live = None
            self.console.print(self._final())
        elif self.answer or (self.think and not self.hide_thinking):
            self.console.print()
        if interrupted:
            self.console.print("[dim]\\[interrupted: the partial reply is kept][/]")

    @property
    def text(self) -> str:
        return "".join(self.answer)

    def _thought_line(self) -> Text:
        secs = self.think_s if self.think_s is not None else time.perf_counter() - self.t0
        hint = "hidden" if self.hide_thinking else "/think show expands it"
        return Text(f"▸ thought for {secs:.1f} s ({hint})", style="dim")

    def _body(self) -> RenderableType:
        text = self.text
        return Markdown(text) if self.markdown else Text(text)

    def _final(self) -> RenderableType:
        parts: list[RenderableType] = [self._thought_line()] if self.think else []
        return Group(*parts, self._body())

    def _live(self) -> RenderableType:
        if self.splitter.thinking or not (self.think or self.answer):
            if self.hide_thinking or not self.think:
                label = "thinking" if self.splitter.thinking else ""
                return Spinner("dots", Text(label, style="dim"), style="dim")
            return Text("".join(self.think), style=THINK_STYLE)
        return self._final()

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield _Tail(self._live(), max(console.height - 2, 3))


def print_reasoning(console: Console, reasoning: str) -> None:
    """``/think show``: the last reply's reasoning, dimmed."""
    if not reasoning:
        console.print("[dim]the last reply has no reasoning[/]")
        return
    console.print(Text(reasoning, style=THINK_STYLE))
