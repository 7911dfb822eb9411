"""Server-sent events as OpenAI sends them: one JSON object per ``data:`` line, then
``data: [DONE]``. An error after the stream started is sent as one last event in
the error envelope. However the stream ends (done, error, client gone), its job is
cancelled, so the model is free for the next request at once."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from typing import Any

from sse_starlette.sse import EventSourceResponse

from flint.server.errors import APIError
from flint.server.queue import Job

log = logging.getLogger("flint.server")
PING_S = 15  # comment lines keep proxies from closing an idle stream


async def _events(
    payloads: AsyncIterator[dict[str, Any]], job: Job, done: bool
) -> AsyncIterator[dict[str, str]]:
    try:
        async for payload in payloads:
            yield {"data": json.dumps(payload, ensure_ascii=False)}
        if done:
            yield {"data": "[DONE]"}
    except APIError as err:
        yield {"data": json.dumps(err.body())}
    except Exception as err:
        log.exception("error while streaming", exc_info=err)
        yield {"data": json.dumps(APIError(500, f"internal error: {type(err).__name__}").body())}
    finally:
        job.cancel.set()


def sse_response(
    payloads: AsyncIterator[dict[str, Any]], job: Job, done: bool = True
) -> EventSourceResponse:
    """``done``: end with ``data: [DONE]`` (OpenAI); llama.cpp's /completion does not."""
    return EventSourceResponse(_events(payloads, job, done), ping=PING_S, sep="\n")
