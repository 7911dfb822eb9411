"""A prompt's forward with its attention in chunks of 512 queries against one call per
layer (``DecoderLayer._whole``), alternating, resident. On CUDA the one call is what
``attention.whole_prompt_attention`` chooses; on the CPU the rule says chunks, and this
script lets the one call run there to compare (torch's flash SDPA runs on the CPU with a
bool mask). Usage, from the repo root:

    python benches/whole_attention.py MODEL.ftw [--tokens 2048] [--device cpu]
        [--threads 2] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import time

import torch

import flint
from flint.models import transformer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rule = transformer.whole_prompt_attention
    ids = torch.randint(5, 300, (args.tokens,), generator=torch.Generator().manual_seed(0))
    rates: dict[str, list[float]] = {"chunks": [], "one call": []}
    with flint.LLM(args.model, device=args.device, context_length=args.tokens + 8) as llm:
        model = llm.model
        for _ in range(args.rounds):
            for name, whole in (("chunks", False), ("one call", True)):
                transformer.whole_prompt_attention = (  # type: ignore[assignment]
                    lambda c, t, s, k, d, dt, w=whole: w and t > k
                )
                model.reset()
                model.forward(ids[:64])  # warm the kernels of this shape family
                model.reset()
                if llm.device.type == "cuda":
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                model.forward(ids)
                if llm.device.type == "cuda":
                    torch.cuda.synchronize()
                rates[name].append(round(args.tokens / (time.perf_counter() - t0), 1))
    transformer.whole_prompt_attention = rule
    print(json.dumps({"tokens": args.tokens, "device": args.device, "tok_s": rates}))


if __name__ == "__main__":
    main()
