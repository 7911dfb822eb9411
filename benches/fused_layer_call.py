"""Time of one MoE layer's routed experts at one token, tiny-code-moe resident on the
CPU: the fused call (``expert_kernels="fused"``) against torch's per-expert path.

Usage: python benches/fused_layer_call.py MODEL.ftw [--threads 1] [--calls 2000]
"""

from __future__ import annotations

import argparse
import json
import time

import torch

import flint
from flint.models.moe import MoEBlock, route


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    results = {}
    outs = {}
    for mode in ("torch", "fused"):
        with flint.LLM(args.model, device="cpu", expert_kernels=mode) as llm:
            block = next(b.mlp for b in llm.model.layers if isinstance(b.mlp, MoEBlock))
            x = torch.randn(
                1, llm.model.config.hidden_size, generator=torch.Generator().manual_seed(0)
            )
            ids, w = route(x, block.router, llm.model.config)
            outs[mode] = block.backend(block.layer, x, ids, w)
            t0 = time.perf_counter()
            for _ in range(args.calls):
                block.backend(block.layer, x, ids, w)
            results[mode] = (time.perf_counter() - t0) / args.calls * 1e6
    err = (outs["fused"] - outs["torch"]).abs().max().item() / outs["torch"].abs().max().item()
    print(json.dumps({"model": args.model, "threads": args.threads,
                      "us_per_layer_torch": round(results["torch"], 1),
                      "us_per_layer_fused": round(results["fused"], 1),
                      "rel_diff": err, "date": time.strftime("%Y-%m-%d")}))  # fmt: skip


if __name__ == "__main__":
    main()
