"""Conversation state: the system prompt and the messages, as prompt ids, and as JSON.

The saved file is ``{"messages": [{"role": ..., "content": ...}, ...]}`` with the system
prompt as a leading ``system`` message: the shape OpenAI-style APIs use, so files can go
both ways. Assistant messages keep their ``<think>`` block; templates that strip old
reasoning (Qwen3) do so when rendering.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flint.tokenizer import Tokenizer

ROLES = ("user", "assistant")
THINK_OPEN = "<think>"


@dataclass(slots=True, frozen=True)
class Prompt:
    """Token ids for the next reply, and what had to be left out to fit the context."""

    ids: list[int]
    dropped: int  # oldest messages left out of this prompt (kept in the conversation)
    in_think: bool  # the prompt opens a <think> block the reply continues


@dataclass(slots=True)
class Conversation:
    """The system prompt and the user/assistant messages, oldest first."""

    system: str | None = None
    messages: list[dict[str, str]] = field(default_factory=list)

    def add(self, role: str, content: str) -> None:
        if role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, got {role!r}")
        self.messages.append({"role": role, "content": content})

    def clear(self) -> None:
        """Forgets the messages; the system prompt stays."""
        self.messages.clear()

    def undo_reply(self) -> bool:
        """Drops a trailing assistant message (for /retry). True if there is something
        to answer again; False, changing nothing, if there is no user message."""
        if not any(m["role"] == "user" for m in self.messages):
            return False
        if self.messages[-1]["role"] == "assistant":
            self.messages.pop()
        return True

    def with_system(self, messages: list[dict[str, str]]) -> list[dict[str, str]]:
        head = [{"role": "system", "content": self.system}] if self.system else []
        return head + messages

    def to_json(self) -> dict[str, Any]:
        return {"messages": self.with_system(self.messages)}

    def save(self, path: Path) -> None:
        text = json.dumps(self.to_json(), indent=2, ensure_ascii=False)
        try:
            path.write_text(text + "\n", "utf-8")
        except OSError as err:
            raise ValueError(f"cannot write {path}: {err.strerror}") from err

    @classmethod
    def from_json(cls, data: Any) -> Conversation:
        """A conversation from ``{"messages": [...]}`` or a bare list; ValueError if malformed."""
        messages = data.get("messages") if isinstance(data, dict) else data
        if not isinstance(messages, list):
            raise ValueError('expected {"messages": [...]} or a list of messages')
        conv = cls()
        for i, msg in enumerate(messages):
            if not isinstance(msg, dict) or not isinstance(msg.get("content"), str):
                raise ValueError(f"message {i} needs a string 'content'")
            if msg.get("role") == "system" and i == 0:
                conv.system = msg["content"]
            elif msg.get("role") in ROLES:
                conv.add(msg["role"], msg["content"])
            else:
                raise ValueError(f"message {i} has role {msg.get('role')!r}: use user or assistant")
        return conv

    @classmethod
    def load(cls, path: Path) -> Conversation:
        try:
            data = json.loads(path.read_text("utf-8"))
        except OSError as err:
            raise ValueError(f"cannot read {path}: {err.strerror}") from err
        except json.JSONDecodeError as err:
            raise ValueError(f"{path} is not JSON: {err}") from err
        try:
            return cls.from_json(data)
        except ValueError as err:
            raise ValueError(f"{path}: {err}") from err


def render_ids(
    conv: Conversation, messages: list[dict[str, str]], tok: Tokenizer, thinking: bool
) -> tuple[list[int], bool]:
    """Prompt ids of ``messages`` and whether the prompt ends inside a <think> block.

    With a chat template the messages are rendered by it; without one (a base model) the
    text is the system prompt and the messages joined as they are, for the model to continue.
    """
    if tok.chat_template is None:
        return tok.encode((conv.system or "") + "".join(m["content"] for m in messages)), False
    text = tok.render_chat(conv.with_system(messages), enable_thinking=thinking)
    return tok.encode(text), _opens_think(text)


def _opens_think(text: str) -> bool:
    tail = text.rstrip()
    return tail.endswith(THINK_OPEN)


def build_prompt(
    conv: Conversation, tok: Tokenizer, context: int, reserve: int, thinking: bool
) -> Prompt:
    """The prompt for the next reply. The oldest messages are left out (starting at a
    user message) until ``reserve`` positions stay free for the reply; the last user
    message alone may leave less. ValueError if even that does not fit."""
    starts = [i for i, m in enumerate(conv.messages) if m["role"] == "user"]
    if not starts:
        raise ValueError("there is no user message to answer")
    size = 0
    for n, start in enumerate(starts):
        ids, in_think = render_ids(conv, conv.messages[start:], tok, thinking)
        size = len(ids)
        if size + reserve <= context or (n == len(starts) - 1 and size < context):
            return Prompt(ids, start, in_think)
    raise ValueError(
        f"the prompt is {size} tokens and the context holds {context}:"
        " shorten the message, /clear, or start with a larger -c/--ctx-size"
    )
