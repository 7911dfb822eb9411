"""The Belady bound of a decode run: the reads no cache of the run's capacity could
have avoided, from the run's own routing."""

from __future__ import annotations

import itertools
import random

import pytest

from flint.bench.belady import belady_reads


def _rows(tokens: list[list[list[int]]]) -> list[list[int]]:
    """[token][layer] -> top-k ids, flattened layer by layer as the backend records."""
    return [ids for token in tokens for ids in token]


def test_a_cold_cache_reads_each_expert_once_when_everything_fits() -> None:
    rows = _rows([[[0, 1], [2, 3]], [[1, 4], [3, 2]], [[0, 4], [5, 2]]])
    # layer 0 uses 0, 1, 4; layer 1 uses 2, 3, 5: six compulsory reads
    assert belady_reads(rows, [set(), set()], n_experts=8, capacity=8) == 6
    # experts held at the first step save their read
    assert belady_reads(rows, [{0, 1, 7}, {2}], n_experts=8, capacity=8) == 3
    assert belady_reads(rows, [{0, 1, 4}, {2, 3, 5}], n_experts=8, capacity=8) == 0


def test_a_small_cache_evicts_the_expert_needed_last() -> None:
    # one layer, capacity 2, top-1: 0 1 2 0 1 -> Belady keeps 0 for its reuse and reads
    # 0, 1, 2 (evicting 1, used after 0), then 1 again: 4; LRU would read all 5
    rows = [[0], [1], [2], [0], [1]]
    assert belady_reads(rows, [set()], n_experts=4, capacity=2) == 4


def test_no_bound_below_top_k_or_without_steps_and_bad_rows_are_refused() -> None:
    assert belady_reads([[0, 1, 2]], [set()], n_experts=8, capacity=2) is None
    assert belady_reads([], [set()], n_experts=8, capacity=2) is None
    with pytest.raises(ValueError, match="one row of 2 distinct"):
        belady_reads([[0, 1], [2, 2]], [set(), set()], n_experts=8, capacity=4)
    with pytest.raises(ValueError, match="3 recorded rows for 2 layers"):
        belady_reads([[0, 1], [2, 3], [4, 5]], [set(), set()], n_experts=8, capacity=4)


def test_held_experts_start_the_replay_warm_exactly() -> None:
    """Held experts (at least top-k of them) are in the replay's cache at the first
    step: against brute force on small random traces, the bound equals the optimum."""
    rng = random.Random(7)
    for _ in range(200):
        n, k, cap, tokens = 6, 2, 3, rng.randint(1, 6)
        held = set(rng.sample(range(n), rng.randint(k, cap)))
        rows = [rng.sample(range(n), k) for _ in range(tokens)]
        assert belady_reads(rows, [held], n_experts=n, capacity=cap) == _optimum(rows, held, cap)


def _optimum(rows: list[list[int]], held: set[int], cap: int) -> int:
    """Fewest reads of any eviction choice (exhaustive; a token's experts are pinned)."""
    best = {frozenset(held): 0}
    for row in rows:
        nxt: dict[frozenset[int], int] = {}
        for cache, reads in best.items():
            missing = [e for e in row if e not in cache]
            keep = cache | set(row)
            victims = [e for e in cache if e not in row]
            over = max(0, len(keep) - cap)
            for drop in itertools.combinations(victims, over):
                state = frozenset(keep - set(drop))
                if reads + len(missing) < nxt.get(state, 1 << 30):
                    nxt[state] = reads + len(missing)
        best = nxt
    return min(best.values())
