"""The q* split of a decode step's experts outside VRAM (issue 9): the rule, its online
bandwidths, and the placement run end to end. The placement logic is device-
independent, so it runs here with the CPU standing in for both sides (a "VRAM" cache
on the CPU, the host target forced on); the CUDA runs are the GPU box's bench rows."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch
from test_vram_cache import PROMPTS, _open
from tiny import FAMILY_NAMES

import flint
from flint.stream.placement import Target
from flint.stream.qsplit import QSplit, resolve_host_split


def test_q_balances_the_two_sides() -> None:
    assert QSplit(50e9, 25e9).q(9) == 6, "PCIe twice as fast: two thirds filled"
    assert QSplit(10e9, 30e9).q(8) == 2
    assert QSplit(1e9, 1e9, "cpu").q(8) == 0 and QSplit(1e9, 1e9, "fill").q(8) == 8
    assert QSplit(1e12, 1.0).q(5) == 5 and QSplit(1.0, 1e12).q(5) == 0, "never past m"
    with pytest.raises(ValueError, match="host split"):
        QSplit(1e9, 1e9, "gpu")


def test_auto_fills_where_the_slab_kernels_run() -> None:
    assert resolve_host_split("auto", slab_waves=True) == "fill"
    assert resolve_host_split("auto", slab_waves=False) == "cpu"
    for split in ("cpu", "fill", "q"):
        assert resolve_host_split(split, slab_waves=True) == split
    with pytest.raises(ValueError, match="--host-split must be one of auto, cpu, fill, q"):
        resolve_host_split("gpu", slab_waves=True)


def test_observed_times_move_the_split() -> None:
    qs = QSplit(10e9, 10e9)
    assert qs.q(10) == 5
    for _ in range(30):  # the CPU turns out 4x slower than assumed
        qs.observe_host(int(2.5e9), 1.0)
    assert abs(qs.host - 2.5e9) < 0.01e9 and qs.q(10) == 8
    qs.observe_pcie(0, 1.0)  # nothing observed: unchanged
    qs.observe_host(100, 0.0)
    assert qs.q(10) == 8


@contextmanager
def _with_host(path: Path) -> Iterator[tuple[flint.LLM, flint.LLM, Any]]:
    """(resident, streamed, its backend): torch's kernels, a "VRAM" slot per layer,
    the host target forced on (as on CUDA) in fp32, so the CPU stands in for both sides."""
    with (
        flint.LLM(path, device="cpu", context_length=64, expert_kernels="torch") as resident,
        _open(path, ram_slots=3, vram_slots=1) as streamed,
    ):
        backend = streamed.expert_backend
        backend.host = Target(torch.device("cpu"), torch.float32, None)  # type: ignore[attr-defined]
        yield resident, streamed, backend


@pytest.mark.parametrize("mode", ["q", "fill"])
@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_split_decode_equals_resident(family: str, mode: str, tiny_ftw: dict[str, Path]) -> None:
    """Filled experts (computed on the model's device from a copied slab) and the
    CPU's share go back to their rows: output bit-identical to resident here, where
    both sides compute in the same dtype with the same ops (torch's kernels, as a GPU
    computes them)."""
    with _with_host(tiny_ftw[family]) as (resident, streamed, backend):
        backend.qsplit = QSplit(20e9, 10e9, mode)  # type: ignore[attr-defined]
        for ids in PROMPTS[:2]:
            resident.model.reset()
            streamed.model.reset()
            want = resident.model.forward(torch.tensor(ids), all_logits=True)
            assert torch.equal(streamed.model.forward(torch.tensor(ids), all_logits=True), want)
            for step in (7, 300, 2, 99, 1, 64, 5, 8):
                tok = torch.tensor([step])
                assert torch.equal(streamed.model.forward(tok), resident.model.forward(tok))
        s = streamed.stats()
    assert s is not None and s["host_split"] == mode and s["split_filled"] > 0
    if mode == "fill":
        assert s["split_on_cpu"] == 0
    else:
        assert s["split_on_cpu"] > 0
    assert s["pcie_bytes"] > 0


@pytest.mark.parametrize("family", ["qwen3_moe", "deepseek_v3"])
def test_fused_host_experts_follow_resident(family: str, tiny_ftw: dict[str, Path]) -> None:
    """The fused CPU call for the experts outside "VRAM" (what a CUDA model's decode
    steps make): each expert's rows land where they belong, so the logits stay within
    the fused kernels' rounding of resident and the greedy tokens agree."""
    from flint.models.cpu_kernels import FusedKernel

    with _with_host(tiny_ftw[family]) as (resident, streamed, backend):
        backend.host_fused = FusedKernel.for_layout(backend.layout, threads=2)
        for ids in PROMPTS[:2]:
            resident.model.reset()
            streamed.model.reset()
            want = resident.model.forward(torch.tensor(ids))
            got = streamed.model.forward(torch.tensor(ids))
            for _ in range(6):
                tok = want[-1:].argmax(-1)
                assert int(got[-1].argmax()) == int(tok)
                want, got = resident.model.forward(tok), streamed.model.forward(tok)
                err = (got - want).abs().max().item()
                assert err <= 1e-3 * want.abs().max().item(), err
        s = streamed.stats()
    assert s is not None and s["cpu_experts"] > 0
