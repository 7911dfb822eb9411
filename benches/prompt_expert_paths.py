"""How one int4/int8 expert projection is best computed for a prompt on CUDA (issue 8).

Usage: python benches/prompt_expert_paths.py [--scheme int4|int8] [--rows 768] [--cols 2048]
       [--tokens 1,8,64,512]

A streamed prompt computes each expert from its slot's bytes: today the projection is
packed into torch's kernel layout on every use (``ProjectionKernel.pack``) and then
multiplied by that kernel (tinygemm for int4, made for few rows). This times, per
token count, with CUDA events (median of 20 after 3 warm-ups):

- ``packed``: torch's kernel on weights packed once (what a resident model does);
- ``pack+mm``: packing from the file's bytes on each call, then torch's kernel (what a
  streamed prompt does);
- ``pack``, ``pack_old``: the pack alone from bytes already in VRAM (a staged copy), and
  the formulation it replaced (``old_pack``: more, smaller ops; the same bytes);
- ``dequant+mm``: dequantizing the file's bytes to bf16 on each call, then cuBLAS
  (what the resident slab backend does for prompts);
- ``dense``: cuBLAS on bf16 weights already there (the floor).
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F

from flint.format.quant import decode_projection, encode_projection, split_int4, split_int8
from flint.models.quant_linear import (
    Packed,
    torch_kernel,
)


def median_ms(fn: Callable[[], object], reps: int = 20, warm: int = 3) -> float:
    """Median ms of ``reps`` calls of ``fn`` timed with CUDA events, after ``warm``."""
    times = []
    for i in range(warm + reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        if i >= warm:
            times.append(start.elapsed_time(end))
    return statistics.median(times)


def old_pack(scheme: str, group: int, raw: torch.Tensor, rows: int, cols: int) -> Packed:
    """The CUDA packs (bf16) as they were before they were cut to fewer ops: the baseline."""
    device, dtype = raw.device, torch.bfloat16
    if scheme == "int8":
        q, scale = split_int8(raw, rows, cols)
        return q.to(device).contiguous(), scale.to(device, dtype).contiguous()
    packed, scale4 = split_int4(raw, rows, cols, group)
    swapped = ((packed & 0x0F) << 4) | (packed >> 4)
    tiles = next((t for t in (8, 4, 2) if cols % (16 * t) == 0), 2)
    w = torch.ops.aten._convert_weight_to_int4pack(swapped.to(device), tiles)
    s = scale4.to(dtype).t()
    return w, torch.stack([s, torch.zeros_like(s)], dim=-1).contiguous().to(device)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scheme", default="int4")
    parser.add_argument("--rows", type=int, default=768)
    parser.add_argument("--cols", type=int, default=2048)
    parser.add_argument("--tokens", default="1,8,64,512")
    parser.add_argument("--group", type=int, default=32)
    args = parser.parse_args()
    device, dtype = torch.device("cuda", 0), torch.bfloat16
    raw = encode_projection(torch.randn(args.rows, args.cols), args.scheme, args.group)
    raw_gpu = raw.to(device)
    kernel = torch_kernel(args.scheme, args.group, device, dtype)
    packed = kernel.pack(raw, args.rows, args.cols)
    shape = (args.rows, args.cols)
    old = old_pack(args.scheme, args.group, raw_gpu, *shape)
    for new_t, old_t in zip(kernel.pack(raw_gpu, *shape), old, strict=True):  # or no timing
        assert torch.equal(new_t.view(torch.uint8), old_t.view(torch.uint8)), "packs differ"
    dense = decode_projection(raw, args.scheme, "u8", args.rows, args.cols, args.group)
    dense = dense.to(device, dtype)

    def dequant() -> torch.Tensor:
        w = decode_projection(raw_gpu, args.scheme, "u8", args.rows, args.cols, args.group)
        return w.to(dtype)

    rows = []
    for tokens in (int(t) for t in args.tokens.split(",")):
        x = torch.randn(tokens, args.cols, device=device, dtype=dtype)
        row = {
            "tokens": tokens,
            "packed_ms": median_ms(lambda: kernel(x, packed)),  # noqa: B023
            "pack+mm_ms": median_ms(
                lambda: kernel(x, kernel.pack(raw_gpu, args.rows, args.cols))  # noqa: B023
            ),
            "pack_ms": median_ms(partial(kernel.pack, raw_gpu, *shape)),
            "pack_old_ms": median_ms(lambda: old_pack(args.scheme, args.group, raw_gpu, *shape)),
            "dequant+mm_ms": median_ms(lambda: F.linear(x, dequant())),  # noqa: B023
            "dense_ms": median_ms(lambda: F.linear(x, dense)),  # noqa: B023
        }
        rows.append({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()})
        print(json.dumps(rows[-1]), flush=True)


if __name__ == "__main__":
    main()
