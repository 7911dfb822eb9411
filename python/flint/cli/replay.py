"""``flint replay``: run a routing trace through the expert-cache policies."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from flint.cache import POLICIES, ReplayConfig, ReplayRow, Trace, load_trace, run_replay

_console = Console()
_err = Console(stderr=True)


def _parse_capacities(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise typer.BadParameter(
            f"expected comma-separated positive integers, e.g. 8,16,24,32; got {text!r}"
        ) from None
    if any(v < 1 for v in values):
        raise typer.BadParameter(f"capacities must be at least 1, got {text!r}")
    return values


def _parse_policies(text: str) -> tuple[str, ...]:
    names = tuple(part.strip().lower() for part in text.split(","))
    unknown = [n for n in names if n not in POLICIES]
    if unknown:
        raise typer.BadParameter(f"unknown policy {unknown[0]!r}; choose from {','.join(POLICIES)}")
    return names


def _table(trace: Trace, rows: list[ReplayRow], recall: float | None) -> Table:
    title = (
        f"{trace.n_tokens} tokens x {trace.n_layers} layers x top-{trace.top_k} "
        f"of {trace.n_experts} experts"
        + (f", predictor recall {recall}" if recall is not None else "")
    )
    table = Table(title=title)
    for name in ("capacity", "policy", "misses/token", "hit rate", "x Belady"):
        table.add_column(name, justify="left" if name == "policy" else "right")
    if recall is not None:
        table.add_column("prefetches/token", justify="right")
    for row in rows:
        cells = [
            str(row.capacity),
            row.policy,
            f"{row.misses_per_token:.3f}",
            f"{row.hit_rate:.3f}",
            f"{row.ratio_to_belady:.3f}",
        ]
        if recall is not None:
            cells.append(f"{row.prefetches_per_token:.3f}")
        table.add_row(*cells)
    return table


def _json(trace_path: Path, trace: Trace, cfg: ReplayConfig, rows: list[ReplayRow]) -> str:
    shape = {"tokens": trace.n_tokens, "layers": trace.n_layers, "top_k": trace.top_k}
    return json.dumps(
        {
            "trace": str(trace_path),
            **shape,
            "n_experts": trace.n_experts,
            "predict_recall": cfg.predict_recall,
            "seed": cfg.seed,
            "rows": [
                {
                    "policy": r.policy,
                    "capacity": r.capacity,
                    "misses_per_token": r.misses_per_token,
                    "hit_rate": r.hit_rate,
                    "ratio_to_belady": r.ratio_to_belady,
                    "demand_reads": r.demand_reads,
                    "prefetch_reads": r.prefetch_reads,
                    "layer_hit_rate": list(r.layer_hit_rate),
                }
                for r in rows
            ],
        },
        indent=2,
    )


def replay_command(
    trace: Annotated[
        Path, typer.Argument(help="Routing trace (.npz with an int16 'experts' [T, L, K] array).")
    ],
    capacity: Annotated[
        str, typer.Option("--capacity", "-c", help="Slots per layer, comma-separated.")
    ] = "8,16,24,32",
    policy: Annotated[
        str,
        typer.Option(
            "--policy",
            "-p",
            help="Policies, comma-separated: lru, lfu, decay (flint's default), "
            "belady (offline optimum, the bound).",
        ),
    ] = ",".join(POLICIES),
    predict_recall: Annotated[
        float | None,
        typer.Option(
            "--predict-recall",
            min=0.0,
            max=1.0,
            help="Add prefetches from a simulated next-layer predictor that finds each "
            "true expert with this probability (the rest of its top-k are wrong guesses).",
        ),
    ] = None,
    seed: Annotated[int, typer.Option(min=0, help="Seed of the simulated predictor.")] = 0,
    n_experts: Annotated[
        int | None,
        typer.Option(min=1, help="Experts per layer (default: largest id in the trace + 1)."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """Replay a routing trace through expert-cache policies.

    For each per-layer capacity and policy, prints demand misses per token (expert
    reads the router waited for), hit rate (selections found resident), and misses
    relative to Belady's offline optimum at the same capacity.
    """
    cfg = ReplayConfig(
        capacities=_parse_capacities(capacity),
        policies=_parse_policies(policy),
        predict_recall=predict_recall,
        seed=seed,
    )
    try:
        loaded = load_trace(trace, n_experts)
        rows = run_replay(loaded, cfg)
    except ValueError as err:
        _err.print(f"[red]error:[/red] {err}", soft_wrap=True)
        raise typer.Exit(code=1) from None
    if as_json:
        print(_json(trace, loaded, cfg, rows))
    else:
        _console.print(_table(loaded, rows, predict_recall))
