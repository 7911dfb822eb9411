"""``flint demo``: stream a model bigger than the RAM it is given, with live statistics.

The model is synthetic (random weights with a small real-looking geometry, made once
with ``flint synth`` and cached), so its text is noise; what the demo shows is the
engine: experts read from disk on demand and ahead of time, a RAM cache holding a
fraction of them, and the output the same as if everything were resident.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Annotated, Any

import torch
import typer
from rich.console import Console
from rich.live import Live
from rich.table import Table

from flint.cli.progress import byte_progress

DEMO_GEOMETRY = "demo"
DEMO_PROMPT = "The quick brown fox"


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "flint"


def drop_stale_demos(keep: Path, console: Console) -> None:
    """Deletes demo models (and their usage tables) an older flint or synth left in the
    cache directory: each is a few GiB, and none is used again."""
    for old in sorted(keep.parent.glob("demo-*.ftw")):
        if old == keep:
            continue
        for f in (old, old.with_name(old.name + ".usage")):
            f.unlink(missing_ok=True)
        console.print(f"removed an outdated demo model: {old}")


def demo_model(console: Console, path: Path | None = None) -> Path:
    """The cached demo model, written with ``flint synth`` the first time."""
    from flint._version import __version__
    from flint.synth import WEIGHTS_REVISION, synth

    target = path or cache_dir() / f"demo-{__version__}-w{WEIGHTS_REVISION}.ftw"
    if path is None:
        drop_stale_demos(target, console)
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    console.print(f"making the demo model once (random weights) at {target}")
    with byte_progress("synth demo", console) as bar:
        synth(DEMO_GEOMETRY, "bf16", target, progress=bar.advance, on_start=bar.start)
    return target


def _table(stats: dict[str, Any], tokens: int, elapsed: float, budget: float) -> Table:
    n = max(1, int(stats["forward_calls"]))
    t = Table(title="flint demo: streaming statistics", show_header=False, min_width=60)
    rows = [
        ("tokens generated", f"{tokens}  ({tokens / max(elapsed, 1e-9):.1f} tok/s)"),
        (
            "RAM expert cache",
            f"{stats['slots_per_layer']} of 64 experts per layer ({budget:g} GiB)",
        ),
        ("reads", f"{stats['mode']} I/O"),
        ("RAM hit rate", f"{(stats['ram_hit_rate'] or 0):.1%}"),
        ("demand reads / token", f"{stats['reads_demand'] / n:.1f}"),
        ("prefetch reads / token", f"{stats['reads_prefetch'] / n:.1f}"),
        ("read from disk", f"{(stats['bytes_demand'] + stats['bytes_prefetch']) / 2**30:.2f} GiB"),
        ("stall on disk", f"{1000 * stats['stall_s'] / n:.1f} ms / token"),
    ]
    for d in (1, 2):
        r = stats.get(f"recall_d{d}")
        if r is not None:
            rows.append((f"lookahead recall, {d} layer{'s' if d > 1 else ''} ahead", f"{r:.1%}"))
    for k, v in rows:
        t.add_row(k, v)
    return t


def register(app: typer.Typer, console: Console) -> None:
    @app.command()
    def demo(
        tokens: Annotated[int, typer.Option("-n", "--tokens", help="Tokens to generate.")] = 32,
        ram_budget: Annotated[
            float, typer.Option(help="GiB of RAM for the expert cache (the model has ~3 GiB).")
        ] = 0.75,
        model: Annotated[
            Path | None, typer.Option(help="Where to keep the demo model (default: cache dir).")
        ] = None,
        threads: Annotated[int | None, typer.Option(help="CPU threads for torch.")] = None,
    ) -> None:
        """Stream a synthetic MoE model larger than its RAM budget and show the engine at work.

        The weights are random, so the generated text is noise: the demo shows the
        streaming (reads on demand and ahead of time, the RAM cache), not the model.
        """
        import flint

        if tokens < 1 or ram_budget < 0:
            console.print("[bold red]error:[/] --tokens must be >= 1 and --ram-budget >= 0")
            raise typer.Exit(2)
        if threads is not None:
            torch.set_num_threads(threads)
        path = demo_model(console, model)
        size = path.stat().st_size / 2**30
        console.print(
            f"demo model: {path} ({size:.2f} GiB); RAM budget for experts: {ram_budget:g} GiB."
            " [bold]The weights are random: the text below is noise.[/]"
        )
        llm = flint.LLM(
            path,
            device="cpu",
            dtype="bfloat16",
            context_length=512,
            ram_budget=ram_budget,
            lookahead=2,
            expert_kernels="fused",  # one Rust call per layer from the cache slots
        )
        with llm, Live(console=console, refresh_per_second=4) as live:
            text, t0, n = "", time.perf_counter(), 0
            for chunk in llm.stream(
                DEMO_PROMPT, max_tokens=tokens, ignore_eos=True, temperature=1.0, seed=0
            ):
                n += len(chunk.token_ids)
                text += chunk.text
                stats = llm.stats() or {}
                live.update(_table(stats, n, time.perf_counter() - t0, ram_budget))
        console.print(f"\ntext (noise): {text!r}")
