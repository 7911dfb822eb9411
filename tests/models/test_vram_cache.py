"""The VRAM expert cache (issue 7): planning, seeding from the usage table, admission on
first use, decode swaps, exactness. Its logic is device-independent, so here it runs on
a CPU "device" with a simulated free size; the CUDA runs are marked ``gpu``."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from tiny import FAMILY_NAMES, SHARED

import flint
from flint.models import parse_config
from flint.models.ftw_source import FtwSource
from flint.stream import streamed_backend
from flint.stream.plan import GIB, plan_vram
from flint.stream.vram import MAX_SWAPS, SWAP_MARGIN, VramCache

PROMPTS = ([7], [5, 17, 250, 3, 99], [(13 * i + 5) % 300 for i in range(23)])
CPU = torch.device("cpu")
TINY_CODE_MOE = SHARED / "models" / "tiny-code-moe"


def _open(
    path: Path,
    ram_slots: int,
    vram_slots: int,
    device: torch.device = CPU,
    usage: bool = False,
    expert_kernels: str = "torch",
    **kw: Any,
) -> flint.LLM:
    """A streamed LLM with ``ram_slots`` RAM and ``vram_slots`` "VRAM" slots per layer
    (on ``device``; on the CPU the VRAM cache lives in RAM: same logic, same bytes).
    Experts on torch's kernels by default, as a GPU computes them (the fused CPU kernels
    have no VRAM cache), so the CPU's resident side of a comparison names them too."""
    source = FtwSource(path)
    lay = source.expert_layout
    assert lay is not None
    config = parse_config(source.config)
    layers = sum(config.sparse_layers)
    backend = streamed_backend(
        source,
        config,
        device,
        torch.float32 if device.type == "cpu" else torch.bfloat16,
        ram_slots * layers * lay.slab_bytes / GIB,
        usage=usage,
        vram_budget_gib=vram_slots * layers * lay.slab_bytes / GIB,
        vram_device=device,
        vram_free_bytes=(lambda: 64 * GIB) if device.type == "cpu" else None,
        notice=lambda _: None,
        expert_kernels=expert_kernels,
        **kw,
    )
    return flint.LLM(source, device=device, context_length=256, expert_backend=backend)


def test_plan_vram_keeps_headroom_caps_at_experts_and_says_why() -> None:
    plan = plan_vram(4, 64, 3 << 20, free_vram=64 * GIB, vram_budget_gib=0.1)
    assert plan.cache_bytes <= 0.1 * GIB and plan.slots_per_layer == 8 and not plan.notes
    plan = plan_vram(2, 64, 3 << 20, free_vram=64 * GIB)
    assert plan.slots_per_layer == 64, "never more slots than experts"
    plan = plan_vram(2, 64, 1 << 30, free_vram=8 * GIB)
    assert plan.cache_bytes <= 8 * GIB - GIB, "headroom kept"
    plan = plan_vram(2, 64, 1 << 30, free_vram=8 * GIB, vram_budget_gib=100)
    assert "more than is free" in plan.notes[0]
    plan = plan_vram(48, 128, 9 << 20, free_vram=GIB)
    assert plan.slots_per_layer == 0 and "RAM cache only" in plan.notes[0]
    assert not plan_vram(2, 8, 4096, free_vram=64 * GIB, vram_budget_gib=0).notes
    with pytest.raises(ValueError, match="vram-budget"):
        plan_vram(2, 8, 4096, free_vram=GIB, vram_budget_gib=-1)


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_vram_cached_streaming_equals_resident_bit_for_bit(
    family: str, tiny_ftw: dict[str, Path]
) -> None:
    path = tiny_ftw[family]
    with (
        flint.LLM(path, device="cpu", context_length=64, expert_kernels="torch") as resident,
        _open(path, ram_slots=1, vram_slots=2, lookahead=2) as streamed,
    ):
        for ids in PROMPTS:
            resident.model.reset()
            streamed.model.reset()
            want = resident.model.forward(torch.tensor(ids), all_logits=True)
            assert torch.equal(streamed.model.forward(torch.tensor(ids), all_logits=True), want)
            for step in range(12):  # past a swap round (every 8 decode tokens)
                tok = torch.tensor([(step * 37 + 11) % 300])
                want = resident.model.forward(tok)
                assert torch.equal(streamed.model.forward(tok), want), (family, ids, step)
        s = streamed.stats()
    assert s is not None and s["vram_slots_per_layer"] == 2
    assert s["vram_hits"] > 0 and s["vram_admitted"] == 2 * s["streamed_layers"]
    assert s["demands"] > 0 and s["demand_placements"] > s["streamed_layers"], "RAM evictions"
    assert 0 < s["vram_hit_rate"] < 1


def test_vram_copies_hold_the_files_bytes_after_seeding_and_swaps(
    tiny_ftw: dict[str, Path], tmp_path: Path
) -> None:
    """Seeded from the usage table with each layer's most-used experts; swaps put hot
    newcomers over cold residents; every VRAM slab equals the file's."""
    path = tmp_path / "m.ftw"
    shutil.copyfile(tiny_ftw["qwen3_moe"], path)
    with _open(path, ram_slots=3, vram_slots=1, usage=True) as first:
        first.generate([5, 17, 250], max_tokens=6, ignore_eos=True)
        backend = first.expert_backend
        layers = backend.plan.streamed_layers  # type: ignore[attr-defined]
        usage = {layer: backend.engine.usage(layer) for layer in layers}  # type: ignore[attr-defined]
    with _open(path, ram_slots=3, vram_slots=1, usage=True) as second:
        backend = second.expert_backend
        vram: VramCache = backend.vram  # type: ignore[attr-defined]
        assert vram.counters.seeded == len(vram.layers)
        for layer in vram.layers:
            (expert,) = vram.where[layer]
            assert usage[layer][expert] == max(usage[layer]), "the most-used expert"
        source = second.source
        # make a cold resident lose to a hot newcomer that sits complete in RAM
        layer = vram.layers[0]
        (cold,) = vram.where[layer]
        hot = next(e for e in range(vram.n_experts) if e != cold)
        second.generate([5, 17, 250], max_tokens=2, ignore_eos=True)
        backend.engine.place(layer, [hot])  # type: ignore[attr-defined]
        backend.engine.wait(layer, hot)  # type: ignore[attr-defined]
        backend.engine.unpin(layer, [hot])  # type: ignore[attr-defined]
        row = vram.row[layer]
        vram.recent[row].zero_()
        vram.recent[row, hot] = SWAP_MARGIN + 1
        assert vram.swap_plan()[:1] == [(layer, hot, cold)]
        backend._swap_round(vram)  # type: ignore[attr-defined]
        assert vram.where[layer] == {hot: 0} and vram.counters.swaps >= 1
        for lyr in vram.layers:
            for expert in vram.where[lyr]:
                slab = vram.entry(lyr, expert)
                assert slab is not None
                assert torch.equal(slab, source.expert_slab(lyr, expert))  # type: ignore[attr-defined]


def test_swap_plan_rule_and_cap() -> None:
    v = VramCache((0, 1), 200, 100, 16, CPU)
    for layer in (0, 1):
        for e in range(100):
            v.admit(layer, e, torch.zeros(16, dtype=torch.uint8))
    v.recent[:, :100] = 10.0
    v.recent[0, 100] = 1.25 * 10 + SWAP_MARGIN  # ties the bar: not enough
    assert v.swap_plan() == []
    v.recent[:, 100:] = 100.0  # 100 hot newcomers per layer
    plan = v.swap_plan()
    assert len(plan) == MAX_SWAPS and len({(lyr, c) for lyr, c, _ in plan}) == MAX_SWAPS
    assert all(c >= 100 and lv < 100 for _, c, lv in plan)
    v.recent.mul_(0.0)
    assert not v.token_done(1) or v.swap_plan() == []


def test_no_vram_cache_when_the_budget_is_zero(tiny_ftw: dict[str, Path]) -> None:
    with _open(tiny_ftw["olmoe"], ram_slots=2, vram_slots=0) as llm:
        assert llm.expert_backend.vram is None  # type: ignore[attr-defined]
        llm.generate([1, 2, 3], max_tokens=2, ignore_eos=True)
        s = llm.stats()
    assert s is not None and "vram_hits" not in s


@pytest.mark.gpu
@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_cuda_deterministic_with_a_small_vram_cache_equals_resident(
    family: str, tiny_ftw: dict[str, Path]
) -> None:
    cuda = torch.device("cuda")
    path = tiny_ftw[family]
    with (
        flint.LLM(path, device="cuda", context_length=64, graphs="off") as resident,
        _open(path, ram_slots=2, vram_slots=1, device=cuda, deterministic=True) as streamed,
    ):
        for ids in PROMPTS:
            resident.model.reset()
            streamed.model.reset()
            want = resident.model.forward(torch.tensor(ids), all_logits=True)
            assert torch.equal(streamed.model.forward(torch.tensor(ids), all_logits=True), want)
            for step in range(12):
                tok = torch.tensor([(step * 37 + 11) % 300])
                assert torch.equal(streamed.model.forward(tok), resident.model.forward(tok))
        s = streamed.stats()
    assert s is not None and s["vram_hits"] > 0 and s["cpu_experts"] == 0
    assert s["pcie_bytes"] > 0


@pytest.mark.gpu
@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_cuda_cpu_and_gpu_experts_in_parallel_stay_within_tolerance(
    family: str, tiny_ftw: dict[str, Path]
) -> None:
    """Experts outside VRAM run on the CPU beside the GPU's. The CPU computes them in
    fp32 where the GPU rounds to bf16 between projections, so the two placements round
    differently: measured against the fp32 CPU reference, the split run's logits stay
    as close as bf16 itself allows (within twice the resident GPU run's own error, plus
    a margin). Random tiny models have near-ties, so their greedy tokens may part; the
    trained model's must not (below)."""
    path = tiny_ftw[family]
    cuda = torch.device("cuda")
    with (
        flint.LLM(path, device="cpu", context_length=64) as exact,  # fp32
        flint.LLM(path, device="cuda", context_length=64, graphs="off") as resident,
        _open(path, ram_slots=2, vram_slots=1, device=cuda) as streamed,
    ):
        for ids in (PROMPTS[1], [11], [42]):  # decode-sized batches: CPU experts
            ref = exact.model.forward(torch.tensor(ids), all_logits=True)
            want = resident.model.forward(torch.tensor(ids), all_logits=True).cpu()
            got = streamed.model.forward(torch.tensor(ids), all_logits=True).cpu()
            bf16_error = (want - ref).abs().max().item()
            assert (got - ref).abs().max().item() <= 2 * bf16_error + 0.02
        s = streamed.stats()
    assert s is not None and s["cpu_experts"] > 0 and s["gpu_experts"] > 0


@pytest.mark.gpu
@pytest.mark.skipif(
    not any(TINY_CODE_MOE.glob("*.safetensors")),
    reason="needs ../shared/models/tiny-code-moe's weights (*.safetensors)",
)
def test_cuda_cpu_and_gpu_experts_keep_the_trained_models_greedy_tokens(tmp_path: Path) -> None:
    """tiny-code-moe streamed with a 1-slot VRAM cache, the other experts on the CPU:
    64 greedy tokens identical to the resident GPU run."""
    from flint.convert import ConvertOptions, convert

    path = tmp_path / "tcm.ftw"
    convert(str(TINY_CODE_MOE), path, ConvertOptions(quant="none"))
    prompt = "import os\n\n\ndef read_config(path):\n"
    kw = {"max_tokens": 64, "ignore_eos": True}
    with flint.LLM(path, device="cuda", context_length=256, graphs="off") as resident:
        want = resident.generate(prompt, **kw).token_ids
    with _open(path, ram_slots=8, vram_slots=4, device=torch.device("cuda")) as streamed:
        got = streamed.generate(prompt, **kw).token_ids
        s = streamed.stats()
    assert got == want
    assert s is not None and s["cpu_experts"] > 0 and s["vram_hits"] > 0


@pytest.mark.parametrize(("quant", "group"), [("int8", 32), ("int4", 16)])
def test_quantized_experts_held_packed_equal_resident(
    quant: str, group: int, tiny_models: dict[str, tuple[Path, object]], tmp_path: Path
) -> None:
    """int8/int4 experts are held in VRAM in their kernel's packed form, made once from
    the file's bytes: bit-identical to resident, and no slab pool is allocated."""
    from flint.convert import ConvertOptions, convert

    path = tmp_path / f"{quant}.ftw"
    convert(str(tiny_models["qwen3_moe"][0]), path, ConvertOptions(quant=quant, group_size=group))
    ids = torch.tensor(PROMPTS[2])
    with (
        flint.LLM(path, device="cpu", context_length=64, expert_kernels="torch") as resident,
        _open(path, ram_slots=1, vram_slots=2) as streamed,
    ):
        vram: VramCache = streamed.expert_backend.vram  # type: ignore[attr-defined]
        assert vram.pack is not None and all(p.numel() == 0 for p in vram.pools.values())
        for _ in range(2):  # the second pass computes from the packed copies
            resident.model.reset()
            streamed.model.reset()
            want = resident.model.forward(ids, all_logits=True)
            assert torch.equal(streamed.model.forward(ids, all_logits=True), want)
        s = streamed.stats()
    assert s is not None and s["vram_hits"] > 0 and s["demands"] > 0


@pytest.mark.gpu
@pytest.mark.parametrize(("quant", "group"), [("int8", 32), ("int4", 16)])
def test_cuda_cpu_experts_of_quantized_files_stay_within_tolerance(
    quant: str, group: int, tiny_models: dict[str, tuple[Path, object]], tmp_path: Path
) -> None:
    """int8/int4 experts outside VRAM computed on the CPU (fused kernels, decode-sized
    batches) beside the GPU's: logits within the stated tolerance of resident CUDA."""
    from flint.convert import ConvertOptions, convert

    path = tmp_path / f"{quant}.ftw"
    convert(str(tiny_models["qwen3_moe"][0]), path, ConvertOptions(quant=quant, group_size=group))
    cuda = torch.device("cuda")
    with (
        flint.LLM(path, device="cuda", context_length=64, graphs="off") as resident,
        _open(path, ram_slots=2, vram_slots=1, device=cuda) as streamed,
    ):
        for ids in ([5, 17, 250, 3, 99], [7]):  # a short prompt, then a decode step
            want = resident.model.forward(torch.tensor(ids), all_logits=True)
            got = streamed.model.forward(torch.tensor(ids), all_logits=True)
            torch.testing.assert_close(got.float(), want.float(), atol=0.05, rtol=0.02)
        s = streamed.stats()
    # the first selected expert of each layer fills its one VRAM slot (whether a later
    # token selects it again depends on the random routing)
    assert s is not None and s["cpu_experts"] > 0 and s["vram_admitted"] > 0


def test_a_vram_cache_with_a_slot_for_every_expert_is_seeded_whole(
    tiny_ftw: dict[str, Path],
) -> None:
    path = tiny_ftw["olmoe"]
    with flint.LLM(path, device="cpu", context_length=16) as probe:
        n = probe.model.config.num_experts
    with _open(path, ram_slots=1, vram_slots=n) as llm:
        vram: VramCache = llm.expert_backend.vram  # type: ignore[attr-defined]
        assert vram.counters.seeded == n * len(vram.layers)
        llm.generate([1, 2, 3], max_tokens=3, ignore_eos=True)
        s = llm.stats()
    assert s is not None and s["vram_hit_rate"] == 1.0 and s["demands"] == 0
