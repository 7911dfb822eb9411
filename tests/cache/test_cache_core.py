"""``flint._core`` cache bindings: the cache API, error classes, usage table, arena."""

from __future__ import annotations

import gc
from pathlib import Path

import numpy as np
import pytest

from flint import _core


def test_admit_evict_and_errors_map_to_the_hierarchy() -> None:
    cache = _core.ExpertCache(n_layers=2, n_experts=8, capacity=2, policy="lru")
    assert (cache.n_layers, cache.n_experts, cache.capacity, cache.policy) == (2, 8, 2, "lru")
    assert cache.admit(0, 3) == (0, None)
    assert cache.admit(0, 4) == (1, None)
    assert cache.lookup(0, 3) == 0 and cache.lookup(1, 3) is None
    cache.touch(0, 3)
    assert cache.admit(0, 5) == (1, 4), "LRU: 4 leaves"
    cache.pin(0, 3)
    cache.pin(0, 5)
    with pytest.raises(_core.CacheFullError, match="all 2 slots are pinned"):
        cache.admit(0, 6)
    assert cache.admit(0, 6, "prefetch") is None
    with pytest.raises(_core.CacheStateError):
        cache.evict(0, 3)
    with pytest.raises(_core.CacheArgumentError, match="layer 2 is out of range"):
        cache.lookup(2, 0)
    with pytest.raises(_core.CacheArgumentError, match="admission kind"):
        cache.admit(1, 0, "maybe")  # type: ignore[arg-type]
    with pytest.raises(_core.CacheArgumentError, match="replay"):
        _core.ExpertCache(1, 8, 2, "belady")  # type: ignore[arg-type]
    for cls in (_core.CacheFullError, _core.CacheStateError, _core.UsageTableError):
        assert issubclass(cls, _core.CacheError) and issubclass(cls, _core.FlintError)


def test_protection_prompt_mode_and_idle_fill() -> None:
    cache = _core.ExpertCache(1, 8, 2)
    assert cache.policy == "decay"
    cache.admit(0, 1, "prefetch")
    cache.admit(0, 2, "prefetch")
    assert cache.admit(0, 3, "prefetch") is None, "predictions for an unstarted layer stay"
    cache.start_layer(0)
    cache.touch(0, 2)
    assert cache.admit(0, 3, "prefetch") == (0, 1), "unused prefetch is worth 0"
    cache.set_mode("prompt")
    cache.prompt_batch(512)
    with pytest.raises(_core.CacheArgumentError):
        cache.set_mode("chat")  # type: ignore[arg-type]
    cache.evict(0, 2)
    cache.evict(0, 3)
    assert cache.idle_fill() == [(0, 2)], "only used experts, most used first"
    assert sorted(cache.resident(0)) == [] and cache.free_slots(0) == 2


def test_usage_table_round_trip_and_corrupt_table_ignored(tmp_path: Path) -> None:
    cache = _core.ExpertCache(2, 4, 2)
    cache.admit(1, 2)
    cache.touch(1, 2)
    path = tmp_path / "model.ftw.usage"
    cache.save_usage(path, model_key=9)
    fresh = _core.ExpertCache(2, 4, 2)
    assert fresh.load_usage(path, model_key=9) is None
    assert fresh.usage_counts() == cache.usage_counts() == [0, 0, 0, 0, 0, 0, 2, 0]
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    reason = fresh.load_usage(path, model_key=9)
    assert reason is not None and "corrupt" in reason and "\n" not in reason
    assert fresh.usage_counts() == [0] * 8
    assert _core.ExpertCache(2, 4, 2).load_usage(tmp_path / "absent", 9) is None
    with pytest.raises(_core.UsageTableError):
        cache.save_usage(tmp_path / "no-such-dir" / "t.usage")


def test_arena_is_page_aligned_and_shared_without_copying() -> None:
    arena = _core.Arena(
        budget_bytes=3 * 2 * 8192 + 1, n_layers=2, n_experts=16, max_slab_bytes=5000
    )
    assert (arena.slots_per_layer, arena.slot_bytes, arena.nbytes) == (3, 8192, 6 * 8192)
    assert arena.address % 4096 == 0
    assert [arena.slot_offset(1, s) % 4096 for s in range(3)] == [0, 0, 0]
    view = np.frombuffer(arena, dtype=np.uint8)
    view[arena.slot_offset(1, 2)] = 7
    again = np.frombuffer(memoryview(arena), dtype=np.uint8)
    assert again[arena.slot_offset(1, 2)] == 7, "both views see the same memory"
    del arena
    gc.collect()
    assert view[5 * 8192] == 7, "the view keeps the arena alive"
    with pytest.raises(_core.ArenaError, match="cannot hold one"):
        _core.Arena(4096, 2, 16, 4096)
    with pytest.raises(_core.CacheArgumentError, match="slot 3 is out of range"):
        _core.Arena(1 << 20, 1, 3, 4096).slot_offset(0, 3)
