"""int8/int4 experts: torch's kernels against dequantize-then-matmul, the start-up probe
and its fallback, and whole models over quantized .ftw files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import flint
from flint.format.quant import encode_projection
from flint.models import FtwSource, ResidentExperts, load_model
from flint.models import quant_linear as ql
from flint.models.loading import Placement
from flint.models.moe import route
from flint.models.quant_experts import QuantizedResidentExperts

CPU = torch.device("cpu")
CPU32 = Placement(CPU, torch.float32)
SHAPES = ((32, 64), (32, 64), (64, 32))  # gate, up, down of the model below


def _notices() -> tuple[list[str], ql.Notice]:
    got: list[str] = []
    return got, got.append


@pytest.mark.parametrize("scheme", ["int8", "int4"])
def test_probe_picks_torch_kernels_on_cpu(scheme: str) -> None:
    notes, notice = _notices()
    kernel = ql.select_kernel(scheme, 32, SHAPES, CPU, torch.float32, notice=notice)
    assert kernel.name.startswith("torch _weight_") and notes == []


@pytest.mark.parametrize("scheme", ["int8", "int4"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernels_equal_dequantize_then_matmul(scheme: str, dtype: torch.dtype) -> None:
    kernel = ql.torch_kernel(scheme, 32, CPU, dtype)
    reference = ql.DequantMm(scheme, 32, CPU, dtype)
    gen = torch.Generator().manual_seed(1)
    for rows, cols in [(64, 256), (256, 64), (48, 128)]:
        raw = encode_projection(torch.randn(rows, cols, generator=gen), scheme, 32)
        x = torch.randn(5, cols, generator=gen).to(dtype)  # [M, K]
        got = kernel(x, kernel.pack(raw, rows, cols))
        want = reference(x, reference.pack(raw, rows, cols))
        assert got.dtype == dtype and got.shape == (5, rows)
        err = (got.float() - want.float()).abs().max().item()
        assert err <= 1e-2 * want.abs().max().item()  # bf16 activations inside the kernel


def test_int4_zero_point_is_zero() -> None:
    # A wrong zero (e.g. torch's asymmetric convention of 8 * scale) shifts every output.
    kernel = ql.Int4MmCpu(32, torch.float32)
    raw = encode_projection(torch.ones(16, 64), "int4", 32)  # q = 7 everywhere
    x = torch.ones(1, 64)
    y = kernel(x, kernel.pack(raw, 16, 64))
    assert torch.allclose(y, torch.full((1, 16), 64.0), rtol=1e-2)


class _WrongZeros(ql.Int4MmCpu):
    """An int4 kernel packed with the wrong zero point: the probe must reject it."""

    def pack(self, raw: torch.Tensor, rows: int, cols: int) -> ql.Packed:
        w, sz = super().pack(raw, rows, cols)
        sz = sz.clone()
        sz[..., 1] = sz[..., 0] * 8
        return w, sz


class _Raises(ql.Int4MmCpu):
    def __call__(self, x: torch.Tensor, w: ql.Packed) -> torch.Tensor:
        raise NotImplementedError("no kernel for this device\nsecond line")


@pytest.mark.parametrize(
    ("broken", "reason"),
    [(_WrongZeros(32, torch.float32), "max error"), (_Raises(32, torch.float32), "no kernel")],
)
def test_failed_probe_falls_back_with_one_notice(
    broken: ql.ProjectionKernel, reason: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ql, "torch_kernel", lambda *args: broken)
    notes, notice = _notices()
    kernel = ql.select_kernel("int4", 32, SHAPES, CPU, torch.float32, notice=notice)
    assert isinstance(kernel, ql.DequantMm)
    assert len(notes) == 1 and "\n" not in notes[0]
    assert reason in notes[0] and "dequantize-then-matmul" in notes[0]


def test_forced_fallback_equals_resident_float_experts(wide_files: dict[str, Path]) -> None:
    source = FtwSource(wide_files["int4"])
    model = load_model(source, CPU, torch.float32, 32)
    notes, notice = _notices()
    fallback = QuantizedResidentExperts(model.config, source, CPU32, "dequant", notice)
    assert isinstance(fallback.kernel, ql.DequantMm) and notes == []
    floats = ResidentExperts(model.config, source, CPU32)  # FtwSource.expert: dequantized f32
    x = torch.randn(9, model.config.hidden_size)
    ids, weights = route(x, source.tensor("model.layers.1.mlp.gate.weight"), model.config)
    assert torch.equal(fallback(1, x, ids, weights), floats(1, x, ids, weights))


@pytest.mark.parametrize("quant", ["int8", "int4"])
def test_quantized_models_follow_their_dequantized_reference(
    quant: str, wide_files: dict[str, Path]
) -> None:
    ids = torch.tensor([5, 17, 250, 3, 99, 42, 7, 7, 120])
    logits = {}
    for mode in ("torch", "dequant"):
        with flint.LLM(
            wide_files[quant], device="cpu", context_length=32, expert_kernels=mode
        ) as llm:
            backend = llm.model.layers[0].mlp.backend
            assert isinstance(backend, QuantizedResidentExperts)
            assert backend.kernel.name.startswith("torch" if mode == "torch" else "dequantize")
            logits[mode] = llm.model.forward(ids, all_logits=True)
    with flint.LLM(
        wide_files["none"], device="cpu", context_length=32, expert_kernels="torch"
    ) as llm:
        full = llm.model.forward(ids, all_logits=True)
    kernel_err = (logits["torch"] - logits["dequant"]).abs().max().item()
    quant_err = (logits["dequant"] - full).abs().max().item()
    assert kernel_err <= 0.02 * full.abs().max().item()
    assert 0 < quant_err <= 0.2 * full.abs().max().item()


def test_unknown_kernel_mode_is_refused(wide_files: dict[str, Path]) -> None:
    with pytest.raises(
        ValueError, match="expert kernels must be one of auto, torch, dequant, fused"
    ):
        flint.LLM(wide_files["int8"], device="cpu", expert_kernels="fast")


def test_kernel_names_reach_the_user(wide_files: dict[str, Any]) -> None:
    from flint.cli.run import expert_kernel

    kw: dict[str, Any] = {"device": "cpu", "context_length": 16, "expert_kernels": "torch"}
    with flint.LLM(wide_files["int8"], **kw) as llm:
        assert expert_kernel(llm) == "torch _weight_int8pack_mm"
    with flint.LLM(wide_files["none"], **kw) as llm:
        assert expert_kernel(llm) == "matmul"
    with flint.LLM(wide_files["int8"], device="cpu", context_length=16) as llm:  # auto
        assert expert_kernel(llm).startswith("flint fused CPU kernels")
