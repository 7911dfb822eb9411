"""Pieces shared by the endpoints: ids, usage, llama.cpp timings, the ``flint``
extension, logprobs in each API's shape, and waiting for a whole generation."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from starlette.requests import Request

from flint.generation import StreamChunk, Timings, TokenLogprob
from flint.server.errors import APIError
from flint.server.queue import Job

DISCONNECT_POLL_S = 0.25


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def now() -> int:
    return int(time.time())


def usage(t: Timings) -> dict[str, int]:
    return {
        "prompt_tokens": t.prompt_tokens,
        "completion_tokens": t.generated_tokens,
        "total_tokens": t.prompt_tokens + t.generated_tokens,
    }


def timings(t: Timings) -> dict[str, float]:
    """llama.cpp's ``timings`` object."""
    steps = max(t.generated_tokens - 1, 0)
    return {
        "prompt_n": t.prompt_tokens,
        "prompt_ms": t.prefill_s * 1e3,
        "prompt_per_token_ms": t.prefill_s * 1e3 / max(t.prompt_tokens, 1),
        "prompt_per_second": t.prefill_tok_s,
        "predicted_n": t.generated_tokens,
        "predicted_ms": t.decode_s * 1e3,
        "predicted_per_token_ms": t.decode_s * 1e3 / steps if steps else 0.0,
        "predicted_per_second": t.decode_tok_s,
    }


def flint_stats(t: Timings, job: Job, chunks: int) -> dict[str, float]:
    """The ``flint`` extension field: queueing and streaming statistics."""
    return {
        "queue_ms": job.queue_s * 1e3,
        "time_to_first_token_ms": t.prefill_s * 1e3,
        "prompt_tokens_per_second": t.prefill_tok_s,
        "tokens_per_second": t.decode_tok_s,
        "chunks": chunks,
    }


TokenText = Callable[[int], str]


def chat_logprobs(lps: Sequence[TokenLogprob], text: TokenText) -> list[dict[str, Any]]:
    """Entries of OpenAI chat's ``logprobs.content``."""

    def entry(token_id: int, logprob: float) -> dict[str, Any]:
        token = text(token_id)
        return {"token": token, "logprob": logprob, "bytes": list(token.encode())}

    return [
        {**entry(lp.token_id, lp.logprob), "top_logprobs": [entry(i, v) for i, v in lp.top]}
        for lp in lps
    ]


def completion_logprobs(
    lps: Sequence[TokenLogprob], text: TokenText, offset: int
) -> dict[str, Any]:
    """OpenAI completions' ``logprobs`` object; offsets count from ``offset``."""
    tokens = [text(lp.token_id) for lp in lps]
    offsets = []
    for token in tokens:
        offsets.append(offset)
        offset += len(token)
    return {
        "tokens": tokens,
        "token_logprobs": [lp.logprob for lp in lps],
        "top_logprobs": [_top_dict(lp.top, text) for lp in lps],
        "text_offset": offsets,
    }


def _top_dict(top: Sequence[tuple[int, float]], text: TokenText) -> dict[str, float]:
    """Alternatives keyed by text; tokens that decode alike keep the likeliest."""
    out: dict[str, float] = {}
    for token_id, logprob in top:
        out.setdefault(text(token_id), logprob)
    return out


def llama_probs(lps: Sequence[TokenLogprob], text: TokenText) -> list[dict[str, Any]]:
    """llama.cpp's ``completion_probabilities``."""

    def entry(token_id: int, logprob: float) -> dict[str, Any]:
        token = text(token_id)
        return {"id": token_id, "token": token, "logprob": logprob, "bytes": list(token.encode())}

    return [
        {**entry(lp.token_id, lp.logprob), "top_logprobs": [entry(i, v) for i, v in lp.top]}
        for lp in lps
    ]


async def collect(job: Job, request: Request) -> list[StreamChunk]:
    """All chunks of a job; cancels it if the client disconnects while waiting."""

    async def gather() -> list[StreamChunk]:
        return [chunk async for chunk in job.chunks()]

    task = asyncio.ensure_future(gather())
    try:
        while not task.done():
            done, _ = await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
            if not done and await request.is_disconnected():
                job.cancel.set()
        return task.result()
    finally:
        job.cancel.set()  # a no-op once finished; stops the job if we are cancelled
        if not task.done():
            task.cancel()


def last_timings(chunks: Sequence[StreamChunk]) -> tuple[str, Timings]:
    """The finish reason and timings of a finished generation."""
    last = chunks[-1] if chunks else None
    if last is None or last.timings is None or last.finish_reason is None:
        raise APIError(503, "the generation was cancelled (server shutting down)")
    return last.finish_reason, last.timings
