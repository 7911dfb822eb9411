"""A parsed tool call, and what a tool-call syntax provides (``flint.server.tools``)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Protocol


@dataclass(slots=True, frozen=True)
class ToolCall:
    """A parsed call: ``arguments`` is a JSON object as text."""

    name: str
    arguments: str
    id: str

    def as_openai(self) -> dict[str, object]:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


class ToolSyntax(Protocol):
    start: str
    end: str

    def parse(self, body: str) -> ToolCall | list[ToolCall] | None:
        """The call (or block of calls) written between the markers, or None when it
        is not one."""
        ...


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]
