"""Layer-major prefill against batch-by-batch prefill: expert reads per prompt.

    python benches/prefill_bench.py MODEL.ftw [--tokens 512,2048,8192] [--batch 16]
        [--cache-share 0.25] [--lookahead 2] [-o results.json]

For each prompt length, the same prompt (Python source from the standard library,
tokenized by the model's tokenizer) is prefilled into a fresh streamed model with a
cold RAM cache (no usage table, no idle fill) of ``--cache-share`` of each layer's
experts, two ways, interleaved:

- ``layer-major``: one forward for the whole prompt (``flint.models.prefill``);
- ``batch N``: forwards of N tokens one after another (what a batch-by-batch prefill
  does; each batch is itself layer-major over its N tokens).

Reported: distinct (layer, expert) pairs the prompt selects, expert reads started
(demand reads + prefetches that got a slot), reads per distinct expert, bytes read,
wall time. The last position's greedy token of each run is printed: both ways must
agree (a control that the faster path computes the same thing).
"""

from __future__ import annotations

import argparse
import json
import sysconfig
import time
from pathlib import Path
from typing import Any

import torch

import flint
from flint.models import parse_config
from flint.models.ftw_source import FtwSource
from flint.models.moe import MoEBlock
from flint.models.prefill import prefill
from flint.stream import streamed_backend


def prompt_text(chars: int) -> str:
    """Python source from the standard library, ``chars`` characters of it."""
    root = Path(sysconfig.get_paths()["stdlib"])
    out: list[str] = []
    n = 0
    for path in sorted(root.glob("*.py")):
        text = path.read_text(errors="replace")
        out.append(text)
        n += len(text)
        if n >= chars:
            break
    return "".join(out)[:chars]


def _record_routing(model: Any, seen: dict[int, set[int]]) -> None:
    """Wraps each MoE layer's backend to collect the experts the prompt selects."""
    for layer in model.layers:
        if isinstance(layer.mlp, MoEBlock):
            inner = layer.mlp.backend

            def call(i: int, x: Any, ids: Any, w: Any, inner: Any = inner) -> Any:
                seen.setdefault(i, set()).update(ids.reshape(-1).tolist())
                return inner(i, x, ids, w)

            layer.mlp.backend = call


def run(path: Path, ids: list[int], batch: int | None, args: argparse.Namespace) -> dict[str, Any]:
    source = FtwSource(path)
    lay = source.expert_layout
    assert lay is not None
    config = parse_config(source.config)
    streamed = sum(config.sparse_layers)
    budget = args.cache_share * lay.n_experts * lay.slab_bytes * streamed / 2**30
    backend = streamed_backend(
        source,
        config,
        torch.device("cpu"),
        torch.float32,
        budget,
        lookahead=args.lookahead,
        usage=False,
        notice=lambda line: None,
    )
    llm = flint.LLM(source, device="cpu", context_length=len(ids) + 1, expert_backend=backend)
    seen: dict[int, set[int]] = {}
    _record_routing(llm.model, seen)
    tensor = torch.tensor(ids)
    t0 = time.perf_counter()
    with torch.inference_mode():
        if batch is None:
            logits = prefill(llm.model, tensor, budget=1 << 62)
        else:
            for s in range(0, len(ids), batch):
                logits = llm.model.forward(tensor[s : s + batch])[-1]
    elapsed = time.perf_counter() - t0
    backend.engine.wait_idle(30.0)
    st = backend.stats()
    llm.close()
    distinct = sum(len(v) for v in seen.values())
    reads = st["demands"] + st["bound"]
    return {
        "mode": "layer-major" if batch is None else f"batch {batch}",
        "tokens": len(ids),
        "slots_per_layer": st["slots_per_layer"],
        "n_experts": st["n_experts"],
        "streamed_layers": streamed,
        "distinct": distinct,
        "reads": reads,
        "demand_reads": st["demands"],
        "prefetch_reads": st["bound"],
        "reads_per_distinct": reads / distinct,
        "bytes_read": st["bytes_demand"] + st["bytes_prefetch"],
        "waves": st["prompt_waves"],
        "seconds": elapsed,
        "greedy": int(torch.argmax(logits)),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--tokens", default="512,2048,8192")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--cache-share", type=float, default=0.25)
    ap.add_argument("--lookahead", type=int, default=2)
    ap.add_argument("-o", "--output", type=Path)
    args = ap.parse_args()
    lengths = [int(t) for t in args.tokens.split(",")]
    with flint.LLM(args.model, device="cpu", context_length=8) as probe:
        text_ids = probe.tokenizer.encode(prompt_text(max(lengths) * 8))
    rows = []
    print(
        "| tokens | mode | distinct experts | reads | reads / distinct | GiB read | waves | s "
        "| greedy |\n|---|---|---|---|---|---|---|---|---|"
    )
    for n in lengths:
        if len(text_ids) < n:
            raise SystemExit(f"only {len(text_ids)} prompt tokens available, {n} asked")
        ids = text_ids[:n]
        for batch in (None, args.batch):
            r = run(args.model, ids, batch, args)
            rows.append(r)
            print(
                f"| {n} | {r['mode']} | {r['distinct']} | {r['reads']} "
                f"| {r['reads_per_distinct']:.3f} | {r['bytes_read'] / 2**30:.3f} "
                f"| {r['waves']} | {r['seconds']:.1f} | {r['greedy']} |",
                flush=True,
            )
    if args.output:
        args.output.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
