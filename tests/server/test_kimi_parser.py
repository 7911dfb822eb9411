"""Kimi K2's tool-call markup on fixed outputs, whole and streamed (the markup as its
official chat template writes it: ids ``functions.NAME:IDX`` kept as the call ids)."""

from __future__ import annotations

import itertools
import json

import pytest

from flint.sampling import SamplingParams
from flint.server.chat import ChatOutput, ChatSetup
from flint.server.tools import (
    KimiToolSyntax,
    QwenToolSyntax,
    ToolStream,
    detect_syntax,
    parse_tool_calls,
)

KIMI = KimiToolSyntax()
BEGIN, END = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"


def call(ident: str, args: str) -> str:
    return f"<|tool_call_begin|>{ident}<|tool_call_argument_begin|>{args}<|tool_call_end|>"


TWO = BEGIN + call("functions.get_weather:0", '{"city": "Paris"}')
TWO += call("functions.get_time:1", "{}") + END


def calls_of(text: str) -> tuple[str, list[tuple[str, str, object]]]:
    content, calls = parse_tool_calls(KIMI, text)
    return content, [(c.id, c.name, json.loads(c.arguments)) for c in calls]


def test_block_of_calls_keeps_the_model_ids() -> None:
    assert calls_of("Let me check." + TWO) == (
        "Let me check.",
        [
            ("functions.get_weather:0", "get_weather", {"city": "Paris"}),
            ("functions.get_time:1", "get_time", {}),
        ],
    )


def test_block_cut_off_by_the_end_of_output() -> None:
    text = BEGIN + call("functions.f:0", '{"x": [1]}') + "\n" + call("functions.g:1", "{}")
    _, calls = calls_of(text.removesuffix("<|tool_call_end|>"))
    assert [(n, a) for _, n, a in calls] == [("f", {"x": [1]}), ("g", {})]


def test_a_bare_name_gets_a_fresh_id() -> None:
    (_, calls) = calls_of(BEGIN + call("get_weather", '{"city": "Oslo"}') + END)
    assert calls[0][1:] == ("get_weather", {"city": "Oslo"})
    assert calls[0][0].startswith("call_")


@pytest.mark.parametrize(
    "bad",
    [
        BEGIN + call("functions.f:0", "{nope}") + END,  # arguments not JSON
        BEGIN + call("functions.f:0", "[1]") + END,  # not an object
        BEGIN + "<|tool_call_begin|>functions.f:0{}<|tool_call_end|>" + END,  # no separator
        BEGIN + "text" + END,
        BEGIN + call("get weather", "{}") + END,  # not a name
    ],
)
def test_unparsable_block_stays_content(bad: str) -> None:
    assert calls_of(bad) == (bad, [])


def test_any_split_streams_like_the_whole() -> None:
    text = "Sure." + TWO + "Done."
    want = calls_of(text)
    for a, b in itertools.combinations(range(0, len(text), 5), 2):
        stream = ToolStream(KIMI)
        parts = []
        for piece in (text[:a], text[a:b], text[b:]):
            parts += stream.feed(piece)
        parts += stream.flush()
        content = "".join(p for p in parts if isinstance(p, str))
        calls = [(p.id, p.name, json.loads(p.arguments)) for p in parts if not isinstance(p, str)]
        assert (content, calls) == want, (a, b)


def test_template_selects_kimi_and_deltas_carry_the_ids() -> None:
    template = "<|tool_calls_section_begin|>{%- for tool_call in message['tool_calls'] -%}"
    assert isinstance(detect_syntax(template), KimiToolSyntax)
    assert isinstance(detect_syntax("<tool_call>{...}</tool_call>"), QwenToolSyntax)
    out = ChatOutput(ChatSetup([], SamplingParams(), None, None, KIMI))
    deltas = [d for i in range(0, len(TWO), 4) for d in out.feed(TWO[i : i + 4])]
    deltas += out.feed("", last=True)
    heads = [c for d in deltas for c in d.get("tool_calls", []) if "id" in c]
    assert [(c["index"], c["id"]) for c in heads] == [
        (0, "functions.get_weather:0"),
        (1, "functions.get_time:1"),
    ]
    assert not any("content" in d for d in deltas)
