"""Page-locking the RAM expert cache for CUDA: the arena (every RAM slot, one
allocation) registered with ``cudaHostRegister``, so host-to-device copies from a slot
(VRAM admissions and swaps, experts copied up for one use) are DMA'd straight over PCIe
instead of through the driver's staging buffer.

On by default when the model runs on CUDA; ``LLM(pin_ram=False)`` or
``FLINT_PIN_RAM=0`` turns it off. Registering locks (and so faults in) every page of the
arena: the RAM cache is fully resident from the start. A failure prints one line and
the model runs unpinned. Unregistered at ``close()`` (or when the backend is collected),
while the arena still lives.

Every copy ends before its slot is released to the cache: admissions, swaps and
per-projection copies are synchronous; the asynchronous ones - GPU waves' side-stream
copies (``gpu_waves.py``) and the q* split's fills (``cuda_place._fill``), asynchronous
only from page-locked memory - are waited for (an event on the stream they were queued
on) before their slots are unpinned.
"""

from __future__ import annotations

import ctypes
import os
import time
import weakref
from collections.abc import Callable
from typing import Any

import torch

REGISTER_PORTABLE = 1  # cudaHostRegisterPortable: page-locked for every GPU of the process
ALREADY_REGISTERED = 712  # cudaErrorHostMemoryAlreadyRegistered
SAY_IF_SLOWER_S = 1.0  # registering a large arena takes a while: say so past this


def wanted(device: torch.device, pin_ram: bool | None) -> bool:
    """Whether to page-lock the arena: only for a model on CUDA (on the CPU the cache
    lends slots' pages to prompts, which must not be locked); ``pin_ram`` when given,
    else unless ``FLINT_PIN_RAM`` is 0/false/no/off."""
    if device.type != "cuda":
        return False
    if pin_ram is not None:
        return pin_ram
    return os.environ.get("FLINT_PIN_RAM", "1").strip().lower() not in ("0", "false", "no", "off")


def _code(err: Any) -> int:
    return int(err.value if hasattr(err, "value") else err)


def _clear_last_error() -> None:
    """Resets the CUDA runtime's last error after a failed registration, so torch's next
    launch check does not report it (the libcudart torch loaded, found in the maps)."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "libcudart" in line}
        for path in paths:
            ctypes.CDLL(path).cudaGetLastError()
    except OSError:
        pass


class PinnedArena:
    """A registered host range; ``release()`` unregisters it (once)."""

    def __init__(self, address: int, nbytes: int, cudart: Any, owner: object) -> None:
        self.address, self.nbytes = address, nbytes
        # runs when ``owner`` (the backend holding the engine) is collected, before its
        # attributes are cleared: the arena is still alive then
        self._done = weakref.finalize(owner, _unregister, cudart, address)
        self._done.atexit = False  # at exit the registration goes with the process

    @property
    def registered(self) -> bool:
        return self._done.alive

    def release(self) -> None:
        self._done()


def _unregister(cudart: Any, address: int) -> None:
    cudart.cudaHostUnregister(address)  # errors ignored: nothing left to do about them


def pin_arena(
    address: int,
    nbytes: int,
    owner: object,
    notice: Callable[[str], None],
    cudart: Any = None,
) -> PinnedArena | None:
    """Registers ``nbytes`` at ``address`` with CUDA (``cudart``: torch's binding of
    libcudart unless given); None, with one line to ``notice``, when it fails."""
    try:
        rt = cudart if cudart is not None else torch.cuda.cudart()  # type: ignore[no-untyped-call]
        start = time.monotonic()
        err = _code(rt.cudaHostRegister(address, nbytes, REGISTER_PORTABLE))
    except (RuntimeError, AttributeError, OSError) as exc:
        notice(f"could not page-lock the RAM expert cache ({exc}); copies to the GPU are staged")
        return None
    if err != 0:
        _clear_last_error()
        notice(
            f"could not page-lock the RAM expert cache ({nbytes / (1 << 30):.2f} GiB, CUDA "
            f"error {err}); copies to the GPU are staged"
        )
        return None
    took = time.monotonic() - start
    if took >= SAY_IF_SLOWER_S:
        notice(
            f"page-locking the RAM expert cache ({nbytes / (1 << 30):.2f} GiB) took {took:.1f} s"
        )
    return PinnedArena(address, nbytes, rt, owner)
