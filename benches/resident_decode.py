"""Decode and prefill speed with every expert resident (the ceiling streaming aims at).

Usage: python benches/resident_decode.py MODEL [--device cpu|cuda] [--tokens 128]
       [--prompt-tokens 512] [--reps 3] [--threads N] [--expert-kernels auto|dequant]

MODEL is a .ftw file (bf16, int8 or int4 experts) or a checkpoint directory.

Greedy decoding with EOS ignored; every repetition must produce the same tokens as the
first (a control), so a faster run that computes something else is caught.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time

import torch

import flint
from flint.cli.run import expert_kernel


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--device", default=None)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--expert-kernels", default="auto")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    with flint.LLM(args.model, device=args.device, expert_kernels=args.expert_kernels) as llm:
        vocab = llm.model.config.vocab_size
        prompt = torch.randint(
            2, vocab, (args.prompt_tokens,), generator=torch.Generator().manual_seed(0)
        )
        ids = prompt.tolist()
        control: tuple[int, ...] | None = None
        decode, prefill = [], []
        for _ in range(args.reps + 1):  # the first run warms up
            out = llm.generate(ids, max_tokens=args.tokens, temperature=0.0, ignore_eos=True)
            control = control or out.token_ids
            if out.token_ids != control:
                raise SystemExit("output differs from the control run")
            decode.append(out.timings.decode_tok_s)
            prefill.append(out.timings.prefill_tok_s)
        result = {
            "model": args.model,
            "experts": _experts(llm),
            "expert_kernel": expert_kernel(llm),
            "device": str(llm.device),
            "dtype": str(llm.dtype),
            "threads": torch.get_num_threads(),
            f"pp{args.prompt_tokens}_tok_s": _stats(prefill[1:]),
            f"tg{args.tokens}_tok_s": _stats(decode[1:]),
            "date": time.strftime("%Y-%m-%d"),
            "commit": _commit(),
        }
        print(json.dumps(result, indent=2))


def _commit() -> str:
    try:
        cmd = ["git", "rev-parse", "--short", "HEAD"]
        out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    except OSError:
        return "unknown"
    return out.stdout.strip() or "unknown"


def _experts(llm: flint.LLM) -> str:
    layout = getattr(llm.source, "expert_layout", None)
    return "checkpoint" if layout is None else f"{layout.scheme} ({layout.dtype})"


def _stats(values: list[float]) -> dict[str, float]:
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return {"mean": round(statistics.fmean(values), 2), "sd": round(sd, 2)}


if __name__ == "__main__":
    main()
