"""What the server needs from a model, and its implementation over ``flint.LLM``.

The routes talk to a ``Backend`` only, so tests can swap in a scripted one that
emits fixed text (tool calls, reasoning) through the same code paths.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Protocol

from flint.generation import StreamChunk, generate_stream
from flint.sampling import SamplingParams


class Backend(Protocol):
    """A loaded model: tokenizer, template, limits and one-at-a-time generation."""

    @property
    def context_length(self) -> int: ...

    @property
    def vocab_size(self) -> int: ...

    @property
    def chat_template(self) -> str | None: ...

    @property
    def eos_token_ids(self) -> frozenset[int]: ...

    def encode(self, text: str) -> list[int]: ...

    def token_text(self, token_id: int) -> str: ...

    def render_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None,
        template_kwargs: Mapping[str, Any],
    ) -> str: ...

    def sampling_params(self, **options: Any) -> SamplingParams: ...

    def generate(
        self,
        prompt: Sequence[int],
        params: SamplingParams,
        logprobs: int | None,
        cancel: threading.Event,
    ) -> Iterator[StreamChunk]: ...

    def cache_stats(self) -> Mapping[str, float] | None: ...


class LLMBackend:
    """A ``flint.LLM`` behind the server; ``chat_template`` overrides the model's."""

    def __init__(self, llm: Any, chat_template: str | None = None) -> None:
        self.llm = llm
        if chat_template is not None:
            llm.tokenizer.chat_template = chat_template

    @property
    def context_length(self) -> int:
        return int(self.llm.model.context_length)

    @property
    def vocab_size(self) -> int:
        return int(self.llm.model.config.vocab_size)

    @property
    def chat_template(self) -> str | None:
        template: str | None = self.llm.tokenizer.chat_template
        return template

    @property
    def eos_token_ids(self) -> frozenset[int]:
        return frozenset(self.llm.tokenizer.eos_token_ids)

    def encode(self, text: str) -> list[int]:
        ids: list[int] = self.llm.tokenizer.encode(text)
        return ids

    def token_text(self, token_id: int) -> str:
        return str(self.llm.tokenizer.decode([token_id], skip_special_tokens=False))

    def render_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None,
        template_kwargs: Mapping[str, Any],
    ) -> str:
        return str(self.llm.tokenizer.render_chat(messages, tools=tools, **template_kwargs))

    def sampling_params(self, **options: Any) -> SamplingParams:
        params: SamplingParams = self.llm.sampling_params(**options)
        return params

    def generate(
        self,
        prompt: Sequence[int],
        params: SamplingParams,
        logprobs: int | None,
        cancel: threading.Event,
    ) -> Iterator[StreamChunk]:
        # Requests share one KV cache: a prompt that starts with what the previous
        # request left there (the same conversation) prefills only its new suffix.
        return generate_stream(
            self.llm.model,
            self.llm.tokenizer,
            prompt,
            params,
            logprobs=logprobs,
            cancel=cancel,
            reuse_prefix=True,
        )

    def cache_stats(self) -> Mapping[str, float] | None:
        """The streaming counters (``LLM.cache_stats``); resident experts keep none."""
        stats: Mapping[str, float] | None = self.llm.cache_stats()
        return stats
