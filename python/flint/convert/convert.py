"""``flint convert``: a Hugging Face MoE checkpoint -> one .ftw file, streaming tensor
by tensor (peak memory is about one tensor plus the writer's buffer)."""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from flint._version import __version__
from flint.convert import ling
from flint.convert.experts import ExpertMap, check_arch, map_experts
from flint.convert.source import Checkpoint, resolve_source
from flint.format.constants import (
    DEFAULT_INT4_GROUP,
    DENSE_QUANTS,
    DTYPE_NAMES,
    EXPERT_QUANTS,
)
from flint.format.quant import dense_quantized, encode_projection, quantize_int8
from flint.format.writer import FtwFileWriter

Progress = Callable[[int], None]  # called with bytes of source consumed


@dataclass(slots=True, frozen=True)
class ConvertOptions:
    quant: str = "none"
    dense_quant: str = "none"
    group_size: int = DEFAULT_INT4_GROUP

    def validate(self) -> None:
        if self.quant not in EXPERT_QUANTS:
            raise ValueError(
                f"--quant must be one of {', '.join(EXPERT_QUANTS)}, not {self.quant!r}"
            )
        if self.dense_quant not in DENSE_QUANTS:
            raise ValueError(f"--dense-quant must be one of {', '.join(DENSE_QUANTS)}")
        if self.group_size < 2 or self.group_size % 2:
            raise ValueError(f"--group-size must be an even number >= 2, not {self.group_size}")


def _sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _dense_quantized(name: str, t: torch.Tensor, dense_quant: str) -> bool:
    return t.ndim == 2 and dense_quantized(name, dense_quant)


def _write_dense(
    ck: Checkpoint, w: FtwFileWriter, skip: set[str], opts: ConvertOptions, progress: Progress
) -> list[str]:
    quantized = []
    for name in ck.names():
        if name in skip:
            continue
        t = ck.get(name)
        if _dense_quantized(name, t, opts.dense_quant):
            q, scale = quantize_int8(t)
            w.add_tensor(name, q)
            w.add_tensor(name + "_scale", scale)
            quantized.append(name)
        else:
            w.add_tensor(name, t)
        progress(ck.nbytes(name))
    return quantized


def _expert_scheme(
    em: ExpertMap, ck: Checkpoint, opts: ConvertOptions
) -> tuple[str, str, list[torch.Tensor]]:
    first = em.load(ck, em.layers()[0], 0)
    src = DTYPE_NAMES.get(first[0].dtype)
    if src not in ("f32", "f16", "bf16"):
        raise ValueError(
            f"expert weights are {first[0].dtype}; flint converts f32/f16/bf16 sources"
        )
    if opts.quant == "none":
        return "raw", src, first
    if opts.quant == "bf16":
        return "raw", "bf16", first
    return opts.quant, "i8" if opts.quant == "int8" else "u8", first


def _encode(p: torch.Tensor, scheme: str, dtype: str, group: int) -> torch.Tensor:
    if scheme == "raw":
        return p if dtype != "bf16" or p.dtype == torch.bfloat16 else p.to(torch.bfloat16)
    return encode_projection(p, scheme, group)


def _write_experts(
    ck: Checkpoint, em: ExpertMap, w: FtwFileWriter, opts: ConvertOptions, progress: Progress
) -> dict[str, Any]:
    scheme, dtype, first = _expert_scheme(em, ck, opts)
    shapes = tuple((int(p.shape[0]), int(p.shape[1])) for p in first)
    group = opts.group_size if scheme == "int4" else 0
    w.begin_experts(em.n_layers, em.n_experts, scheme, dtype, group, shapes)  # type: ignore[arg-type]
    for layer in em.layers():
        for e in range(em.n_experts):
            projs = em.load(ck, layer, e)
            got = tuple((int(p.shape[0]), int(p.shape[1])) for p in projs)
            if got != shapes:
                raise ValueError(f"expert {e} of layer {layer} has shapes {got}, expected {shapes}")
            w.add_expert(layer, e, [_encode(p, scheme, dtype, group) for p in projs])
            progress(em.source_bytes(ck, layer, e))
    src = DTYPE_NAMES.get(first[0].dtype)
    return {
        "scheme": scheme,
        "dtype": dtype,
        "group_size": group,
        "source_dtype": src,
        "moe_layers": em.layers(),
        "keys": "fused" if em.fused else "per-expert",
        "source_fp8": bool(ck.scales),
    }


def _chat_template(ck: Checkpoint, tok_cfg: dict[str, Any] | None) -> str | None:
    if (t := ck.text_file("chat_template.jinja")) is not None:
        return t
    tpl = (tok_cfg or {}).get("chat_template")
    if isinstance(tpl, list):  # [{"name": "default", "template": ...}, ...]
        by_name = {d.get("name"): d.get("template") for d in tpl if isinstance(d, dict)}
        tpl = by_name.get("default") or next(iter(by_name.values()), None)
    return tpl if isinstance(tpl, str) else None


def _json_file(ck: Checkpoint, name: str) -> dict[str, Any] | None:
    text = ck.text_file(name)
    return json.loads(text) if text is not None else None


def source_bytes(ck: Checkpoint) -> int:
    return sum(ck.nbytes(n) for n in ck.names())


def convert(
    source: str,
    out: Path,
    opts: ConvertOptions,
    progress: Progress | None = None,
    on_start: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """Converts ``source`` to ``out``; returns a summary. ``on_start`` gets the total
    source bytes before work begins, ``progress`` the bytes of each tensor done."""
    opts.validate()
    root = resolve_source(source)
    ck = ling.adapt(Checkpoint.open(root))  # Ling: seen as the GLM-4.5 it computes
    arch = check_arch(ck.config)
    em = map_experts(ck)
    tick = progress or (lambda n: None)
    if on_start:
        on_start(source_bytes(ck))
    t0 = time.perf_counter()
    # Source hashes are computed beside the conversion, one thread per file up to half
    # the cores: on one thread they took longer than the conversion itself (measured:
    # 1.6 GB converted in 1.4-1.7 s without hashing, 3.1-4.6 s with, on 2 cores).
    with ThreadPoolExecutor(max_workers=max(1, min(8, (os.cpu_count() or 2) // 2))) as pool:
        hashes: dict[str, Future[str]] = {p.name: pool.submit(_sha256, p) for p in ck.iter_files()}
        try:
            with FtwFileWriter(out) as w:
                dense_q = _write_dense(ck, w, em.expert_names(), opts, tick)
                experts = _write_experts(ck, em, w, opts, tick)
                tok_cfg = _json_file(ck, "tokenizer_config.json")
                meta = {
                    "format": "ftw",
                    "arch": arch,
                    "config": ck.config,
                    "generation_config": _json_file(ck, "generation_config.json"),
                    "tokenizer": ck.text_file("tokenizer.json"),
                    "tokenizer_config": tok_cfg,
                    "chat_template": _chat_template(ck, tok_cfg),
                    "quant": {
                        "experts": experts,
                        "dense": {"scheme": opts.dense_quant, "tensors": dense_q},
                    },
                    "source": {
                        "path": str(root),
                        "sha256": {k: f.result() for k, f in hashes.items()},
                    },
                    "converter": f"flint {__version__}",
                }
                size = w.finish(meta)
        finally:
            ck.close()
    return {
        "path": str(out),
        "arch": arch,
        "bytes": size,
        "seconds": time.perf_counter() - t0,
        "experts": experts,
        "skipped_tensors": len(ck.skipped),
    }
