"""A backend that emits fixed text: tool calls and reasoning a tiny random model
never writes, through the same server code paths. It tokenizes and renders chat
templates with the tiny model's real tokenizer."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from flint.generation import StreamChunk, Timings, TokenLogprob
from flint.sampling import SamplingParams
from flint.tokenizer import Tokenizer


class ScriptedBackend:
    def __init__(self, tokenizer: Tokenizer, context_length: int = 128) -> None:
        self.tokenizer = tokenizer
        self.context_length = context_length
        self.vocab_size = 320
        self.chat_template: str | None = tokenizer.chat_template
        self.eos_token_ids = frozenset({2})
        self.script: list[str] = ["Hello", " world", "!"]
        self.delay_s = 0.0  # per piece
        self.prompts: list[str] = []  # rendered chat prompts, newest last
        self.started = 0  # generations begun
        self.stats: dict[str, float] | None = None

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text)

    def token_text(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id], skip_special_tokens=False)

    def render_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None,
        template_kwargs: Mapping[str, Any],
    ) -> str:
        if self.chat_template is None:
            raise AssertionError("the server must not render without a template")
        self.tokenizer.chat_template = self.chat_template
        text = self.tokenizer.render_chat(messages, tools=tools, **template_kwargs)
        self.prompts.append(text)
        return text

    def sampling_params(self, **options: Any) -> SamplingParams:
        return SamplingParams.build({}, **options)

    def generate(
        self,
        prompt: Sequence[int],
        params: SamplingParams,
        logprobs: int | None,
        cancel: threading.Event,
    ) -> Iterator[StreamChunk]:
        self.started += 1
        t0 = time.perf_counter()
        pieces = list(self.script)[: params.max_tokens]
        for i, text in enumerate(pieces):
            time.sleep(self.delay_s)
            if cancel.is_set():
                return
            ids = (10 + i,)
            lps = (
                tuple(TokenLogprob(t, -0.5, ((t, -0.5), (3, -1.5))[: logprobs or 0]) for t in ids)
                if logprobs is not None
                else ()
            )
            last = i == len(pieces) - 1
            elapsed = time.perf_counter() - t0
            if not last:
                yield StreamChunk(text, ids, elapsed, logprobs=lps)
                continue
            reason = "length" if len(pieces) < len(self.script) else "stop"
            timings = Timings(len(prompt), len(pieces), elapsed / 2 + 1e-6, elapsed / 2 + 1e-6)
            yield StreamChunk(text, ids, elapsed, reason, timings, lps)

    def cache_stats(self) -> Mapping[str, float] | None:
        return self.stats
