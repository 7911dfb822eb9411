"""Open + validate + load-dense time of .ftw files.

    python benches/open_load.py FILE [FILE ...] [--reps 5]

For each file, in fresh interpreter state per repetition: FtwFile(path) (header, footer,
indexes, metadata parsed and validated; 16 expert checksums sampled), then every dense
tensor read into torch tensors with its checksum verified. Page cache warm (the first
repetition is reported separately as the cold-ish run).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from flint.format import FtwFile


def once(path: Path) -> tuple[float, float, int]:
    t0 = time.perf_counter()
    f = FtwFile(path)
    t1 = time.perf_counter()
    n = 0
    for name in f.tensors:
        n += f.tensor(name).nbytes
    t2 = time.perf_counter()
    f.close()
    return t1 - t0, t2 - t1, n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    for p in a.files:
        first = once(p)
        runs = [once(p) for _ in range(a.reps)]
        opens = [r[0] * 1e3 for r in runs]
        loads = [r[1] * 1e3 for r in runs]
        gb = first[2] / 1e9
        print(
            f"{p.name}: {p.stat().st_size / 1e9:.2f} GB file, {gb:.3f} GB dense | first run: "
            f"open {first[0] * 1e3:.1f} ms, load {first[1] * 1e3:.1f} ms | warm: open "
            f"{statistics.mean(opens):.1f} ± {statistics.stdev(opens):.1f} ms, load dense "
            f"{statistics.mean(loads):.1f} ± {statistics.stdev(loads):.1f} ms "
            f"({gb / (statistics.mean(loads) / 1e3):.2f} GB/s)"
        )


if __name__ == "__main__":
    main()
