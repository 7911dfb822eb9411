"""``POST /v1/chat/completions``: prompt through the template, then the reply split
into reasoning, content and tool calls, whole or as OpenAI's stream of chunks."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request

from flint.generation import TokenLogprob
from flint.harmony import REASONING, HarmonyCall, HarmonyParser, is_harmony
from flint.sampling import SamplingParams
from flint.server.backend import Backend
from flint.server.errors import bad_request
from flint.server.limits import build_params
from flint.server.queue import Job
from flint.server.reasoning import CLOSE, ReasoningSplitter, prompt_opens_think
from flint.server.responses import (
    chat_logprobs,
    collect,
    flint_stats,
    last_timings,
    new_id,
    now,
    timings,
    usage,
)
from flint.server.schemas import ChatRequest, Message
from flint.server.tools import ToolCall, ToolStream, ToolSyntax, for_request, new_call_id


@dataclass(slots=True, frozen=True)
class ChatSetup:
    """A validated chat request, ready to queue."""

    prompt_ids: list[int]
    params: SamplingParams
    logprobs: int | None  # alternatives per token; None: no logprobs
    think: bool | None  # starts inside <think>; None: no reasoning split
    tools: ToolSyntax | None  # parse tool calls with this syntax
    harmony: bool = False  # GPT-OSS's channels (then think and tools are None)
    harmony_tools: bool = False  # read harmony messages to functions as tool calls


def _template_message(m: Message, args_as_text: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {"role": "system" if m.role == "developer" else m.role}
    out["content"] = m.text()
    for key in ("name", "tool_call_id", "reasoning_content"):
        if getattr(m, key) is not None:
            out[key] = getattr(m, key)
    if m.tool_calls:
        out["tool_calls"] = [
            {
                "id": c.id,
                "type": "function",
                "function": {
                    "name": c.function.name,
                    "arguments": _args(c.function.arguments, args_as_text),
                },
            }
            for c in m.tool_calls
        ]
    return out


def _args(arguments: str | dict[str, Any], as_text: bool = False) -> str | dict[str, Any]:
    """Arguments as an object when they are JSON text (templates expect a mapping);
    ``as_text``: as JSON text (DeepSeek's templates concatenate them as a string)."""
    if as_text:
        return arguments if isinstance(arguments, str) else json.dumps(arguments)
    if isinstance(arguments, str):
        try:
            parsed = json.loads(arguments)
        except ValueError:
            return arguments
        return parsed if isinstance(parsed, dict) else arguments
    return arguments


def prepare(req: ChatRequest, backend: Backend, syntax: ToolSyntax | None) -> ChatSetup:
    template = backend.chat_template
    if template is None:
        raise bad_request(
            "this model has no chat template; start the server with --chat-template FILE "
            "or use /v1/completions",
            param="messages",
            code="no_chat_template",
        )
    use_tools = bool(req.tools) and req.tool_choice != "none"
    tools = [t.model_dump(exclude_none=True) for t in req.tools or ()] if use_tools else None
    try:
        as_text = bool(getattr(syntax, "arguments_as_text", False))
        text = backend.render_chat(
            [_template_message(m, as_text) for m in req.messages],
            tools,
            req.chat_template_kwargs or {},
        )
    except ValueError as err:
        raise bad_request(str(err), param="messages") from None
    ids = backend.encode(text)
    params = build_params(backend, len(ids), req.limit(), req.sampling())
    logprobs = (req.top_logprobs or 0) if req.logprobs else None
    if is_harmony(template):
        return ChatSetup(ids, params, logprobs, None, None, True, use_tools)
    think = prompt_opens_think(text) if CLOSE in template else None
    bound = for_request(syntax, tools) if use_tools and syntax is not None else None
    return ChatSetup(ids, params, logprobs, think, bound)


class ChatOutput:
    """Turns generated text into chat deltas (reasoning, content, tool calls)."""

    def __init__(self, setup: ChatSetup) -> None:
        self.reasoning = ReasoningSplitter(setup.think) if setup.think is not None else None
        self.tools = ToolStream(setup.tools) if setup.tools is not None else None
        self.harmony = HarmonyParser(setup.harmony_tools) if setup.harmony else None
        self.calls = 0

    def feed(self, text: str, last: bool = False) -> list[dict[str, Any]]:
        if self.harmony is not None:
            return self._harmony(text, last)
        reasoning, content = self.reasoning.feed(text) if self.reasoning else ("", text)
        if last and self.reasoning:
            more_r, more_c = self.reasoning.flush()
            reasoning, content = reasoning + more_r, content + more_c
        parts: list[str | ToolCall] = [content]
        if self.tools is not None:
            parts = self.tools.feed(content) + (self.tools.flush() if last else [])
        deltas = [{"reasoning_content": reasoning}] if reasoning else []
        for part in parts:
            if isinstance(part, ToolCall):
                deltas += self._call(part)
            elif part:
                deltas.append({"content": part})
        return deltas

    def _harmony(self, text: str, last: bool) -> list[dict[str, Any]]:
        assert self.harmony is not None
        events = self.harmony.feed(text) + (self.harmony.flush() if last else [])
        deltas: list[dict[str, Any]] = []
        for event in events:
            if isinstance(event, HarmonyCall):
                deltas += self._call(ToolCall(event.name, event.arguments, new_call_id()))
            else:
                kind, piece = event
                deltas.append({"reasoning_content" if kind == REASONING else "content": piece})
        return deltas

    def _call(self, call: ToolCall) -> list[dict[str, Any]]:
        index, self.calls = self.calls, self.calls + 1
        head = {
            "index": index,
            "id": call.id,
            "type": "function",
            "function": {"name": call.name, "arguments": ""},
        }
        args = {"index": index, "function": {"arguments": call.arguments}}
        return [{"tool_calls": [head]}, {"tool_calls": [args]}]

    def finish_reason(self, reason: str) -> str:
        return "tool_calls" if self.calls and reason == "stop" else reason


def _message(deltas: list[dict[str, Any]]) -> dict[str, Any]:
    content = "".join(d.get("content", "") for d in deltas)
    reasoning = "".join(d.get("reasoning_content", "") for d in deltas)
    calls = [c for d in deltas for c in d.get("tool_calls", []) if "id" in c]
    args = [
        c["function"]["arguments"] for d in deltas for c in d.get("tool_calls", []) if "id" not in c
    ]
    msg: dict[str, Any] = {"role": "assistant", "content": content or (None if calls else "")}
    if reasoning:
        msg["reasoning_content"] = reasoning
    if calls:
        msg["tool_calls"] = [
            {
                "id": c["id"],
                "type": "function",
                "function": {"name": c["function"]["name"], "arguments": a},
            }
            for c, a in zip(calls, args, strict=True)
        ]
    return msg


async def complete(
    job: Job, request: Request, setup: ChatSetup, model: str, backend: Backend
) -> dict[str, Any]:
    chunks = await collect(job, request)
    reason, t = last_timings(chunks)
    out = ChatOutput(setup)
    message = _message(out.feed("".join(c.text for c in chunks), last=True))
    lps = [lp for c in chunks for lp in c.logprobs]
    logprobs = None
    if setup.logprobs is not None:
        logprobs = {"content": chat_logprobs(lps, backend.token_text)}
    choice = {
        "index": 0,
        "message": message,
        "logprobs": logprobs,
        "finish_reason": out.finish_reason(reason),
    }
    return {
        "id": new_id("chatcmpl"),
        "object": "chat.completion",
        "created": now(),
        "model": model,
        "choices": [choice],
        "usage": usage(t),
        "timings": timings(t),
        "flint": flint_stats(t, job, len(chunks)),
    }


async def stream(
    job: Job, setup: ChatSetup, model: str, backend: Backend, include_usage: bool
) -> AsyncIterator[dict[str, Any]]:
    base = {
        "id": new_id("chatcmpl"),
        "object": "chat.completion.chunk",
        "created": now(),
        "model": model,
    }
    extra = {"usage": None} if include_usage else {}

    def chunk(
        delta: dict[str, Any], lps: list[TokenLogprob], finish: str | None = None
    ) -> dict[str, Any]:
        logprobs = None
        if setup.logprobs is not None and lps:
            logprobs = {"content": chat_logprobs(lps, backend.token_text)}
        choice = {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
        return {**base, "choices": [choice], **extra}

    yield chunk({"role": "assistant", "content": ""}, [])
    out, sent = ChatOutput(setup), 1
    pending: list[TokenLogprob] = []
    async for piece in job.chunks():
        pending += piece.logprobs
        for delta in out.feed(piece.text, last=piece.finish_reason is not None):
            yield chunk(delta, pending)
            pending, sent = [], sent + 1
        if piece.finish_reason is not None and piece.timings is not None:
            t = piece.timings
            final = chunk({}, pending, out.finish_reason(piece.finish_reason))
            yield {**final, "timings": timings(t), "flint": flint_stats(t, job, sent + 1)}
            if include_usage:
                yield {**base, "choices": [], "usage": usage(t)}
