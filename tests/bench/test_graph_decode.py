"""benches/graph_decode.py without a GPU: its arguments."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

import pytest

GRAPH_DECODE = Path(__file__).parents[2] / "benches" / "graph_decode.py"


def test_early_kernels_must_be_known(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--early-kernels`` takes only names of ``moe_kernel.EARLY_NAMES`` (never gate/up,
    whose reads ahead need the top-k's wait), refused before anything loads."""
    main = runpy.run_path(str(GRAPH_DECODE))["main"]
    for names in ("gate_up", "norm,nope"):
        monkeypatch.setattr(sys, "argv", ["graph_decode.py", "m.ftw", "--early-kernels", names])
        with pytest.raises(SystemExit) as raised:
            main()
        assert raised.value.code == 2
        assert "--early-kernels: not in" in capsys.readouterr().err


def test_route_ranks_must_name_a_mode_and_warps(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--route-ranks MODE,WARPS`` takes mode 1 or 2 on 1, 2, 4 or 8 warps (or ``off``),
    refused before anything loads otherwise."""
    main = runpy.run_path(str(GRAPH_DECODE))["main"]
    for value, says in (("2", "two integers"), ("x,1", "two integers"), ("3,1", "MODE 1 or 2")):
        monkeypatch.setattr(sys, "argv", ["graph_decode.py", "m.ftw", "--route-ranks", value])
        with pytest.raises(SystemExit) as raised:
            main()
        assert raised.value.code == 2
        assert says in capsys.readouterr().err
    monkeypatch.setattr(sys, "argv", ["graph_decode.py", "m.ftw", "--route-ranks", "2,3"])
    with pytest.raises(SystemExit):
        main()
    assert "WARPS 1, 2, 4 or 8" in capsys.readouterr().err


def test_early_kernels_none_starts_no_kernel_early(monkeypatch: pytest.MonkeyPatch) -> None:
    """``--early-kernels none``: no kernel lets the next start before its wait (the A/B
    against a set), accepted by the parser."""
    from flint.graphs import moe_kernel

    main = runpy.run_path(str(GRAPH_DECODE))["main"]
    monkeypatch.setattr(moe_kernel, "EARLY", frozenset({"route"}))
    monkeypatch.setattr(sys, "argv", ["graph_decode.py", "m.ftw", "--early-kernels", "none"])
    with pytest.raises(Exception) as raised:  # past the parser: no GPU or no file here
        main()
    assert not isinstance(raised.value, SystemExit)
    assert not moe_kernel.EARLY
