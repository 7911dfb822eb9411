"""``POST /v1/completions`` (OpenAI) and ``POST /completion`` (llama.cpp): raw
prompts, no chat template, so they work for any model."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request

from flint.generation import StreamChunk, Timings
from flint.sampling import SamplingParams
from flint.server.backend import Backend
from flint.server.limits import build_params, check_token_ids
from flint.server.queue import Job
from flint.server.responses import (
    collect,
    completion_logprobs,
    flint_stats,
    last_timings,
    llama_probs,
    new_id,
    now,
    timings,
    usage,
)
from flint.server.schemas import CompletionRequest, LlamaCompletionRequest


@dataclass(slots=True, frozen=True)
class CompletionSetup:
    prompt_ids: list[int]
    params: SamplingParams
    logprobs: int | None


def _ids(prompt: str | list[int], backend: Backend) -> list[int]:
    if isinstance(prompt, str):
        return backend.encode(prompt)
    return check_token_ids(prompt, backend.vocab_size)


def prepare(req: CompletionRequest, backend: Backend) -> CompletionSetup:
    ids = _ids(req.prompt, backend)
    params = build_params(backend, len(ids), req.max_tokens, req.sampling())
    return CompletionSetup(ids, params, req.logprobs)


def prepare_llama(req: LlamaCompletionRequest, backend: Backend) -> CompletionSetup:
    ids = _ids(req.prompt, backend)
    limit = None if req.n_predict < 0 else req.n_predict
    params = build_params(backend, len(ids), limit, req.sampling(), param="n_predict")
    return CompletionSetup(ids, params, req.n_probs or None)


def _choice(
    setup: CompletionSetup,
    chunks: list[StreamChunk],
    backend: Backend,
    offset: int,
    finish: str | None,
) -> dict[str, Any]:
    text = "".join(c.text for c in chunks)
    logprobs = None
    if setup.logprobs is not None:
        lps = [lp for c in chunks for lp in c.logprobs]
        logprobs = completion_logprobs(lps, backend.token_text, offset)
    return {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish}


def _extensions(t: Timings, job: Job, chunks: int) -> dict[str, Any]:
    return {"usage": usage(t), "timings": timings(t), "flint": flint_stats(t, job, chunks)}


async def complete(
    job: Job, request: Request, setup: CompletionSetup, model: str, backend: Backend
) -> dict[str, Any]:
    chunks = await collect(job, request)
    reason, t = last_timings(chunks)
    return {
        "id": new_id("cmpl"),
        "object": "text_completion",
        "created": now(),
        "model": model,
        "choices": [_choice(setup, chunks, backend, 0, reason)],
        **_extensions(t, job, 1),
    }


async def stream(
    job: Job, setup: CompletionSetup, model: str, backend: Backend, include_usage: bool
) -> AsyncIterator[dict[str, Any]]:
    base = {"id": new_id("cmpl"), "object": "text_completion", "created": now(), "model": model}
    offset, sent = 0, 0
    async for piece in job.chunks():
        sent += 1
        choice = _choice(setup, [piece], backend, offset, piece.finish_reason)
        offset += len(piece.text)
        if piece.timings is None:
            yield {**base, "choices": [choice]}
            continue
        ext = _extensions(piece.timings, job, sent)
        yield {**base, "choices": [choice], "timings": ext["timings"], "flint": ext["flint"]}
        if include_usage:
            yield {**base, "choices": [], "usage": ext["usage"]}


def _llama_body(
    setup: CompletionSetup, text: str, chunks: list[StreamChunk], backend: Backend
) -> dict[str, Any]:
    body: dict[str, Any] = {"content": text, "id_slot": 0, "stop": False}
    if setup.logprobs is not None:
        lps = [lp for c in chunks for lp in c.logprobs]
        body["completion_probabilities"] = llama_probs(lps, backend.token_text)
    return body


def _llama_final(
    body: dict[str, Any], reason: str, t: Timings, job: Job, model: str, stop: list[int]
) -> dict[str, Any]:
    stop_type = "limit" if reason == "length" else ("eos" if stop else "word")
    return {
        **body,
        "stop": True,
        "model": model,
        "stop_type": stop_type,
        "tokens_predicted": t.generated_tokens,
        "tokens_evaluated": t.prompt_tokens,
        "truncated": False,
        "timings": timings(t),
        "flint": flint_stats(t, job, 1),
    }


def _eos_hit(chunks: list[StreamChunk], backend: Backend) -> list[int]:
    last = [i for c in chunks[-1:] for i in c.token_ids[-1:]]
    return [i for i in last if i in backend.eos_token_ids]


async def llama_complete(
    job: Job, request: Request, setup: CompletionSetup, model: str, backend: Backend
) -> dict[str, Any]:
    chunks = await collect(job, request)
    reason, t = last_timings(chunks)
    body = _llama_body(setup, "".join(c.text for c in chunks), chunks, backend)
    return _llama_final(body, reason, t, job, model, _eos_hit(chunks, backend))


async def llama_stream(
    job: Job, setup: CompletionSetup, model: str, backend: Backend
) -> AsyncIterator[dict[str, Any]]:
    async for piece in job.chunks():
        body = _llama_body(setup, piece.text, [piece], backend)
        if piece.finish_reason is None or piece.timings is None:
            yield body
            continue
        eos = _eos_hit([piece], backend)
        yield _llama_final(body, piece.finish_reason, piece.timings, job, model, eos)
