"""Decode and prefill speed with every expert resident (the ceiling streaming aims at).

Usage: python benches/resident_decode.py MODEL [MODEL ...] [--device cpu|cuda] [--tokens 128]
       [--prompt-tokens 512] [--reps 3] [--threads N] [--expert-kernels auto|torch|dequant|fused]

``--expert-kernels`` takes a comma-separated list (e.g. ``torch,fused``; ``auto`` is
``fused`` on the CPU since the fused kernels became its default, ``torch`` on CUDA):
every model runs once per mode, all interleaved.

MODEL is a .ftw file (bf16, int8 or int4 experts) or a checkpoint directory. Several
models are measured interleaved (model A, B, C, then A, B, C again, ...), so a change in
the machine's load hits them alike.

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
from flint.generation import Timings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+", metavar="MODEL")
    parser.add_argument("--device", default=None)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--expert-kernels", default="auto")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    runs_of = [(m, k) for m in args.models for k in args.expert_kernels.split(",")]
    llms = [flint.LLM(m, device=args.device, expert_kernels=k) for m, k in runs_of]
    vocab = min(llm.model.config.vocab_size for llm in llms)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(2, vocab, (args.prompt_tokens,), generator=gen).tolist()
    runs: list[list[Timings]] = [[] for _ in llms]
    controls: list[tuple[int, ...] | None] = [None for _ in llms]
    for rep in range(args.reps + 1):  # rep 0 warms up; models interleave within a rep
        for i, llm in enumerate(llms):
            out = llm.generate(ids, max_tokens=args.tokens, temperature=0.0, ignore_eos=True)
            controls[i] = controls[i] or out.token_ids
            if out.token_ids != controls[i]:
                raise SystemExit(f"{runs_of[i]}: output differs from its control run")
            if rep > 0:
                runs[i].append(out.timings)
    for (model, _), llm, timings in zip(runs_of, llms, runs, strict=True):
        print(json.dumps(_result(args, model, llm, timings), indent=2))
        llm.close()


def _result(
    args: argparse.Namespace, model: str, llm: flint.LLM, timings: list[Timings]
) -> dict[str, object]:
    return {
        "model": model,
        "experts": _experts(llm),
        "expert_kernel": expert_kernel(llm),
        "device": str(llm.device),
        "dtype": str(llm.dtype),
        "threads": torch.get_num_threads(),
        f"pp{args.prompt_tokens}_tok_s": _stats([t.prefill_tok_s for t in timings]),
        f"tg{args.tokens}_tok_s": _stats([t.decode_tok_s for t in timings]),
        "date": time.strftime("%Y-%m-%d"),
        "commit": _commit(),
    }


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
    return {
        "mean": round(statistics.fmean(values), 2),
        "sd": round(sd, 2),
        "median": round(statistics.median(values), 2),
    }


if __name__ == "__main__":
    main()
