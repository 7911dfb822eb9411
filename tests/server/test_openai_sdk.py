"""The openai SDK against a live server running a tiny random model."""

from __future__ import annotations

import httpx
import openai

from tests.server.live import LiveServer

MSG = [{"role": "user", "content": "Weather in Tokyo?"}]


def test_health_and_models(live: LiveServer, client: openai.OpenAI) -> None:
    assert httpx.get(live.url + "/health").json() == {"status": "ok"}
    models = client.models.list()
    assert [m.id for m in models.data] == ["tiny"]


def test_chat(client: openai.OpenAI) -> None:
    out = client.chat.completions.create(
        model="tiny", messages=MSG, max_tokens=12, temperature=0, extra_body={"ignore_eos": True}
    )
    choice = out.choices[0]
    assert choice.finish_reason == "length" and choice.message.role == "assistant"
    assert isinstance(choice.message.content, str) and out.usage is not None
    assert out.usage.completion_tokens == 12
    assert out.usage.total_tokens == out.usage.prompt_tokens + 12
    extra = out.model_extra or {}
    assert extra["timings"]["predicted_n"] == 12 and extra["timings"]["predicted_per_second"] > 0
    assert extra["flint"]["queue_ms"] >= 0


def test_chat_stream_matches_plain(client: openai.OpenAI) -> None:
    args = {
        "model": "tiny",
        "messages": MSG,
        "max_tokens": 16,
        "temperature": 0,
        "extra_body": {"ignore_eos": True, "chat_template_kwargs": {"enable_thinking": False}},
    }
    whole = client.chat.completions.create(**args)
    chunks = list(
        client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **args)
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks[:-2]] == [None] * (len(chunks) - 2)
    assert chunks[-2].choices[0].finish_reason == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 16
    assert all(c.usage is None for c in chunks[:-1])
    text = "".join((c.choices[0].delta.content or "") for c in chunks[:-1])
    reasoning = "".join(
        (c.choices[0].delta.model_extra or {}).get("reasoning_content", "") for c in chunks[:-1]
    )
    message = whole.choices[0].message
    assert text == (message.content or "")
    assert reasoning == (message.model_extra or {}).get("reasoning_content", "")


def test_completions_plain_stream_and_logprobs(client: openai.OpenAI) -> None:
    args = {"model": "tiny", "prompt": "def main(argv):\n", "max_tokens": 10, "temperature": 0}
    whole = client.completions.create(logprobs=2, extra_body={"ignore_eos": True}, **args)
    choice = whole.choices[0]
    assert choice.finish_reason == "length" and choice.logprobs is not None
    assert len(choice.logprobs.token_logprobs or []) == 10
    assert "".join(choice.logprobs.tokens or []) == choice.text
    tops = choice.logprobs.top_logprobs or []
    assert all(
        len(t) <= 2 and max(t.values()) >= lp - 1e-4
        for t, lp in zip(tops, choice.logprobs.token_logprobs or [], strict=True)
    )
    stream = list(client.completions.create(stream=True, extra_body={"ignore_eos": True}, **args))
    assert "".join(c.choices[0].text for c in stream) == choice.text
    assert stream[-1].choices[0].finish_reason == "length"


def test_completions_token_ids_prompt(client: openai.OpenAI) -> None:
    out = client.completions.create(
        model="tiny", prompt=[5, 6, 7], max_tokens=3, extra_body={"ignore_eos": True}
    )
    assert out.usage is not None and out.usage.prompt_tokens == 3


def test_chat_logprobs(client: openai.OpenAI) -> None:
    out = client.chat.completions.create(
        model="tiny",
        messages=MSG,
        max_tokens=6,
        temperature=0,
        logprobs=True,
        top_logprobs=3,
        extra_body={"ignore_eos": True},
    )
    content = out.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content is not None and len(content) == 6
    for entry in content:
        assert len(entry.top_logprobs) == 3 and entry.logprob <= 0
        # greedy: the sampled token is the most likely one
        assert entry.top_logprobs[0].logprob == entry.logprob


def test_llama_cpp_completion(live: LiveServer) -> None:
    body = {
        "prompt": "import os\n",
        "n_predict": 8,
        "temperature": 0,
        "ignore_eos": True,
        "n_probs": 2,
    }
    out = httpx.post(live.url + "/completion", json=body, timeout=30).json()
    assert out["stop"] is True and out["stop_type"] == "limit"
    assert out["tokens_predicted"] == 8 and out["timings"]["predicted_n"] == 8
    assert len(out["completion_probabilities"]) == 8
    with httpx.stream("POST", live.url + "/completion", json={**body, "stream": True}) as r:
        events = [line for line in r.iter_lines() if line.startswith("data: ")]
    import json

    parts = [json.loads(e[6:]) for e in events]
    assert "".join(p["content"] for p in parts) == out["content"]
    assert [p["stop"] for p in parts][-1] is True and "[DONE]" not in events[-1]


def test_metrics(live: LiveServer, client: openai.OpenAI) -> None:
    client.completions.create(model="tiny", prompt="hi", max_tokens=2)
    text = httpx.get(live.url + "/metrics").text
    assert 'flint_requests_total{endpoint="completions"}' in text
    assert "flint_queue_depth 0" in text and "flint_tokens_predicted_total" in text
    assert "# TYPE flint_prompt_tokens_total counter" in text
