"""Splitting a streamed reply into reasoning and answer, whatever the chunking."""

from __future__ import annotations

import pytest

from flint.chat.think import ANSWER, THINK, ThinkSplitter, split_reply

REPLY = "<think>\nThe user says hi.\nBe nice.\n</think>\n\nHello! Use `<think>` tags like this."


def feed_all(pieces: list[str], in_think: bool = False) -> tuple[str, str]:
    splitter = ThinkSplitter(in_think)
    out = {THINK: "", ANSWER: ""}
    for piece in pieces:
        for kind, text in splitter.feed(piece):
            out[kind] += text
    for kind, text in splitter.flush():
        out[kind] += text
    return out[THINK], out[ANSWER]


def test_whole_reply() -> None:
    assert split_reply(REPLY) == (
        "The user says hi.\nBe nice.",
        "Hello! Use `<think>` tags like this.",
    )


@pytest.mark.parametrize("size", [1, 2, 3, 5, 8])
def test_any_chunking_gives_the_same_split(size: int) -> None:
    pieces = [REPLY[i : i + size] for i in range(0, len(REPLY), size)]
    assert feed_all(pieces) == split_reply(REPLY)


def test_tags_split_between_every_pair_of_characters() -> None:
    for cut in range(1, len(REPLY)):
        assert feed_all([REPLY[:cut], REPLY[cut:]]) == split_reply(REPLY), cut


def test_no_think_block_is_all_answer() -> None:
    assert split_reply("  Hello <think> there") == ("", "  Hello <think> there")


def test_open_tag_only_counts_at_the_start() -> None:
    assert split_reply("Hi.\n<think>x</think>") == ("", "Hi.\n<think>x</think>")


def test_prompt_that_opened_the_block() -> None:
    assert split_reply("pondering\n</think>\n\nAnswer", in_think=True) == ("pondering", "Answer")


def test_unclosed_block_is_reasoning_and_partial_tag_is_flushed() -> None:
    assert split_reply("<think>still going") == ("still going", "")
    assert split_reply("<thi") == ("", "<thi")
    assert split_reply("<think>abc</thi") == ("abc</thi", "")


def test_thinking_flag_follows_the_stream() -> None:
    splitter = ThinkSplitter()
    assert not splitter.thinking
    splitter.feed("<think>a")
    assert splitter.thinking
    splitter.feed("</think>b")
    assert not splitter.thinking
