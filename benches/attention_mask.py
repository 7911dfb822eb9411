"""A prompt chunk's attention with the explicit boolean causal mask flint passes today
against torch's lower-right causal bias (the same mask, which lets SDPA pick its flash
kernels): ms per call and the largest difference between the two.

Usage: python benches/attention_mask.py [--device cpu|cuda] [--heads 16] [--kv-heads 4]
       [--dim 64] [--shapes 512x512,512x1024] [--threads 2] [--reps 10]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right


def time_ms(fn: Callable[[], object], dev: torch.device, reps: int) -> float:
    """Mean ms per call of ``fn`` over ``reps`` calls after one warm-up."""
    fn()
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    return (time.perf_counter() - t0) * 1000 / reps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--shapes", default="512x512,512x1024")  # queries x keys
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=10)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    dev = torch.device(a.device)
    dtype = torch.float32 if dev.type == "cpu" else torch.bfloat16
    print("| queries x keys | explicit mask ms | lower-right bias ms | max difference |")
    print("|---|---|---|---|")
    for shape in a.shapes.split(","):
        t, s = (int(v) for v in shape.split("x"))
        q = torch.randn(1, a.heads, t, a.dim, device=dev, dtype=dtype)
        k, v = (torch.randn(1, a.kv_heads, s, a.dim, device=dev, dtype=dtype) for _ in range(2))
        mask = torch.arange(s, device=dev)[None, :] <= torch.arange(s - t, s, device=dev)[:, None]
        calls = {
            "mask": partial(
                F.scaled_dot_product_attention, q, k, v, attn_mask=mask, enable_gqa=True
            ),
            "bias": partial(
                F.scaled_dot_product_attention, q, k, v, attn_mask=causal_lower_right(t, s),
                enable_gqa=True,
            ),
        }  # fmt: skip
        ms = {name: time_ms(fn, dev, a.reps) for name, fn in calls.items()}
        diff = (calls["mask"]() - calls["bias"]()).abs().max().item()
        print(f"| {t} x {s} | {ms['mask']:.2f} | {ms['bias']:.2f} | {diff:.3g} |")


if __name__ == "__main__":
    main()
