"""One generation at a time: a worker thread, a bounded queue, cancellation.

Requests are jobs. The routes (on the event loop) submit them; the worker thread
runs them one after another and hands each chunk back to the loop. A job whose
client went away has its ``cancel`` event set: a waiting job is skipped, a running
one stops before its next token, so the model is free for the next job at once.
"""

from __future__ import annotations

import asyncio
import math
import queue
import threading
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

from flint.generation import StreamChunk
from flint.sampling import SamplingParams
from flint.server.backend import Backend
from flint.server.errors import APIError
from flint.server.metrics import Metrics

_Item = StreamChunk | BaseException | None  # None: the job is over


@dataclass(slots=True, eq=False)
class Job:
    """One request's generation, as seen from both sides of the queue."""

    prompt: Sequence[int]
    params: SamplingParams
    logprobs: int | None
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue[_Item] = field(default_factory=asyncio.Queue)
    cancel: threading.Event = field(default_factory=threading.Event)
    enqueued: float = field(default_factory=time.perf_counter)
    started: float = 0.0

    @property
    def queue_s(self) -> float:
        return max(self.started - self.enqueued, 0.0)

    def put(self, item: _Item) -> None:
        """Called by the worker thread."""
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, item)
        except RuntimeError:  # the loop is closed: the server is shutting down
            self.cancel.set()

    async def chunks(self) -> AsyncIterator[StreamChunk]:
        """The generated chunks; an error in the worker is raised here."""
        while True:
            item = await self.events.get()
            if item is None:
                return
            if isinstance(item, BaseException):
                raise item
            yield item


class Scheduler:
    """Runs jobs on the backend one at a time, with at most ``max_waiting`` queued."""

    def __init__(self, backend: Backend, max_waiting: int, metrics: Metrics) -> None:
        if max_waiting < 1:
            raise ValueError(f"the queue must hold at least 1 request, got {max_waiting}")
        self.backend, self.max_waiting, self.metrics = backend, max_waiting, metrics
        self._jobs: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._waiting = 0
        self._busy = False
        self._mean_s = 1.0  # moving average of a job's run time, for Retry-After
        self._thread = threading.Thread(target=self._run, name="flint-generate", daemon=True)
        self._thread.start()

    @property
    def waiting(self) -> int:
        return self._waiting

    @property
    def processing(self) -> int:
        return int(self._busy)

    def submit(self, prompt: Sequence[int], params: SamplingParams, logprobs: int | None) -> Job:
        """Queues a job (call on the event loop); 429 with Retry-After when full."""
        with self._lock:
            if self._waiting >= self.max_waiting:
                self.metrics.reject()
                retry = max(1, math.ceil(self._mean_s * (self._waiting + 1)))
                raise APIError(
                    429,
                    f"the server is busy: {self._waiting} requests are waiting; retry later",
                    code="queue_full",
                    headers={"Retry-After": str(retry)},
                )
            self._waiting += 1
        job = Job(prompt, params, logprobs, asyncio.get_running_loop())
        self._jobs.put(job)
        return job

    def close(self) -> None:
        self._jobs.put(None)
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            with self._lock:
                self._waiting -= 1
                self._busy = True
            try:
                if job.cancel.is_set():
                    self.metrics.cancel()
                else:
                    self._generate(job)
            finally:
                with self._lock:
                    self._busy = False
                job.put(None)

    def _generate(self, job: Job) -> None:
        job.started = time.perf_counter()
        chunks = self.backend.generate(job.prompt, job.params, job.logprobs, job.cancel)
        finished = False
        try:
            for chunk in chunks:
                job.put(chunk)
                if chunk.timings is not None:
                    finished = True
                    self.metrics.finished(chunk.timings, job.queue_s)
                if job.cancel.is_set():
                    break
        except Exception as err:  # reported to this job's client; the worker goes on
            job.put(err)
        finally:
            close = getattr(chunks, "close", None)
            if callable(close):
                close()
        if not finished and job.cancel.is_set():
            self.metrics.cancel()
        self._mean_s = 0.8 * self._mean_s + 0.2 * (time.perf_counter() - job.started)
