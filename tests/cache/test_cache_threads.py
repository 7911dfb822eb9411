"""Replay runs without the GIL: another Python thread keeps running meanwhile."""

from __future__ import annotations

import threading
import time

import numpy as np

from flint import _core


def test_replay_releases_the_gil() -> None:
    rng = np.random.default_rng(0)
    # [T=20000, L=8, K=8] over 128 experts: a replay of a few hundred milliseconds.
    experts = np.argsort(rng.random((20000, 8, 128)), axis=2)[:, :, :8].astype("<i2")
    data = experts.tobytes()
    window: list[float] = []

    def work() -> None:
        start = time.perf_counter()
        _core.replay(data, 20000, 8, 8, 128, 16, "decay")
        window.extend([start, time.perf_counter()])

    thread = threading.Thread(target=work)
    beats: list[float] = []
    thread.start()
    while thread.is_alive():
        beats.append(time.perf_counter())
        time.sleep(0.001)
    thread.join()
    start, end = window
    inside = [b for b in beats if start < b < end]
    # Holding the GIL for the whole call would leave no beat strictly inside it.
    assert end - start > 0.05 and len(inside) >= 5, (end - start, len(inside))
