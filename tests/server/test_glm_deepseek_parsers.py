"""GLM-4.5's and DeepSeek's tool-call markup and their reasoning blocks, on fixed model
outputs, whole and streamed (the markup as their official chat templates write it)."""

from __future__ import annotations

import itertools
import json

import pytest

from flint.sampling import SamplingParams
from flint.server.chat import ChatOutput, ChatSetup, _template_message
from flint.server.reasoning import ReasoningSplitter, prompt_opens_think
from flint.server.schemas import Message
from flint.server.tools import (
    DS_CALL_BEGIN,
    DS_CALL_END,
    DS_CALLS_BEGIN,
    DS_CALLS_END,
    DS_SEP,
    DeepSeekToolSyntax,
    GlmToolSyntax,
    QwenToolSyntax,
    ToolStream,
    detect_syntax,
    for_request,
    parse_tool_calls,
)

BAR = "\uff5c"  # DeepSeek's fullwidth bar
USER, ASSISTANT = f"<{BAR}User{BAR}>", f"<{BAR}Assistant{BAR}>"
GLM = GlmToolSyntax()
DS = DeepSeekToolSyntax()


def glm_call(name: str, args: dict[str, str]) -> str:
    pairs = "".join(
        f"\n<arg_key>{k}</arg_key>\n<arg_value>{v}</arg_value>" for k, v in args.items()
    )
    return f"<tool_call>{name}{pairs}\n</tool_call>"


def ds_call(name: str, args: dict[str, object]) -> str:  # V3 / R1
    return f"{DS_CALL_BEGIN}function{DS_SEP}{name}\n```json\n{json.dumps(args)}\n```{DS_CALL_END}"


def ds31_call(name: str, args: dict[str, object]) -> str:  # V3.1
    return f"{DS_CALL_BEGIN}{name}{DS_SEP}{json.dumps(args)}{DS_CALL_END}"


GLM_TWO = glm_call("get_weather", {"city": "Tokyo", "days": "3"}) + "\n" + glm_call("get_time", {})
DS_TWO = DS_CALLS_BEGIN + ds_call("get_weather", {"city": "東京"}) + "\n"
DS_TWO += ds_call("get_time", {}) + DS_CALLS_END


def calls_of(text: str, syntax: GlmToolSyntax | DeepSeekToolSyntax) -> tuple[str, list]:  # type: ignore[type-arg]
    content, calls = parse_tool_calls(syntax, text)
    return content, [(c.name, json.loads(c.arguments)) for c in calls]


def test_glm_calls_after_text() -> None:
    content, calls = calls_of("Let me look.\n" + GLM_TWO, GLM)
    assert content == "Let me look."
    assert calls == [("get_weather", {"city": "Tokyo", "days": 3}), ("get_time", {})]


def test_glm_values_follow_the_request_schema() -> None:
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": {"properties": {"days": {"type": "string"}, "city": {}}},
            },
        }
    ]
    bound = for_request(GLM, tools)
    text = glm_call("get_weather", {"city": '{"a": [1, 2]}', "days": "3"})
    _, calls = calls_of(text, bound)  # type: ignore[arg-type]
    assert calls == [("get_weather", {"city": {"a": [1, 2]}, "days": "3"})]
    assert calls_of(glm_call("f", {"x": "true", "y": "Tokyo"}), GLM)[1] == [
        ("f", {"x": True, "y": "Tokyo"})
    ]


@pytest.mark.parametrize(
    "bad",
    [
        "<tool_call>get weather\n</tool_call>",  # not a name
        "<tool_call>f\n<arg_key>x</arg_key>\n</tool_call>",  # a key without a value
        "<tool_call>\n</tool_call>",  # no name at all
    ],
)
def test_glm_unparsable_call_stays_content(bad: str) -> None:
    assert calls_of(bad, GLM) == (bad, [])


def test_deepseek_v3_block_of_calls() -> None:
    content, calls = calls_of("Checking." + DS_TWO, DS)
    assert content == "Checking."
    assert calls == [("get_weather", {"city": "東京"}), ("get_time", {})]


def test_deepseek_v31_calls_and_missing_block_end() -> None:
    text = DS_CALLS_BEGIN + ds31_call("a", {"x": 1}) + ds31_call("b", {"y": [2]})
    assert calls_of(text, DS)[1] == [("a", {"x": 1}), ("b", {"y": [2]})]  # EOS before the end
    assert calls_of(DS_CALLS_BEGIN + ds_call("c", {}), DS)[1] == [("c", {})]


@pytest.mark.parametrize(
    "bad",
    [
        DS_CALLS_BEGIN + f"{DS_CALL_BEGIN}function{DS_SEP}f\n```json\n{{nope}}\n```{DS_CALL_END}",
        DS_CALLS_BEGIN + f"{DS_CALL_BEGIN}f{DS_CALL_END}" + DS_CALLS_END,  # no separator
        DS_CALLS_BEGIN + "text" + DS_CALLS_END,
    ],
)
def test_deepseek_unparsable_block_stays_content(bad: str) -> None:
    assert calls_of(bad, DS) == (bad, [])


@pytest.mark.parametrize(
    ("syntax", "text"),
    [(GLM, "Sure.\n" + GLM_TWO + "\nDone."), (DS, "Sure." + DS_TWO + "Done.")],
)
def test_any_split_streams_like_the_whole(
    syntax: GlmToolSyntax | DeepSeekToolSyntax, text: str
) -> None:
    want = calls_of(text, syntax)
    for a, b in itertools.combinations(range(0, len(text), 7), 2):
        stream = ToolStream(syntax)
        parts = []
        for piece in (text[:a], text[a:b], text[b:]):
            parts += stream.feed(piece)
        parts += stream.flush()
        content = "".join(p for p in parts if isinstance(p, str))
        calls = [(p.name, json.loads(p.arguments)) for p in parts if not isinstance(p, str)]
        assert (content, calls) == want, (a, b)


def test_templates_select_their_syntax() -> None:
    glm_template = "<tool_call>{function-name}\n<arg_key>{arg-key-1}</arg_key>"
    ds_template = "{{'" + ASSISTANT + DS_CALLS_BEGIN + DS_CALL_BEGIN + "' + tool['type'] }}"
    assert isinstance(detect_syntax(glm_template), GlmToolSyntax)
    assert isinstance(detect_syntax(ds_template), DeepSeekToolSyntax)
    assert isinstance(detect_syntax("<tool_call>{...}</tool_call>"), QwenToolSyntax)


def test_deepseek_templates_get_arguments_as_text() -> None:
    msg = Message.model_validate(
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}
            ],
        }
    )
    assert (
        _template_message(msg, args_as_text=True)["tool_calls"][0]["function"]["arguments"]
        == '{"x": 1}'
    )
    assert _template_message(msg)["tool_calls"][0]["function"]["arguments"] == {"x": 1}


def deltas_of(setup: ChatSetup, pieces: list[str]) -> list[dict]:  # type: ignore[type-arg]
    out = ChatOutput(setup)
    deltas = []
    for i, piece in enumerate(pieces):
        deltas += out.feed(piece, last=i == len(pieces) - 1)
    return deltas


def test_glm_reasoning_then_call_streamed() -> None:
    """GLM-4.5 writes ``\\n<think>..</think>\\n`` then the answer; with thinking off its
    template ends the prompt with ``<think></think>`` and the model answers directly."""
    text = "\n<think>The user wants weather.</think>\nOne moment.\n" + GLM_TWO
    setup = ChatSetup([], SamplingParams(), None, False, GLM)
    deltas = deltas_of(setup, [text[i : i + 5] for i in range(0, len(text), 5)])
    assert "".join(d.get("reasoning_content", "") for d in deltas) == "The user wants weather."
    assert "".join(d.get("content", "") for d in deltas) == "One moment."
    names = [c["function"]["name"] for d in deltas for c in d.get("tool_calls", []) if "id" in c]
    assert names == ["get_weather", "get_time"]
    assert not prompt_opens_think("[gMASK]<sop><|user|>\nhi<|assistant|>\n<think></think>")


def test_r1_reasoning_opened_by_the_prompt_then_deepseek_calls() -> None:
    """R1's template ends the prompt with ``<|Assistant|><think>\\n`` (fullwidth bars)."""
    assert prompt_opens_think(USER + "hi" + ASSISTANT + "<think>\n")
    text = "Need the weather.\n</think>\n\n" + DS_TWO
    setup = ChatSetup([], SamplingParams(), None, True, DS)
    deltas = deltas_of(setup, [text[i : i + 3] for i in range(0, len(text), 3)])
    assert "".join(d.get("reasoning_content", "") for d in deltas) == "Need the weather."
    assert "".join(d.get("content", "") for d in deltas) == ""
    calls = [c for d in deltas for c in d.get("tool_calls", []) if "id" in c]
    assert [c["index"] for c in calls] == [0, 1]
    assert ChatOutput(setup).finish_reason("stop") == "stop"  # no calls seen by this one
    splitter = ReasoningSplitter(True)
    assert splitter.feed("a</think>b") == ("a", "b")
