"""Plots V1's decode speed against the VRAM budget and S1's against the RAM budget
(issue 9) from measured points (benches/data/v1_s1_budgets.json, each from one `flint
bench` run on the GPU box; the file says which). Needs matplotlib. From the repo root:

    python benches/plot_budgets.py [--data benches/data/v1_s1_budgets.json]
        [--out docs/img/v1-s1-budgets.png]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=Path("benches/data/v1_s1_budgets.json"))
    parser.add_argument("--out", type=Path, default=Path("docs/img/v1-s1-budgets.png"))
    args = parser.parse_args()
    data = json.loads(args.data.read_text())
    fig, (v1, s1) = plt.subplots(1, 2, figsize=(9, 3.6), sharey=True)
    for ax, key, x_key, label, fixed in (
        (v1, "v1", "vram_gib", "VRAM budget (GiB)", f"RAM {data['v1']['ram_gib']} GiB"),
        (s1, "s1", "ram_gib", "RAM budget (GiB)", f"VRAM {data['s1']['vram_gib']} GiB"),
    ):
        points = sorted(data[key]["points"], key=lambda p: p[x_key])
        ax.plot([p[x_key] for p in points], [p["tok_s"] for p in points], "o-")
        for p in points:
            ax.annotate(f"{p['tok_s']:.2f}", (p[x_key], p["tok_s"]), textcoords="offset points",
                        xytext=(0, 6), ha="center", fontsize=8)  # fmt: skip
        ax.set_title(f"{key.upper()}: decode vs {label.split()[0]} budget ({fixed})", fontsize=10)
        ax.set_xlabel(label)
        ax.grid(alpha=0.3)
    v1.set_ylabel("tok/s (tg, random ids)")
    v1.set_ylim(bottom=0)
    fig.suptitle(
        "30B-A3B geometry, int4, H200 (boxes: see the data file), streamed CUDA graph step",
        fontsize=10,
    )
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=120)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
