"""Chat prompts: text and token ids equal transformers' ``apply_chat_template``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tiny import QWEN3_TEMPLATE

from flint.chat_template import render_chat
from flint.tokenizer import Tokenizer

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city — °C",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
TOOL_ROUND_TRIP: list[dict[str, Any]] = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Weather in Tokyo?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "type": "function",
                "function": {"name": "get_weather", "arguments": {"city": "Tokyo"}},
            }
        ],
    },
    {"role": "tool", "content": '{"temp": 21}'},
]
CASES: list[tuple[str, list[dict[str, Any]], dict[str, Any]]] = [
    ("plain", [{"role": "user", "content": "Hello! 日本語 too"}], {}),
    (
        "system_and_history",
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "<think>\nsaying hi\n</think>\n\nHello!"},
            {"role": "user", "content": "Bye"},
        ],
        {},
    ),
    ("tools", [{"role": "user", "content": "Weather in Tokyo?"}], {"tools": [WEATHER_TOOL]}),
    ("tool_round_trip", TOOL_ROUND_TRIP, {"tools": [WEATHER_TOOL], "enable_thinking": False}),
    (
        "reasoning_field",
        [
            {"role": "user", "content": "2+2?"},
            {"role": "assistant", "content": "4", "reasoning_content": "add"},
            {"role": "user", "content": "and 3+3?"},
            {"role": "assistant", "content": "6", "reasoning_content": None},
        ],
        {"add_generation_prompt": False},
    ),
]


@pytest.fixture(scope="module")
def tokenizers(tiny_models: dict[str, Any]) -> tuple[Tokenizer, Any]:
    from transformers import AutoTokenizer

    path: Path = tiny_models["qwen3_moe"][0]
    ours = Tokenizer(
        (path / "tokenizer.json").read_text(),
        chat_template=QWEN3_TEMPLATE.resolve().read_text(),
        special_tokens={"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
    )
    return ours, AutoTokenizer.from_pretrained(path)


@pytest.mark.parametrize(("name", "messages", "kwargs"), CASES, ids=[c[0] for c in CASES])
def test_chat_matches_transformers(
    tokenizers: tuple[Tokenizer, Any],
    name: str,
    messages: list[dict[str, Any]],
    kwargs: dict[str, Any],
) -> None:
    ours, theirs = tokenizers
    kwargs = {"add_generation_prompt": True, **kwargs}
    want_text = theirs.apply_chat_template(messages, tokenize=False, **kwargs)
    want_ids = theirs.apply_chat_template(messages, tokenize=True, return_dict=False, **kwargs)
    assert ours.render_chat(messages, **kwargs) == want_text
    assert ours.encode_chat(messages, **kwargs) == list(want_ids)
    assert "<|im_start|>" in want_text


def test_tool_round_trip_text_is_the_documented_one(tokenizers: tuple[Tokenizer, Any]) -> None:
    text = tokenizers[0].render_chat(TOOL_ROUND_TRIP, tools=[WEATHER_TOOL], enable_thinking=False)
    assert '"description": "Current weather in a city — °C"' in text  # no ASCII escapes
    assert text.endswith(
        "<|im_start|>assistant\n<tool_call>\n"
        '{"name": "get_weather", "arguments": {"city": "Tokyo"}}\n'
        "</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n"
        '{"temp": 21}\n</tool_response><|im_end|>\n'
        "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )
    # special tokens are encoded once, as single ids
    ids = tokenizers[0].encode_chat(TOOL_ROUND_TRIP, tools=[WEATHER_TOOL])
    im_start = tokenizers[0].token_to_id("<|im_start|>")
    assert ids.count(im_start) == 5


def test_template_helpers_and_errors() -> None:
    template = (
        "{% for m in messages %}{% if m.role == 'bad' %}{{ raise_exception('no bad') }}{% endif %}"
        "{{ m.content | tojson }}{% if loop.index == 1 %}{% break %}{% endif %}{% endfor %}"
        "{{ strftime_now('%Y') | length }}{{ bos_token }}"
    )
    out = render_chat(
        template,
        [{"role": "u", "content": "é"}, {"role": "u", "content": "x"}],
        special_tokens={"bos_token": "<s>"},
    )
    assert out == '"é"4<s>'
    with pytest.raises(ValueError, match="no bad"):
        render_chat(template, [{"role": "bad", "content": ""}])
    with pytest.raises(ValueError, match="list of"):
        render_chat(template, "hello")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="role"):
        render_chat(template, [{"content": "no role"}])
    with pytest.raises(ValueError, match="chat template"):
        Tokenizer(_word_level_json()).render_chat([{"role": "user", "content": "x"}])


def _word_level_json() -> str:
    from tokenizers import Tokenizer as HF
    from tokenizers.models import WordLevel

    return str(HF(WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]")).to_str())
