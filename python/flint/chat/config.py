"""What a chat session is started with, and the sampling settings ``/set`` changes."""

from __future__ import annotations

import dataclasses
import os
import re
import sys
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}


@dataclass(slots=True, frozen=True)
class ChatConfig:
    """Startup options of ``flint chat`` (the CLI flags, parsed and checked)."""

    model: str
    system: str | None = None
    context_length: int | None = None  # None: the model's maximum, capped at 8192
    device: str | None = None  # None: CUDA when present, else CPU
    chat_template: str | None = None  # template text that replaces the model's own
    hide_thinking: bool = False
    ram_budget: int | None = None  # bytes: stream experts through a RAM cache this big
    vram_budget: int | None = None  # bytes: VRAM expert cache when streaming on CUDA
    history_file: Path | None = None  # None: no input history


@dataclass(slots=True, frozen=True)
class Settings:
    """Per-reply settings; ``None`` keeps the model's generation_config default."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    max_tokens: int | None = None  # None: until end of sequence or a full context
    seed: int | None = None  # None: a fresh random seed per reply
    thinking: bool = True  # the template's enable_thinking

    def updated(self, name: str, value: Any) -> Settings:
        """A copy with field ``name`` set to ``value`` (the caller checked it)."""
        return dataclasses.replace(self, **{name: value})

    def describe(self) -> str:
        parts = [f"{f.name}={getattr(self, f.name)}" for f in fields(self)]
        return " ".join(p.replace("=None", "=default") for p in parts)


def parse_size(text: str) -> int:
    """Bytes from '512M', '8G', '1.5GiB', '4096' (binary units); ValueError otherwise."""
    match = _SIZE.match(text)
    if match is None:
        raise ValueError(f"invalid size {text!r}: use a number with K, M, G or T (e.g. 8G)")
    number, unit = float(match.group(1)), match.group(2).lower()
    size = int(number * _UNITS[unit])
    if size <= 0:
        raise ValueError(f"size must be positive, got {text!r}")
    return size


def format_size(size: int) -> str:
    """'8 GiB', '1.5 MiB', '512 B'."""
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024:
            return f"{value:.3g} {unit}"
        value /= 1024
    return f"{value:.3g} TiB"


def data_dir() -> Path:
    """Where flint keeps per-user data (platformdirs' user_data_dir, without the dep)."""
    if sys.platform == "win32":
        base = os.environ.get("LOCALAPPDATA") or str(Path.home() / "AppData" / "Local")
    elif sys.platform == "darwin":
        base = str(Path.home() / "Library" / "Application Support")
    else:
        base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "flint"


def default_history_file() -> Path:
    return data_dir() / "chat_history"
