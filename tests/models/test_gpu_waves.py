"""GPU waves (issue 8): a prompt's experts outside VRAM staged through double-buffered
VRAM copies on a side stream. CUDA only (gpu-marked): the staging is CUDA streams and
events; on the CPU the backend computes from the slots directly."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from test_vram_cache import PROMPTS, _open
from tiny import FAMILY_NAMES

import flint
from flint.stream.gpu_waves import GpuStager

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_staged_prompt_experts_equal_resident_and_per_use_copies(
    family: str, tiny_ftw: dict[str, Path]
) -> None:
    """Two-slot buffer sets force several chunks per wave and reuse of both sets: the
    logits equal resident CUDA and the per-projection copy path bit for bit."""
    cuda = torch.device("cuda", 0)
    path = tiny_ftw[family]
    runs = {}
    for waves in (True, False):
        with (
            flint.LLM(path, device="cuda:0", context_length=64, graphs="off") as resident,
            _open(
                path, ram_slots=3, vram_slots=1, device=cuda, deterministic=True, gpu_waves=waves
            ) as streamed,
        ):
            backend = streamed.expert_backend
            if waves:
                backend._stagers[cuda] = GpuStager(cuda, backend.layout.slab_bytes, 2)  # type: ignore[attr-defined]
            got = []
            for ids in PROMPTS[1:]:
                resident.model.reset()
                streamed.model.reset()
                want = resident.model.forward(torch.tensor(ids), all_logits=True)
                out = streamed.model.forward(torch.tensor(ids), all_logits=True)
                assert torch.equal(out, want)
                got.append(out)
            runs[waves] = got
            s = streamed.stats()
        assert s is not None
        if waves:
            assert s["gpu_wave_chunks"] > s["forward_calls"], "several chunks per wave"
        else:
            assert "gpu_wave_chunks" not in s
    assert all(torch.equal(a, b) for a, b in zip(runs[True], runs[False], strict=True))


@pytest.mark.parametrize("quant", ["int8", "int4"])
def test_slab_kernel_waves_equal_the_resident_slab_backend(
    quant: str, wide_files: dict[str, Path]
) -> None:
    """int8/int4 beside the graph step: a prompt's experts staged two at a time and the
    VRAM cache's one slot per layer, each group computed in one grouped launch from
    slabs, give the resident slab backend's prompt logits bit for bit (the same
    kernels, each pair computed alone)."""
    cuda = torch.device("cuda", 0)
    path = wide_files[quant]
    prompt = torch.tensor([3, 17, 42, 7, 99, 5, 23, 61] * 6)  # 48 tokens: grouped
    with (
        flint.LLM(path, device="cuda:0", context_length=64, graphs="on") as resident,
        _open(
            path, ram_slots=3, vram_slots=1, device=cuda, deterministic=True, slab_kernels=True
        ) as streamed,
    ):
        backend = streamed.expert_backend
        assert backend.slab_kernels  # type: ignore[attr-defined]
        backend._stagers[cuda] = GpuStager(cuda, backend.layout.slab_bytes, 2)  # type: ignore[attr-defined]
        want = resident.model.forward(prompt.to(cuda), all_logits=True)
        got = streamed.model.forward(prompt.to(cuda), all_logits=True)
        assert torch.equal(got, want)
        s = streamed.stats()
    assert s is not None and s["gpu_wave_chunks"] > s["forward_calls"]


@pytest.mark.parametrize("quant", ["int8", "int4"])
def test_filled_decode_through_the_slot_kernels(quant: str, wide_files: dict[str, Path]) -> None:
    """``--host-split fill`` with the slab kernels: a decode step's experts outside VRAM
    go through the staging buffers and one slot-kernel launch per chunk (no CPU batch);
    greedy tokens are the CPU split's, logits within rounding (other kernels)."""
    cuda = torch.device("cuda", 0)
    prompt = torch.tensor([3, 17, 42, 7, 99, 5, 23, 61] * 5)
    runs, stats = {}, {}
    for mode in ("cpu", "fill"):
        with _open(
            wide_files[quant], ram_slots=3, vram_slots=1, device=cuda, slab_kernels=True,
            host_split=mode,
        ) as llm:  # fmt: skip
            ids, logits = prompt.tolist(), []
            for _ in range(6):
                out = llm.model.forward(torch.tensor(ids[-1:] if logits else ids).to(cuda))
                logits.append(out[-1].float().cpu())
                ids.append(int(out[-1].argmax()))
            s = llm.stats()
        assert s is not None
        stats[mode] = s
        runs[mode] = (ids, torch.stack(logits))
    assert stats["cpu"]["cpu_experts"] > 0 and stats["fill"]["cpu_experts"] == 0
    assert stats["fill"]["split_on_cpu"] == 0 and stats["fill"]["split_filled"] > 0
    assert stats["fill"]["gpu_wave_chunks"] > stats["cpu"].get("gpu_wave_chunks", 0), "staged"
    assert runs["fill"][0] == runs["cpu"][0]
    a, b = runs["fill"][1], runs["cpu"][1]
    assert ((a - b).norm() / b.norm()).item() <= 1e-2


def test_a_prompt_layer_synchronises_once(wide_files: dict[str, Path]) -> None:
    """A streamed prompt layer waits for the GPU once: to read its router's ids. Any
    other synchronising call stops the host from queueing the layer's copies while the
    GPU still computes (the wave plan read the device's ids, and so waited for the VRAM
    experts' launch: 2-3 ms a layer of P8). CUDA's sync debug mode warns at each one."""
    import linecache
    import warnings

    cuda = torch.device("cuda", 0)
    prompt = torch.tensor([3, 17, 42, 7, 99, 5, 23, 61] * 8).to(cuda)  # grouped kernels
    path = wide_files["int4"]
    with _open(path, ram_slots=3, vram_slots=1, device=cuda, slab_kernels=True) as llm:
        layers = len(llm.expert_backend.plan.streamed_layers)  # type: ignore[attr-defined]
        llm.model.forward(prompt)  # the first prompt fills VRAM and compiles the kernels
        llm.model.reset()
        torch.cuda.synchronize()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                llm.model.forward(prompt)
            finally:
                torch.cuda.set_sync_debug_mode("default")
    sites = [
        (Path(w.filename).name, w.lineno, linecache.getline(w.filename, w.lineno).strip())
        for w in caught
        if "synchroniz" in str(w.message) and f"flint{os.sep}stream" in w.filename
    ]
    # (a wave's end waits for its copies, not for computation: its RAM slots are
    # unpinned); the ids come back in one copy (``routing_summary`` for a prompt)
    ids = "the ids' read-back"
    others = [s for s in sites if ids not in s[2] and ".synchronize()" not in s[2]]
    assert not others, f"synchronising calls besides the router's ids: {others}"
    assert sum(ids in s[2] for s in sites) == layers


@pytest.mark.parametrize(("ahead", "route"), [(True, False), (False, False), (True, True)])
@pytest.mark.parametrize("quant", ["int8", "int4"])
def test_a_long_prompts_next_layer_copied_ahead_equals_resident(
    quant: str,
    ahead: bool,
    route: bool,
    wide_files: dict[str, Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A prompt with 16 (token, rank) pairs per expert, every expert in RAM: layer 1's
    experts outside VRAM are copied up while layer 0 runs (prompt_ahead.py) and
    computed from that area with the VRAM experts (``cuda_place._early``); the logits
    equal the resident slab backend's bit for bit, as they do with
    ``FLINT_PROMPT_AHEAD=0``, and with both backends dequantizing first (``route``:
    the dequantize-first threshold lowered to this prompt). A decode step between the
    prompts gives the areas back; the next prompt makes them again."""
    from flint.graphs import grouped

    monkeypatch.setenv("FLINT_PROMPT_AHEAD", "1" if ahead else "0")
    if route:
        monkeypatch.setattr(grouped, "DEQUANT_TOKENS", 33)
    cuda = torch.device("cuda", 0)
    path = wide_files[quant]
    prompt = torch.tensor([3, 17, 42, 7, 99, 5, 23, 61] * 8).to(cuda)  # 64 x 2 pairs, 8 experts
    with (
        flint.LLM(path, device="cuda:0", context_length=128, graphs="on") as resident,
        _open(path, ram_slots=8, vram_slots=1, device=cuda, slab_kernels=True) as streamed,
    ):
        want = resident.model.forward(prompt, all_logits=True)
        streamed.model.forward(prompt)  # the first prompt fills the free VRAM slots
        for _ in range(2):
            streamed.model.reset()
            assert torch.equal(streamed.model.forward(prompt, all_logits=True), want)
            streamed.model.forward(torch.tensor([5], device=cuda))  # decode: areas freed
        s = streamed.stats()
    assert s is not None
    if ahead:
        assert s["prompt_ahead_experts"] >= 2 * 7, "layer 1's 7 experts outside VRAM, twice"
        # this prompt repeats 8 tokens: not every expert copied ahead is selected
        assert 0 < s["prompt_ahead_computed"] <= s["prompt_ahead_experts"]
        # one copy per run of adjacent RAM slots, at least one per prompt
        assert 2 <= s["prompt_ahead_copies"] <= s["prompt_ahead_experts"]
    else:
        assert "prompt_ahead_experts" not in s
