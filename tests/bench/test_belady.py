"""The Belady bound of a decode run: the reads no cache of the run's capacity could
have avoided, from the run's own routing."""

from __future__ import annotations

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


def test_no_bound_below_top_k_and_none_needed_without_steps() -> None:
    assert belady_reads([[0, 1, 2]], [set()], n_experts=8, capacity=2) is None
    assert belady_reads([], [set()], n_experts=8, capacity=2) == 0
