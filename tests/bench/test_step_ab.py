"""``benches/step_ab.py``'s stream shares (``critical_shares``): under dependent launch
a kernel of the step starts before the one before it has ended, so a profile's kernel
times overlap; each kernel's share is what it adds to the stream's time. And its
block-shape configurations: each changes the products it names and no other."""

from __future__ import annotations

import runpy
from collections.abc import Callable
from pathlib import Path

import pytest

STEP_AB = Path(__file__).resolve().parents[2] / "benches" / "step_ab.py"


Shares = Callable[[list[tuple[str, float, float]]], dict[str, tuple[float, float, int]]]


@pytest.fixture(scope="module")
def critical_shares() -> Shares:
    function: Shares = runpy.run_path(str(STEP_AB))["critical_shares"]
    return function


def test_shares_of_overlapping_kernels(critical_shares: Shares) -> None:
    """b starts 3 us before a ends and ends 2 us after it: b's share is 2 and it ran 3
    beside a; c follows after 1 us idle, which is nobody's; the shares sum to the busy
    time (end of c less start of a, less the idle us)."""
    spans = [("b", 7.0, 12.0), ("a", 0.0, 10.0), ("c", 13.0, 14.0), ("b", 13.5, 20.0)]
    shares = critical_shares(spans)
    assert shares == {"a": (10.0, 0.0, 1), "b": (2.0 + 6.0, 3.0 + 0.5, 2), "c": (1.0, 0.0, 1)}
    assert sum(s for s, _, _ in shares.values()) == 20.0 - 0.0 - 1.0


def test_serial_kernels_share_their_own_time(critical_shares: Shares) -> None:
    """Without overlap (no dependent launch) a kernel's share is its own time."""
    spans = [("x", 0.0, 2.0), ("y", 2.5, 4.0), ("x", 4.0, 7.0)]
    assert critical_shares(spans) == {"x": (5.0, 0.0, 2), "y": (1.5, 0.0, 1)}


def test_whole_row_configs_change_only_their_product() -> None:
    """``o-whole*`` give the output projection (2048 x 4096 on the 30B-A3B) one tile of
    all its columns and leave q/k/v, the router and the LM head as by default;
    ``qkv-whole`` gives bf16 q/k/v whole rows and leaves int8 q/k/v and o."""
    from flint.graphs import fused

    ns = runpy.run_path(str(STEP_AB))
    configs = ns["CONFIGS"]
    shapes = {"qkv": (5120, 2048), "o": (2048, 4096), "router": (128, 2048), "head": (151936, 2048)}
    for name, want in (("o-whole-1", (1, 1)), ("o-whole-2", (2, 2)), ("o-whole", (1, 2))):
        block = configs[name]["fused.linear_block"]
        for int8, rows in ((False, want[0]), (True, want[1])):
            assert block(*shapes["o"], int8) == (rows, 4096, 4)
            for other in ("qkv", "router", "head"):
                assert block(*shapes[other], int8) == fused.linear_block(*shapes[other], int8)
    block = configs["qkv-whole"]["fused.linear_block"]
    assert block(*shapes["qkv"], False) == (2, 2048, 4)
    for shape, int8 in ((shapes["qkv"], True), (shapes["o"], False), (shapes["head"], False)):
        assert block(*shape, int8) == fused.linear_block(*shape, int8)
