"""The RAM expert cache page-locked for CUDA (issue 9): registered when the model runs
on CUDA, off on request, a failure said in one line, unregistered at close. The CUDA
checks are marked ``gpu``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import flint
from flint.models import parse_config
from flint.models.ftw_source import FtwSource
from flint.stream import streamed_backend
from flint.stream.pinned import (
    ALREADY_REGISTERED,
    REGISTER_PORTABLE,
    _clear_last_error,
    pin_arena,
    wanted,
)
from flint.stream.slab import slot_bytes

CUDA = torch.device("cuda")
CPU = torch.device("cpu")


class _FakeCudart:
    def __init__(self, result: int) -> None:
        self.result, self.calls = result, list[tuple[Any, ...]]()

    def cudaHostRegister(self, address: int, nbytes: int, flags: int) -> int:
        self.calls.append(("register", address, nbytes, flags))
        return self.result

    def cudaHostUnregister(self, address: int) -> int:
        self.calls.append(("unregister", address))
        return 0


class _Owner:
    pass


def test_wanted_on_cuda_by_default_and_never_on_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FLINT_PIN_RAM", raising=False)
    assert wanted(CUDA, None) and not wanted(CUDA, False) and wanted(CUDA, True)
    assert not wanted(CPU, None) and not wanted(CPU, True)
    monkeypatch.setenv("FLINT_PIN_RAM", "0")
    assert not wanted(CUDA, None) and wanted(CUDA, True)


def test_registers_once_and_unregisters_at_release_or_collection() -> None:
    rt, lines = _FakeCudart(0), list[str]()
    owner = _Owner()
    pinned = pin_arena(4096, 1 << 20, owner, lines.append, rt)
    assert pinned is not None and pinned.registered and not lines
    assert rt.calls == [("register", 4096, 1 << 20, REGISTER_PORTABLE)]
    pinned.release()
    pinned.release()
    assert rt.calls[1:] == [("unregister", 4096)] and not pinned.registered
    other = pin_arena(8192, 4096, _Owner(), lines.append, rt)  # its owner is gone at once
    assert other is not None and not other.registered and rt.calls[-1] == ("unregister", 8192)


def test_a_failure_says_one_line_and_goes_on() -> None:
    rt, lines = _FakeCudart(2), list[str]()
    assert pin_arena(4096, 1 << 30, _Owner(), lines.append, rt) is None
    assert len(lines) == 1 and "could not page-lock the RAM expert cache" in lines[0]
    assert "error 2" in lines[0] and len(rt.calls) == 1


def _streamed(
    path: Path, pin_ram: bool | None, lines: list[str], device: torch.device = CUDA
) -> flint.LLM:
    source = FtwSource(path)
    backend = streamed_backend(
        source,
        parse_config(source.config),
        device,
        torch.bfloat16 if device.type == "cuda" else torch.float32,
        0.01,
        usage=False,
        notice=lines.append,
        deterministic=True,
        pin_ram=pin_ram,
    )
    return flint.LLM(source, device=device, context_length=64, expert_backend=backend)


def test_not_registered_on_the_cpu(tiny_ftw: dict[str, Path]) -> None:
    with _streamed(tiny_ftw["olmoe"], True, [], CPU) as llm:
        assert llm.expert_backend.pinned is None  # type: ignore[attr-defined]


@pytest.mark.gpu
def test_cuda_arena_is_page_locked_and_unlocked_at_close(tiny_ftw: dict[str, Path]) -> None:
    lines: list[str] = []
    with _streamed(tiny_ftw["qwen3_moe"], None, lines) as llm:
        backend: Any = llm.expert_backend
        engine = backend.engine
        assert backend.pinned is not None and backend.pinned.registered, lines
        view = slot_bytes(engine.arena_address, engine.slot_bytes)
        assert view.is_pinned(), "the driver sees the slot as page-locked host memory"
        again = torch.cuda.cudart().cudaHostRegister(engine.arena_address, 4096, 0)
        _clear_last_error()  # the refusal above is the runtime's last error now
        assert int(again) == ALREADY_REGISTERED
        # a slot's bytes go up asynchronously, straight from the slot
        up = view.to(CUDA, non_blocking=True)
        torch.cuda.synchronize()
        assert torch.equal(up.cpu(), view)
        out = llm.generate([5, 17, 250], max_tokens=4, ignore_eos=True, temperature=0.0).token_ids
        backend.close()
        assert not backend.pinned.registered and not view.is_pinned()
    with _streamed(tiny_ftw["qwen3_moe"], False, lines) as off:
        b: Any = off.expert_backend
        assert b.pinned is None
        assert not slot_bytes(b.engine.arena_address, b.engine.slot_bytes).is_pinned()
        assert (
            off.generate([5, 17, 250], max_tokens=4, ignore_eos=True, temperature=0.0).token_ids
            == out
        )
