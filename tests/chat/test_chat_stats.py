"""The status line and the expert-cache figures (shown only when the LLM has them)."""

from __future__ import annotations

from typing import Any

import pytest

from flint.chat.stats import NO_CACHE, CacheStats, ReplyMeter, read_cache_stats, status_line
from flint.generation import StreamChunk, Timings


class CachedLLM:
    def cache_stats(self) -> dict[str, Any]:
        return {"ram_hit_rate": 0.875, "vram_hit_rate": 0.5, "stall_s": 0.25}


def test_no_statistics_means_no_numbers() -> None:
    assert read_cache_stats(object()) is None
    meter = ReplyMeter()
    meter.add(StreamChunk("hi", (5, 6), 0.1))
    line = status_line(meter.stats(10, 64, 0, None))
    assert f"expert cache {NO_CACHE}" in line and "2 tokens" in line and "ctx 12/64" in line


def test_statistics_of_the_llm_are_shown() -> None:
    cache = read_cache_stats(CachedLLM())
    assert cache == CacheStats(0.875, 0.5, 0.25)
    meter = ReplyMeter()
    meter.add(StreamChunk("a", (1,), 0.1, "length", Timings(10, 9, 0.2, 0.5)))
    stats = meter.stats(10, 20, 2, cache)
    assert (stats.generated_tokens, stats.ttft_s) == (9, 0.2)
    assert stats.decode_tok_s == pytest.approx(16.0)
    line = status_line(stats)
    assert "RAM 87.5%, VRAM 50.0%, stall 0.25 s" in line and "TTFT 200 ms" in line
    assert "token limit" in line and "2 old messages left out" in line


def test_interrupted_reply_is_measured_by_chat() -> None:
    meter = ReplyMeter()
    meter.add(StreamChunk("a", (1, 2, 3), 0.1))
    stats = meter.stats(4, 20, 0, None)
    assert stats.finish == "interrupted" and stats.generated_tokens == 3
    assert 0 <= stats.ttft_s <= stats.total_s
