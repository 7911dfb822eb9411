"""Request bodies with their validation rules (pydantic). Context-dependent limits
(max_tokens vs the context, token ids vs the vocabulary) are checked by the routes.

Unknown fields are ignored, as OpenAI-compatible servers do: clients send many.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, field_validator, model_validator

MAX_STOP = 4
MAX_TOOL_SCHEMA_BYTES = 64 * 1024  # all tool definitions, as JSON
MAX_TOP_LOGPROBS = 20

MAX_SEED = 2**63 - 1  # torch.Generator.manual_seed's range
TokenIds = Annotated[list[StrictInt], Field(min_length=1)]


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)


class StreamOptions(_Body):
    include_usage: bool = False


class _Sampling(_Body):
    model: str | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: StrictInt | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, ge=0.0, le=1.0)
    top_k: StrictInt | None = Field(None, ge=0)
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    repetition_penalty: float | None = Field(None, gt=0.0, le=10.0)
    seed: StrictInt | None = Field(None, ge=0, le=MAX_SEED)
    stop: str | list[str] | None = None
    n: StrictInt = 1
    ignore_eos: bool = False
    logit_bias: dict[str, float] | None = None

    @field_validator("stop")
    @classmethod
    def _stops(cls, v: str | list[str] | None) -> list[str]:
        stops = [v] if isinstance(v, str) else list(v or [])
        if len(stops) > MAX_STOP:
            raise ValueError(f"at most {MAX_STOP} stop sequences are allowed")
        if not all(stops):
            raise ValueError("stop sequences must be non-empty")
        return stops

    @field_validator("n")
    @classmethod
    def _one(cls, v: int) -> int:
        if v != 1:
            raise ValueError("only n=1 is supported")
        return v

    @field_validator("logit_bias")
    @classmethod
    def _no_bias(cls, v: dict[str, float] | None) -> None:
        if v:
            raise ValueError("logit_bias is not supported")
        return None

    @model_validator(mode="after")
    def _stream_options_need_stream(self) -> _Sampling:
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options is only allowed when stream is true")
        return self

    def sampling(self) -> dict[str, Any]:
        """Options for ``SamplingParams`` (None: the model's default)."""
        top_p = self.top_p if self.top_p != 0.0 else 1e-9  # 0 keeps only the top token
        return {
            "temperature": self.temperature,
            "top_p": top_p,
            "top_k": self.top_k,
            "min_p": self.min_p,
            "presence_penalty": self.presence_penalty,
            "frequency_penalty": self.frequency_penalty,
            "repetition_penalty": self.repetition_penalty,
            "seed": self.seed,
            "stop": tuple(self.stop or ()),
            "ignore_eos": self.ignore_eos,
        }


class ToolCallFunction(_Body):
    name: str
    arguments: str | dict[str, Any] = "{}"


class ToolCall(_Body):
    id: str | None = None
    type: Literal["function"] = "function"
    function: ToolCallFunction


class ContentPart(_Body):
    type: Literal["text"]
    text: str


class Message(_Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None

    @model_validator(mode="after")
    def _has_content(self) -> Message:
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise ValueError(f"a {self.role} message needs content")
        return self

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content or ""


class FunctionDef(_Body):
    name: str = Field(pattern=r"^[A-Za-z0-9_.\-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None


class Tool(_Body):
    type: Literal["function"]
    function: FunctionDef


class ChatRequest(_Sampling):
    messages: list[Message] = Field(min_length=1)
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto"] | None = None
    max_completion_tokens: StrictInt | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: StrictInt | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    chat_template_kwargs: dict[str, Any] | None = None
    response_format: dict[str, Any] | None = None

    @field_validator("tools")
    @classmethod
    def _tool_size(cls, v: list[Tool] | None) -> list[Tool] | None:
        if v is not None:
            size = len(json.dumps([t.model_dump(exclude_none=True) for t in v]))
            if size > MAX_TOOL_SCHEMA_BYTES:
                raise ValueError(
                    f"tool definitions take {size} bytes; the cap is {MAX_TOOL_SCHEMA_BYTES}"
                )
        return v

    @field_validator("response_format")
    @classmethod
    def _text_only(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        if v is not None and v.get("type") != "text":
            raise ValueError("only response_format type 'text' is supported")
        return v

    @model_validator(mode="after")
    def _logprob_rules(self) -> ChatRequest:
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs requires logprobs to be true")
        return self

    def limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class CompletionRequest(_Sampling):
    prompt: str | TokenIds
    logprobs: StrictInt | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    echo: bool = False
    suffix: str | None = None

    @field_validator("prompt", mode="before")
    @classmethod
    def _single(cls, v: Any) -> Any:
        """A batch of one (``["text"]`` or ``[[ids]]``) is that prompt."""
        if isinstance(v, list) and v and isinstance(v[0], str | list):
            if len(v) != 1:
                raise ValueError("exactly one prompt is supported per request")
            v = v[0]
        if isinstance(v, str | list) and len(v) == 0:
            raise ValueError("the prompt is empty")
        return v

    @model_validator(mode="after")
    def _unsupported(self) -> CompletionRequest:
        if self.echo:
            raise ValueError("echo is not supported")
        if self.suffix:
            raise ValueError("suffix is not supported")
        return self


class LlamaCompletionRequest(_Body):
    """llama.cpp's ``/completion`` body (its field names and defaults)."""

    prompt: str | TokenIds
    stream: bool = False
    n_predict: StrictInt = Field(-1, ge=-1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_k: StrictInt | None = Field(None, ge=0)
    top_p: float | None = Field(None, ge=0.0, le=1.0)
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    repeat_penalty: float | None = Field(None, gt=0.0, le=10.0)
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    seed: StrictInt = Field(-1, ge=-1, le=MAX_SEED)
    stop: list[str] = Field(default_factory=list, max_length=MAX_STOP)
    n_probs: StrictInt = Field(0, ge=0, le=MAX_TOP_LOGPROBS)
    ignore_eos: bool = False

    @field_validator("prompt")
    @classmethod
    def _non_empty(cls, v: str | list[int]) -> str | list[int]:
        if not v:
            raise ValueError("the prompt is empty")
        return v

    @field_validator("stop")
    @classmethod
    def _stops(cls, v: list[str]) -> list[str]:
        if not all(v):
            raise ValueError("stop sequences must be non-empty")
        return v

    def sampling(self) -> dict[str, Any]:
        return {
            "temperature": self.temperature,
            "top_k": self.top_k,
            "top_p": self.top_p if self.top_p != 0.0 else 1e-9,
            "min_p": self.min_p,
            "repetition_penalty": self.repeat_penalty,
            "presence_penalty": self.presence_penalty,
            "frequency_penalty": self.frequency_penalty,
            "seed": None if self.seed < 0 else self.seed,
            "stop": tuple(self.stop),
            "ignore_eos": self.ignore_eos,
        }
