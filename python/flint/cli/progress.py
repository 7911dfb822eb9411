"""A rich progress bar with bytes, speed and ETA, shared by long-running commands."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)


@dataclass
class ByteBar:
    progress: Progress
    task: TaskID = field(default=TaskID(0))

    def start(self, total: int) -> None:
        self.progress.update(self.task, total=total)

    def advance(self, n: int) -> None:
        self.progress.advance(self.task, n)


@contextmanager
def byte_progress(description: str, console: Console) -> Iterator[ByteBar]:
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        DownloadColumn(binary_units=True),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=console,
        transient=False,
    ) as p:
        yield ByteBar(p, p.add_task(description, total=None))


@contextmanager
def count_progress(description: str, total: int, console: Console) -> Iterator[ByteBar]:
    """Like ``byte_progress`` for a known count of items (tokens, windows, ...)."""
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
        transient=False,
    ) as p:
        yield ByteBar(p, p.add_task(description, total=total))


@contextmanager
def spinner(first: str, console: Console) -> Iterator[Callable[[str], None]]:
    """A transient spinner with elapsed time for work of unknown length; yields the
    function that sets its text (first ``first``)."""
    with Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as bar:
        task = bar.add_task(first, total=None)
        yield lambda what: bar.update(task, description=what)
