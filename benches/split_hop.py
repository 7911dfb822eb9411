"""The cost of one boundary hop of a layer split across two GPUs: the hidden state of a
decode step ([1, H]) or a prompt ([T, H]) copied from one GPU to the next, timed with
CUDA events on the receiving stream (what a forward pays per boundary per call).

    python benches/split_hop.py --hidden 2048 --tokens 1,512 --reps 1000
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def hop_us(hidden: int, tokens: int, reps: int) -> tuple[float, float]:
    """Median and p90 microseconds of x [tokens, hidden] bf16 cuda:0 -> cuda:1, each
    copy followed by a use on cuda:1 and a synchronisation (the forward's pattern)."""
    a, b = torch.device("cuda", 0), torch.device("cuda", 1)
    x = torch.randn(tokens, hidden, dtype=torch.bfloat16, device=a)
    w = torch.randn(hidden, hidden, dtype=torch.bfloat16, device=b)
    times = []
    for i in range(reps + 50):
        torch.cuda.synchronize(a)
        torch.cuda.synchronize(b)
        t0 = time.perf_counter()
        y = x.to(b)
        torch.cuda.synchronize(b)
        t1 = time.perf_counter()
        if i >= 50:  # warm-up
            times.append(1e6 * (t1 - t0))
        _ = y @ w  # the next layer's first use
    times.sort()
    return statistics.median(times), times[int(0.9 * len(times))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--tokens", default="1,512")
    ap.add_argument("--reps", type=int, default=1000)
    args = ap.parse_args()
    if torch.cuda.device_count() < 2:
        raise SystemExit("needs 2 GPUs")
    print(f"{torch.cuda.get_device_name(0)} x{torch.cuda.device_count()}, hidden {args.hidden}")
    for t in (int(v) for v in args.tokens.split(",")):
        med, p90 = hop_us(args.hidden, t, args.reps)
        mib = t * args.hidden * 2 / 2**20
        print(
            f"hop [{t}, {args.hidden}] bf16 ({mib:.3f} MiB): median {med:.1f} us, p90 {p90:.1f} us"
        )


if __name__ == "__main__":
    main()
