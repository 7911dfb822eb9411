"""The next layer copied ahead (flint/stream/prompt_ahead.py): the parts that run
without a GPU. The copies themselves are CUDA streams and events: test_gpu_waves.py."""

from __future__ import annotations

from flint.stream.prompt_ahead import runs, worth_it


def test_adjacent_slots_go_in_one_copy() -> None:
    """Runs of addresses one stride apart, and only those, share a copy."""
    s = 4096
    assert runs([], s) == []
    assert runs([0], s) == [(0, 1)]
    assert runs([0, s, 2 * s], s) == [(0, 3)]
    assert runs([0, s, 3 * s, 4 * s, 9 * s], s) == [(0, 2), (2, 2), (4, 1)]
    assert runs([0, s + 64], s) == [(0, 1), (1, 1)], "a gap of less than a slot"
    # every slot of a layer read in one go: one copy
    assert runs([100 * s + i * s for i in range(95)], s) == [(0, 95)]


def test_copied_ahead_only_when_a_prompt_selects_about_every_expert() -> None:
    assert worth_it(8192, 8, 128)
    assert worth_it(128, 8, 128) and not worth_it(127, 8, 128)
