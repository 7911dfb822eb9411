"""A prompt's working memory counts: when a prompt's activations would not fit beside
the RAM expert cache, the cache lends slots back to the OS for the prompt and takes
them back at the first decode token.

The engine (``IoEngine.lend``) picks the slots: empty ones first, then the coldest
unpinned residents (evicted in the policy's order); never a pinned slot, and every
layer keeps at least one usable slot. Their pages are given back (``madvise``), and no
expert is placed in them until ``reclaim``. While slots are lent a layer's waves hold
at most its usable slots (``capacity``), so each selected expert is still placed
exactly once per layer call: lending changes how many waves a layer needs and which
experts stay resident, never which experts run or what they compute.

Only the memory the prompt's activations live in counts: on the CPU that is the RAM
the cache holds; on CUDA the activations are in VRAM, so nothing is lent.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

GIB = 1 << 30
MIB = 1 << 20


def _size(nbytes: int) -> str:
    return f"{nbytes / GIB:.2f} GiB" if nbytes >= GIB // 10 else f"{nbytes / MIB:.1f} MiB"


class _Engine(Protocol):
    def lend(self, nbytes: int) -> int: ...
    def reclaim(self) -> int: ...
    def usable_slots(self) -> list[int]: ...


class PromptMemory:
    """Slots lent to the running prompt and the layers' usable capacity meanwhile."""

    def __init__(
        self,
        engine: _Engine,
        streamed: Sequence[int],
        slots: int,
        notice: Callable[[str], None],
    ) -> None:
        self.engine, self.streamed, self.slots = engine, list(streamed), slots
        self.notice = notice
        self.usable: dict[int, int] = {}  # model layer -> usable slots; empty: all
        self.lent_bytes = 0  # given back for the prompt now
        self._told = False

    def capacity(self, layer: int) -> int:
        """Slots a wave of ``layer`` may hold now."""
        return self.usable.get(layer, self.slots)

    def lend(self, nbytes: int) -> int:
        """Gives back at least ``nbytes`` of slot memory, as far as the engine's rules
        allow; returns the bytes given (0: none could be). The first time memory is
        given back, one line says so."""
        if nbytes <= 0:
            return 0
        given = self.engine.lend(nbytes)
        if given <= 0:
            return 0
        self.lent_bytes += given
        self._refresh()
        if not self._told:
            self._told = True
            lent = sum(self.slots - n for n in self.usable.values())
            self.notice(
                f"a prompt's activations need {_size(nbytes)} more than is free: "
                f"the RAM expert cache gives back {_size(self.lent_bytes)} "
                f"({lent} slots, empty then coldest) until the first reply token"
            )
        return given

    def reclaim(self) -> None:
        """Every lent slot is usable again (its memory faults back in when read into)."""
        if self.lent_bytes:
            self.engine.reclaim()
            self.lent_bytes = 0
            self.usable = {}

    def _refresh(self) -> None:
        self.usable = dict(zip(self.streamed, self.engine.usable_slots(), strict=True))
