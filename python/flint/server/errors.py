"""OpenAI's error envelope and the exception handlers that always produce it.

Every error leaves the server as ``{"error": {"message", "type", "param", "code"}}``;
FastAPI's own 422 shape never does. Extra keys (llama.cpp's ``n_prompt_tokens`` and
``n_ctx`` on context overflow) sit next to those four.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

log = logging.getLogger("flint.server")

_HTTP_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    503: "unavailable_error",
}


class APIError(Exception):
    """An error answered to the client in OpenAI's envelope."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str | None = None,
        param: str | None = None,
        code: str | int | None = None,
        extra: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type or _HTTP_TYPES.get(status, "server_error")
        self.param = param
        self.code = code
        self.extra = extra or {}
        self.headers = headers

    def body(self) -> dict[str, Any]:
        err = {"message": self.message, "type": self.type, "param": self.param, "code": self.code}
        return {"error": {**err, **self.extra}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def context_overflow(n_prompt: int, n_ctx: int) -> APIError:
    """llama.cpp's ``exceed_context_size_error`` in OpenAI's wording."""
    message = (
        f"This model's maximum context length is {n_ctx} tokens. However, your request has "
        f"{n_prompt} prompt tokens, which leaves no room to generate. Please reduce the "
        "length of the messages or the prompt."
    )
    return APIError(
        400,
        message,
        type="exceed_context_size_error",
        param="messages",
        code="context_length_exceeded",
        extra={"n_prompt_tokens": n_prompt, "n_ctx": n_ctx},
    )


def _loc(loc: tuple[Any, ...]) -> str | None:
    parts = [str(p) for p in loc if p != "body"]
    return ".".join(parts) or None


def validation_message(err: dict[str, Any]) -> str:
    """A pydantic error as one sentence naming the field."""
    where = _loc(tuple(err.get("loc", ())))
    msg = str(err.get("msg", "invalid value")).removeprefix("Value error, ")
    if err.get("type") == "json_invalid":
        return "the request body is not valid JSON"
    return f"{where}: {msg}" if where else msg


async def _api_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, APIError)
    return exc.response()


async def _validation_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = list(exc.errors())
    first: dict[str, Any] = dict(errors[0]) if errors else {}
    param = _loc(tuple(first.get("loc", ())))
    return bad_request(validation_message(first), param=param).response()


async def _http_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPException)
    headers = dict(exc.headers) if exc.headers else None
    return APIError(exc.status_code, str(exc.detail), headers=headers).response()


async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
    log.exception("unexpected error", exc_info=exc)
    return APIError(500, f"internal error: {type(exc).__name__}", type="server_error").response()


def install_handlers(app: FastAPI) -> None:
    app.add_exception_handler(APIError, _api_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(Exception, _unexpected)
