"""Tokenizer: raw encoding and streaming detokenization without broken UTF-8."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flint.tokenizer import Tokenizer

TEXTS = [
    "plain ascii text\n",
    "naïve café — 日本語のテキスト 🙂👍🏽 and ∑ x² ≤ ∞",
    "🦀🦀🦀 emoji only 👨‍👩‍👧",
    "<|im_start|>user\nhi<|im_end|>",
]


@pytest.fixture(scope="module")
def tok(tiny_tokenizer_json: str) -> Tokenizer:
    return Tokenizer(tiny_tokenizer_json, eos_token_ids=[2])


def _stream(tok: Tokenizer, ids: list[int], context: list[int] | None = None) -> list[str]:
    decoder = tok.stream_decoder(context or [])
    pieces = [decoder.push(i) for i in ids]
    return [*pieces, decoder.flush()]


@pytest.mark.parametrize("text", TEXTS)
def test_stream_pieces_are_whole_characters(tok: Tokenizer, text: str) -> None:
    ids = tok.encode(text)
    assert len(ids) > len(text.encode()) // 4  # tiny vocabulary: characters span tokens
    pieces = _stream(tok, ids, context=tok.encode("prompt: "))
    assert all("\ufffd" not in p for p in pieces)
    assert (
        "".join(pieces)
        == tok.decode(ids)
        == text.replace("<|im_start|>", "").replace("<|im_end|>", "")
    )


@settings(max_examples=60, deadline=None)
@given(st.text(min_size=1, max_size=40))
def test_stream_equals_decode_for_any_text(tiny_tokenizer_json: str, text: str) -> None:
    tok = Tokenizer(tiny_tokenizer_json)
    ids = tok.encode(text)
    pieces = _stream(tok, ids)
    assert "".join(pieces) == tok.decode(ids)
    if "\ufffd" not in text:
        assert all("\ufffd" not in p for p in pieces)


def test_split_multibyte_character_is_held_back(tok: Tokenizer) -> None:
    ids = tok.encode("🙂")
    assert len(ids) > 1
    decoder = tok.stream_decoder()
    assert [decoder.push(i) for i in ids[:-1]] == [""] * (len(ids) - 1)
    assert decoder.push(ids[-1]) == "🙂"


def test_encode_adds_no_special_tokens(tok: Tokenizer) -> None:
    ids = tok.encode("<|im_end|>")
    assert ids == [tok.token_to_id("<|im_end|>")] == [2]
    assert tok.decode(ids, skip_special_tokens=False) == "<|im_end|>"
    assert tok.id_to_token(2) == "<|im_end|>"
    assert tok.vocab_size == 300
    with pytest.raises(ValueError, match="must be a str"):
        tok.encode(b"bytes")  # type: ignore[arg-type]
