"""Bad requests get the right status in OpenAI's error envelope, and the server
keeps serving; the API key guards everything but /health and /v1/models."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from flint.server import ServerConfig, create_app
from tests.server.live import LiveServer
from tests.server.scripted import ScriptedBackend

MSG = [{"role": "user", "content": "hi"}]
CHAT, CMPL, LLAMA = "/v1/chat/completions", "/v1/completions", "/completion"
BIG_TOOL = {"type": "function", "function": {"name": "f", "description": "x" * 70_000}}

CASES: list[tuple[str, Any, int, str | None]] = [
    (CHAT, {}, 400, "messages"),
    (CHAT, {"messages": []}, 400, "messages"),
    (CHAT, {"messages": [{"role": "wizard", "content": "x"}]}, 400, "messages.0.role"),
    (CHAT, {"messages": [{"role": "user"}]}, 400, "messages.0"),
    (CHAT, {"messages": MSG, "temperature": 2.5}, 400, "temperature"),
    (CHAT, {"messages": MSG, "temperature": -0.1}, 400, "temperature"),
    (
        CHAT,
        '{"messages": [{"role": "user", "content": "x"}], "temperature": NaN}',
        400,
        "temperature",
    ),
    (CHAT, '{"messages": [{"role": "user", "content": "x"}], "top_p": Infinity}', 400, "top_p"),
    (CHAT, {"messages": MSG, "top_p": 1.01}, 400, "top_p"),
    (CHAT, {"messages": MSG, "top_k": -1}, 400, "top_k"),
    (CHAT, {"messages": MSG, "max_tokens": 0}, 400, "max_tokens"),
    (CHAT, {"messages": MSG, "max_tokens": 5000}, 400, "max_tokens"),
    (CHAT, {"messages": MSG, "max_tokens": "ten"}, 400, "max_tokens"),
    (CHAT, {"messages": MSG, "n": 2}, 400, "n"),
    (CHAT, {"messages": MSG, "seed": 2**64}, 400, "seed"),
    (CHAT, {"messages": MSG, "stop": ["a", "b", "c", "d", "e"]}, 400, "stop"),
    (CHAT, {"messages": MSG, "stop": [""]}, 400, "stop"),
    (CHAT, {"messages": MSG, "tools": [BIG_TOOL]}, 400, "tools"),
    (
        CHAT,
        {"messages": MSG, "tools": [{"type": "function", "function": {"name": "a b"}}]},
        400,
        "tools.0.function.name",
    ),
    (CHAT, {"messages": MSG, "tool_choice": "required"}, 400, "tool_choice"),
    (CHAT, {"messages": MSG, "top_logprobs": 2}, 400, None),
    (CHAT, {"messages": MSG, "stream_options": {"include_usage": True}}, 400, None),
    (CHAT, {"messages": MSG, "logit_bias": {"5": 1.0}}, 400, "logit_bias"),
    (CHAT, {"messages": MSG, "response_format": {"type": "json_object"}}, 400, "response_format"),
    (CHAT, "{not json", 400, None),
    (CHAT, "[1, 2]", 400, None),
    (CHAT, "[" * 100_000, 400, None),
    (CMPL, {"prompt": [1, 2, 999]}, 400, "prompt"),
    (CMPL, {"prompt": [1, -2]}, 400, "prompt"),
    (CMPL, {"prompt": ""}, 400, "prompt"),
    (CMPL, {"prompt": ["a", "b"]}, 400, "prompt"),
    (CMPL, {"prompt": "x", "logprobs": 21}, 400, "logprobs"),
    (CMPL, {"prompt": "x", "echo": True}, 400, None),
    (LLAMA, {"prompt": "x", "n_predict": -2}, 400, "n_predict"),
    (LLAMA, {"prompt": "x", "stop": ["1", "2", "3", "4", "5"]}, 400, "stop"),
    (LLAMA, {"prompt": [400]}, 400, "prompt"),
]


def _post(url: str, body: Any, headers: dict[str, str] | None = None) -> httpx.Response:
    content = body if isinstance(body, str | bytes) else json.dumps(body)
    headers = {"content-type": "application/json", **(headers or {})}
    return httpx.post(url, content=content, headers=headers, timeout=30)


def assert_envelope(r: httpx.Response, status: int) -> dict[str, Any]:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"}
    err = body["error"]
    assert {"message", "type", "param", "code"} <= set(err)
    assert isinstance(err["message"], str) and err["message"]
    return dict(err)


@pytest.mark.parametrize(("path", "body", "status", "param"), CASES)
def test_bad_request(
    scripted: LiveServer,
    backend: ScriptedBackend,
    path: str,
    body: Any,
    status: int,
    param: str | None,
) -> None:
    err = assert_envelope(_post(scripted.url + path, body), status)
    assert err["param"] == param
    assert httpx.get(scripted.url + "/health").json() == {"status": "ok"}


def test_context_overflow(scripted: LiveServer, backend: ScriptedBackend) -> None:
    for path in (CMPL, LLAMA):
        err = assert_envelope(_post(scripted.url + path, {"prompt": [5] * 4096}), 400)
        assert err["type"] == "exceed_context_size_error"
        assert err["n_prompt_tokens"] == 4096 and err["n_ctx"] == 4096
        assert "This model's maximum context length is 4096 tokens" in err["message"]


def test_body_cap(scripted: LiveServer, backend: ScriptedBackend) -> None:
    big = {"prompt": "x" * (5 << 20)}
    assert_envelope(_post(scripted.url + CMPL, big), 413)
    assert _post(scripted.url + CMPL, {"prompt": "x"}).status_code == 200


def test_unknown_route_and_method(scripted: LiveServer) -> None:
    assert_envelope(httpx.get(scripted.url + "/v1/nothing"), 404)
    assert_envelope(httpx.get(scripted.url + CHAT), 405)


@pytest.fixture(scope="module")
def keyed(scripted_backend: ScriptedBackend) -> Iterator[LiveServer]:
    app = create_app(ServerConfig("k", api_key="sekret"), scripted_backend)
    with LiveServer(app) as server:
        yield server


def test_api_key(keyed: LiveServer, backend: ScriptedBackend) -> None:
    assert httpx.get(keyed.url + "/health").status_code == 200
    assert httpx.get(keyed.url + "/v1/models").status_code == 200
    for path in (CHAT, CMPL, LLAMA):
        for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": "sekret"}):
            err = assert_envelope(_post(keyed.url + path, {"prompt": "x"}, headers), 401)
            assert err["code"] == "invalid_api_key"
    assert_envelope(httpx.get(keyed.url + "/metrics"), 401)
    ok = _post(keyed.url + CMPL, {"prompt": "x"}, {"authorization": "Bearer sekret"})
    assert ok.status_code == 200 and ok.json()["choices"][0]["text"] == "Hello world!"
