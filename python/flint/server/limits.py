"""Checks that need the loaded model: context length, vocabulary, sampling params."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from flint.sampling import SamplingParams
from flint.server.backend import Backend
from flint.server.errors import bad_request, context_overflow


def check_token_ids(ids: Sequence[int], vocab: int, param: str = "prompt") -> list[int]:
    bad = next((i for i in ids if not 0 <= i < vocab), None)
    if bad is not None:
        raise bad_request(f"token id {bad} is outside the vocabulary [0, {vocab})", param=param)
    return list(ids)


def build_params(
    backend: Backend,
    n_prompt: int,
    max_tokens: int | None,
    sampling: dict[str, Any],
    param: str = "max_tokens",
) -> SamplingParams:
    """Sampling params for a prompt of ``n_prompt`` tokens; 400 when it cannot run.

    ``max_tokens`` None means: until the context is full."""
    ctx = backend.context_length
    if n_prompt >= ctx:
        raise context_overflow(n_prompt, ctx)
    if max_tokens is not None and max_tokens > ctx:
        raise bad_request(
            f"{param} must be at most the context length ({ctx}), got {max_tokens}", param=param
        )
    limit = max_tokens if max_tokens is not None else ctx - n_prompt
    try:
        return backend.sampling_params(max_tokens=limit, **sampling)
    except ValueError as err:
        raise bad_request(str(err)) from None
