"""The CUDA paths: torch's int8/int4 kernels on the GPU, bf16 models on the GPU, and
tiny-code-moe's int8/int4 quality there. Skipped where CUDA is absent."""

from __future__ import annotations

import inspect
import logging.handlers
from pathlib import Path

import pytest
import torch
from tiny import SHARED

import flint
from flint.convert import ConvertOptions, convert
from flint.evaluate import evaluate
from flint.format.quant import encode_projection
from flint.models import quant_linear as ql
from flint.models.quant_experts import QuantizedResidentExperts

pytestmark = pytest.mark.gpu
CUDA = torch.device("cuda")
SHAPES = ((64, 256), (64, 256), (256, 64))  # tiny-code-moe's gate, up, down
TINY_CODE_MOE = SHARED / "models" / "tiny-code-moe"


@pytest.mark.parametrize("scheme", ["int8", "int4"])
def test_cuda_kernel_passes_its_probe_and_matches_dequant(scheme: str) -> None:
    notes: list[str] = []
    kernel = ql.select_kernel(scheme, 32, SHAPES, CUDA, torch.bfloat16, notice=notes.append)
    assert isinstance(kernel, ql.Int8Mm if scheme == "int8" else ql.Int4MmCuda), notes
    reference = ql.DequantMm(scheme, 32, CUDA, torch.bfloat16)
    gen = torch.Generator().manual_seed(2)
    for rows, cols in [*SHAPES, (768, 2048)]:
        raw = encode_projection(torch.randn(rows, cols, generator=gen), scheme, 32)
        x = torch.randn(7, cols, generator=gen).to(CUDA, torch.bfloat16)  # [M, K]
        got = kernel(x, kernel.pack(raw, rows, cols)).float()
        want = reference(x, reference.pack(raw, rows, cols)).float()
        assert got.shape == (7, rows) and got.device.type == "cuda"
        assert (got - want).abs().max().item() <= 2e-2 * want.abs().max().item()


def test_bf16_on_the_gpu_follows_fp32_on_the_cpu(wide_files: dict[str, Path]) -> None:
    ids = [5, 17, 250, 3, 99, 42, 7, 7, 120, 121, 122]
    with flint.LLM(wide_files["none"], context_length=32) as gpu:
        assert gpu.device.type == "cuda" and gpu.dtype == torch.bfloat16
        got = gpu.model.forward(torch.tensor(ids), all_logits=True).cpu()
    with flint.LLM(wide_files["none"], device="cpu", context_length=32) as cpu:
        want = cpu.model.forward(torch.tensor(ids), all_logits=True)
    assert (got - want).abs().max().item() <= 0.05 * want.abs().max().item()
    assert (got.argmax(-1) == want.argmax(-1)).float().mean().item() >= 0.8


@pytest.mark.parametrize("quant", ["int8", "int4"])
def test_quantized_models_on_the_gpu_follow_dequant(
    quant: str, wide_files: dict[str, Path]
) -> None:
    ids = torch.tensor([5, 17, 250, 3, 99, 42, 7, 7, 120])
    logits = {}
    for mode in ("auto", "dequant"):
        with flint.LLM(
            wide_files[quant], context_length=32, expert_kernels=mode, graphs="off"
        ) as llm:
            backend = llm.model.layers[0].mlp.backend
            assert isinstance(backend, QuantizedResidentExperts)
            assert backend.kernel.name.startswith("torch" if mode == "auto" else "dequantize")
            logits[mode] = llm.model.forward(ids, all_logits=True).cpu()
    err = (logits["auto"] - logits["dequant"]).abs().max().item()
    assert err <= 0.05 * logits["dequant"].abs().max().item()


@pytest.mark.slow
@pytest.mark.skipif(
    not any(TINY_CODE_MOE.glob("*.safetensors")),
    reason="needs ../shared/models/tiny-code-moe's weights (*.safetensors)",
)
def test_tiny_code_moe_quality_on_the_gpu(tmp_path: Path) -> None:
    files = {}
    for quant in ("none", "int8", "int4"):
        files[quant] = tmp_path / f"{quant}.ftw"
        convert(str(TINY_CODE_MOE.resolve()), files[quant], ConvertOptions(quant=quant))
    text = inspect.getsource(logging.handlers)
    with flint.LLM(files["none"], context_length=512) as ref:
        ids = ref.tokenizer.encode(text)[:1000]
        for quant, (max_kl, min_top1) in {"int8": (0.002, 0.98), "int4": (0.05, 0.90)}.items():
            with flint.LLM(files[quant], context_length=512) as llm:
                r = evaluate(llm.model, ids, 512, ref.model)
            print(f"cuda {quant}: mean KL {r.kl:.5f}, top-1 {r.top1:.4f}")
            assert r.kl is not None and r.top1 is not None
            assert r.kl <= max_kl and r.top1 >= min_top1


@pytest.mark.parametrize("cudnn", ["1", "0"])
@pytest.mark.parametrize("quant", ["none", "int4"])
def test_whole_prompt_attention_follows_the_chunks(
    quant: str, cudnn: str, wide_files: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A prompt and a continuation longer than the chunk attend in one call on CUDA
    (cuDNN's, flash or efficient SDPA under the real rule; ``FLINT_CUDNN_ATTENTION=0``
    without cuDNN's): logits and the decode steps after them (which read the keys and
    values they wrote) agree with chunked attention within rounding, greedy tokens
    equal."""
    from flint.models.attention import Attention

    monkeypatch.setenv("FLINT_CUDNN_ATTENTION", cudnn)
    attend = Attention.__call__
    ids = [(7 * i + 3) % 290 + 5 for i in range(88)]
    runs = {}
    for whole in ("1", "0"):
        monkeypatch.setenv("FLINT_WHOLE_ATTENTION", whole)
        rows: list[int] = []

        def spy(
            self: Attention, x: torch.Tensor, *args: object, rows: list[int] = rows
        ) -> torch.Tensor:
            rows.append(x.shape[0])
            return attend(self, x, *args)  # type: ignore[arg-type]

        monkeypatch.setattr(Attention, "__call__", spy)
        with flint.LLM(wide_files[quant], device="cuda", context_length=128, graphs="off") as llm:
            model = llm.model
            first = model.forward(torch.tensor(ids[:48]), all_logits=True, chunk=32)
            logits = torch.cat(
                [first, model.forward(torch.tensor(ids[48:]), all_logits=True, chunk=32)]
            )
            assert all(layer.whole_ok for layer in model.layers), "no fallback to chunks"
            tokens, steps, last = [], [], logits[-1]
            for _ in range(8):
                tokens.append(int(last.argmax()))
                last = model.forward(torch.tensor(tokens[-1:]))[-1]
                steps.append(last.float().cpu())
        runs[whole] = (logits.float().cpu(), tokens, torch.stack(steps), rows)
    (a, ta, la, rows_a), (b, tb, lb, rows_b) = runs["1"], runs["0"]
    assert {48, 40} <= set(rows_a) and max(rows_b) == 32, "one call against chunks of 32"
    assert ((a - b).norm() / b.norm()).item() <= 1e-2
    assert ta == tb
    assert ((la - lb).norm() / lb.norm()).item() <= 1e-2


@pytest.mark.parametrize("w32", [False, True])
def test_cuda_norms_take_the_fused_kernel(w32: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """An RMSNorm on CUDA ([T, H] and per head [T, N, D]) is the fused kernel's result,
    within a rounding of torch's ops (``FLINT_FUSED_NORM=0``), and a row's bits do not
    depend on the rows beside it; a weight in another dtype keeps torch's ops."""
    from flint.graphs.fused import rms_norm as fused
    from flint.models.norm import rms_norm

    torch.manual_seed(0)
    for shape in ((300, 2048), (300, 8, 128)):
        x = torch.randn(*shape, device=CUDA).bfloat16()
        w = torch.randn(shape[-1], device=CUDA).bfloat16()
        got = rms_norm(x, w, 1e-6, w32)
        assert got.shape == x.shape
        rows = x.reshape(-1, shape[-1])
        assert torch.equal(got, fused(rows, w, 1e-6, w32).view(shape))
        assert torch.equal(rms_norm(x[-1:], w, 1e-6, w32), got[-1:]), "the last row alone"
        monkeypatch.setenv("FLINT_FUSED_NORM", "0")
        want = rms_norm(x, w, 1e-6, w32)
        monkeypatch.delenv("FLINT_FUSED_NORM")
        torch.testing.assert_close(got.float(), want.float(), rtol=1.6e-2, atol=1e-2)
        monkeypatch.setenv("FLINT_FUSED_NORM", "0")
        torch_dtype = rms_norm(x, w.float(), 1e-6, w32).dtype
        monkeypatch.delenv("FLINT_FUSED_NORM")
        assert rms_norm(x, w.float(), 1e-6, w32).dtype == torch_dtype, "an fp32 weight: torch's"


def test_the_gpus_rounding_gives_the_bit_arithmetics_bits(monkeypatch: pytest.MonkeyPatch) -> None:
    """The grouped kernels' int4 and int8 tiles rounded by the GPU's conversion
    (``Tiles.native``, on by default there) give the bits of ``_round``'s arithmetic,
    at 64- and 128-pair programs; so does the launch dequantizing its slots first
    (``FLINT_PROMPT_DEQUANT=1``)."""
    from test_grouped import _pool, _route

    from flint.graphs.grouped import Tiles, grouped_experts, pair_plan

    torch.manual_seed(3)
    experts, inter, hidden, k, tokens = 8, 96, 256, 4, 600
    for scheme in ("int8", "int4"):
        pool, _ = _pool(scheme, experts, inter, hidden, group=32, device="cuda")
        x = torch.randn(tokens, hidden, device=CUDA).bfloat16()
        ids, _ = _route(tokens, experts, k)
        plan = pair_plan(ids.to(CUDA), experts, CUDA)
        every = {e: e for e in range(experts)}
        for bm, warps in ((64, 4), (128, 8)):
            outs = []
            for native, first in ((False, "0"), (True, "0"), (True, "1")):
                monkeypatch.setenv("FLINT_PROMPT_DEQUANT", first)
                out = torch.full((tokens * k, hidden), float("nan"), device=CUDA)
                grouped_experts(x, plan, every, pool, out, Tiles(bm, warps=warps, native=native))
                outs.append(out)
            assert not outs[0].isnan().any()
            assert torch.equal(outs[0], outs[1]), (scheme, bm)
            assert torch.equal(outs[0], outs[2]), (scheme, bm, "dequantized first")
