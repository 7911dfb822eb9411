"""Elastic VRAM (issue 9): the VRAM expert cache shrinks at a token boundary when free
VRAM falls into the headroom and grows when it comes back, dropping its coldest
experts, without changing a bit of the output. On the CPU here with a simulated free
size (the logic is device-independent); the CUDA run with another process taking
memory is marked ``gpu``."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import flint
from flint.models import parse_config
from flint.models.ftw_source import FtwSource
from flint.stream import streamed_backend
from flint.stream.elastic import CHECK_EVERY, ElasticVram, usable_vram
from flint.stream.plan import GIB
from flint.stream.vram import VramCache

CPU = torch.device("cpu")
PROMPT = [5, 17, 250, 3, 99]


def _open(
    path: Path,
    vram_slots: int | None,
    free: Callable[[], int] | None,
    device: torch.device = CPU,
    notices: list[str] | None = None,
    expert_kernels: str = "torch",
    **kw: Any,
) -> flint.LLM:
    """A streamed LLM with 2 RAM slots per layer and a "VRAM" cache of ``vram_slots``
    per layer (None: what ``free()`` allows) whose free size is ``free()``; experts on
    torch's kernels by default, as a GPU computes them (the fused CPU kernels have no
    VRAM cache)."""
    source = FtwSource(path)
    lay = source.expert_layout
    assert lay is not None
    layers = sum(parse_config(source.config).sparse_layers)
    per_slot = layers * lay.slab_bytes / GIB
    backend = streamed_backend(
        source,
        parse_config(source.config),
        device,
        torch.float32 if device.type == "cpu" else torch.bfloat16,
        2 * per_slot,
        usage=False,
        vram_budget_gib=None if vram_slots is None else vram_slots * per_slot,
        vram_device=device,
        vram_free_bytes=free,
        notice=(notices.append if notices is not None else lambda _: None),
        expert_kernels=expert_kernels,
        **kw,
    )
    return flint.LLM(source, device=device, context_length=256, expert_backend=backend)


def _fill(v: VramCache, layer: int, experts: range) -> None:
    for e in experts:
        v.admit(layer, e, torch.full((16,), e, dtype=torch.uint8))


def test_resize_keeps_the_hottest_compacts_and_frees() -> None:
    v = VramCache((0, 1), 10, 4, 16, CPU)
    for layer in (0, 1):
        _fill(v, layer, range(4))
    v.recent[0, :4] = torch.tensor([5.0, 1.0, 9.0, 1.0])  # 1 and 3 tie as coldest
    v.recent[1, :4] = torch.tensor([0.0, 2.0, 3.0, 7.0])
    assert v.resize(2) == 4 and v.slots == 2
    assert set(v.where[0]) == {0, 2} and set(v.where[1]) == {2, 3}
    assert all(p.shape == (2, 16) for p in v.pools.values()) and v.held_bytes == 2 * 2 * 16
    assert not v.free[0] and v.admit(0, 7, torch.zeros(16, dtype=torch.uint8)) is None
    for layer in (0, 1):
        for e in v.where[layer]:
            assert torch.equal(v.entry(layer, e), torch.full((16,), e, dtype=torch.uint8))
    assert v.resize(1) == 2 and set(v.where[0]) == {2}  # ties: the lower id stays
    assert v.resize(5) == 0 and v.slots == 5 and len(v.free[0]) == 4
    assert torch.equal(v.entry(0, 2), torch.full((16,), 2, dtype=torch.uint8))
    assert v.resize(0) == 2 and v.slots == 0 and v.held_bytes == 0
    assert v.entry(0, 2) is None and v.swap_plan() == []


def test_resize_when_a_pool_cannot_be_allocated(monkeypatch: pytest.MonkeyPatch) -> None:
    """Growing: a layer whose larger pool fails keeps its size (``slots`` then says the
    smallest layer's). Shrinking: a smaller pool that fails next to the old one is made
    after freeing it, and the layer starts empty."""
    v = VramCache((0, 1), 10, 2, 16, CPU)
    for layer in (0, 1):
        _fill(v, layer, range(2))
    make, calls = v._pool, [0]

    def pool_failing_once(rows: int) -> torch.Tensor:
        calls[0] += 1
        if calls[0] == 2:  # the second layer's pool
            raise torch.cuda.OutOfMemoryError("simulated")
        return make(rows)

    monkeypatch.setattr(v, "_pool", pool_failing_once)
    assert v.resize(4) == 0
    assert v.capacity(0) == 4 and v.capacity(1) == 2 and v.slots == 2
    assert set(v.where[1]) == {0, 1} and v.pools[1].shape[0] == 2
    calls[0] = 0
    v.recent[:, 1] = 5.0
    assert v.resize(1) == 1 + 2  # layer 1 lost both: its old pool went first
    assert set(v.where[0]) == {1} and not v.where[1] and v.free[1] == [0]
    assert v.slots == 1 and v.held_bytes == 2 * 16


def test_a_growth_that_cannot_allocate_says_so_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every larger pool fails: one line, the size kept, no retry (and no reallocation
    of the layers) until more memory is free."""
    v = VramCache((0, 1), 64, 1, 1 << 20, CPU)
    free = [int(1.5 * GIB)]
    lines: list[str] = []
    w = ElasticVram(v, lambda: free[0], None, lines.append)
    make, calls = v._pool, [0]

    def no_larger_pool(rows: int) -> torch.Tensor:
        calls[0] += 1
        if rows > 1:
            raise torch.cuda.OutOfMemoryError("simulated")
        return make(rows)

    monkeypatch.setattr(v, "_pool", no_larger_pool)
    free[0] = 4 * GIB
    assert w.check() is None and v.slots == 1
    assert len(lines) == 1 and "could not grow 1 -> " in lines[0]
    tried = calls[0]
    assert w.check() is None and calls[0] == tried and len(lines) == 1, "no retry"
    free[0] = 8 * GIB  # more memory: it tries again (and fails again, once more said)
    assert w.check() is None and calls[0] > tried and len(lines) == 2


def test_resize_drops_packed_forms() -> None:
    v = VramCache((3,), 10, 3, 16, CPU, pack=lambda t: [t.clone()])
    _fill(v, 3, range(3))
    v.recent[0, :3] = torch.tensor([1.0, 3.0, 2.0])
    assert v.held_bytes == 3 * 16
    assert v.resize(1) == 2 and set(v.where[3]) == {1} and len(v.packed) == 1
    assert torch.equal(v.entry(3, 1)[0], torch.full((16,), 1, dtype=torch.uint8))
    assert v.resize(2) == 0 and v.free[3] == [1] and v.held_bytes == 16


def test_checks_at_every_prompt_and_every_n_decode_tokens() -> None:
    v = VramCache((0,), 4, 1, 16, CPU)
    w = ElasticVram(v, lambda: 64 * GIB, None, lambda _: None)
    assert w.due(5) and w.due(2)
    assert [w.due(1) for _ in range(2 * CHECK_EVERY)].count(True) == 2


def test_only_other_programs_make_it_shrink() -> None:
    """What this process allocates after the plan (GPU-wave buffers, workspaces) comes
    out of the headroom; the same drop in free memory from another program shrinks."""
    v = VramCache((0, 1), 8, 4, 1 << 20, CPU)
    free, mine, lines = [GIB + v.held_bytes // 4], [5 * GIB + v.held_bytes], list[str]()
    w = ElasticVram(v, lambda: free[0], None, lines.append, lambda: mine[0])
    assert w.check() is None and v.slots == 4
    free[0] -= 256 << 20
    mine[0] += 256 << 20  # ours
    assert w.check() is None and v.slots == 4 and not lines
    free[0] -= 4 << 20  # someone else's: room for 3 slots per layer (1 MiB each)
    assert w.check() == 3 and v.slots == 3 and len(lines) == 1
    assert lines[0] == (
        "cpu: VRAM expert cache shrunk 4 -> 3 slots/layer (free VRAM fell by 0.0 GiB: "
        "another program took memory)"
    )


@pytest.mark.parametrize("family", ["qwen3_moe", "deepseek_v3"])
def test_shrink_and_grow_at_token_boundaries_keep_the_output(
    family: str, tiny_ftw: dict[str, Path]
) -> None:
    path = tiny_ftw[family]
    source = FtwSource(path)
    lay = source.expert_layout
    assert lay is not None
    n_layers = sum(parse_config(source.config).sparse_layers)
    per_slot = n_layers * lay.slab_bytes  # one slot in every streamed layer
    free = [64 * GIB]
    notices: list[str] = []
    with (
        flint.LLM(path, device="cpu", context_length=256, expert_kernels="torch") as resident,
        _open(path, 3, lambda: 64 * GIB) as steady,
        _open(path, 3, lambda: free[0], notices=notices, lookahead=2) as elastic,
    ):
        backend: Any = elastic.expert_backend
        vram: VramCache = backend.vram
        assert vram.slots == 3
        # what each resize saw (recent counts, residents) and kept
        seen: list[tuple[int, dict[int, list[float]], dict[int, set[int]], dict[int, set[int]]]]
        seen = []
        resize = vram.resize

        def spy(slots: int) -> int:
            rec = {lyr: vram.recent[vram.row[lyr]].tolist() for lyr in vram.layers}
            before = {lyr: set(vram.where[lyr]) for lyr in vram.layers}
            dropped = resize(slots)
            seen.append((slots, rec, before, {lyr: set(vram.where[lyr]) for lyr in vram.layers}))
            return dropped

        vram.resize = spy  # type: ignore[method-assign]
        slots: list[int] = []
        ids = torch.tensor(PROMPT)
        want = resident.model.forward(ids, all_logits=True)
        assert torch.equal(steady.model.forward(ids, all_logits=True), want)
        assert torch.equal(elastic.model.forward(ids, all_logits=True), want)
        for step in range(2 * CHECK_EVERY + 4):
            if step == 3:  # another program takes memory: room for one slot per layer
                free[0] = GIB + per_slot + 100 - vram.held_bytes
            if step == CHECK_EVERY + 3:
                free[0] = 64 * GIB  # it gave the memory back
            tok = torch.tensor([(step * 37 + 11) % 300])
            want = resident.model.forward(tok)
            assert torch.equal(steady.model.forward(tok), want), step
            assert torch.equal(elastic.model.forward(tok), want), step
            slots.append(vram.slots)
            if vram.slots == 1:
                # nothing held beyond the new budget (one slot per layer)
                assert vram.held_bytes <= per_slot
                assert all(len(w) <= 1 for w in vram.where.values())
        # decode forward i (0-based step) checks at the boundary before it when
        # (i + 1) % CHECK_EVERY == 0
        first, second = CHECK_EVERY - 1, 2 * CHECK_EVERY - 1
        assert slots[:first] == [3] * first
        assert slots[first:second] == [1] * (second - first)
        assert slots[second:] == [3] * (len(slots) - second)
        s = elastic.stats()
    assert [n for n, _, _, _ in seen] == [1, 3]
    _, recent, held, kept = seen[0]
    for lyr in held:
        assert len(kept[lyr]) == min(1, len(held[lyr])) and kept[lyr] <= held[lyr]
        for k in kept[lyr]:  # the hottest stays, the coldest go
            assert all(recent[lyr][k] >= recent[lyr][d] for d in held[lyr] - kept[lyr])
    assert seen[1][3] == seen[0][3], "growing drops nothing"
    assert notices[0].startswith("VRAM expert cache: 3/") and notices[1:] == [
        f"cpu: VRAM expert cache shrunk 3 -> 1 slots/layer (free VRAM fell by "
        f"{(64 * GIB - free_after_shrink(per_slot, 3)) / GIB:.1f} GiB: another program "
        "took memory)",
        f"cpu: VRAM expert cache grew 1 -> 3 slots/layer "
        f"({(64 * GIB - free_after_shrink(per_slot, 3)) / GIB:.1f} GiB of VRAM came back)",
    ]
    assert s is not None and s["vram_shrinks"] == 1 and s["vram_grows"] == 1
    assert s["vram_slots_per_layer"] == 3 and s["vram_hits"] > 0


def free_after_shrink(per_slot: int, slots: int) -> int:
    return GIB + per_slot + 100 - slots * per_slot


def test_a_new_prompt_checks_at_once(tiny_ftw: dict[str, Path]) -> None:
    path = tiny_ftw["olmoe"]
    free = [64 * GIB]
    with _open(path, 2, lambda: free[0]) as llm:
        vram: VramCache = llm.expert_backend.vram  # type: ignore[attr-defined]
        llm.generate(PROMPT, max_tokens=3, ignore_eos=True, temperature=0.0)
        assert vram.slots == 2
        free[0] = GIB // 2  # below the headroom: no room at all
        llm.generate(PROMPT, max_tokens=1, ignore_eos=True, temperature=0.0)
        assert vram.slots == 0 and vram.held_bytes == 0
        out = llm.generate(PROMPT, max_tokens=4, ignore_eos=True, temperature=0.0).token_ids
    with _open(path, 2, lambda: 64 * GIB) as steady:
        assert (
            steady.generate(PROMPT, max_tokens=4, ignore_eos=True, temperature=0.0).token_ids == out
        )


_HOG = """
import sys, torch
x = torch.empty({nbytes}, dtype=torch.uint8, device="cuda")
x.fill_(1)
torch.cuda.synchronize()
print("ready", flush=True)
sys.stdin.read()
"""


@pytest.mark.gpu
def test_cuda_another_process_taking_vram_shrinks_then_grows_the_cache(
    tiny_ftw: dict[str, Path],
) -> None:
    """A second process allocates 8 GiB on the same GPU mid-generation: the cache
    shrinks within CHECK_EVERY tokens, output stays bit-identical to resident
    (--deterministic), and it grows back once that process exits. The cache's view of
    free memory is the real one less a fixed offset (6 GiB free at start), so the
    tiny model's cache fills "all" of VRAM and the other program's bytes come out of
    its headroom."""
    cuda = torch.device("cuda")
    path = tiny_ftw["qwen3_moe"]
    notices: list[str] = []
    with flint.LLM(path, device="cuda", context_length=256, graphs="off") as resident:
        offset = usable_vram(cuda) - 6 * GIB

        def free() -> int:
            return max(0, usable_vram(cuda) - offset)

        with _open(path, None, free, cuda, notices, deterministic=True) as streamed:
            vram: VramCache = streamed.expert_backend.vram  # type: ignore[attr-defined]
            full = vram.slots
            assert full > 0
            ids = torch.tensor(PROMPT)
            want = resident.model.forward(ids, all_logits=True)
            assert torch.equal(streamed.model.forward(ids, all_logits=True), want)
            hog = subprocess.Popen(
                [sys.executable, "-c", _HOG.format(nbytes=8 * GIB)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            try:
                assert hog.stdout is not None and hog.stdout.readline().strip() == "ready"
                sizes = []
                for step in range(4 * CHECK_EVERY):
                    if step == 2 * CHECK_EVERY:
                        assert hog.stdin is not None
                        hog.stdin.close()  # the other program exits, freeing its memory
                        assert hog.wait(timeout=60) == 0
                    tok = torch.tensor([(step * 37 + 11) % 300])
                    assert torch.equal(streamed.model.forward(tok), resident.model.forward(tok))
                    sizes.append(vram.slots)
            finally:
                if hog.poll() is None:
                    hog.kill()
                hog.wait()
                for pipe in (hog.stdin, hog.stdout):  # closed: no unraisable warning
                    if pipe is not None:
                        pipe.close()
            s = streamed.stats()
    assert min(sizes[: 2 * CHECK_EVERY]) < full, "shrunk while the other process held VRAM"
    assert sizes[-1] == full, "grew back once it exited"
    assert s is not None and s["vram_shrinks"] >= 1 and s["vram_grows"] >= 1
    assert any("shrunk" in n for n in notices) and any("grew" in n for n in notices)
