"""Time of one MoE layer's routed experts for a prompt of T tokens, resident on the
CPU: the fused call (``expert_kernels="fused"``) against torch's per-expert path, and
the whole prefill of the same prompt length for context.

Usage: python benches/prompt_layer_call.py MODEL.ftw [--threads 2] [--tokens 512] [--calls 20]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

import flint
from flint.models.moe import MoEBlock, route


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--modes", default="torch,fused")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    results = {}
    outs = {}
    for mode in args.modes.split(","):
        with flint.LLM(args.model, device="cpu", expert_kernels=mode) as llm:
            cfg = llm.model.config
            block = next(b.mlp for b in llm.model.layers if isinstance(b.mlp, MoEBlock))
            g = torch.Generator().manual_seed(0)
            x = torch.randn(args.tokens, cfg.hidden_size, generator=g)
            ids, w = route(x, block.router, cfg)
            outs[mode] = block.backend(block.layer, x, ids, w)
            times = []
            for _ in range(args.calls):
                t0 = time.perf_counter()
                block.backend(block.layer, x, ids, w)
                times.append(time.perf_counter() - t0)
            results[mode] = statistics.median(times) * 1e3
    out = {"model": args.model, "threads": args.threads, "tokens": args.tokens}
    out.update({f"ms_per_layer_{m}": round(v, 3) for m, v in results.items()})
    if "torch" in outs and "fused" in outs:
        ref = outs["torch"].float()
        out["rel_diff"] = ((outs["fused"].float() - ref).abs().max() / ref.abs().max()).item()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
