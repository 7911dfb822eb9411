"""flint's fused CPU expert kernels (issue 15): against torch's matmuls on the same
weights for every scheme and instruction set, the fused layer call against the
per-expert torch backends, thread counts, the GIL, transformers, and streamed ==
resident bit for bit with the fused kernels on both sides."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from tiny import FAMILY_NAMES

import flint
from flint import _core
from flint.format.quant import decode_projection, encode_projection
from flint.models import FtwSource, ResidentExperts, SafetensorsSource, load_model
from flint.models.cpu_kernels import FusedKernel, FusedResidentExperts
from flint.models.loading import Placement
from flint.models.mlp import swiglu
from flint.models.moe import route, weighted_sum
from flint.models.quant_experts import fused_supported

CPU32 = Placement(torch.device("cpu"), torch.float32)
TOL = 1e-5  # of the largest |output|: fp32 with a different summation order (docs)
VNNI_TOL = 3e-2  # the VNNI kernels: activations rounded to 8 bits (docs/cpu-kernels.md)


def _has_vnni() -> bool:
    """Whether this CPU has what the VNNI kernels need (Linux's flags)."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return all(f in flags for f in ("avx512_vnni", "avx512bw", "avx512vl"))


def _isas() -> list[str]:
    out = []
    for isa in ("scalar", "portable", "avx2", "avx512", "avx512bf16"):
        try:
            _core.CpuKernels("raw", "f32", 0, ((1, 1), (1, 1), (1, 1)), 1, 1, isa)
        except ValueError:
            continue  # this CPU lacks it
        out.append(isa)
    return out


ISAS = _isas()
# (scheme, dtype, group, I, H): odd shapes for raw/int8; int4 shapes are multiples of
# the group (the format requires it) but not of 2 x 16 lanes.
CASES = [
    ("raw", "f32", 0, 37, 53),
    ("raw", "bf16", 0, 19, 200),
    ("raw", "f16", 0, 5, 17),
    ("int8", "i8", 0, 37, 53),
    ("int4", "u8", 32, 32, 96),
    ("int4", "u8", 6, 18, 42),
]


def _expert_bytes(
    scheme: str, dtype: str, group: int, inter: int, hidden: int, gen: torch.Generator
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Random projection bytes (gate, up, down) and their f32 weights as the file means them."""
    raws, dense = [], []
    for rows, cols in ((inter, hidden), (inter, hidden), (hidden, inter)):
        w = torch.randn(rows, cols, generator=gen) * 0.3
        if scheme == "raw":
            raw = w.to({"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}[dtype])
            raw = raw.contiguous().view(torch.uint8).reshape(-1)
        else:
            raw = encode_projection(w, scheme, group)
        raws.append(raw)
        dense.append(decode_projection(raw, scheme, dtype, rows, cols, group).float())
    return raws, dense


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize(("scheme", "dtype", "group", "inter", "hidden"), CASES)
def test_one_expert_equals_torch_matmuls_on_the_same_weights(
    isa: str, scheme: str, dtype: str, group: int, inter: int, hidden: int
) -> None:
    gen = torch.Generator().manual_seed(inter * hidden)
    raws, (wg, wu, wd) = _expert_bytes(scheme, dtype, group, inter, hidden, gen)
    shapes = ((inter, hidden), (inter, hidden), (hidden, inter))
    kernel = FusedKernel(scheme, dtype, group, shapes, 1, threads=2, isa=isa)
    assert kernel.proj_bytes == tuple(r.numel() for r in raws)
    table = torch.tensor([[r.data_ptr() for r in raws]])
    for tokens in (1, 7):
        x = torch.randn(tokens, hidden, generator=gen)
        ids = torch.zeros(tokens, 1, dtype=torch.int64)
        got = kernel.moe_layer(x, ids, torch.ones(tokens, 1), table)
        want = swiglu(x, wg, wu, wd)
        err = (got - want).abs().max().item()
        assert err <= TOL * want.abs().max().item(), (isa, scheme, tokens, err)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize(("scheme", "dtype", "group", "inter", "hidden"), CASES[3:])
def test_rounded_hidden_rows_follow_a_bf16_model(
    isa: str, scheme: str, dtype: str, group: int, inter: int, hidden: int
) -> None:
    """``round_hidden``: down reads silu(gate) * up rounded to bf16, as the CPU side of a
    bf16 model on CUDA does (the GPU's kernels and torch's bf16 ops hold it so)."""
    gen = torch.Generator().manual_seed(inter + hidden)
    raws, (wg, wu, wd) = _expert_bytes(scheme, dtype, group, inter, hidden, gen)
    shapes = ((inter, hidden), (inter, hidden), (hidden, inter))
    table = torch.tensor([[r.data_ptr() for r in raws]])
    x = torch.randn(3, hidden, generator=gen).bfloat16().float()
    ids, w = torch.zeros(3, 1, dtype=torch.int64), torch.ones(3, 1)
    kernel = FusedKernel(scheme, dtype, group, shapes, 1, threads=2, isa=isa, round_hidden=True)
    assert kernel.core.round_hidden
    got = kernel.moe_layer(x, ids, w, table)
    h = (F.silu(x @ wg.T) * (x @ wu.T)).bfloat16().float()
    want = h @ wd.T
    plain = FusedKernel(scheme, dtype, group, shapes, 1, threads=2, isa=isa).moe_layer(
        x, ids, w, table
    )
    scale = want.abs().max().item()
    assert (got - want).abs().max().item() <= 4e-3 * scale, "one bf16 step of a hidden value"
    assert not torch.equal(got, plain), "the rows were rounded"


@pytest.mark.parametrize("threads", [1, 2])
def test_plain_read_sums_the_buffers_words(threads: int) -> None:
    """The benchmark's yardstick reads every whole u64 word (its wrapping sum comes back)."""
    core = _core.CpuKernels("raw", "f32", 0, ((1, 1), (1, 1), (1, 1)), 1, threads, "scalar")
    buf = torch.randint(0, 1 << 62, (300_001,), dtype=torch.int64, generator=torch.Generator())
    want = sum(buf.tolist()) % (1 << 64)  # the wrapping sum of the words
    assert core.plain_read(buf.data_ptr(), buf.numel() * 8) == want
    assert core.plain_read(buf.data_ptr(), 12) == int(buf[0])  # a partial word left out
    assert core.plain_read(0, 0) == 0


@pytest.mark.parametrize("isa", _isas())
def test_the_name_says_which_kernel_variants_run(isa: str) -> None:
    """The run header (``FusedKernel.name``) names the instruction set and, where it has a
    choice for the experts' scheme, the int4 kernel and the rows computed at once
    (defaults by CPU vendor); raw experts have none."""
    shapes = ((128, 256), (128, 256), (256, 128))
    rows = ("one row at a time", "2 rows at once", "4 rows at once")
    for scheme, dtype, group in (("int4", "u8", 32), ("int8", "i8", 0), ("raw", "bf16", 0)):
        k = FusedKernel(scheme, dtype, group, shapes, 2, threads=1, isa=isa)
        variants = k.core.variants
        parts = variants.split(", ") if variants else []
        vnni = f"{scheme} vnni" in parts  # FLINT_CPU_INT8 / FLINT_CPU_INT4=vnni
        if scheme == "int8" and isa in ("avx512", "avx512bf16"):  # the default with VNNI
            by_default = _has_vnni() and os.environ.get("FLINT_CPU_INT8") != "f32"
            assert vnni == by_default, variants
        if (isa == "avx512bf16" or vnni) and scheme == "int4":
            assert parts[0] in ("int4 lanes", "int4 bf16", "int4 vnni"), variants
        # Rows at once: int8 on AVX-512, int4 on AVX-512 BF16 or through VNNI (plain
        # AVX-512's f32 int4 kernel takes one row at a time whatever the setting).
        avx512 = isa in ("avx512", "avx512bf16")
        if (scheme == "int8" and avx512) or (scheme == "int4" and (isa == "avx512bf16" or vnni)):
            assert parts[-1] in rows, variants
        else:
            assert variants == "", (scheme, variants)
        what = ", ".join(v for v in (isa, variants) if v)
        assert k.name == f"flint fused CPU kernels ({what}, 1 threads)"


def test_weighted_sum_is_bit_identical_to_the_torch_one() -> None:
    gen = torch.Generator().manual_seed(3)
    kernel = FusedKernel("raw", "f32", 0, ((4, 24), (4, 24), (24, 4)), 8)
    y = torch.randn(5 * 3, 24, generator=gen)
    w = torch.rand(5, 3, generator=gen)
    assert torch.equal(kernel.weighted_sum(y, w), weighted_sum(y.view(5, 3, 24), w))


def _layer_inputs(path: Path, tokens: int) -> tuple[Any, FtwSource, torch.Tensor, Any, Any]:
    source = FtwSource(path)
    config = load_model(source, torch.device("cpu"), torch.float32, 8).config
    gen = torch.Generator().manual_seed(tokens)
    x = torch.randn(tokens, config.hidden_size, generator=gen)
    router = source.tensor("model.layers.1.mlp.gate.weight").float()
    ids, weights = route(x, router, config)
    return config, source, x, ids, weights


@pytest.mark.parametrize("quant", ["none", "int8", "int4"])
def test_fused_layer_equals_the_per_expert_torch_path(
    quant: str, wide_files: dict[str, Path]
) -> None:
    # 40 tokens: every expert gets several (the prompt path on AVX-512)
    for tokens in (1, 9, 40):
        config, source, x, ids, weights = _layer_inputs(wide_files[quant], tokens)
        fused = FusedResidentExperts(config, source, CPU32, threads=2)
        reference = ResidentExperts(config, source, CPU32)  # dequantized f32, F.linear
        got, want = fused(1, x, ids, weights), reference(1, x, ids, weights)
        assert got.dtype == x.dtype and got.shape == x.shape
        err = (got - want).abs().max().item()
        # the VNNI kernels (defaults where the CPU has them) round the activation to 8
        # bits per 32 columns: within that rounding, not fp32's
        tol = VNNI_TOL if "vnni" in fused.kernel.core.variants else TOL
        assert err <= tol * want.abs().max().item(), (quant, tokens, err)
        one = FusedResidentExperts(config, source, CPU32, threads=1)
        assert torch.equal(one(1, x, ids, weights), got), "thread count changed the bytes"


def test_checkpoint_experts_keep_their_dtype() -> None:
    from tiny import SHARED

    source = SafetensorsSource(SHARED / "models" / "tiny-code-moe")  # bf16 weights
    model = load_model(source, torch.device("cpu"), torch.float32, 8, expert_kernels="fused")
    backend = model.layers[-1].mlp.backend
    assert isinstance(backend, FusedResidentExperts)
    assert backend.kernel.name.startswith("flint fused CPU kernels")
    cfg = model.config
    assert backend.kernel.proj_bytes[0] == cfg.moe_intermediate_size * cfg.hidden_size * 2


def test_the_gil_is_released_during_a_call() -> None:
    inter = hidden = 2048
    gen = torch.Generator().manual_seed(0)
    raws, _ = _expert_bytes("raw", "f32", 0, inter, hidden, gen)
    shapes = ((inter, hidden), (inter, hidden), (hidden, inter))
    kernel = FusedKernel("raw", "f32", 0, shapes, 1, threads=1, isa="scalar")  # slow on purpose
    table = torch.tensor([[r.data_ptr() for r in raws]])
    x = torch.randn(4, hidden, generator=gen)
    ids, w = torch.zeros(4, 1, dtype=torch.int64), torch.ones(4, 1)
    done = threading.Event()

    def work() -> None:
        kernel.moe_layer(x, ids, w, table)
        done.set()

    worker = threading.Thread(target=work)
    spins = 0
    worker.start()
    while not done.is_set():
        spins += 1  # Python bytecode runs only if the call left the GIL
    worker.join()
    assert spins > 1000


def test_bad_inputs_are_value_errors() -> None:
    kernel = FusedKernel("raw", "f32", 0, ((4, 8), (4, 8), (8, 4)), 2)
    table = torch.zeros(2, 3, dtype=torch.int64)  # no expert has weights
    x, ids, w = torch.randn(1, 8), torch.tensor([[1]]), torch.ones(1, 1)
    with pytest.raises(ValueError, match="expert 1"):
        kernel.moe_layer(x, ids, w, table)
    with pytest.raises(ValueError, match="do not fit"):
        kernel.moe_layer(torch.randn(1, 9), ids, w, table)
    with pytest.raises(ValueError, match="unknown instruction set"):
        FusedKernel("raw", "f32", 0, ((4, 8), (4, 8), (8, 4)), 2, isa="neon")


def test_logits_match_transformers_with_fused_kernels(
    tiny_models: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    for family in FAMILY_NAMES:
        path, ref = tiny_models[family]
        model = load_model(
            SafetensorsSource(path), torch.device("cpu"), torch.float32, 64, None, "fused"
        )
        backends = [getattr(layer.mlp, "backend", None) for layer in model.layers]
        fused = any(isinstance(b, FusedResidentExperts) for b in backends)
        # GPT-OSS's experts (biases, clamped GLU) are not what the kernels compute: one
        # line, then torch's path
        assert fused == fused_supported(model.config), family
        if not fused:
            assert "SwiGLU experts without biases" in capsys.readouterr().err
        prompt = [5, 17, 250, 3, 99, 42, 7]
        with torch.no_grad():
            want = ref(torch.tensor([prompt])).logits[0]
        got = model.forward(torch.tensor(prompt), all_logits=True)
        assert (got - want).abs().max().item() <= 1e-4, family


def _slab_gib(path: Path, slots: int) -> float:
    from flint.stream.plan import GIB

    with flint.LLM(path, device="cpu", context_length=8) as llm:
        lay = llm.source.expert_layout  # type: ignore[attr-defined]
        layers = sum(llm.model.config.sparse_layers)
    return float(slots * layers * lay.slab_bytes / GIB)


@pytest.mark.parametrize("quant", ["none", "int8", "int4"])
@pytest.mark.parametrize(("slots", "lookahead"), [(1, 0), (2, 2)])
def test_streamed_equals_resident_bit_for_bit_with_fused_kernels(
    quant: str, slots: int, lookahead: int, wide_files: dict[str, Path]
) -> None:
    path = wide_files[quant]
    kw: dict[str, Any] = {"device": "cpu", "context_length": 64, "expert_kernels": "fused"}
    budget = _slab_gib(path, slots)
    with (
        # the torch decode path on both sides (the Rust decode step is resident-only and
        # differs by summation order: tests/models/test_cpu_decode.py)
        flint.LLM(path, cpu_decode_step=False, **kw) as resident,
        flint.LLM(path, ram_budget=budget, lookahead=lookahead, **kw) as streamed,
    ):
        assert streamed.expert_backend is not None
        assert getattr(streamed.expert_backend, "fused", None) is not None
        # the 23- and 48-token prompts give experts >= 4 tokens: the prompt path (AVX-512)
        prompts = [[7], [5, 17, 250, 3, 99], [(13 * i + 5) % 300 for i in range(23)]]
        prompts.append([(29 * i + 11) % 300 for i in range(48)])
        for ids in prompts:
            resident.model.reset()
            streamed.model.reset()
            want = resident.model.forward(torch.tensor(ids), all_logits=True)
            got = streamed.model.forward(torch.tensor(ids), all_logits=True)
            assert torch.equal(got, want), (quant, ids)
            for step in (11, 42):
                want = resident.model.forward(torch.tensor([step]))
                got = streamed.model.forward(torch.tensor([step]))
                assert torch.equal(got, want), (quant, ids, step)
        stats = streamed.stats()
        assert stats is not None and stats["demands"] > 0, "demand reads happened"


def test_streamed_kernels_leave_threads_to_the_readers_on_big_machines() -> None:
    from flint.models import cpu_kernels

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(16)
        assert cpu_kernels.streaming_threads() == 16 - cpu_kernels.STREAMING_RESERVE
        torch.set_num_threads(2)
        assert cpu_kernels.streaming_threads() == 2  # a small machine keeps them all
    finally:
        torch.set_num_threads(before)
