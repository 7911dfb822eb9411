"""Slot -> GPU copy bandwidth with the RAM expert cache's arena pageable and page-locked
(``cudaHostRegister``, ``flint.stream.pinned``), and what an elastic-VRAM check costs.

An arena (``flint._core.Arena``, the same allocation the I/O engine's cache uses) of
``--slots`` slots of ``--slab-mib`` MiB (default 9 MiB: a Qwen3-30B-A3B bf16 expert);
each slot is copied to the GPU the two ways the streamed backend does: ``copy_`` into a
preallocated VRAM row (admissions, swaps) and ``.to(cuda)`` (an expert copied up for one
use), synchronously, ``--rounds`` passes over all slots. Then the arena is registered
and the same copies are timed again; then the host time of one asynchronous copy of 1,
8 and 32 adjacent slots on a side stream (median), and whether it returned before the
copy ended. Prints one JSON line per case.

    python benches/pinned_copy.py                      # on the GPU box
    python benches/pinned_copy.py --slab-mib 2 --slots 512
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from flint import _core
from flint.stream.elastic import usable_vram
from flint.stream.pinned import pin_arena
from flint.stream.slab import slot_bytes


def _gbps(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / 1e9


def _time_copies(views: list[torch.Tensor], rounds: int, dev: torch.device) -> dict[str, float]:
    dst = torch.empty(views[0].numel(), dtype=torch.uint8, device=dev)
    total = sum(v.numel() for v in views) * rounds
    out: dict[str, float] = {}
    for name in ("copy", "to"):
        for v in views[:4]:  # warm up
            dst.copy_(v) if name == "copy" else v.to(dev)
        torch.cuda.synchronize(dev)
        start = time.perf_counter()
        for _ in range(rounds):
            for v in views:
                if name == "copy":
                    dst.copy_(v)
                else:
                    v.to(dev)
        torch.cuda.synchronize(dev)
        out[f"{name}_gb_s"] = round(_gbps(total, time.perf_counter() - start), 2)
    return out


def _host_time(arena: object, run: int, dev: torch.device) -> dict[str, float]:
    """Host time of one ``copy_(non_blocking=True)`` of ``run`` adjacent page-locked
    slots on a side stream (as ``prompt_ahead.py`` queues them), and the share of calls
    after which the copy was still in flight (1.0: the call returned at once)."""
    slab = arena.slot_bytes  # type: ignore[attr-defined]
    base = arena.address  # type: ignore[attr-defined]
    n = arena.slots_per_layer // run  # type: ignore[attr-defined]
    dst = torch.empty(run * slab, dtype=torch.uint8, device=dev)
    side = torch.cuda.Stream(dev)
    calls, pending = [], 0
    for i in range(n):
        src = slot_bytes(base + i * run * slab, run * slab)
        with torch.cuda.stream(side):
            start = time.perf_counter()
            dst.copy_(src, non_blocking=True)
            calls.append(time.perf_counter() - start)
            done = torch.cuda.Event()
            done.record(side)
        pending += not done.query()
        done.synchronize()
    return {
        "bytes_a_call": run * slab,
        "host_us_a_call": round(1e6 * sorted(calls)[len(calls) // 2], 1),
        "in_flight_after_call": round(pending / n, 2),
    }


def _queued(arena: object, run: int, dev: torch.device) -> dict[str, float]:
    """Host time of each of a layer's worth of asynchronous copies (~240 MB, as
    ``prompt_ahead.py`` queues a layer) issued back to back on a side stream, the
    stream first held behind a ~100 ms matmul loop on another (as the copies wait for
    the launch that last read their area): whether later calls block."""
    slab = arena.slot_bytes  # type: ignore[attr-defined]
    base = arena.address  # type: ignore[attr-defined]
    n = min(96, arena.slots_per_layer) // run  # type: ignore[attr-defined]
    dst = torch.empty(n * run * slab, dtype=torch.uint8, device=dev)
    side, busy = torch.cuda.Stream(dev), torch.cuda.Stream(dev)
    a = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16)
    with torch.cuda.stream(busy):
        for _ in range(200):
            a = a @ a * 1e-3
        held = torch.cuda.Event()
        held.record(busy)
    calls = []
    start_all = time.perf_counter()
    with torch.cuda.stream(side):
        side.wait_event(held)
        for i in range(n):
            src = slot_bytes(base + i * run * slab, run * slab)
            start = time.perf_counter()
            dst[i * run * slab : (i + 1) * run * slab].copy_(src, non_blocking=True)
            calls.append(time.perf_counter() - start)
    issued = time.perf_counter() - start_all
    torch.cuda.synchronize(dev)
    return {
        "calls": n,
        "bytes_a_call": run * slab,
        "host_us_first": round(1e6 * calls[0], 1),
        "host_us_median": round(1e6 * sorted(calls)[n // 2], 1),
        "host_us_max": round(1e6 * max(calls), 1),
        "host_ms_all": round(1e3 * issued, 2),
    }


class _Owner:
    """A weak-referenceable holder of the arena (``flint._core.Arena`` is not)."""

    arena: object = None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--slab-mib", type=float, default=9.0)
    ap.add_argument("--slots", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    dev = torch.device(args.device)
    slab = int(args.slab_mib * (1 << 20)) // 4096 * 4096
    arena = _core.Arena(slab * args.slots, 1, args.slots, slab)
    base = arena.address
    views = [slot_bytes(base + arena.slot_offset(0, s), slab) for s in range(arena.slots_per_layer)]
    for v in views:
        v.fill_(7)  # fault the pages in, as reads into the cache would
    common = {"slab_bytes": slab, "slots": len(views), "arena_gib": arena.nbytes / (1 << 30)}
    print(json.dumps({"case": "pageable", **common, **_time_copies(views, args.rounds, dev)}))
    start = time.perf_counter()
    owner = _Owner()  # what the registration's lifetime follows (the backend, in flint)
    owner.arena = arena
    pinned = pin_arena(base, arena.nbytes, owner, print)
    took = time.perf_counter() - start
    if pinned is None:
        return
    assert views[0].is_pinned()
    row = _time_copies(views, args.rounds, dev)
    print(json.dumps({"case": "page-locked", "register_s": round(took, 3), **common, **row}))
    for run in (1, 8, 32):
        if run <= len(views):
            print(json.dumps({"case": f"async, {run} slots a call", **_host_time(arena, run, dev)}))
    for run in (1, 3):
        print(json.dumps({"case": f"queued, {run} slots a call", **_queued(arena, run, dev)}))
    pinned.release()
    n = 1000
    usable_vram(dev)
    start = time.perf_counter()
    for _ in range(n):
        usable_vram(dev)
    check_us = (time.perf_counter() - start) / n * 1e6
    print(json.dumps({"case": "elastic check (usable_vram)", "us_per_check": round(check_us, 1)}))


if __name__ == "__main__":
    main()
