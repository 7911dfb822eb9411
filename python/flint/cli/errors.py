"""One-line command errors on stderr, without tracebacks."""

from __future__ import annotations

import typer
from rich.console import Console

from flint import _core

# What loading or running a model raises for bad input or a bad file.
USER_ERRORS: tuple[type[Exception], ...] = (ValueError, FileNotFoundError, _core.FlintError)

stderr = Console(stderr=True, soft_wrap=True, highlight=False)


def fail(message: str, code: int = 2) -> typer.Exit:
    """Prints ``error: message`` to stderr; raise the result (``raise fail(...) from None``)."""
    stderr.print(f"[bold red]error:[/] {message}")
    return typer.Exit(code)


def fail_from(err: Exception, model: object = None) -> typer.Exit:
    """``fail`` for a caught error: exit 1 for a bad model file (format or checksum, named
    after ``model``), 2 for bad input."""
    if isinstance(err, _core.FlintError):
        return fail(f"{model}: {err}" if model is not None else str(err), 1)
    return fail(str(err))
