"""Tool-call and reasoning parsing on fixed model outputs, whole and streamed."""

from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flint.server.reasoning import ReasoningSplitter, prompt_opens_think
from flint.server.tools import QwenToolSyntax, ToolCall, ToolStream, parse_tool_calls

QWEN = QwenToolSyntax()
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Tokyo"}}\n</tool_call>'
TWO = CALL + "\n" + CALL.replace("Tokyo", "Paris").replace("get_weather", "get_time")


def test_qwen_single_call() -> None:
    content, calls = parse_tool_calls(QWEN, CALL)
    assert content == ""
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", {"city": "Tokyo"})
    ]
    assert calls[0].id.startswith("call_")


def test_qwen_text_then_two_calls() -> None:
    content, calls = parse_tool_calls(QWEN, "Let me check.\n\n" + TWO + "\n")
    assert content == "Let me check."
    assert [c.name for c in calls] == ["get_weather", "get_time"]
    assert json.loads(calls[1].arguments) == {"city": "Paris"}


@pytest.mark.parametrize(
    "bad",
    [
        "<tool_call>\n{not json}\n</tool_call>",
        '<tool_call>{"arguments": {}}</tool_call>',  # no name
        '<tool_call>{"name": "f", "arguments": [1]}</tool_call>',  # not an object
    ],
)
def test_unparsable_call_stays_content(bad: str) -> None:
    content, calls = parse_tool_calls(QWEN, bad)
    assert calls == [] and content == bad


def test_arguments_given_as_json_string() -> None:
    text = '<tool_call>{"name": "f", "arguments": "{\\"x\\": 1}"}</tool_call>'
    _, calls = parse_tool_calls(QWEN, text)
    assert json.loads(calls[0].arguments) == {"x": 1}


def test_unterminated_call_at_end_still_parses() -> None:
    _, calls = parse_tool_calls(QWEN, CALL.removesuffix("</tool_call>"))
    assert [c.name for c in calls] == ["get_weather"]


def test_plain_text_passes_through_untouched() -> None:
    text = "  a < b and <tool is not a tag\n"
    assert parse_tool_calls(QWEN, text) == (text, [])


def _stream_tools(pieces: list[str]) -> tuple[str, list[tuple[str, str]]]:
    stream = ToolStream(QWEN)
    parts = [p for piece in pieces for p in stream.feed(piece)] + stream.flush()
    content = "".join(p for p in parts if isinstance(p, str))
    return content, [(p.name, p.arguments) for p in parts if isinstance(p, ToolCall)]


def _split(text: str, cuts: list[int]) -> list[str]:
    bounds = sorted({c % (len(text) + 1) for c in cuts} | {0, len(text)})
    return [text[a:b] for a, b in itertools.pairwise(bounds)]


OUTPUTS = ["Sure.\n" + TWO, "plain answer, no tools <tool", CALL + "\nDone.", "x <tool_call>{bad"]


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(OUTPUTS), st.lists(st.integers(0, 400), max_size=12))
def test_tool_stream_any_split_equals_whole(text: str, cuts: list[int]) -> None:
    content, calls = parse_tool_calls(QWEN, text)
    assert _stream_tools(_split(text, cuts)) == (content, [(c.name, c.arguments) for c in calls])


def _split_reasoning(pieces: list[str], in_think: bool = False) -> tuple[str, str]:
    s = ReasoningSplitter(in_think)
    outs = [s.feed(p) for p in pieces] + [s.flush()]
    return "".join(r for r, _ in outs), "".join(c for _, c in outs)


def test_think_block_is_split_off() -> None:
    text = "<think>\nThe user wants weather.\n</think>\n\nIt is sunny."
    assert _split_reasoning([text]) == ("The user wants weather.", "It is sunny.")


def test_no_think_block_is_all_content() -> None:
    assert _split_reasoning(["<thin", "king about it"]) == ("", "<thinking about it")


def test_prompt_that_opens_think() -> None:
    assert prompt_opens_think("<|im_start|>assistant\n<think>\n")
    assert not prompt_opens_think("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert _split_reasoning(["hmm, 2+2", "</think>", "4"], in_think=True) == ("hmm, 2+2", "4")


def test_unterminated_think_is_reasoning() -> None:
    assert _split_reasoning(["<think>still going  "]) == ("still going", "")


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 200), max_size=12))
def test_reasoning_any_split_equals_whole(cuts: list[int]) -> None:
    text = "<think>\nstep 1\n\nstep 2 </thi\n</think>\n\nanswer <think> x"
    assert _split_reasoning(_split(text, cuts)) == _split_reasoning([text])
