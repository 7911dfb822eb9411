"""Convert throughput against a plain file copy of the same checkpoint, same machine, same run.

    python benches/convert_throughput.py [--gib 1.5] [--reps 3] [--dir /tmp/flint-bench]

Builds a synthetic bf16 Qwen3-MoE checkpoint (sharded safetensors) of about --gib GiB,
then alternates, in this process, a plain copy of its shards (shutil.copyfile + fsync)
and flint's converter (--quant none and bf16, which also hashes every source file),
page cache warm for both reads; every output is fsynced; one warm-up conversion first,
the order rotated each repetition. Prints MB/s of source bytes and the ratio to copy
speed; then runs `flint convert` once as a fresh process to
report the end-to-end time (torch import included) and its peak RSS.
"""

from __future__ import annotations

import argparse
import json
import os
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


def copy_all(src: Path, out: Path) -> float:
    t0 = time.perf_counter()
    for f in sorted(src.glob("*.safetensors")):
        dst = out / f.name
        shutil.copyfile(f, dst)
        with dst.open("rb+") as h:
            os.fsync(h.fileno())
    return time.perf_counter() - t0


def convert_once(src: Path, out: Path, quant: str) -> float:
    from flint.convert import ConvertOptions, convert

    t0 = time.perf_counter()
    convert(str(src), out, ConvertOptions(quant=quant))
    return time.perf_counter() - t0


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
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    runs: dict[str, list[float]] = {"copy": [], "none": [], "bf16": []}

    def one(kind: str) -> float:
        dt = copy_all(src, out) if kind == "copy" else convert_once(src, out / "x.ftw", kind)
        for f in out.glob("*"):
            f.unlink()
        return dt

    one("bf16")  # warm-up: source pages cached, code paths loaded
    kinds = list(runs)
    for rep in range(a.reps):
        # Rotate the order each repetition so no kind always follows the same one.
        for kind in kinds[rep % 3 :] + kinds[: rep % 3]:
            runs[kind].append(one(kind))
    mb = total / 1e6
    copy = statistics.mean(runs["copy"])
    print(f"source: {mb:.0f} MB bf16, {a.reps} interleaved reps, in-process")
    for k, v in runs.items():
        speed = [mb / x for x in v]
        ratio = "" if k == "copy" else f"  {copy / statistics.mean(v):.0%} of copy speed"
        sd = statistics.stdev(speed) if len(speed) > 1 else 0.0
        print(f"{k:>5}: {statistics.mean(speed):7.0f} ± {sd:.0f} MB/s{ratio}")
    cmd = [sys.executable, "-m", "flint", "convert", str(src), "-o", str(out / "cli.ftw")]
    dt, rss = timed(cmd)
    (out / "cli.ftw").unlink()
    print(f"flint convert as a new process: {dt:.1f} s, peak RSS {rss / 1024:.0f} MiB")


if __name__ == "__main__":
    main()
