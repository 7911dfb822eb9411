"""The routed experts of the resident step in one launch (``fused_experts``, issue 10):
gate/up, down and the ranked sum by programs that wait on counters give the bits of
the three launches, and leave the counters at zero."""

from __future__ import annotations

import pytest
import torch
from test_graphs import _slabs

from flint.graphs import fused_experts, moe_kernel
from flint.graphs.moe_kernel import moe_experts, slab_pool


def _agree(
    hidden: int, inter: int, group: int, experts: int, k: int, tokens: int,
    device: torch.device, launches: int,
) -> None:  # fmt: skip
    torch.manual_seed(hidden + inter + tokens)
    shapes = ((inter, hidden), (inter, hidden), (hidden, inter))
    slabs, offsets, _ = _slabs("int4", experts, shapes, group)
    pool = slab_pool(slabs.to(device), "int4", group, shapes, offsets)
    cnt = fused_experts.counters(tokens * k, tokens, hidden, moe_kernel.SUM_BLOCK, device)
    scratch = (
        torch.empty(tokens * k, inter, dtype=torch.bfloat16, device=device),
        torch.empty(tokens * k, hidden, dtype=torch.float32, device=device),
    )
    fused_calls = []
    real = moe_kernel._fused

    def spy(*args: object) -> bool:
        fused_calls.append(real(*args))  # type: ignore[arg-type]
        return fused_calls[-1]

    for launch in range(launches):
        x = (torch.randn(tokens, hidden) / hidden**0.5).bfloat16().to(device)
        ids = torch.stack([torch.randperm(experts)[:k] for _ in range(tokens)]).to(device)
        w = torch.rand(tokens, k).bfloat16().to(device)
        want = moe_experts(x, ids, w, pool)
        out = torch.full((tokens, hidden), float("nan"), dtype=torch.bfloat16, device=device)
        moe_kernel._fused = spy  # type: ignore[assignment]
        try:
            got = moe_experts(x, ids, w, pool, scratch, out, counters=cnt)
        finally:
            moe_kernel._fused = real  # type: ignore[assignment]
        assert fused_calls == [True] * (launch + 1)
        assert got is out and torch.isfinite(got).all()
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8)), launch
        assert fused_experts.stuck(cnt) == 0
        assert int(cnt.abs().sum().item()) == 0  # put back for the next launch


@pytest.mark.interpreter
@pytest.mark.parametrize(
    ("hidden", "inter", "group", "tokens"),
    [(512, 64, 32, 1), (1000, 768, 8, 1), (264, 96, 8, 2)],
)
def test_one_launch_gives_the_three_launches_bits(
    hidden: int, inter: int, group: int, tokens: int
) -> None:
    """One token and two; down rows of one, three and one masked tile; a hidden size
    that is not a multiple of the ranked sum's block."""
    _agree(hidden, inter, group, 6, 2, tokens, torch.device("cpu"), 2)


@pytest.mark.interpreter
def test_no_counters_or_rows_too_long_keep_the_three_launches(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without counters, with ``FUSED`` off, or with gate/up rows of five tiles, the
    three launches run (and still give the result)."""
    torch.manual_seed(0)
    hidden, inter, group = 2560, 32, 32
    shapes = ((inter, hidden), (inter, hidden), (hidden, inter))
    slabs, offsets, _ = _slabs("int4", 3, shapes, group)
    pool = slab_pool(slabs, "int4", group, shapes, offsets)
    x = (torch.randn(1, hidden) / hidden**0.5).bfloat16()
    ids, w = torch.tensor([[2, 0]]), torch.tensor([[0.75, 0.25]]).bfloat16()
    cnt = fused_experts.counters(2, 1, hidden, moe_kernel.SUM_BLOCK, torch.device("cpu"))
    scratch = (torch.empty(2, inter).bfloat16(), torch.empty(2, hidden))
    out = torch.empty(1, hidden).bfloat16()
    assert not moe_kernel._fused(x, ids, w, pool, out, None, scratch, cnt)  # five tiles
    monkeypatch.setattr(moe_kernel, "FUSED", False)
    want = moe_experts(x, ids, w, pool)
    got = moe_experts(x, ids, w, pool, scratch, out, counters=cnt)
    assert torch.equal(got, want)


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("hidden", "inter", "group", "experts", "k"),
    [(2048, 768, 32, 128, 8), (1000, 264, 8, 16, 4)],
)
def test_one_launch_gives_the_three_launches_bits_on_cuda(
    hidden: int, inter: int, group: int, experts: int, k: int
) -> None:
    """Compiled, many launches on one set of counters: the tiles' layouts (the sums'
    order) as the three kernels', no wait given up, the counters back at zero each time."""
    _agree(hidden, inter, group, experts, k, 1, torch.device("cuda"), 20)


@pytest.mark.gpu
def test_the_grid_fits_the_gpu_at_once() -> None:
    """Every program of the one launch resident together, one place a multiprocessor
    to spare (a program waits on others: they must all run)."""
    threads = torch.cuda.get_device_properties(0).max_threads_per_multi_processor
    assert fused_experts._fit(0, 64, 4, 1024) == min(threads // 128, 8)
    assert fused_experts._fit(0, 72, 4, 1024) == 7
    assert fused_experts._fit(0, 255, 4, 1024) == 2
