"""Layers split across several devices (issue 14). The planner runs on simulated free
sizes; the split model runs on the CPU under two device names ("cpu" and "cpu:0": the
same memory, but every path a second GPU takes - per-device KV cache parts, rope
tables, linear-attention states, VRAM caches, the hop between layers - is taken). The
gpu-marked tests run it on two real GPUs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from tiny import FAMILY_NAMES, build, qwen3_next_config, save_tokenizer

import flint
from flint.api import resolve_devices
from flint.models import parse_config
from flint.models.ftw_source import FtwSource
from flint.models.kv_cache import SplitKVCache
from flint.models.split import GIB, layer_costs, plan_split
from flint.stream import streamed_backend

TWO = "cpu,cpu:0"
PROMPTS = ([5, 17, 250, 3, 99, 4, 8, 15, 16, 23, 42], [11])
STEPS = (7, 300, 2, 99, 1, 64)
D0, D1, D2 = torch.device("cuda", 0), torch.device("cuda", 1), torch.device("cuda", 2)


def _free(sizes: dict[torch.device, float]) -> Any:
    return lambda d: int(sizes[d] * GIB)


def test_layers_are_split_in_proportion_to_free_memory() -> None:
    costs = [GIB // 4] * 48
    even = plan_split([D0, D1], costs, 0, 0, _free({D0: 80, D1: 80}))
    assert even.layer_device == (0,) * 24 + (1,) * 24
    # the embedding and the LM head stay on the first GPU: its layers get what is
    # free beside them, and both keep the same free memory per layer (10 GiB / 24)
    headed = plan_split([D0, D1], costs, 2 * GIB, 2 * GIB, _free({D0: 20, D1: 16}))
    assert headed.layer_device == (0,) * 24 + (1,) * 24
    assert headed.planned == (10 * GIB, 6 * GIB)
    fewer = plan_split([D0, D1], costs, 2 * GIB, 2 * GIB, _free({D0: 16, D1: 16}))
    assert fewer.layer_device.count(0) < 24
    skewed = plan_split([D0, D1], costs, 0, 0, _free({D0: 60, D1: 20}))
    assert skewed.layer_device == (0,) * 36 + (1,) * 12, "3:1 free -> 3:1 layers"
    assert sorted(skewed.layer_device) == list(skewed.layer_device), "consecutive layers"
    assert skewed.planned == (36 * GIB // 4, 12 * GIB // 4) and not skewed.notes
    lines = skewed.describe()
    assert lines[0].startswith("cuda:0: layers 0-35 (36)") and "60.00 GiB free" in lines[0]
    assert lines[1].startswith("cuda:1: layers 36-47 (12)")


def test_every_gpu_gets_a_layer_and_a_tight_one_is_named() -> None:
    tiny_share = plan_split([D0, D1, D2], [GIB] * 4, 0, 0, _free({D0: 100, D1: 0.1, D2: 0.1}))
    assert set(tiny_share.layer_device) == {0, 1, 2}
    assert list(tiny_share.layer_device) == sorted(tiny_share.layer_device)
    assert any("cuda:1" in n and "may run out of memory" in n for n in tiny_share.notes)
    one = plan_split([D0, D1], [GIB] * 1, 0, 0, _free({D0: 8, D1: 8}))
    assert one.layer_device == (0,)
    assert one.describe()[1].startswith("cuda:1: no layers")


def test_layer_0_stays_first_no_gpu_is_skipped_and_the_head_is_charged_to_the_first() -> None:
    tight = plan_split([D0, D1], [GIB], GIB, GIB, _free({D0: 0.5, D1: 80}))
    assert tight.layer_device == (0,), "layer 0 beside the embedding"
    assert tight.planned == (3 * GIB, 0) and "cuda:0" in tight.notes[0]
    middle = plan_split([D0, D1, D2], [GIB // 4] * 12, 0, 0, _free({D0: 40, D1: 0.5, D2: 40}))
    assert set(middle.layer_device) == {0, 1, 2}, "the small middle GPU still gets a layer"
    steps = [b - a for a, b in zip(middle.layer_device, middle.layer_device[1:], strict=False)]
    assert set(steps) <= {0, 1}


def test_layer_costs_count_resident_experts_and_the_kv_cache(
    tiny_models: dict[str, tuple[Path, Any]],
) -> None:
    config = parse_config(tiny_models["deepseek_v3"][1].config.to_dict())
    streamed, embed, head = layer_costs(config, torch.bfloat16, 64, None)
    resident, _, _ = layer_costs(config, torch.bfloat16, 64, 1000)
    longer, _, _ = layer_costs(config, torch.bfloat16, 128, None)
    dense = [i for i, sparse in enumerate(config.sparse_layers) if not sparse]
    for i, sparse in enumerate(config.sparse_layers):
        assert resident[i] - streamed[i] == (config.num_experts * 1000 if sparse else 0)
        assert longer[i] > streamed[i], "the KV cache grows with the context"
    assert dense and embed == config.vocab_size * config.hidden_size * 2 and head > 0


def test_device_lists_resolve() -> None:
    assert resolve_devices(TWO) == [torch.device("cpu"), torch.device("cpu:0")]
    with pytest.raises(ValueError, match="twice"):
        resolve_devices("cpu,cpu")
    assert resolve_devices("cpu") == [torch.device("cpu")]


def _split_model_checks(path: Path, split: flint.LLM, whole: flint.LLM) -> None:
    devices = split.model.place.devices
    assert len(devices) == 2
    assert {layer.device for layer in split.model.layers} == set(devices)
    for ids in PROMPTS:
        split.model.reset()
        whole.model.reset()
        want = whole.model.forward(torch.tensor(ids), all_logits=True)
        assert torch.equal(split.model.forward(torch.tensor(ids), all_logits=True), want)
        for step in STEPS:
            tok = torch.tensor([step])
            assert torch.equal(split.model.forward(tok), whole.model.forward(tok))


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_a_split_model_equals_the_whole_one_bit_for_bit(
    family: str, tiny_ftw: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """Against the whole model's general path (``cpu_decode_step=False``): a split has
    no Rust decode step, which is only within rounding of it."""
    path = tiny_ftw[family]
    with (
        flint.LLM(path, device="cpu", context_length=64, cpu_decode_step=False) as whole,
        flint.LLM(path, device=TWO, context_length=64) as split,
    ):
        err = capsys.readouterr().err
        assert "flint: cpu: layers 0-" in err and "flint: cpu:0: layers" in err
        if split.model.config.num_layers > 1:
            assert isinstance(split.model.cache, SplitKVCache)
        _split_model_checks(path, split, whole)
        got = split.generate([1, 2, 3], max_tokens=8, ignore_eos=True).token_ids
        assert got == whole.generate([1, 2, 3], max_tokens=8, ignore_eos=True).token_ids


def test_a_split_qwen3_next_keeps_its_states_per_device(
    tmp_path: Path, tiny_tokenizer_json: str
) -> None:
    build("qwen3_next", tmp_path, seed=2, config=qwen3_next_config())
    save_tokenizer(tmp_path, tiny_tokenizer_json)
    with (
        flint.LLM(tmp_path, device="cpu", context_length=64) as whole,
        flint.LLM(tmp_path, device=TWO, context_length=64) as split,
    ):
        states = split.model.states
        assert states is not None and len(states.parts) == 2
        _split_model_checks(tmp_path, split, whole)


@pytest.mark.parametrize("family", ["mixtral", "olmoe", "gpt_oss"])  # no dense layer
def test_a_split_streamed_model_has_a_vram_cache_per_device(
    family: str, tiny_ftw: dict[str, Path]
) -> None:
    """Streamed over a split with one "VRAM" cache per device (simulated free sizes):
    bit-identical to the whole resident model; each device's cache holds only its
    layers and reports its own hit rate. torch's kernels on both sides, as a GPU
    computes them (the fused CPU kernels have no VRAM cache)."""
    path = tiny_ftw[family]
    source = FtwSource(path)
    lay = source.expert_layout
    assert lay is not None
    config = parse_config(source.config)
    layers = sum(config.sparse_layers)
    cpu = torch.device("cpu")
    backend = streamed_backend(
        source,
        config,
        cpu,
        torch.float32,
        2 * layers * lay.slab_bytes / GIB,
        usage=False,
        vram_budget_gib=2 * layers * lay.slab_bytes / GIB,
        vram_device=cpu,
        vram_free_bytes=lambda: 64 * GIB,
        notice=lambda _: None,
        expert_kernels="torch",
    )
    with (
        flint.LLM(path, device="cpu", context_length=64, expert_kernels="torch") as whole,
        flint.LLM(source, device=TWO, context_length=64, expert_backend=backend) as split,
    ):
        vrams = backend.vrams
        assert set(vrams) == set(split.model.place.devices) and len(vrams) == 2
        held = [layer for v in vrams.values() for layer in v.layers]
        assert sorted(held) == [i for i, s in enumerate(config.sparse_layers) if s]
        for device, v in vrams.items():
            assert all(split.model.layers[i].device == device for i in v.layers)
        _split_model_checks(path, split, whole)
        s = split.stats()
    assert s is not None and s["vram_hits"] > 0
    assert all(f"vram_hit_rate {d}" in s for d in vrams)


CUDA2 = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 GPUs"
)


@pytest.mark.gpu
@CUDA2
@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_two_gpus_equal_one_gpu_and_stay_close_to_the_cpu(
    family: str, tiny_ftw: dict[str, Path]
) -> None:
    """On two GPUs: bit-identical to one GPU (resident and streamed); in fp32, the
    resident CPU run's logits within 1e-4 and its greedy tokens (CPU and GPU kernels
    sum in different orders, so not bit for bit)."""
    path = tiny_ftw[family]
    with (
        flint.LLM(path, device="cuda:0", context_length=64, graphs="off") as one,
        flint.LLM(path, device="cuda:0,cuda:1", context_length=64) as two,
    ):
        assert two.model.place.devices == (D0, D1)
        _split_model_checks(path, two, one)
    with (
        flint.LLM(path, device="cuda:0,cuda:1", dtype="float32", context_length=64) as two,
        flint.LLM(path, device="cpu", context_length=64) as cpu,
    ):
        for ids in PROMPTS:
            ref = cpu.model.forward(torch.tensor(ids), all_logits=True)
            got = two.model.forward(torch.tensor(ids), all_logits=True).cpu()
            torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4)
        kw: dict[str, Any] = {"max_tokens": 16, "ignore_eos": True}
        assert two.generate([1, 2, 3], **kw).token_ids == cpu.generate([1, 2, 3], **kw).token_ids
    with (
        flint.LLM(path, device="cuda:0", context_length=64, ram_budget=1e-6) as one,
        flint.LLM(path, device="cuda:0,cuda:1", context_length=64, ram_budget=1e-6) as two,
    ):
        backend: Any = two.expert_backend
        for device, v in backend.vrams.items():  # each GPU's cache holds its own layers
            assert all(two.model.layers[i].device == device for i in v.layers)
        assert sum(len(v.layers) for v in backend.vrams.values()) == sum(
            two.model.config.sparse_layers
        )
        _split_model_checks(path, two, one)


def test_bench_shows_each_gpus_vram_hit_rate() -> None:
    from flint.bench.report import _per_gpu
    from flint.bench.runner import per_token

    keys = ("hits", "in_flight_at_start", "demand_placements", "stall_s", "reads_demand")
    keys += ("reads_prefetch", "bytes_demand", "bytes_prefetch", "vram_hits", "pcie_bytes")
    keys += ("cpu_experts", "gpu_experts")
    before: dict[str, Any] = dict.fromkeys(keys, 0) | {f"q{d}": (0, 0, 0) for d in (1, 2)}
    after = dict(before, vram_hits=3, hits=1)
    before |= {"vram cuda:0": (0, 0), "vram cuda:1": (0, 0)}
    after |= {"vram cuda:0": (2, 4), "vram cuda:1": (1, 4)}
    out = per_token(before, after, 2)
    assert out["vram_hit_rate cuda:0"] == 0.5 and out["vram_hit_rate cuda:1"] == 0.25
    row = {k: {"mean": v} for k, v in out.items() if k.startswith("vram_hit_rate ")}
    assert _per_gpu(row) == " (0.500 cuda:0, 0.250 cuda:1)"


@pytest.mark.gpu
@CUDA2
def test_two_gpus_equal_one_gpu_for_qwen3_next_and_deepseek_v2(
    tmp_path: Path, tiny_tokenizer_json: str
) -> None:
    """The families outside the shared list: Qwen3-Next (linear-attention states per
    GPU) and DeepSeek-V2 (fp32 rope tables, latent cache), two GPUs against one."""
    from test_deepseek_v2 import deepseek_v2_config

    builds = {
        "qwen3_next": qwen3_next_config(),
        "deepseek_v2": deepseek_v2_config(),
    }
    for family, config in builds.items():
        path = tmp_path / family
        build(family, path, seed=2, config=config)
        save_tokenizer(path, tiny_tokenizer_json)
        with (
            flint.LLM(path, device="cuda:0", context_length=64, graphs="off") as one,
            flint.LLM(path, device="cuda:0,cuda:1", context_length=64) as two,
        ):
            _split_model_checks(path, two, one)
