"""Wave plans and the prompt read-ahead window, on random routings and a fake engine."""

from __future__ import annotations

import math

import pytest
import torch

from flint.stream.readahead import ReadAhead
from flint.stream.waves import end_order, first_selected, plan_waves

E, K = 16, 4


def _ids(tokens: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(tokens)])  # [T, K]


@pytest.mark.parametrize("seed", range(40))
def test_every_selected_expert_is_placed_once_within_the_slots(seed: int) -> None:
    g = torch.Generator().manual_seed(1000 + seed)
    tokens = int(torch.randint(1, 30, (1,), generator=g))
    slots = int(torch.randint(1, E + 1, (1,), generator=g))
    ids = _ids(tokens, seed)
    resident = torch.randperm(E, generator=g)[: int(torch.randint(0, slots + 1, (1,)))].tolist()
    plan = plan_waves(ids, E, slots, resident)
    placed = [e for wave in plan.waves for e in wave]
    selected = set(ids.reshape(-1).tolist())
    assert sorted(placed) == sorted(selected), "each selected expert exactly once"
    kept = set(plan.protect)
    assert kept <= set(resident) and len(kept) <= slots // 2
    for wave in plan.waves:
        assert wave and len(wave) + len(kept - set(wave)) <= slots, "pins + protected fit"
    # A wave with a read never comes before a resident's wave: a read cannot evict a
    # resident that is still to run (protected ones are kept by protection).
    first_read = min((i for i, w in enumerate(plan.waves) if set(w) - set(resident)), default=0)
    for i, wave in enumerate(plan.waves):
        unprotected = (set(wave) & set(resident)) - kept
        assert not unprotected or i <= first_read
    if not resident:
        assert len(plan.waves) == math.ceil(len(selected) / slots), "cold: ceil(D/S) waves"
    # The experts of the last token stay: in the final wave or protected.
    if slots >= K:
        last = set(ids[-1].tolist())
        assert last <= set(plan.waves[-1]) | kept | set(resident) & set(plan.waves[0])


def test_end_order_puts_the_last_tokens_experts_last() -> None:
    ids = torch.tensor([[0, 1], [2, 3], [1, 4], [5, 0]])
    # by (last token, selections, id): 2, 3 last at t1; 4 then 1 (twice) at t2; 5, 0
    assert end_order(ids, 8) == [2, 3, 4, 1, 5, 0]
    counts = torch.bincount(ids.reshape(-1), minlength=8).tolist()
    assert end_order(ids, 8, counts) == [2, 3, 4, 1, 5, 0], "the caller's counts"


class FakeEngine:
    def __init__(self, resident: dict[int, list[int]], usage: dict[int, list[int]]) -> None:
        self.res, self.use = resident, usage
        self.protected: dict[int, list[int]] = {}
        self.predicted: list[tuple[int, int, int, int]] = []

    def resident(self, layer: int) -> list[int]:
        return self.res.get(layer, [])

    def protect(self, layer: int, experts: list[int]) -> int:
        self.protected[layer] = experts
        return len(experts)

    def usage(self, layer: int) -> list[int]:
        return self.use[layer]

    def predict(self, predictions: list[tuple[int, int, int, int]]) -> None:
        self.predicted.extend(predictions)


def test_read_ahead_fills_only_free_slots_of_the_next_two_layers() -> None:
    usage = {layer: [0, 9, 3, 7, 1, 0, 5, 2] for layer in (1, 2, 3, 5)}
    eng = FakeEngine({2: [1, 3], 3: [0, 1, 2, 3, 4, 5]}, usage)
    ra = ReadAhead([1, 2, 3, 5], slots=4, n_experts=8, top_k=2)
    assert ra(eng, 1, tokens=7) == 0, "7 x 2 selections < 2 x 8 experts: too short"
    assert ra(eng, 1, tokens=8) == 2
    assert eng.protected == {2: [1, 3], 3: [0, 1, 2, 3, 4, 5]}
    # layer 2: 2 free slots -> most used not resident (6, then 2); layer 3: full
    assert eng.predicted == [(2, 6, 1, 0), (2, 2, 1, 1)]
    eng.predicted.clear()
    assert ra(eng, 3, tokens=100) == 4  # only layer 5 is left; unused experts never
    assert eng.predicted == [(5, 1, 1, 0), (5, 3, 1, 1), (5, 6, 1, 2), (5, 2, 1, 3)]
    assert ra(eng, 5, tokens=100) == 0 and ReadAhead([1], 4, 8, 2, depth=0)(eng, 1, 99) == 0


@pytest.mark.parametrize("pairs", [1, 8, 64, 65, 4096])
def test_first_selected_is_the_order_of_first_selection(pairs: int) -> None:
    """Both ways (a Python scan for a few pairs, torch for a prompt's) give the experts
    in the order their first pair selected them."""
    gen = torch.Generator().manual_seed(pairs)
    for n_experts in (4, 128):
        flat = torch.randint(0, n_experts, (pairs,), generator=gen)
        want = list(dict.fromkeys(flat.tolist()))
        assert first_selected(flat, n_experts) == want
    flat = torch.tensor([5, 5, 2] * 40)  # 120 pairs, two experts of 8
    assert first_selected(flat, 8) == [5, 2]


@pytest.mark.parametrize("tokens", [1, 9, 600])
def test_the_routing_summary_gives_the_hosts_plan(tokens: int) -> None:
    """``routing_summary`` (a GPU prompt's counts, first and last selections, made on
    the device and read back with the ids; here on the CPU) gives the ids, the counts,
    and the first-selection and end orders the host computes from the ids alone,
    unselected experts included."""
    from flint.stream.waves import routing_summary

    gen = torch.Generator().manual_seed(tokens)
    k, n_experts = 4, 40
    ids = torch.stack([torch.randperm(n_experts - 5, generator=gen)[:k] for _ in range(tokens)])
    flat_host, counts, first, last = routing_summary(ids.reshape(-1), k, n_experts)
    assert torch.equal(flat_host, ids.reshape(-1))
    assert counts == torch.bincount(ids.reshape(-1), minlength=n_experts).tolist()
    assert first_selected(flat_host, n_experts, first) == first_selected(ids.reshape(-1), n_experts)
    assert end_order(ids, n_experts, counts, last) == end_order(ids, n_experts)
    want = plan_waves(ids, n_experts, 7, [3, 1])
    assert plan_waves(ids, n_experts, 7, [3, 1], counts, last) == want
