"""GPT-OSS's harmony format on fixed outputs: the tokenizer keeps its markers, the
parser splits channels and calls (whole and streamed at any split), and the server
returns reasoning, content and tool calls without a marker in what users see."""

from __future__ import annotations

import itertools
import json

import openai
import pytest

from flint.chat.think import split_reply
from flint.harmony import HarmonyCall, HarmonyParser, is_harmony, split_harmony
from flint.markup import HARMONY_MARKERS, kept_special
from flint.sampling import SamplingParams
from flint.server.chat import ChatOutput, ChatSetup
from flint.tokenizer import Tokenizer
from tests.server.scripted import ScriptedBackend

ANALYSIS = "<|channel|>analysis<|message|>User asks weather. Call the tool.<|end|>"
CALL = (
    "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
    '<|message|>{"city": "Paris"}<|call|>'
)
FINAL = "<|start|>assistant<|channel|>final<|message|>It is **sunny** in Paris.<|return|>"
# A minimal template in harmony's shape (the real one is GPT-OSS's chat_template.jinja).
TEMPLATE = (
    "{% for m in messages %}<|start|>{{ m.role }}"
    "{% if m.role == 'assistant' %}<|channel|>final{% endif %}"
    "<|message|>{{ m.content }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|start|>assistant{% endif %}"
)
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
ASK = [{"role": "user", "content": "Weather in Paris?"}]


def harmony_tokenizer() -> Tokenizer:
    """Byte-level BPE with harmony's markers (and <|endoftext|>) as special tokens."""
    from tokenizers import Tokenizer as HF
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tok = HF(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<|endoftext|>", *HARMONY_MARKERS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(["the weather in Paris is sunny", "call the tool"], trainer=trainer)
    return Tokenizer(tok.to_str())


def test_tokenizer_keeps_only_the_named_special_tokens() -> None:
    tok = harmony_tokenizer()
    text = ANALYSIS + FINAL
    ids = [*tok.encode(text), tok.token_to_id("<|endoftext|>") or 0]
    plain = tok.decode(ids)
    assert "<|" not in plain  # default: every special token skipped, as before
    tok.keep_special_tokens(kept_special("gpt_oss"))
    assert tok.decode(ids) == text  # markers kept, <|endoftext|> still skipped
    assert tok.decode(ids, skip_special_tokens=False) == text + "<|endoftext|>"
    decoder = tok.stream_decoder(tok.encode("<|start|>assistant"))
    assert "".join([decoder.push(i) for i in ids] + [decoder.flush()]) == text
    assert kept_special("qwen3_moe") == ()
    tok.keep_special_tokens(["<|not-a-token|>", "weather"])  # only special ones count
    assert tok.keep_special == frozenset()


def test_channels_and_a_call() -> None:
    reasoning, content, calls = split_harmony(ANALYSIS + CALL, tools=True)
    assert reasoning == "User asks weather. Call the tool."
    assert content == ""
    assert calls == [HarmonyCall("get_weather", '{"city": "Paris"}')]
    assert split_harmony(ANALYSIS + FINAL) == (
        "User asks weather. Call the tool.",
        "It is **sunny** in Paris.",
        [],
    )


@pytest.mark.parametrize(
    ("text", "want"),
    [
        # <|call|> and <|return|> end generation: the output stops before them
        (ANALYSIS + CALL.removesuffix("<|call|>"), ("", [("get_weather", {"city": "Paris"})])),
        (FINAL.removesuffix("<|return|>"), ("It is **sunny** in Paris.", [])),
        # recipient after the role, no <|constrain|>
        (
            '<|start|>assistant to=functions.f<|channel|>commentary json<|message|>{"a": [1]}',
            ("", [("f", {"a": [1]})]),
        ),
        # a preamble on commentary is content; a bad call shows its body
        (
            "<|channel|>commentary<|message|>Checking.<|end|>"
            "<|start|>assistant<|channel|>commentary to=functions.f<|message|>{oops<|call|>",
            ("Checking.{oops", []),
        ),
        ("Plain text, no channels.", ("Plain text, no channels.", [])),
        ("<|channel|>final<|message|>a<|start|>assistant<|channel|>final<|message|>b", ("ab", [])),
    ],
)
def test_outputs(text: str, want: tuple[str, list[tuple[str, object]]]) -> None:
    _, content, calls = split_harmony(text, tools=True)
    assert (content, [(c.name, json.loads(c.arguments)) for c in calls]) == want


def test_without_tools_a_call_is_content() -> None:
    assert split_harmony(CALL, tools=False) == ("", '{"city": "Paris"}', [])


@pytest.mark.parametrize("text", [ANALYSIS + CALL, ANALYSIS + FINAL, "Plain <|x> text"])
def test_any_split_streams_like_the_whole(text: str) -> None:
    want = split_harmony(text, tools=True)
    for a, b in itertools.combinations(range(0, len(text) + 1, 3), 2):
        parser = HarmonyParser(tools=True)
        events = []
        for piece in (text[:a], text[a:b], text[b:]):
            events += parser.feed(piece)
        events += parser.flush()
        texts = {"reasoning": "", "content": ""}
        for e in events:
            if isinstance(e, tuple):
                texts[e[0]] += e[1]
        calls = [e for e in events if isinstance(e, HarmonyCall)]
        assert (texts["reasoning"], texts["content"], calls) == want, (a, b)


def test_streamed_deltas_never_hold_a_marker() -> None:
    text = ANALYSIS + "<|start|>assistant<|channel|>commentary<|message|>One moment.<|end|>" + CALL
    setup = ChatSetup([], SamplingParams(), None, None, None, True, True)
    for size in (1, 2, 5, 11):
        out = ChatOutput(setup)
        pieces = [text[i : i + size] for i in range(0, len(text), size)]
        deltas = [d for i, p in enumerate(pieces) for d in out.feed(p, i == len(pieces) - 1)]
        shown = [d.get("content", "") + d.get("reasoning_content", "") for d in deltas]
        assert not any("<|" in s or "|>" in s for s in shown), size
        assert "".join(d.get("content", "") for d in deltas) == "One moment."
        calls = [c for d in deltas for c in d.get("tool_calls", []) if "id" in c]
        assert [c["function"]["name"] for c in calls] == ["get_weather"]
        assert out.finish_reason("stop") == "tool_calls"


def test_chat_cli_split() -> None:
    assert split_reply(ANALYSIS + FINAL, harmony=True) == (
        "User asks weather. Call the tool.",
        "It is **sunny** in Paris.",
    )
    assert is_harmony(TEMPLATE) and not is_harmony("<|im_start|>{{ m.content }}")


def test_server_whole_and_streamed(sclient: openai.OpenAI, backend: ScriptedBackend) -> None:
    backend.chat_template = TEMPLATE
    text = ANALYSIS + CALL.removesuffix("<|call|>")
    backend.script = [text[i : i + 4] for i in range(0, len(text), 4)]
    out = sclient.chat.completions.create(model="m", messages=ASK, tools=TOOLS)  # type: ignore[arg-type]
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    assert choice.message.reasoning_content == "User asks weather. Call the tool."  # type: ignore[attr-defined]
    calls = choice.message.tool_calls or []
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [  # type: ignore[union-attr]
        ("get_weather", {"city": "Paris"})
    ]
    assert backend.prompts[-1].endswith("<|start|>assistant")

    text = ANALYSIS + FINAL.removesuffix("<|return|>")
    backend.script = [text[i : i + 3] for i in range(0, len(text), 3)]
    stream = sclient.chat.completions.create(model="m", messages=ASK, stream=True)  # type: ignore[arg-type]
    content, reasoning = "", ""
    for chunk in stream:
        for choice in chunk.choices:
            content += choice.delta.content or ""
            reasoning += getattr(choice.delta, "reasoning_content", None) or ""
    assert (reasoning, content) == (
        "User asks weather. Call the tool.",
        "It is **sunny** in Paris.",
    )
