"""flint._core.IoEngine from Python: exact bytes, GIL-free waits, fallback, errors."""

from __future__ import annotations

import ctypes
import itertools
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from flint import _core
from flint.format import FtwFile, FtwFileWriter


def _bytes_at(address: int, n: int) -> bytes:
    return ctypes.string_at(address, n)


def _model(path: Path, experts: int = 16, rows: int = 256) -> Path:
    """One MoE layer of `experts` distinct bf16 experts (rows x 1024 projections)."""
    g = torch.Generator().manual_seed(0)
    with FtwFileWriter(path) as w:
        w.add_tensor("x", torch.zeros(1))
        w.begin_experts(1, experts, "raw", "bf16", 0, ((rows, 1024), (rows, 1024), (1024, rows)))
        for e in range(experts):
            projs = [torch.randn(*s, generator=g).bfloat16() for s in ((rows, 1024),) * 2]
            projs.append(torch.randn(1024, rows, generator=g).bfloat16())
            w.add_expert(0, e, projs)
        w.finish({"arch": "test"})
    return path


def test_placed_experts_hold_the_file_bytes(tmp_path: Path) -> None:
    path = _model(tmp_path / "m.ftw")
    f = FtwFile(path)
    eng = _core.IoEngine(str(path), [0], 4, workers=2)
    assert eng.mode == "direct"
    for token, selected in enumerate([[3, 7], [7, 9], [9, 1, 2, 4]]):
        eng.begin_layer(0, selected)
        for expert, _slot, address, _hit in eng.place(0, selected):
            assert eng.wait(0, expert) == address
            want = f.expert_slab(0, expert).numpy().tobytes()
            assert _bytes_at(address, len(want)) == want, (token, expert)
        eng.unpin(0, selected)
        eng.tick()
    st = eng.stats()
    assert st["hits"] == 2 and st["demands"] == 6, st  # 7 hits in token 1, 9 in token 2


def test_predictions_are_read_ahead(tmp_path: Path) -> None:
    path = _model(tmp_path / "m.ftw")
    eng = _core.IoEngine(str(path), [0], 6)
    eng.predict([(0, e, 1, r) for r, e in enumerate([5, 6, 8])])
    assert eng.wait_idle(10.0)
    assert eng.begin_layer(0, [6, 8, 11]) == (0, 0)
    placed = eng.place(0, [6, 8, 11])
    assert [p[3] for p in placed] == [True, True, False]
    assert eng.stats()["bound"] == 3


def test_waits_release_the_gil(tmp_path: Path) -> None:
    path = _model(tmp_path / "m.ftw", experts=32, rows=512)
    eng = _core.IoEngine(str(path), [0], 32, workers=1)

    def reads() -> None:
        eng.begin_layer(0, list(range(32)))
        for expert, *_ in eng.place(0, list(range(32))):
            eng.wait(0, expert)

    stamps: list[float] = []
    th = threading.Thread(target=reads)
    start = time.perf_counter()
    th.start()
    while th.is_alive():
        stamps.append(time.perf_counter())
    busy = time.perf_counter() - start
    th.join()
    stalled = sum(g for a, b in itertools.pairwise(stamps) if (g := b - a) > 0.02)
    assert eng.stats()["demands"] == 32
    assert stalled < 0.5 * busy, (stalled, busy)


def test_refused_direct_io_falls_back_with_exactly_one_line(tmp_path: Path) -> None:
    path = _model(tmp_path / "m.ftw", experts=2)
    code = (
        "from flint import _core; import sys;"
        f"e = _core.IoEngine({str(path)!r}, [0], 2, workers=4);"
        "e.begin_layer(0, [1]); e.place(0, [1]); e.wait(0, 1); print(e.mode)"
    )
    env = {"FLINT_IO_REFUSE_DIRECT": "1", "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "buffered"
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "refuses direct I/O" in lines[0], out.stderr


def test_corrupt_expert_raises_checksum_error_naming_it(tmp_path: Path) -> None:
    path = _model(tmp_path / "m.ftw", experts=4)
    off = FtwFile(path).experts()[2][2]
    data = bytearray(path.read_bytes())
    data[off + 100] ^= 0xFF
    path.write_bytes(bytes(data))
    eng = _core.IoEngine(str(path), [0], 2)
    eng.begin_layer(0, [2])
    eng.place(0, [2])
    with pytest.raises(_core.ChecksumError, match="expert 2 of layer 0"):
        eng.wait(0, 2)
    with pytest.raises(KeyError):
        eng.wait(0, 3)
    with pytest.raises(ValueError, match="proj"):
        eng.wait(0, 2, proj=5)
