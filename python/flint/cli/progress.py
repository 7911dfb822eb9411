"""A rich progress bar with bytes, speed and ETA, shared by long-running commands."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    MofNCompleteColumn,
    Progress,
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
