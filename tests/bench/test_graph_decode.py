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
