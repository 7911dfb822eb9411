"""Numbers about the last reply: the status line and ``/stats``.

Expert-cache figures come from the LLM only when it exposes them: an object with a
``cache_stats()`` method returning a mapping with any of ``ram_hit_rate``,
``vram_hit_rate`` (0..1) and ``stall_s`` (seconds spent waiting for experts) for the
last request. The resident model (every expert in memory) has none, and chat then says
so instead of showing numbers.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from flint.generation import StreamChunk, Timings

NO_CACHE = "n/a (all experts resident)"


@dataclass(slots=True, frozen=True)
class CacheStats:
    ram_hit_rate: float | None
    vram_hit_rate: float | None
    stall_s: float | None


@dataclass(slots=True, frozen=True)
class ReplyStats:
    """One reply, measured by chat (also when it was interrupted)."""

    prompt_tokens: int
    generated_tokens: int
    ttft_s: float  # request start to the first generated token
    total_s: float
    context_size: int
    finish: str  # "stop", "length" or "interrupted"
    dropped_messages: int
    cache: CacheStats | None

    @property
    def decode_tok_s(self) -> float:
        steps, secs = self.generated_tokens - 1, self.total_s - self.ttft_s
        return steps / secs if steps > 0 and secs > 0 else 0.0

    @property
    def prefill_tok_s(self) -> float:
        return self.prompt_tokens / self.ttft_s if self.ttft_s > 0 else 0.0

    @property
    def context_used(self) -> int:
        return self.prompt_tokens + self.generated_tokens


class ReplyMeter:
    """Measures a reply from its stream chunks; exact engine timings when the reply
    finished, chat's own clock when it was interrupted."""

    def __init__(self) -> None:
        self.t0 = time.perf_counter()
        self.pieces: list[str] = []
        self.generated = 0
        self.first_s: float | None = None
        self.finish = "interrupted"
        self.timings: Timings | None = None

    def add(self, chunk: StreamChunk) -> None:
        if self.first_s is None:
            self.first_s = time.perf_counter() - self.t0
        self.pieces.append(chunk.text)
        self.generated += len(chunk.token_ids)
        if chunk.finish_reason is not None:
            self.finish, self.timings = chunk.finish_reason, chunk.timings

    @property
    def text(self) -> str:
        return "".join(self.pieces)

    def stats(
        self, prompt_tokens: int, context_size: int, dropped: int, cache: CacheStats | None
    ) -> ReplyStats:
        total = time.perf_counter() - self.t0
        tokens, ttft = self.generated, self.first_s if self.first_s is not None else total
        if self.timings is not None:
            tokens, ttft = self.timings.generated_tokens, self.timings.prefill_s
            total = self.timings.prefill_s + self.timings.decode_s
        return ReplyStats(
            prompt_tokens, tokens, ttft, total, context_size, self.finish, dropped, cache
        )


def read_cache_stats(llm: Any) -> CacheStats | None:
    getter = getattr(llm, "cache_stats", None)
    if not callable(getter):
        return None
    raw = getter()
    if not isinstance(raw, Mapping):
        return None

    def num(key: str) -> float | None:
        value = raw.get(key)
        return float(value) if isinstance(value, int | float) else None

    return CacheStats(num("ram_hit_rate"), num("vram_hit_rate"), num("stall_s"))


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1%}"


def _secs(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f} s"


def cache_summary(cache: CacheStats | None) -> str:
    if cache is None:
        return NO_CACHE
    return (
        f"RAM {_pct(cache.ram_hit_rate)}, VRAM {_pct(cache.vram_hit_rate)},"
        f" stall {_secs(cache.stall_s)}"
    )


def _duration(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.2f} s"


def status_line(s: ReplyStats) -> str:
    """The dim line printed under each reply."""
    parts = [
        f"{s.generated_tokens} tokens",
        f"{s.decode_tok_s:.1f} tok/s",
        f"TTFT {_duration(s.ttft_s)}",
        f"ctx {s.context_used}/{s.context_size}",
        f"expert cache {cache_summary(s.cache)}",
    ]
    if s.finish == "length":
        parts.append("stopped at the token limit")
    if s.dropped_messages:
        parts.append(f"{s.dropped_messages} old messages left out to fit")
    return " · ".join(parts)


def stats_rows(s: ReplyStats) -> list[tuple[str, str]]:
    """The rows of ``/stats``."""
    cache = s.cache
    return [
        ("prompt tokens", str(s.prompt_tokens)),
        ("generated tokens", str(s.generated_tokens)),
        ("time to first token", f"{s.ttft_s:.3f} s"),
        ("prompt processing", f"{s.prefill_tok_s:.1f} tok/s"),
        ("generation", f"{s.decode_tok_s:.1f} tok/s"),
        ("total time", f"{s.total_s:.2f} s"),
        ("context used", f"{s.context_used} / {s.context_size}"),
        ("finish", s.finish),
        ("messages left out", str(s.dropped_messages)),
        ("RAM expert cache hit rate", NO_CACHE if cache is None else _pct(cache.ram_hit_rate)),
        ("VRAM expert cache hit rate", NO_CACHE if cache is None else _pct(cache.vram_hit_rate)),
        ("stall (waiting for experts)", NO_CACHE if cache is None else _secs(cache.stall_s)),
    ]
