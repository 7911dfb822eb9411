"""Read-ahead window for prompts: while a streamed layer computes a long prompt, the
most-used experts (usage table) of the next ``depth`` streamed layers are sent to the
I/O engine as predictions, so their reads overlap this layer's compute.

A prompt selects most of a layer's experts, so every expert resident in a target layer
is likely to be a hit there: the window first protects the target layer's residents
(a prefetch never evicts a protected expert) and then predicts only experts that are
not resident, at most as many as the layer has free slots. So read-ahead never evicts
anything: not in the layer that is computing (each layer has its own slots), and not in
the layers it reads for. The protection ends when the target layer starts. Experts the
target layer does not select are cancelled when it starts (``begin_layer``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

# E = experts per layer


class _Engine(Protocol):
    def resident(self, layer: int) -> list[int]: ...
    def protect(self, layer: int, experts: list[int]) -> int: ...
    def usage(self, layer: int) -> list[int]: ...
    def predict(self, predictions: list[tuple[int, int, int, int]]) -> None: ...


class ReadAhead:
    """Predictions for the ``depth`` streamed layers after the one computing a prompt."""

    def __init__(
        self, streamed: Sequence[int], slots: int, n_experts: int, top_k: int, depth: int = 2
    ) -> None:
        self.streamed, self.slots, self.depth = list(streamed), slots, depth
        self.n_experts, self.top_k = n_experts, top_k
        # usable slots of a layer (fewer while slots are lent to a prompt's memory)
        self.capacity: Callable[[int], int] = lambda layer: slots
        self.issued = 0  # predictions sent, for the statistics

    def long_enough(self, tokens: int) -> bool:
        """A prompt whose selections could cover every expert twice: most of each
        layer's experts will be selected, so the most-used ones are worth reading."""
        return tokens * self.top_k >= 2 * self.n_experts

    def __call__(self, engine: _Engine, layer: int, tokens: int) -> int:
        """Protects the residents of the next layers and predicts their most-used
        non-resident experts into free slots. Returns the predictions sent."""
        if self.depth < 1 or layer not in self.streamed or not self.long_enough(tokens):
            return 0
        i = self.streamed.index(layer)
        out: list[tuple[int, int, int, int]] = []
        for d, target in enumerate(self.streamed[i + 1 : i + 1 + self.depth], start=1):
            held = engine.resident(target)
            free = self.capacity(target) - len(held)
            if held:
                engine.protect(target, held)
            if free <= 0:
                continue
            counts = engine.usage(target)
            known = set(held)
            ranked = sorted(
                (e for e in range(self.n_experts) if counts[e] > 0 and e not in known),
                key=lambda e: (-counts[e], e),
            )[:free]
            out.extend((target, e, d, min(rank, 255)) for rank, e in enumerate(ranked))
        if out:
            engine.predict(out)
        self.issued += len(out)
        return len(out)
