"""``benches/step_ab.py``'s stream shares (``critical_shares``): under dependent launch
a kernel of the step starts before the one before it has ended, so a profile's kernel
times overlap; each kernel's share is what it adds to the stream's time. And a
block-shape configuration: it changes the product it names and no other."""

from __future__ import annotations

import runpy
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

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


def test_qkv_tiles_config_changes_only_bf16_qkv(monkeypatch: pytest.MonkeyPatch) -> None:
    """``qkv-tiles`` gives bf16 q/k/v (5120 x 2048 on the 30B-A3B) the block of before
    gpu130 and leaves int8 q/k/v, o, the router and the LM head as by default, where
    bf16 q/k/v is two whole rows a program read before the wait; ``QKV_AFTER_WAIT``
    makes it four read after, and changes no other product."""
    from flint.graphs import fused

    config = runpy.run_path(str(STEP_AB))["CONFIGS"]["qkv-tiles"]
    block = config["fused.linear_block"]
    qkv, o, router, head = (5120, 2048), (2048, 4096), (128, 2048), (151936, 2048)
    assert fused.linear_block(*qkv, False) == (2, 2048, 4)
    assert fused.first_tile_ahead(*qkv, False)
    assert config["fused.QKV_AFTER_WAIT"] is False
    assert block(*qkv, False) == (4, 512, 4)
    others = ((qkv, True), (o, False), (o, True), (router, False), (router, True), (head, False))
    for shape, int8 in (*others, ((1024, 512), False), ((3000, 4096), False)):
        assert block(*shape, int8) == fused.linear_block(*shape, int8)
        assert fused.first_tile_ahead(*shape, int8)
    before = {(shape, int8): fused.linear_block(*shape, int8) for shape, int8 in others}
    monkeypatch.setattr(fused, "QKV_AFTER_WAIT", True)
    assert fused.linear_block(*qkv, False) == (4, 2048, 8)
    assert not fused.first_tile_ahead(*qkv, False)
    for shape, int8 in others:
        assert fused.first_tile_ahead(*shape, int8)
        assert fused.linear_block(*shape, int8) == before[shape, int8]


def test_timeline_of_one_layer() -> None:
    """Two replays of a two-layer step (two kernels before the first norm, then norm, x,
    y a layer, then the last norm): a layer's kernels timed from its norm's start, each
    adding its end less the later of its start and the latest end before it (kernel
    "a", not "b", for the first norm), averaged over the replays. Replays that launch
    different kernels, and a layer the step does not have, are errors."""
    timeline = runpy.run_path(str(STEP_AB))["timeline"]
    one = [
        ("a", 0.0, 30.0),
        ("b", 1.0, 3.0),
        ("rms_norm_kernel", 5.0, 12.0),
        ("x", 10.0, 20.0),
        ("y", 18.0, 35.0),
        ("rms_norm_kernel", 30.0, 40.0),
        ("x", 38.0, 50.0),
        ("y", 45.0, 47.0),
        ("rms_norm_kernel", 50.0, 55.0),
    ]
    second = [(n, s + 100.0, e + 100.0) for n, s, e in one]
    second[6] = ("x", 138.0, 152.0)  # layer 1's x ends 2 us later in the second replay
    spans = one + second
    rows = timeline(spans, 2, 0)
    assert [row["kernel"] for row in rows] == ["rms_norm_kernel", "x", "y"]
    assert [(r["start_us"], r["end_us"], r["adds_us"]) for r in rows] == [
        (0.0, 7.0, 0.0),
        (5.0, 15.0, 0.0),
        (13.0, 30.0, 5.0),
    ]
    rows = timeline(spans, 2, 1)
    assert [(r["start_us"], r["end_us"], r["adds_us"]) for r in rows] == [
        (0.0, 10.0, 5.0),
        (8.0, 21.0, 11.0),
        (15.0, 17.0, 0.0),
    ]
    with pytest.raises(SystemExit, match="2 layers"):
        timeline(spans, 2, 2)
    with pytest.raises(SystemExit, match="same kernels"):
        timeline(spans[:-1], 2, 0)
    with pytest.raises(SystemExit, match="same kernels"):
        timeline(one + [("z", *s[1:]) if s[0] == "y" else s for s in second], 2, 0)


def test_rounds_rotate_and_captures_summarise() -> None:
    """Each round starts one place later, so every capture is timed at every place of a
    round; a configuration's figure is the median of its captures' medians, with the
    rounds for one capture or each capture's median and their spread for several."""
    bench = runpy.run_path(str(STEP_AB))
    rotated, summary = bench["rotated"], bench["summary"]
    keys = [("a", 0), ("a", 1), ("b", 0)]
    orders = [rotated(keys, r) for r in range(4)]
    assert orders[0] == keys and orders[3] == keys
    assert [order.index(("b", 0)) for order in orders[:3]] == [2, 1, 0]
    assert sorted(orders[1]) == sorted(keys)
    one = summary([[1000.0, 1004.0, 1002.0]])
    assert one == {"us_per_step": 1002.0, "tok_s": 998.0, "rounds_us": [1000.0, 1004.0, 1002.0]}
    three = summary([[10.0, 12.0, 11.0], [20.0, 19.0, 18.0], [14.0, 16.0, 15.0]])
    assert three["us_per_step"] == 15.0
    assert three["captures_us"] == [11.0, 19.0, 15.0]
    assert three["capture_spread_us"] == 8.0
    assert "rounds_us" not in three


def test_main_times_every_capture_and_profiles_its_first(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``main`` without a GPU (the model, captures and timings faked): each configuration
    captured ``--captures`` times and a profiled-only one once, one JSON row a
    configuration with its captures' spread and the sweep's figures; bad arguments are
    errors before anything loads."""
    import json
    import sys
    import types

    main = runpy.run_path(str(STEP_AB))["main"]
    fakes = main.__globals__
    model = types.SimpleNamespace(experts=None, decoder=None)
    llm = types.SimpleNamespace(model=model, source=None)
    monkeypatch.setitem(fakes, "flint", types.SimpleNamespace(LLM=lambda *a, **k: _Context(llm)))
    monkeypatch.setitem(fakes, "expert_pools", lambda experts: {})
    made: list[dict[str, object]] = []

    def captured(*args: object) -> tuple[object, object]:
        made.append(args[3])  # type: ignore[arg-type]
        return types.SimpleNamespace(position=torch.zeros(1)), object()

    monkeypatch.setitem(fakes, "captured", captured)
    monkeypatch.setitem(fakes, "timed", lambda graph, replays: 1000.0)
    monkeypatch.setitem(fakes, "swept", lambda d, graph, sweep, tokens: 900.0)
    monkeypatch.setitem(fakes, "greedy_tokens", lambda d, graph, sweep: 128)
    profiled: list[int | None] = []
    monkeypatch.setitem(fakes, "kernels", lambda graph, replays, layer: profiled.append(layer))
    argv = ["step_ab.py", "m.ftw", "--configs", "base,qkv-after", "--captures", "3"]
    argv += ["--sweep", "64-191", "--profile", "o-late", "--timeline", "3"]
    monkeypatch.setattr(sys, "argv", argv)
    main()
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(made) == 7 and profiled == [3]
    assert rows[0] == {"profile": "o-late"}
    assert [r["config"] for r in rows[1:]] == ["base", "qkv-after"]
    assert rows[1]["captures_us"] == [1000.0] * 3 and rows[1]["capture_spread_us"] == 0.0
    assert rows[2]["sweep_us_per_step"] == 900.0 and rows[2]["sweep_distinct_tokens"] == 128
    for bad in (["--sweep", "191-64"], ["--sweep", "64-300"], ["--captures", "0"]):
        monkeypatch.setattr(sys, "argv", ["step_ab.py", "m.ftw", *bad])
        with pytest.raises(SystemExit):
            main()
    assert len(made) == 7


def test_processes_time_each_configuration_alone(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--processes N``: this script run once a configuration a process (faked), the
    order rotated each round, the model and its switches passed on; a row a process,
    then a configuration's median of its processes and their spread. What it cannot
    take, and a failed process, are errors."""
    import json
    import subprocess
    import sys

    main = runpy.run_path(str(STEP_AB))["main"]
    fakes = main.__globals__
    times = {"base": iter([1774.2, 1774.5, 1774.0]), "early-rn": iter([1795.1, 1795.3, 1796.0])}
    ran: list[list[str]] = []

    def run(command: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        ran.append(command)
        name = command[command.index("--configs") + 1]
        us = next(times[name], None)
        if us is None:  # a process that failed: no row, its error on stderr
            return subprocess.CompletedProcess(command, 1, "", "CUDA error")
        out = "loading\n" + json.dumps({"config": name, "us_per_step": us}) + "\n"
        return subprocess.CompletedProcess(command, 0, out, "")

    monkeypatch.setitem(fakes, "subprocess", type("S", (), {"run": staticmethod(run)}))
    monkeypatch.setitem(fakes, "flint", None)  # nothing loads in this process
    argv = ["step_ab.py", "m.ftw", "--configs", "base,early-rn", "--processes", "3"]
    monkeypatch.setattr(sys, "argv", [*argv, "--rounds", "2"])
    main()
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    order = [command[command.index("--configs") + 1] for command in ran]
    assert order == ["base", "early-rn", "early-rn", "base", "base", "early-rn"]
    assert all(c[2] == "m.ftw" and c[c.index("--rounds") + 1] == "2" for c in ran)
    assert [r["process"] for r in rows[:6]] == [0, 0, 1, 1, 2, 2]
    assert rows[6] == {
        "config": "base", "us_per_step": 1774.2, "tok_s": 563.6,
        "processes_us": [1774.2, 1774.5, 1774.0], "process_spread_us": 0.5,
    }  # fmt: skip
    assert rows[7]["us_per_step"] == 1795.3 and rows[7]["process_spread_us"] == 0.9
    for bad in (["--profile", "base"], ["--captures", "2"], ["--processes", "-1"]):
        monkeypatch.setattr(sys, "argv", [*argv, *bad])
        with pytest.raises(SystemExit):
            main()
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit, match="the process failed"):
        main()  # the fake's times have run out


class _Context:
    """A context manager that gives ``value``."""

    def __init__(self, value: object) -> None:
        self.value = value

    def __enter__(self) -> object:
        return self.value

    def __exit__(self, *exc: object) -> None:
        return None
