"""Decode-step logits of a model on a text, teacher-forced one token at a time (the
decode path, not the prompt's), and their distance to a reference's.

Usage: python benches/decode_logits.py FILE --text TEXT [--tokens 512] -o OUT.pt
       python benches/decode_logits.py --compare REF.pt A.pt [B.pt ...]

The first form runs FILE on the CPU (the environment picks the kernels, e.g.
``FLINT_CPU_INT8=vnni|f32``) and saves its logits; the second prints, for each file
against REF, the mean KL(REF || file) in nats per token and the share of positions
whose argmax agrees (docs/benchmarks.md, "Nineteenth session": the VNNI kernels'
quality on tiny-code-moe).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.nn.functional as F

import flint


def logits(path: str, text: str, tokens: int) -> tuple[list[int], torch.Tensor, str]:
    """(token ids, logits [N, V] fp32, the expert kernels' name)."""
    with flint.LLM(path, device="cpu", context_length=tokens + 8) as llm:
        ids = llm.tokenizer.encode(text)[:tokens]
        model = llm.model
        model.reset()
        rows = []
        with torch.inference_mode():
            for t in ids:
                rows.append(model.forward(torch.tensor([t]))[-1].float().clone())
        return ids, torch.stack(rows), str(model.expert_kernel)


def compare(ref_path: str, paths: list[str]) -> None:
    ref = torch.load(ref_path)
    p = F.log_softmax(ref["logits"], -1)
    for path in paths:
        got = torch.load(path)
        assert got["ids"] == ref["ids"], f"{path}: another token sequence"
        q = F.log_softmax(got["logits"], -1)
        kl = (p.exp() * (p - q)).sum(-1).mean().item()
        top1 = (p.argmax(-1) == q.argmax(-1)).float().mean().item()
        row = {"file": path, "kernels": got["kernels"], "kl": round(kl, 6), "top1": round(top1, 4)}
        print(json.dumps(row))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?")
    parser.add_argument("--text", type=Path)
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("-o", "--out")
    parser.add_argument("--compare", nargs="+", metavar="PT")
    args = parser.parse_args()
    if args.compare:
        compare(args.compare[0], args.compare[1:])
        return
    if not (args.model and args.text and args.out):
        parser.error("MODEL, --text and -o are needed (or --compare)")
    ids, out, kernels = logits(args.model, args.text.read_text(), args.tokens)
    torch.save({"ids": ids, "logits": out, "kernels": kernels}, args.out)
    print(json.dumps({"file": args.out, "tokens": len(ids), "kernels": kernels}))


if __name__ == "__main__":
    main()
