"""Hypothesis-generated bad (and sometimes good) requests never produce a 500."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.server.live import LiveServer
from tests.server.scripted import ScriptedBackend

_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
)
_json = st.recursive(
    _scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
_message = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "system", "assistant", "tool", "bot"]) | _json},
    optional={"content": st.text(max_size=30) | _json, "tool_calls": _json, "name": _json},
)
_fields = {
    "messages": st.lists(_message, max_size=3) | _json,
    "prompt": st.text(max_size=30) | st.lists(st.integers(-5, 400), max_size=5) | _json,
    "max_tokens": st.integers(-3, 5000) | _json,
    "n_predict": st.integers(-3, 5000) | _json,
    "temperature": st.floats() | _json,
    "top_p": st.floats() | _json,
    "top_k": st.integers(-3, 100) | _json,
    "stop": st.lists(st.text(max_size=3), max_size=6) | _json,
    "stream": st.booleans() | _json,
    "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}) | _json,
    "tools": _json,
    "tool_choice": st.sampled_from(["auto", "none", "required"]) | _json,
    "logprobs": st.booleans() | st.integers(-1, 30) | _json,
    "top_logprobs": st.integers(-1, 30) | _json,
    "n_probs": st.integers(-1, 30) | _json,
    "seed": st.integers(-(2**65), 2**65) | _json,
    "chat_template_kwargs": _json,
    "n": st.integers(0, 3) | _json,
}
_bodies = st.fixed_dictionaries({}, optional=_fields)
_paths = st.sampled_from(["/v1/chat/completions", "/v1/completions", "/completion"])


def _check(r: httpx.Response) -> None:
    assert r.status_code < 500, r.text
    if r.status_code >= 400:
        err = r.json()["error"]
        assert isinstance(err["message"], str) and {"type", "param", "code"} <= set(err)


@pytest.mark.slow
@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(path=_paths, body=_bodies)
def test_random_bodies_never_500(
    scripted: LiveServer, backend: ScriptedBackend, path: str, body: dict[str, Any]
) -> None:
    content = json.dumps(body)  # NaN / Infinity stay in, as Python clients send them
    r = httpx.post(
        scripted.url + path,
        content=content,
        timeout=30,
        headers={"content-type": "application/json"},
    )
    _check(r)


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(path=_paths, raw=st.binary(max_size=64) | st.text(max_size=64).map(str.encode))
def test_random_bytes_never_500(
    scripted: LiveServer, backend: ScriptedBackend, path: str, raw: bytes
) -> None:
    _check(httpx.post(scripted.url + path, content=raw, timeout=30))
