"""Scenario T1: expert-cache policy replay on the held-out tiny-code-moe trace.

Prints the markdown table for docs/benchmarks.md and writes the plot of hit rate vs
capacity. Needs matplotlib (`pip install matplotlib`). Run from the repository root:

    python benches/cache_replay.py [--trace PATH] [--out docs/img/cache-replay-hit-rate.png]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt

from flint.cache import POLICIES, ReplayConfig, ReplayRow, load_trace, run_replay

CAPACITIES = (8, 16, 24, 32)
DEFAULT_TRACE = Path("../shared/traces/tiny-code-moe-heldout.npz")
DEFAULT_OUT = Path("docs/img/cache-replay-hit-rate.png")


def markdown(rows: list[ReplayRow]) -> str:
    lines = [
        "| capacity / layer | policy | misses / token | hit rate | misses x Belady |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.capacity} | {r.policy} | {r.misses_per_token:.2f} | {r.hit_rate:.3f} "
            f"| {r.ratio_to_belady:.3f} |"
        )
    return "\n".join(lines)


def plot(rows: list[ReplayRow], out: Path, title: str) -> None:
    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=120)
    for policy in POLICIES:
        mine = [r for r in rows if r.policy == policy]
        ax.plot([r.capacity for r in mine], [r.hit_rate for r in mine], marker="o", label=policy)
    ax.set_xlabel("cache capacity (experts per layer, of 64)")
    ax.set_ylabel("hit rate (selections found resident)")
    ax.set_xticks(list(CAPACITIES))
    ax.set_ylim(0.0, 1.0)
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    trace = load_trace(args.trace)
    rows = run_replay(trace, ReplayConfig(capacities=CAPACITIES, policies=POLICIES))
    print(markdown(rows))
    shape = f"{trace.n_tokens} tokens, {trace.n_layers} layers, top-{trace.top_k}"
    title = f"{args.trace.name}: {shape}"
    plot(rows, args.out, title)
    print(f"\nplot: {args.out}")


if __name__ == "__main__":
    main()
