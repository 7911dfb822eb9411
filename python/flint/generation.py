"""The generation loop: prefill, then sample -> forward one token at a time.

``generate_stream`` yields ``StreamChunk``s; the last one carries the finish reason
and the timings. The per-token path is model forward + sampler + detokenizer; it
does no I/O and no logging.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from flint.models.prefill import prefill
from flint.models.transformer import MoEModel
from flint.sampling import Sampler, SamplingParams
from flint.tokenizer import Tokenizer


@dataclass(slots=True, frozen=True)
class Timings:
    """Wall-clock times of one request, in seconds."""

    prompt_tokens: int
    generated_tokens: int
    prefill_s: float  # prompt forward, up to the first sampled token
    decode_s: float  # everything after the first sampled token
    cached_tokens: int = 0  # leading prompt tokens whose KV cache entries were reused

    @property
    def prefill_tok_s(self) -> float:
        """Prompt tokens actually run per second (reused ones excluded)."""
        run = self.prompt_tokens - self.cached_tokens
        return run / self.prefill_s if self.prefill_s > 0 else 0.0

    @property
    def decode_tok_s(self) -> float:
        steps = self.generated_tokens - 1
        return steps / self.decode_s if steps > 0 and self.decode_s > 0 else 0.0


@dataclass(slots=True, frozen=True)
class TokenLogprob:
    """A sampled token's log-probability under the model (before penalties and
    temperature, as vLLM reports it), with the most likely alternatives."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...]  # (token id, logprob), most likely first


@dataclass(slots=True, frozen=True)
class StreamChunk:
    """A piece of generated text with the token ids that produced it."""

    text: str
    token_ids: tuple[int, ...]
    elapsed_s: float  # since the request started
    finish_reason: str | None = None  # "stop" (EOS or stop string), "length", or None
    timings: Timings | None = None  # on the last chunk only
    logprobs: tuple[TokenLogprob, ...] = ()  # one per token id, when asked for


@dataclass(slots=True, frozen=True)
class Completion:
    """A finished generation."""

    text: str
    token_ids: tuple[int, ...]
    prompt_token_ids: tuple[int, ...]
    finish_reason: str
    timings: Timings


class _StopMatcher:
    """Holds back text that could still become a stop string."""

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = tuple(stops)
        self.pending = ""

    def feed(self, text: str) -> tuple[str, bool]:
        """Returns (text safe to emit, whether a stop string was reached)."""
        self.pending += text
        hits = [i for i in (self.pending.find(s) for s in self.stops) if i >= 0]
        if hits:
            out, self.pending = self.pending[: min(hits)], ""
            return out, True
        keep = max((_overlap(self.pending, s) for s in self.stops), default=0)
        cut = len(self.pending) - keep
        out, self.pending = self.pending[:cut], self.pending[cut:]
        return out, False


def _overlap(text: str, stop: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``stop``."""
    for n in range(min(len(text), len(stop) - 1), 0, -1):
        if text.endswith(stop[:n]):
            return n
    return 0


class _Request:
    """Per-request state after prefill: turns sampled tokens into stream chunks."""

    def __init__(
        self, model: MoEModel, tokenizer: Tokenizer, prompt: Sequence[int], params: SamplingParams
    ) -> None:
        self.model, self.params, self.prompt = model, params, prompt
        self.decoder = tokenizer.stream_decoder(prompt)
        self.stops = _StopMatcher(params.stop)
        self.eos = frozenset() if params.ignore_eos else tokenizer.eos_token_ids
        self.generated: list[int] = []
        self.pending_ids: list[int] = []
        self.pending_lp: list[TokenLogprob] = []
        self.t0 = time.perf_counter()
        self.t_first = 0.0
        self.cached = 0  # prompt tokens reused from the KV cache

    def step(self, token: int, logprob: TokenLogprob | None = None) -> StreamChunk | None:
        """Takes the sampled token; returns a chunk when there is text or the end."""
        if not self.generated:
            self.t_first = time.perf_counter()
        self.generated.append(token)
        self.pending_ids.append(token)
        if logprob is not None:
            self.pending_lp.append(logprob)
        if token in self.eos:
            return self._finish(self.stops.feed(self.decoder.flush())[0], "stop")
        text, stopped = self.stops.feed(self.decoder.push(token))
        if stopped:
            return self._finish(text, "stop")
        full = self.model.cache.length >= self.model.context_length
        if len(self.generated) >= self.params.max_tokens or full:
            tail, stopped = self.stops.feed(self.decoder.flush())
            rest = "" if stopped else self.stops.pending
            return self._finish(text + tail + rest, "stop" if stopped else "length")
        if not text:
            return None
        elapsed = time.perf_counter() - self.t0
        chunk = StreamChunk(text, tuple(self.pending_ids), elapsed, logprobs=tuple(self.pending_lp))
        self.pending_ids, self.pending_lp = [], []
        return chunk

    def _finish(self, text: str, reason: str) -> StreamChunk:
        now = time.perf_counter()
        timings = Timings(
            len(self.prompt),
            len(self.generated),
            self.t_first - self.t0,
            now - self.t_first,
            self.cached,
        )
        ids, lps = tuple(self.pending_ids), tuple(self.pending_lp)
        return StreamChunk(text, ids, now - self.t0, reason, timings, lps)


def token_logprob(logits: torch.Tensor, token: int, vocab: int, top: int) -> TokenLogprob:
    """``token``'s logprob under logits [V'] (cut to V) and the ``top`` most likely."""
    logp = torch.log_softmax(logits[:vocab].float(), dim=-1)
    alts: tuple[tuple[int, float], ...] = ()
    if top > 0:
        values, ids = torch.topk(logp, min(top, vocab))
        alts = tuple(zip(ids.tolist(), values.tolist(), strict=True))
    return TokenLogprob(token, float(logp[token]), alts)


def generate_stream(
    model: MoEModel,
    tokenizer: Tokenizer,
    prompt: Sequence[int],
    params: SamplingParams,
    *,
    logprobs: int | None = None,
    cancel: threading.Event | None = None,
    reuse_prefix: bool = False,
) -> Iterator[StreamChunk]:
    """Generates after ``prompt`` (token ids), starting from an empty KV cache, or
    with ``reuse_prefix`` from the cached positions of the longest prefix the prompt
    shares with what the cache holds (the previous turn of a conversation): only the
    rest of the prompt is prefilled. The prompt runs layer-major (``prefill``).

    ``logprobs``: attach each token's logprob and that many alternatives (None: off).
    ``cancel``: checked before every forward; once set, the stream ends without a
    finish chunk (the caller has gone away).
    """
    if not prompt:
        raise ValueError("the prompt is empty")
    if len(prompt) >= model.context_length:
        raise ValueError(
            f"prompt of {len(prompt)} tokens fills the context ({model.context_length})"
        )
    request = _Request(model, tokenizer, prompt, params)
    device = model.place.device
    ids = list(prompt)
    # At least the last prompt token runs: its logits start the reply.
    keep = min(model.cached_prefix(ids), len(ids) - 1) if reuse_prefix else 0
    model.reset(keep)
    request.cached = keep
    sampler = Sampler(params, model.config.vocab_size, device, prompt)
    logits = prefill(model, torch.tensor(ids[keep:], dtype=torch.int64, device=device))
    vocab = model.config.vocab_size
    if logprobs is None and _device_greedy(model, params):
        yield from _greedy_ahead(model, request, logits, cancel)
        return
    while True:
        if cancel is not None and cancel.is_set():
            return
        token = sampler(logits)
        lp = None if logprobs is None else token_logprob(logits, token, vocab, logprobs)
        chunk = request.step(token, lp)
        if chunk is not None:
            yield chunk
            if chunk.finish_reason is not None:
                return
        logits = model.forward(torch.tensor([token], dtype=torch.int64, device=device))[-1]


def _device_greedy(model: MoEModel, params: SamplingParams) -> bool:
    """Whether ``_greedy_ahead`` gives this request's tokens: greedy without penalties
    (the argmax of the logits as they are) through a decoder that runs a whole step on
    the device."""
    plain = (
        params.repetition_penalty == 1.0
        and params.frequency_penalty == 0.0
        and params.presence_penalty == 0.0
    )
    return params.greedy and plain and getattr(model.decoder, "device_greedy", False)


def _greedy_ahead(
    model: MoEModel,
    request: _Request,
    logits: torch.Tensor,  # [V'] the prompt's last row
    cancel: threading.Event | None,
) -> Iterator[StreamChunk]:
    """Greedy decode one step ahead of the host: each step's argmax is the next step's
    input on the device, so the step for token i is queued before the host has read
    token i, and the GPU computes it while the host reads, decodes and checks that
    token (the host's work between tokens, and its synchronisation, leave the GPU's
    critical path). The same steps on the same inputs as the loop above, so the same
    tokens; the KV cache and its length end as that loop leaves them (a step queued
    for a token that ends the reply writes a cache row past the length, unused). The
    host reads each token from pinned memory the step's argmax writes
    (``GraphDecoder.tokens_on_host``), or else copies it in the stream; the cache's
    record of the tokens is written once, as the reply ends."""
    from flint.graphs.decode import GraphDecoder  # loaded already: the model has one

    decoder = model.decoder
    assert isinstance(decoder, GraphDecoder)
    cuda = decoder.device.type == "cuda"
    vocab = model.config.vocab_size
    read = torch.empty(1, dtype=torch.int64, pin_memory=cuda)  # each token, in turn
    # where the step at position p writes the token after it (slot p % 2), if it does:
    # then only the first token (the prompt's) is copied in the stream
    slots = decoder.tokens_on_host(vocab)
    decoder.greedy_first(logits, vocab)
    start = model.cache.length
    made: list[int] = []  # the tokens at start, start + 1, ...: for the cache's record
    try:
        while True:
            if cancel is not None and cancel.is_set():
                return
            position = model.cache.length
            # this token: in the slot the step before wrote, or else copied before its step
            source, at = (read, 0) if slots is None or not made else (slots, (position - 1) % 2)
            if source is read:
                read.copy_(decoder.token, non_blocking=cuda)
            ready = torch.cuda.Event() if cuda else None  # type: ignore[no-untyped-call]
            if ready is not None:  # on the decoder's GPU, which need not be the current one
                ready.record(torch.cuda.current_stream(decoder.device))
            last = len(request.generated) + 1 >= request.params.max_tokens
            if position < model.context_length and not last:
                decoder.launch_greedy(position, vocab)
            if ready is not None:
                ready.synchronize()
            token = int(source[at])
            chunk = request.step(token)
            if chunk is not None:
                yield chunk
                if chunk.finish_reason is not None:
                    return
            made.append(token)
            model.cache.length = position + 1
    finally:
        # the cache's token record, once: a write per token would be a launch in the
        # stream between the steps (and assigning an int, a copy from pageable memory
        # that waits for the stream: the host then queued each next step only after the
        # GPU had finished the last, 45-170 us idle a token on the H200, gpu111). From
        # pinned memory, so that this copy does not wait for the stream either.
        if made:
            record = torch.tensor(made, dtype=torch.int64)
            record = record.pin_memory() if cuda else record
            model.cache.tokens[start : start + len(made)].copy_(record, non_blocking=cuda)


def collect(prompt: Sequence[int], chunks: Iterator[StreamChunk]) -> Completion:
    """Runs a stream to its end and joins it into a ``Completion``."""
    text: list[str] = []
    ids: list[int] = []
    for chunk in chunks:
        text.append(chunk.text)
        ids.extend(chunk.token_ids)
        if chunk.finish_reason is not None and chunk.timings is not None:
            return Completion(
                "".join(text), tuple(ids), tuple(prompt), chunk.finish_reason, chunk.timings
            )
    raise AssertionError("a generation stream always ends with a finish reason")
