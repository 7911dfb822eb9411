"""Tool calls and reasoning through the live server with fixed model output, read
with the openai SDK (its own stream helpers assemble the tool call)."""

from __future__ import annotations

import json

import openai

from tests.server.scripted import ScriptedBackend

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
ASK = [{"role": "user", "content": "Weather in Tokyo?"}]
CALL_SCRIPT = [
    "I'll check.",
    "\n<tool_call>",
    '\n{"name": "get_weather", ',
    '"arguments": {"city": "Tok',
    'yo"}}\n',
    "</tool_call>",
]


def test_tool_call_non_streaming(sclient: openai.OpenAI, backend: ScriptedBackend) -> None:
    backend.script = CALL_SCRIPT
    out = sclient.chat.completions.create(model="m", messages=ASK, tools=TOOLS)
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "I'll check."
    calls = choice.message.tool_calls or []
    assert len(calls) == 1 and calls[0].type == "function" and calls[0].id.startswith("call_")
    assert calls[0].function.name == "get_weather"  # type: ignore[union-attr]
    assert json.loads(calls[0].function.arguments) == {"city": "Tokyo"}  # type: ignore[union-attr]
    assert '"name": "get_weather"' in backend.prompts[-1]  # tools reached the template


def test_tool_call_streaming_with_sdk_helper(
    sclient: openai.OpenAI, backend: ScriptedBackend
) -> None:
    backend.script = [
        *CALL_SCRIPT,
        "\n<tool_call>",
        '{"name": "get_weather", "arguments": {"city": "Paris"}}',
        "</tool_call>",
    ]
    client = sclient
    with client.chat.completions.stream(model="m", messages=ASK, tools=TOOLS) as stream:
        for _ in stream:
            pass
        final = stream.get_final_completion()
    choice = final.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == "I'll check."
    calls = choice.message.tool_calls or []
    assert [json.loads(c.function.arguments) for c in calls] == [  # type: ignore[union-attr]
        {"city": "Tokyo"},
        {"city": "Paris"},
    ]
    # the raw deltas follow OpenAI's rules
    deltas = [
        c.choices[0].delta
        for c in client.chat.completions.create(model="m", messages=ASK, tools=TOOLS, stream=True)
        if c.choices
    ]
    tool_deltas = [t for d in deltas for t in (d.tool_calls or [])]
    assert all(isinstance(t.index, int) for t in tool_deltas)
    for index in (0, 1):
        mine = [t for t in tool_deltas if t.index == index]
        assert mine[0].id and mine[0].type == "function" and mine[0].function.name
        assert all(t.id is None and t.type is None for t in mine[1:])
        assert all(t.function.name is None for t in mine[1:])


def test_tool_choice_none_gives_text(sclient: openai.OpenAI, backend: ScriptedBackend) -> None:
    backend.script = CALL_SCRIPT
    out = sclient.chat.completions.create(model="m", messages=ASK, tools=TOOLS, tool_choice="none")
    assert out.choices[0].finish_reason == "stop" and not out.choices[0].message.tool_calls
    assert "<tool_call>" in (out.choices[0].message.content or "")
    assert "# Tools" not in backend.prompts[-1]


def test_tool_result_reaches_the_template(sclient: openai.OpenAI, backend: ScriptedBackend) -> None:
    messages = [
        *ASK,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Tokyo"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 21}'},
    ]
    sclient.chat.completions.create(model="m", messages=messages, tools=TOOLS)  # type: ignore[arg-type]
    prompt = backend.prompts[-1]
    assert (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Tokyo"}}\n</tool_call>'
        in prompt
    )
    assert '<tool_response>\n{"temp": 21}\n</tool_response>' in prompt


def test_reasoning_content(sclient: openai.OpenAI, backend: ScriptedBackend) -> None:
    backend.script = ["<think>", "\nThe user", " asks.\n", "</think>", "\n\nSunny", "."]
    client = sclient
    out = client.chat.completions.create(model="m", messages=ASK)
    message = out.choices[0].message
    assert message.content == "Sunny." and message.model_extra is not None
    assert message.model_extra["reasoning_content"] == "The user asks."
    chunks = list(client.chat.completions.create(model="m", messages=ASK, stream=True))
    got = {"content": "", "reasoning_content": ""}
    for c in chunks:
        delta = c.choices[0].delta
        got["content"] += delta.content or ""
        got["reasoning_content"] += (delta.model_extra or {}).get("reasoning_content") or ""
    assert got == {"content": "Sunny.", "reasoning_content": "The user asks."}


def test_enable_thinking_false_reaches_template(
    sclient: openai.OpenAI, backend: ScriptedBackend
) -> None:
    sclient.chat.completions.create(
        model="m", messages=ASK, extra_body={"chat_template_kwargs": {"enable_thinking": False}}
    )
    assert backend.prompts[-1].endswith("<think>\n\n</think>\n\n")


def test_no_chat_template(sclient: openai.OpenAI, backend: ScriptedBackend) -> None:
    backend.chat_template = None
    client = sclient
    try:
        client.chat.completions.create(model="m", messages=ASK)
        raise AssertionError("expected a 400")
    except openai.BadRequestError as err:
        assert err.status_code == 400 and "no chat template" in err.message
    assert client.completions.create(model="m", prompt="hi").choices[0].text == "Hello world!"
