"""The next layer copied ahead (flint/stream/prompt_ahead.py): the parts that run
without a GPU. The copies themselves are CUDA streams and events: test_gpu_waves.py."""

from __future__ import annotations

import random

import torch

from flint.stream.prompt_ahead import copy_plan, runs, worth_it


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


def test_the_copy_plan_puts_each_expert_in_its_row() -> None:
    """Carried out on CPU tensors (the area a tensor of rows, the RAM cache one of
    slots), the plan's copies leave every placed expert's bytes in the row it gives
    that expert, whatever order the experts come in and wherever the gaps are; adjacent
    slots share a copy."""
    stride, slots = 16, 40
    ram = torch.arange(slots * stride, dtype=torch.int64).remainder(251).to(torch.uint8)
    rng = random.Random(5)
    for _ in range(20):
        chosen = rng.sample(range(slots), rng.randint(1, slots))
        placed = [(1000 + s, s * stride) for s in chosen]  # expert 1000+s in slot s
        rng.shuffle(placed)
        rows, spans = copy_plan(placed, stride)
        area = torch.zeros(len(placed), stride, dtype=torch.uint8)
        for row, address, n in spans:
            area[row : row + n].view(-1).copy_(ram[address : address + n * stride])
        for expert, address in placed:
            assert torch.equal(area[rows[expert]], ram[address : address + stride])
        assert sorted(rows.values()) == list(range(len(placed)))
        assert len(spans) == len(runs(sorted(s * stride for s in chosen), stride))
    every = [(e, e * stride) for e in range(slots)]
    assert len(copy_plan(every, stride)[1]) == 1


def test_the_early_launches_take_the_selected_experts_once() -> None:
    """``early_split``: of the selected experts, the ones VRAM holds go in its pool's
    part, the ones copied ahead and not held in the area's, and the rest (neither, or
    not selected) are left: the waves' count; an unselected expert nowhere."""
    from flint.stream.cuda_place import early_split

    counts = [3, 0, 1, 5, 0, 2, 7, 1]  # experts 1 and 4 unselected
    held = {0: 4, 1: 0, 6: 2}  # expert -> VRAM slot (1: held, not selected)
    ahead = {3: 0, 4: 1, 6: 2, 7: 3}  # expert -> area row (6 also held; 4 unselected)
    in_vram, copied, rest = early_split(counts, held, ahead)
    assert in_vram == {0: 4, 6: 2}
    assert copied == {3: 0, 7: 3}
    assert rest == 2, "experts 2 and 5: selected, in neither"
    assert set(in_vram).isdisjoint(copied)
    assert early_split([0] * 8, held, ahead) == ({}, {}, 0)
    assert early_split(counts, {}, {}) == ({}, {}, sum(1 for c in counts if c))
