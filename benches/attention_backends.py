"""A prompt's attention by SDPA backend: ms per call, TFLOP/s and the largest difference
from the flash kernel, for causal self-attention over a fresh prompt (queries = keys)
with grouped-query heads (``enable_gqa``), given as ``is_causal`` and as torch's
lower-right causal bias (what ``flint.models.attention.causal_mask`` passes on CUDA).

Usage: python benches/attention_backends.py [--heads 32] [--kv-heads 4] [--dim 128]
       [--tokens 2048,8192] [--backends flash,cudnn,efficient] [--reps 10]
"""

from __future__ import annotations

import argparse
from functools import partial

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right

from prompt_expert_paths import median_ms  # (benches/ is the script's path)

BACKENDS = {
    "flash": SDPBackend.FLASH_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--tokens", default="2048,8192")
    ap.add_argument("--backends", default="flash,cudnn,efficient")
    ap.add_argument("--reps", type=int, default=10)
    a = ap.parse_args()
    dev = torch.device("cuda")
    print("| tokens | backend | causal as | ms / call | TFLOP/s | max diff from flash |")
    print("|---|---|---|---|---|---|")
    for t in (int(v) for v in a.tokens.split(",")):
        q = torch.randn(1, a.heads, t, a.dim, device=dev, dtype=torch.bfloat16)
        k, v = (
            torch.randn(1, a.kv_heads, t, a.dim, device=dev, dtype=torch.bfloat16) for _ in "kv"
        )
        flop = 4 * a.heads * a.dim * t * t / 2  # causal: half the score matrix
        ref = None
        for name in a.backends.split(","):
            ways = (("is_causal", {"is_causal": True}),
                    ("lower-right bias", {"attn_mask": causal_lower_right(t, t)}))  # fmt: skip
            for how, kw in ways:
                call = partial(F.scaled_dot_product_attention, q, k, v, enable_gqa=True, **kw)
                try:
                    with sdpa_kernel([BACKENDS[name]]):
                        out = call()
                        ms = median_ms(call, reps=a.reps, warm=2)
                except RuntimeError as err:
                    print(f"| {t} | {name} | {how} | {type(err).__name__}: "
                          f"{str(err).splitlines()[0][:80]} | | |")  # fmt: skip
                    continue
                ref = out if ref is None else ref
                diff = (out.float() - ref.float()).abs().max().item()
                print(f"| {t} | {name} | {how} | {ms:.3f} | {flop / ms / 1e9:.0f} | {diff:.3g} |")


if __name__ == "__main__":
    main()
