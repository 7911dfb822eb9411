"""Convert throughput against a plain file copy of the same checkpoint, same machine, same run.

    python benches/convert_throughput.py [--gib 1.5] [--reps 3] [--dir /tmp/flint-bench]

Builds a synthetic bf16 Qwen3-MoE checkpoint (sharded safetensors) of about --gib GiB,
then alternates `cp` of its shards and `flint convert` (--quant none and bf16), each in
a fresh process, page cache warm for both (the source is read from cache, the output
is written and fsynced). Prints MB/s of source bytes, the ratio to copy speed and the
converter's peak RSS.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import save_file


def make_checkpoint(root: Path, gib: float) -> int:
    h, inter, n_exp = 1024, 512, 64
    per_layer = n_exp * 3 * h * inter * 2
    layers = max(1, round(gib * 2**30 / per_layer))
    cfg = {
        "model_type": "qwen3_moe",
        "architectures": ["Qwen3MoeForCausalLM"],
        "hidden_size": h,
        "moe_intermediate_size": inter,
        "intermediate_size": 2048,
        "num_hidden_layers": layers,
        "num_experts": n_exp,
        "num_experts_per_tok": 8,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": 128,
        "vocab_size": 8192,
    }
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps(cfg))
    g = torch.Generator().manual_seed(0)
    weight_map = {}
    total = 0
    for layer in range(layers):
        shard: dict[str, torch.Tensor] = {}
        p = f"model.layers.{layer}."
        shard[p + "mlp.gate.weight"] = torch.randn(n_exp, h, generator=g).bfloat16()
        for e in range(n_exp):
            for n, s in (
                ("gate_proj", (inter, h)),
                ("up_proj", (inter, h)),
                ("down_proj", (h, inter)),
            ):
                shard[f"{p}mlp.experts.{e}.{n}.weight"] = torch.randn(*s, generator=g).bfloat16()
        if layer == 0:
            shard["model.embed_tokens.weight"] = torch.randn(8192, h, generator=g).bfloat16()
        name = f"model-{layer:05d}.safetensors"
        save_file(shard, root / name)
        weight_map.update(dict.fromkeys(shard, name))
        total += sum(t.numel() * 2 for t in shard.values())
    (root / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return total


def timed(cmd: list[str]) -> tuple[float, int]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    dt = time.perf_counter() - t0
    return dt, max(before, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=float, default=1.5)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--dir", type=Path, default=Path("/tmp/flint-bench"))
    a = ap.parse_args()
    src = a.dir / "ckpt"
    total = (
        make_checkpoint(src, a.gib)
        if not (src / "config.json").exists()
        else sum(f.stat().st_size for f in src.glob("*.safetensors"))
    )
    out = a.dir / "out"
    out.mkdir(exist_ok=True)
    copy_cmd = ["sh", "-c", f"cp {src}/*.safetensors {out}/ && sync {out}/*.safetensors"]
    runs: dict[str, list[float]] = {"copy": [], "none": [], "bf16": []}
    rss = 0
    for _ in range(a.reps):
        runs["copy"].append(timed(copy_cmd)[0])
        shutil.rmtree(out)
        out.mkdir()
        for q in ("none", "bf16"):
            dt, r = timed(
                [
                    sys.executable,
                    "-m",
                    "flint",
                    "convert",
                    str(src),
                    "-o",
                    str(out / f"{q}.ftw"),
                    "--quant",
                    q,
                ]
            )
            runs[q].append(dt)
            rss = max(rss, r)
            (out / f"{q}.ftw").unlink()
    mb = total / 1e6
    copy = statistics.mean(runs["copy"])
    print(f"source: {mb:.0f} MB bf16, {a.reps} interleaved reps")
    for k, v in runs.items():
        speed = [mb / x for x in v]
        ratio = "" if k == "copy" else f"  {copy / statistics.mean(v):.0%} of copy speed"
        print(f"{k:>5}: {statistics.mean(speed):7.0f} ± {statistics.stdev(speed):.0f} MB/s{ratio}")
    print(f"convert peak RSS: {rss / 1024:.0f} MiB (includes torch import)")


if __name__ == "__main__":
    main()
