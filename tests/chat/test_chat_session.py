"""Conversation state, prompt building (template, raw, fitting the context) and JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tiny import QWEN3_TEMPLATE, tokenizer_json

from flint.chat.session import Conversation, build_prompt, render_ids
from flint.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer(
        tokenizer_json(), chat_template=QWEN3_TEMPLATE.read_text("utf-8"), eos_token_ids=[2]
    )


def conversation(turns: int, system: str | None = "Be brief.") -> Conversation:
    conv = Conversation(system=system)
    for i in range(turns):
        conv.add("user", f"Question {i}?")
        conv.add("assistant", f"<think>\nhm {i}\n</think>\n\nAnswer {i}.")
    conv.add("user", "Last question?")
    return conv


def test_prompt_renders_the_template_with_the_system_prompt(tok: Tokenizer) -> None:
    conv = conversation(1)
    ids, in_think = render_ids(conv, conv.messages, tok, thinking=True)
    text = tok.decode(ids, skip_special_tokens=False)
    assert text.startswith("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nQuestion 0?")
    assert "hm 0" not in text  # Qwen3 strips reasoning of earlier turns
    assert text.endswith("Last question?<|im_end|>\n<|im_start|>assistant\n") and not in_think
    no_think, _ = render_ids(conv, conv.messages, tok, thinking=False)
    assert tok.decode(no_think, skip_special_tokens=False).endswith("<think>\n\n</think>\n\n")


def test_prompt_ending_in_an_open_think_block(tok: Tokenizer) -> None:
    tok = Tokenizer(tokenizer_json(), chat_template="{{ messages[-1].content }}<think>\n")
    conv = conversation(0)
    assert render_ids(conv, conv.messages, tok, thinking=True)[1]


def test_raw_prompt_joins_the_text(tok: Tokenizer) -> None:
    raw = Tokenizer(tokenizer_json())
    conv = Conversation(system="# file\n")
    conv.add("user", "def main(")
    conv.add("assistant", "argv):")
    conv.add("user", "\n    return")
    ids, in_think = render_ids(conv, conv.messages, raw, thinking=True)
    assert raw.decode(ids) == "# file\ndef main(argv):\n    return" and not in_think


def test_oldest_messages_are_left_out_to_fit(tok: Tokenizer) -> None:
    conv = conversation(6)
    full = build_prompt(conv, tok, context=4096, reserve=16, thinking=True)
    assert full.dropped == 0
    fitted = build_prompt(conv, tok, context=len(full.ids) - 10, reserve=16, thinking=True)
    assert fitted.dropped % 2 == 0 and fitted.dropped > 0  # whole exchanges, from a user turn
    assert len(fitted.ids) + 16 <= len(full.ids) - 10
    text = tok.decode(fitted.ids, skip_special_tokens=False)
    assert text.startswith("<|im_start|>system\nBe brief.")  # the system prompt stays
    assert len(conv.messages) == 13  # the conversation itself keeps everything


def test_last_message_too_long_is_an_error(tok: Tokenizer) -> None:
    conv = Conversation()
    conv.add("user", "word " * 200)
    with pytest.raises(ValueError, match=r"context holds 50: .*-c/--ctx-size"):
        build_prompt(conv, tok, context=50, reserve=4, thinking=True)
    with pytest.raises(ValueError, match="no user message"):
        build_prompt(Conversation(), tok, context=50, reserve=4, thinking=True)


def test_undo_reply_and_clear() -> None:
    conv = conversation(1)
    assert conv.undo_reply()  # last is a user message: nothing dropped
    assert len(conv.messages) == 3
    conv.add("assistant", "x")
    assert conv.undo_reply() and conv.messages[-1]["content"] == "Last question?"
    conv.add("assistant", "more")  # a raw continuation: /retry redoes the last piece only
    conv.add("assistant", "and more")
    assert conv.undo_reply() and conv.messages[-1]["content"] == "more"
    conv.clear()
    assert conv.messages == [] and conv.system == "Be brief." and not conv.undo_reply()
    conv.messages.append({"role": "assistant", "content": "hello"})
    assert not conv.undo_reply() and len(conv.messages) == 1
    with pytest.raises(ValueError, match="role"):
        conv.add("tool", "x")


def test_json_round_trip(tmp_path: Path) -> None:
    conv = conversation(2, system="Réponds en français. 日本語")
    path = tmp_path / "c.json"
    conv.save(path)
    data = json.loads(path.read_text("utf-8"))
    assert data["messages"][0] == {"role": "system", "content": conv.system}
    assert Conversation.load(path) == conv
    assert Conversation.from_json(data["messages"]) == conv  # a bare list works too


@pytest.mark.parametrize(
    ("data", "error"),
    [
        ({"msgs": []}, "expected"),
        ([{"role": "user"}], "message 0 needs a string 'content'"),
        (
            [{"role": "user", "content": "a"}, {"role": "system", "content": "b"}],
            "message 1 has role",
        ),
        ([{"role": "tool", "content": "a"}], "use user or assistant"),
    ],
)
def test_malformed_json_is_rejected(data: object, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        Conversation.from_json(data)


def test_load_errors_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"cannot read .*missing\.json"):
        Conversation.load(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{", "utf-8")
    with pytest.raises(ValueError, match=r"bad\.json is not JSON"):
        Conversation.load(bad)
    with pytest.raises(ValueError, match="cannot write"):
        Conversation().save(tmp_path / "no" / "such" / "dir.json")
