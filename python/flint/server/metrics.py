"""Server counters, rendered as Prometheus text (exposition format 0.0.4)."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Mapping

from flint.generation import Timings

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class Metrics:
    """Counts requests and tokens; written by the worker and the routes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests: Counter[str] = Counter()  # endpoint -> accepted requests
        self.rejected = 0  # 429: queue full
        self.cancelled = 0  # client went away
        self.prompt_tokens = 0
        self.generated_tokens = 0
        self.prefill_s = 0.0
        self.decode_s = 0.0
        self.queue_wait_s = 0.0
        self.last_prefill_tok_s = 0.0
        self.last_decode_tok_s = 0.0

    def accepted(self, endpoint: str) -> None:
        with self._lock:
            self.requests[endpoint] += 1

    def reject(self) -> None:
        with self._lock:
            self.rejected += 1

    def cancel(self) -> None:
        with self._lock:
            self.cancelled += 1

    def finished(self, timings: Timings, queue_wait_s: float) -> None:
        with self._lock:
            self.prompt_tokens += timings.prompt_tokens
            self.generated_tokens += timings.generated_tokens
            self.prefill_s += timings.prefill_s
            self.decode_s += timings.decode_s
            self.queue_wait_s += queue_wait_s
            self.last_prefill_tok_s = timings.prefill_tok_s
            self.last_decode_tok_s = timings.decode_tok_s

    def render(self, queue_depth: int, processing: int, cache: Mapping[str, float] | None) -> str:
        with self._lock:
            lines = _family("requests_total", "counter", "Requests accepted for generation.")
            lines += [
                f'flint_requests_total{{endpoint="{k}"}} {v}'
                for k, v in sorted(self.requests.items())
            ]
            rows = [
                (
                    "requests_rejected_total",
                    "counter",
                    "Requests refused: queue full.",
                    self.rejected,
                ),
                (
                    "requests_cancelled_total",
                    "counter",
                    "Generations cancelled by a disconnect.",
                    self.cancelled,
                ),
                ("prompt_tokens_total", "counter", "Prompt tokens processed.", self.prompt_tokens),
                ("tokens_predicted_total", "counter", "Tokens generated.", self.generated_tokens),
                ("prompt_seconds_total", "counter", "Time spent in prefill.", self.prefill_s),
                (
                    "tokens_predicted_seconds_total",
                    "counter",
                    "Time spent decoding.",
                    self.decode_s,
                ),
                (
                    "queue_wait_seconds_total",
                    "counter",
                    "Time requests waited in the queue.",
                    self.queue_wait_s,
                ),
                (
                    "prompt_tokens_seconds",
                    "gauge",
                    "Prefill tok/s of the last request.",
                    self.last_prefill_tok_s,
                ),
                (
                    "predicted_tokens_seconds",
                    "gauge",
                    "Decode tok/s of the last request.",
                    self.last_decode_tok_s,
                ),
            ]
        rows += [
            ("queue_depth", "gauge", "Requests waiting for the model.", queue_depth),
            ("requests_processing", "gauge", "Requests generating now (0 or 1).", processing),
        ]
        rows += [
            (f"expert_cache_{_name(k)}", "gauge", f"Expert cache: {k}.", v)
            for k, v in sorted((cache or {}).items())
        ]
        for name, kind, help_text, value in rows:
            lines += [*_family(name, kind, help_text), f"flint_{name} {_num(value)}"]
        return "\n".join(lines) + "\n"


def _family(name: str, kind: str, help_text: str) -> list[str]:
    return [f"# HELP flint_{name} {help_text}", f"# TYPE flint_{name} {kind}"]


def _name(key: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in key.lower())


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:.6g}"
