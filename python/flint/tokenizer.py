"""The model's tokenizer (``tokenizers``), streaming detokenization and chat prompts."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from tokenizers import Tokenizer as _HFTokenizer

from flint.chat_template import render_chat

# Tokens of context kept in front of the unread ones when decoding a stream: enough
# for decoders that drop a leading space or join bytes across tokens.
_CONTEXT_TOKENS = 5
_REPLACEMENT = "\ufffd"


class Tokenizer:
    """Encode/decode text, render chat templates, and detokenize streams."""

    def __init__(
        self,
        tokenizer_json: str,
        *,
        chat_template: str | None = None,
        special_tokens: Mapping[str, str] | None = None,
        eos_token_ids: Iterable[int] = (),
    ) -> None:
        self._tok = _HFTokenizer.from_str(tokenizer_json)
        self.chat_template = chat_template
        self.special_tokens = dict(special_tokens or {})
        self.eos_token_ids = frozenset(eos_token_ids)
        decoder = self._tok.get_added_tokens_decoder()
        self._special = frozenset(int(i) for i, t in decoder.items() if t.special)
        # Special tokens that decoding keeps anyway (a family's output markup).
        self.keep_special: frozenset[int] = frozenset()

    @property
    def vocab_size(self) -> int:
        return int(self._tok.get_vocab_size(with_added_tokens=True))

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of ``text``; by default no BOS/EOS are added (prompts are raw)."""
        if not isinstance(text, str):
            raise ValueError(f"text must be a str, got {type(text).__name__}")
        return list(self._tok.encode(text, add_special_tokens=add_special_tokens).ids)

    def keep_special_tokens(self, tokens: Iterable[str]) -> None:
        """Decoding keeps these special tokens (those the vocabulary has) even when it
        skips the others: markup the output parsers read, e.g. GPT-OSS's channels."""
        ids = (self.token_to_id(t) for t in tokens)
        self.keep_special = frozenset(i for i in ids if i is not None and i in self._special)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        ids = list(ids)
        if skip_special_tokens and self.keep_special:
            ids = [i for i in ids if i in self.keep_special or i not in self._special]
            skip_special_tokens = False
        return str(self._tok.decode(ids, skip_special_tokens=skip_special_tokens))

    def token_to_id(self, token: str) -> int | None:
        found = self._tok.token_to_id(token)
        return None if found is None else int(found)

    def id_to_token(self, token_id: int) -> str | None:
        found = self._tok.id_to_token(token_id)
        return None if found is None else str(found)

    def render_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        **template_kwargs: Any,
    ) -> str:
        """The chat prompt as text (transformers' ``apply_chat_template(tokenize=False)``)."""
        if self.chat_template is None:
            raise ValueError("this model has no chat template; use a raw prompt instead")
        return render_chat(
            self.chat_template,
            messages,
            tools=tools,
            add_generation_prompt=add_generation_prompt,
            special_tokens=self.special_tokens,
            **template_kwargs,
        )

    def encode_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        **template_kwargs: Any,
    ) -> list[int]:
        """Token ids of the rendered chat. The template writes its own special tokens,
        so none are added on top (as transformers does)."""
        text = self.render_chat(
            messages, tools=tools, add_generation_prompt=add_generation_prompt, **template_kwargs
        )
        return self.encode(text, add_special_tokens=False)

    def stream_decoder(
        self, context: Sequence[int] = (), skip_special_tokens: bool = True
    ) -> StreamDecoder:
        """A detokenizer for tokens that follow ``context`` (e.g. the prompt)."""
        return StreamDecoder(self, context, skip_special_tokens)


class StreamDecoder:
    """Incremental detokenization that never emits a broken UTF-8 sequence.

    Each new token is decoded together with a few tokens before it; the text is
    released only when it no longer ends in U+FFFD (an incomplete byte sequence),
    so a multi-byte character split across tokens comes out whole.
    """

    def __init__(self, tokenizer: Tokenizer, context: Sequence[int], skip_special: bool) -> None:
        self._tok = tokenizer
        self._skip = skip_special
        self._ids = list(context[-_CONTEXT_TOKENS:])
        self._prefix = 0  # start of the decode window
        self._read = len(self._ids)  # tokens before this were already emitted

    def push(self, token_id: int) -> str:
        """Adds one token; returns the newly complete text (maybe empty)."""
        self._ids.append(token_id)
        prefix_text = self._tok.decode(self._ids[self._prefix : self._read], self._skip)
        text = self._tok.decode(self._ids[self._prefix :], self._skip)
        if len(text) <= len(prefix_text) or text.endswith(_REPLACEMENT):
            return ""
        new = text[len(prefix_text) :]
        self._prefix, self._read = self._read, len(self._ids)
        return new

    def flush(self) -> str:
        """Whatever is still held back (at the end of generation)."""
        prefix_text = self._tok.decode(self._ids[self._prefix : self._read], self._skip)
        text = self._tok.decode(self._ids[self._prefix :], self._skip)
        self._prefix = self._read = len(self._ids)
        return text[len(prefix_text) :]
