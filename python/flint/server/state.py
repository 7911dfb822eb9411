"""The server's configuration and its state: loading, then a backend and its queue."""

from __future__ import annotations

from dataclasses import dataclass

from flint.server.backend import Backend
from flint.server.errors import APIError
from flint.server.metrics import Metrics
from flint.server.queue import Scheduler
from flint.server.responses import now
from flint.server.tools import SYNTAXES, ToolSyntax, detect_syntax

MiB = 1 << 20


@dataclass(slots=True, frozen=True)
class ServerConfig:
    """How the server behaves, independent of the model."""

    model_name: str  # the id clients see in /v1/models and responses
    api_key: str | None = None  # Bearer key for everything but /health and /v1/models
    max_waiting: int = 8  # queued requests beyond the running one; then 429
    max_body_bytes: int = 4 * MiB
    tool_parser: str = "auto"  # auto (from the chat template), none, or a SYNTAXES name

    def __post_init__(self) -> None:
        if self.max_waiting < 1:
            raise ValueError(f"the queue must hold at least 1 request, got {self.max_waiting}")
        if self.max_body_bytes < 1024:
            raise ValueError(f"the body cap must be at least 1024 bytes, got {self.max_body_bytes}")
        choices = ("auto", "none", *SYNTAXES)
        if self.tool_parser not in choices:
            raise ValueError(f"tool parser {self.tool_parser!r} is not one of {choices}")


class ServerState:
    """Shared by the routes; ``attach`` is called once the model is loaded."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.metrics = Metrics()
        self.created = now()
        self.backend: Backend | None = None
        self.scheduler: Scheduler | None = None
        self.syntax: ToolSyntax | None = None

    def attach(self, backend: Backend) -> None:
        parser = self.config.tool_parser
        if parser == "auto":
            self.syntax = detect_syntax(backend.chat_template)
        elif parser != "none":
            self.syntax = SYNTAXES[parser]
        self.scheduler = Scheduler(backend, self.config.max_waiting, self.metrics)
        self.backend = backend

    def ready(self) -> tuple[Backend, Scheduler]:
        if self.backend is None or self.scheduler is None:
            raise APIError(503, "Loading model", code=503)
        return self.backend, self.scheduler

    def close(self) -> None:
        if self.scheduler is not None:
            self.scheduler.close()
