"""The ``flint`` command line (typer + rich). One module per command group."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console

from flint._version import __version__, core_version
from flint.cli.replay import replay_command
from flint.cli.serve import serve_command

app = typer.Typer(
    name="flint",
    help="Run Mixture-of-Experts models larger than GPU memory and RAM by streaming "
    "experts from NVMe, with exact output.",
    no_args_is_help=True,
    rich_markup_mode="rich",
    context_settings={"help_option_names": ["-h", "--help"]},
)
console = Console()


def _version_callback(value: bool) -> None:
    if value:
        console.print(f"flint {__version__} (core {core_version()})")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            "-V",
            help="Show the Python package and Rust core versions and exit.",
            callback=_version_callback,
            is_eager=True,
        ),
    ] = False,
) -> None:
    """flint: MoE inference that streams experts from NVMe."""


from flint.cli import bench, chat, demo, evaluate, model_file, run, tune  # noqa: E402

# Order of `flint --help`: first runs, then the server, model files, measurement.
demo.register(app, console)
run.register(app)
chat.register(app, console)
app.command("serve")(serve_command)
model_file.register(app, console)
evaluate.register(app)
bench.register(app)
tune.register(app)
app.command("replay")(replay_command)


def main() -> None:
    """Entry point of the ``flint`` console script."""
    app()
