"""The FastAPI application: routes, auth, body cap. The work is in chat.py and
completions.py; this file only wires requests to them."""

from __future__ import annotations

import hmac
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, TypeVar

from fastapi import Depends, FastAPI, Request, Response
from fastapi.responses import JSONResponse, PlainTextResponse
from pydantic import BaseModel, ValidationError

from flint.server import chat, completions
from flint.server.backend import Backend
from flint.server.errors import APIError, bad_request, install_handlers, validation_message
from flint.server.metrics import CONTENT_TYPE
from flint.server.schemas import ChatRequest, CompletionRequest, LlamaCompletionRequest
from flint.server.sse import sse_response
from flint.server.state import ServerConfig, ServerState

M = TypeVar("M", bound=BaseModel)


def _state(request: Request) -> ServerState:
    state: ServerState = request.app.state.flint
    return state


def _auth(request: Request) -> None:
    key = _state(request).config.api_key
    if key is None:
        return
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), key.encode()):
        raise APIError(401, "Incorrect API key provided.", code="invalid_api_key")


async def _read(request: Request, model: type[M]) -> M:
    """The body, size-capped, parsed and validated into ``model`` (400/413 otherwise)."""
    cap = _state(request).config.max_body_bytes
    length = request.headers.get("content-length", "")
    too_big = APIError(
        413, f"the request body is larger than {cap} bytes", code="request_too_large"
    )
    if length.isdigit() and int(length) > cap:
        raise too_big
    body = bytearray()
    async for part in request.stream():
        body += part
        if len(body) > cap:
            raise too_big
    try:
        obj = json.loads(body)
    except (ValueError, RecursionError):
        raise bad_request("the request body is not valid JSON") from None
    if not isinstance(obj, dict):
        raise bad_request("the request body must be a JSON object")
    try:
        return model.model_validate(obj)
    except ValidationError as err:
        first: dict[str, Any] = dict(err.errors(include_url=False)[0])
        param = ".".join(str(p) for p in first.get("loc", ())) or None
        raise bad_request(validation_message(first), param=param) from None


def _include_usage(req: ChatRequest | CompletionRequest) -> bool:
    return req.stream_options is not None and req.stream_options.include_usage


def create_app(config: ServerConfig, backend: Backend | None = None) -> FastAPI:
    """The app; without ``backend`` it answers 503 until ``app.state.flint.attach``."""
    state = ServerState(config)
    if backend is not None:
        state.attach(backend)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        state.close()

    app = FastAPI(title="flint", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.flint = state
    install_handlers(app)
    _open_routes(app, state)
    _generation_routes(app, state)
    return app


def _open_routes(app: FastAPI, state: ServerState) -> None:
    @app.get("/health")
    async def health() -> dict[str, str]:
        state.ready()
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        meta = {"n_ctx": state.backend.context_length} if state.backend else {}
        card = {
            "id": state.config.model_name,
            "object": "model",
            "created": state.created,
            "owned_by": "flint",
            "meta": meta,
        }
        return {"object": "list", "data": [card]}

    @app.get("/metrics", dependencies=[Depends(_auth)])
    async def metrics() -> Response:
        s, backend = state.scheduler, state.backend
        text = state.metrics.render(
            s.waiting if s else 0,
            s.processing if s else 0,
            backend.cache_stats() if backend else None,
        )
        return PlainTextResponse(text, media_type=CONTENT_TYPE)


def _generation_routes(app: FastAPI, state: ServerState) -> None:
    name = state.config.model_name

    @app.post("/v1/chat/completions", dependencies=[Depends(_auth)])
    async def chat_completions(request: Request) -> Response:
        backend, scheduler = state.ready()
        req = await _read(request, ChatRequest)
        setup = chat.prepare(req, backend, state.syntax)
        job = scheduler.submit(setup.prompt_ids, setup.params, setup.logprobs)
        state.metrics.accepted("chat")
        if req.stream:
            return sse_response(chat.stream(job, setup, name, backend, _include_usage(req)), job)
        return JSONResponse(await chat.complete(job, request, setup, name, backend))

    @app.post("/v1/completions", dependencies=[Depends(_auth)])
    async def openai_completions(request: Request) -> Response:
        backend, scheduler = state.ready()
        req = await _read(request, CompletionRequest)
        setup = completions.prepare(req, backend)
        job = scheduler.submit(setup.prompt_ids, setup.params, setup.logprobs)
        state.metrics.accepted("completions")
        if req.stream:
            payloads = completions.stream(job, setup, name, backend, _include_usage(req))
            return sse_response(payloads, job)
        return JSONResponse(await completions.complete(job, request, setup, name, backend))

    @app.post("/completion", dependencies=[Depends(_auth)])
    async def llama_completion(request: Request) -> Response:
        backend, scheduler = state.ready()
        req = await _read(request, LlamaCompletionRequest)
        setup = completions.prepare_llama(req, backend)
        job = scheduler.submit(setup.prompt_ids, setup.params, setup.logprobs)
        state.metrics.accepted("completion")
        if req.stream:
            return sse_response(completions.llama_stream(job, setup, name, backend), job, False)
        return JSONResponse(await completions.llama_complete(job, request, setup, name, backend))
