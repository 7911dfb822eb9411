"""One generation at a time: 429 with Retry-After when the queue is full, a client
that disconnects frees the model at once, 503 while loading, and a bounded soak."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack

import httpx
import openai
import psutil
import pytest

from flint.server import ServerConfig, create_app
from tests.server.conftest import sdk
from tests.server.live import LiveServer
from tests.server.scripted import ScriptedBackend

BODY = {"messages": [{"role": "user", "content": "hi"}], "stream": True}


def _metric(url: str, name: str) -> float:
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise KeyError(name)


def _wait_until(check: object, timeout: float = 3.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def _open_stream(stack: ExitStack, http: httpx.Client, url: str) -> Iterator[str]:
    r = stack.enter_context(http.stream("POST", url + "/v1/chat/completions", json=BODY))
    assert r.status_code == 200
    return r.iter_lines()


def test_queue_full_then_disconnects_free_the_model(
    scripted: LiveServer, backend: ScriptedBackend
) -> None:
    backend.script, backend.delay_s = ["tok"] * 2000, 0.02  # 40 s unless cancelled
    url = scripted.url
    with ExitStack() as stack:
        clients = [stack.enter_context(httpx.Client(timeout=10)) for _ in range(3)]
        running = _open_stream(stack, clients[0], url)
        assert next(line for line in running if line.startswith("data:"))
        for c in clients[1:]:  # max_waiting=2: both wait
            _open_stream(stack, c, url)
        _wait_until(lambda: _metric(url, "flint_queue_depth") == 2)
        refused = httpx.post(url + "/v1/chat/completions", json=BODY)
        assert refused.status_code == 429 and int(refused.headers["retry-after"]) >= 1
        assert refused.json()["error"]["type"] == "rate_limit_error"
    # all three clients are gone: the running job stops at its next token, the
    # waiting ones are skipped, and a new request starts immediately
    _wait_until(lambda: _metric(url, "flint_requests_processing") == 0)
    assert _metric(url, "flint_queue_depth") == 0
    backend.script, backend.delay_s = ["done"], 0.0
    t0 = time.monotonic()
    r = httpx.post(url + "/v1/chat/completions", json={**BODY, "stream": False}, timeout=5)
    assert r.json()["choices"][0]["message"]["content"] == "done"
    assert time.monotonic() - t0 < 1.0
    assert _metric(url, "flint_requests_cancelled_total") >= 3


def test_disconnect_stops_a_real_generation(live: LiveServer) -> None:
    body = {"prompt": "def", "max_tokens": 120, "ignore_eos": True, "stream": True}
    with (
        httpx.Client(timeout=10) as http,
        http.stream("POST", live.url + "/v1/completions", json=body) as r,
    ):
        assert next(line for line in r.iter_lines() if line.startswith("data:"))
    _wait_until(lambda: _metric(live.url, "flint_requests_processing") == 0)
    with sdk(live) as client:
        out = client.completions.create(model="tiny", prompt="def", max_tokens=3)
    assert out.usage is not None and out.usage.completion_tokens <= 3


def test_health_is_503_while_loading(backend: ScriptedBackend) -> None:
    app = create_app(ServerConfig("loading"))
    with LiveServer(app) as server:
        r = httpx.get(server.url + "/health")
        assert r.status_code == 503 and r.json()["error"]["message"] == "Loading model"
        assert httpx.post(server.url + "/v1/completions", json={"prompt": "x"}).status_code == 503
        assert httpx.get(server.url + "/v1/models").json()["data"][0]["id"] == "loading"
        app.state.flint.attach(backend)
        assert httpx.get(server.url + "/health").json() == {"status": "ok"}


def _soak_client(url: str, n: int, seed: int) -> int:
    ok = 0
    with openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=60) as c:
        for i in range(n):
            if (i + seed) % 2:
                out = c.chat.completions.create(
                    model="tiny", max_tokens=4, messages=[{"role": "user", "content": f"hi {i}"}]
                )
                ok += out.choices[0].finish_reason in ("stop", "length")
            else:
                chunks = list(
                    c.completions.create(model="tiny", prompt=f"n{i}", max_tokens=4, stream=True)
                )
                ok += chunks[-1].choices[0].finish_reason in ("stop", "length")
    return ok


@pytest.mark.slow
def test_soak_200_requests_8_clients(live: LiveServer) -> None:
    proc = psutil.Process(os.getpid())
    _soak_client(live.url, 8, 0)  # warm up
    rss0 = proc.memory_info().rss
    with ThreadPoolExecutor(8) as pool:
        done = list(pool.map(lambda k: _soak_client(live.url, 25, k), range(8)))
    assert sum(done) == 200
    assert _metric(live.url, "flint_queue_depth") == 0
    growth = (proc.memory_info().rss - rss0) / 2**20
    assert growth < 64, f"RSS grew by {growth:.0f} MiB over 200 requests"
    assert threading.active_count() < 50


def test_expert_cache_counters_are_exported(scripted: LiveServer, backend: ScriptedBackend) -> None:
    assert "flint_expert_cache" not in httpx.get(scripted.url + "/metrics").text
    backend.stats = {"hit_rate": 0.5, "stall seconds": 1.25}
    text = httpx.get(scripted.url + "/metrics").text
    assert "flint_expert_cache_hit_rate 0.5" in text
    assert "flint_expert_cache_stall_seconds 1.25" in text


def test_non_streaming_client_that_leaves_frees_the_model(
    scripted: LiveServer, backend: ScriptedBackend
) -> None:
    backend.script, backend.delay_s = ["tok"] * 2000, 0.02
    body = {"prompt": "x", "max_tokens": 2000}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(scripted.url + "/v1/completions", json=body, timeout=0.5)
    _wait_until(lambda: _metric(scripted.url, "flint_requests_processing") == 0)
