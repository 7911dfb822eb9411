"""The sampler's draw: ``torch.multinomial`` against ``flint.sampling.draw`` (inverse
cumulative sum), alone on a 4k vocabulary and in a sampled ``generate`` of MODEL,
alternating. Usage, from the repo root:

    python benches/sampler_draw.py MODEL.ftw [--tokens 128] [--rounds 4]
"""

from __future__ import annotations

import argparse
import json
import time

# isort: off
import flint  # before torch: flint sets the OpenMP wait policy torch then keeps
import flint.sampling as sampling
import torch

# isort: on


def _multinomial(probs: torch.Tensor, generator: torch.Generator) -> int:
    return int(torch.multinomial(probs, 1, generator=generator))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    draws = {"multinomial": _multinomial, "draw": sampling.draw}
    probs = torch.softmax(torch.randn(4096, generator=torch.Generator().manual_seed(0)), -1)
    alone = {}
    for name, fn in draws.items():
        gen = torch.Generator().manual_seed(0)
        t0 = time.perf_counter()
        for _ in range(3000):
            fn(probs, gen)
        alone[name] = round((time.perf_counter() - t0) / 3000 * 1e6, 1)
    decode: dict[str, list[float]] = {name: [] for name in draws}
    with flint.LLM(args.model, device="cpu", context_length=args.tokens + 16) as llm:
        for _ in range(args.rounds):
            for name, fn in draws.items():
                sampling.draw = fn  # what Sampler calls
                out = llm.generate(
                    [5, 17, 250, 3, 99], max_tokens=args.tokens, ignore_eos=True,
                    temperature=0.8, seed=1,
                )  # fmt: skip
                assert out.timings is not None
                decode[name].append(round(out.timings.decode_tok_s, 1))
    sampling.draw = draws["draw"]
    print(json.dumps({"draw_us_4k_vocab": alone, "sampled_decode_tok_s": decode}))


if __name__ == "__main__":
    main()
