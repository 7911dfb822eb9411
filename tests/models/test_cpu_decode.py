"""The Rust CPU decode step (flint.models.cpu_decode) against the torch decode path:
logits within tolerance on every tiny family it takes, the same greedy tokens on the
trained tiny-code-moe, and prefill (torch) + decode (Rust) + reset / prefix reuse on one
shared KV cache."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from tiny import FAMILY_NAMES, SHARED

import flint
from flint.models import SafetensorsSource, load_model
from flint.models.cpu_decode import ENV_SWITCH, CpuDecodeStep
from flint.models.transformer import MoEModel

STEPPED = ("qwen3_moe", "qwen2_moe", "mixtral", "olmoe")  # families the step takes
PROMPT = [5, 17, 250, 3, 99, 42, 7]
TINY_CODE_MOE = SHARED / "models" / "tiny-code-moe"


def _load(path: Path, dtype: torch.dtype = torch.float32, **kw: Any) -> MoEModel:
    return load_model(SafetensorsSource(path), torch.device("cpu"), dtype, 64, None, "fused", **kw)


def _greedy(model: MoEModel, prompt: list[int], steps: int) -> tuple[list[int], torch.Tensor]:
    """Greedy tokens after ``prompt`` and the logits [steps, V] of each decode step."""
    model.reset(0)
    logits = model.forward(torch.tensor(prompt))
    tokens, out = [], []
    for _ in range(steps):
        tokens.append(int(logits.argmax()))
        logits = model.forward(torch.tensor([tokens[-1]]))
        out.append(logits[0])
    return tokens, torch.stack(out)


def _torch_path(model: MoEModel, prompt: list[int], steps: int) -> tuple[list[int], torch.Tensor]:
    step, model.decoder = model.decoder, None
    try:
        return _greedy(model, prompt, steps)
    finally:
        model.decoder = step


def test_the_step_applies_to_the_standard_families_only(tiny_models: dict[str, Any]) -> None:
    for family in FAMILY_NAMES:
        model = _load(tiny_models[family][0])
        assert isinstance(model.decoder, CpuDecodeStep) == (family in STEPPED), family


def test_decode_logits_match_the_torch_path_in_f32(tiny_models: dict[str, Any]) -> None:
    # f32 model: the same math up to summation order
    for family in STEPPED:
        model = _load(tiny_models[family][0])
        want_tokens, want = _torch_path(model, PROMPT, 12)
        got_tokens, got = _greedy(model, PROMPT, 12)
        assert got_tokens == want_tokens, family
        scale = want.abs().max().item()
        assert (got - want).abs().max().item() <= 1e-5 * max(1.0, scale), family


def test_decode_logits_in_bf16_stay_within_the_torch_paths_rounding(
    tiny_models: dict[str, Any],
) -> None:
    # bf16 model: the torch path rounds to bf16 between ops, the step keeps f32; both
    # against the f32 model's logits on the same tokens (the f32 greedy tokens fed to all)
    for family in STEPPED:
        path = tiny_models[family][0]
        ref = _load(path, cpu_decode_step=False)
        tokens, want = _greedy(ref, PROMPT, 8)
        feed = PROMPT + tokens[:-1]
        model = _load(path, torch.bfloat16)
        assert model.decoder is not None
        errs = []
        for step in (model.decoder, None):
            model.decoder = step
            model.reset(0)
            model.forward(torch.tensor(feed[: len(PROMPT)]))
            rows = [model.forward(torch.tensor([t]))[0] for t in feed[len(PROMPT) :]]
            errs.append((torch.stack(rows).float() - want[:-1]).abs().max().item())
        rust, torch_bf16 = errs
        assert rust <= 2 * torch_bf16 + 1e-3, (family, rust, torch_bf16)


def test_prefill_decode_reset_and_prefix_reuse_share_the_cache(tiny_ftw: dict[str, Path]) -> None:
    path = tiny_ftw["qwen3_moe"]
    kw: dict[str, Any] = {"device": "cpu", "context_length": 64, "expert_kernels": "fused"}
    with flint.LLM(path, **kw) as rust, flint.LLM(path, cpu_decode_step=False, **kw) as ref:
        assert rust.model.decoder is not None and ref.model.decoder is None
        first = list(PROMPT)
        outs: list[list[tuple[int, ...]]] = [[], []]
        for i, llm in enumerate((rust, ref)):
            a = llm.generate(first, max_tokens=10, temperature=0.0, ignore_eos=True)
            # the next turn: the first turn and its reply, then more prompt
            turn = first + list(a.token_ids) + [9, 11]
            b = llm.generate(
                turn, max_tokens=10, temperature=0.0, ignore_eos=True, reuse_prefix=True
            )
            assert b.timings.cached_tokens > len(first)
            c = llm.generate(first[:4], max_tokens=10, temperature=0.0, ignore_eos=True)
            outs[i] = [a.token_ids, b.token_ids, c.token_ids]
        assert outs[0] == outs[1]


def test_the_step_can_be_turned_off(
    tiny_models: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tiny_models["qwen3_moe"][0]
    assert _load(path, cpu_decode_step=False).decoder is None
    monkeypatch.setenv(ENV_SWITCH, "0")
    assert _load(path).decoder is None
    model = load_model(SafetensorsSource(path), torch.device("cpu"), torch.float32, 64)
    assert model.decoder is None  # torch's expert kernels: no step


@pytest.mark.skipif(not TINY_CODE_MOE.exists(), reason="tiny-code-moe is not in ../shared")
def test_tiny_code_moe_greedy_64_tokens_are_the_torch_paths() -> None:
    with flint.LLM(TINY_CODE_MOE, device="cpu", context_length=256, expert_kernels="fused") as llm:
        model = llm.model
        assert model.decoder is not None
        prompt = llm.tokenizer.encode("def fibonacci(n):\n")
        want, _ = _torch_path(model, prompt, 64)
        got, _ = _greedy(model, prompt, 64)
        assert got == want


def _fused_kernels(model: Any) -> list[Any]:
    """The fused kernels of the model's MoE layers."""
    backends = [getattr(layer.mlp, "backend", None) for layer in model.layers]
    return [b.kernel for b in backends if b is not None and hasattr(b, "kernel")]


@pytest.mark.parametrize("quant", ["none", "int8", "int4"])
def test_every_expert_scheme_decodes_as_the_torch_path(
    quant: str, wide_files: dict[str, Path]
) -> None:
    # the routed experts through the fused kernels' rows in both paths: f32 logits
    # within summation order of each other, the same greedy tokens
    kw: dict[str, Any] = {"device": "cpu", "context_length": 64, "expert_kernels": "fused"}
    with flint.LLM(wide_files[quant], **kw) as llm:
        model = llm.model
        assert model.decoder is not None
        want_tokens, want = _torch_path(model, PROMPT, 12)
        got_tokens, got = _greedy(model, PROMPT, 12)
        assert got_tokens == want_tokens, quant
        scale = want.abs().max().item()
        # the VNNI kernels round each path's activations to 8 bits: a last-bit difference
        # between the paths' inputs may round one value a step apart
        vnni = any("vnni" in kernel.core.variants for kernel in _fused_kernels(model))
        tol = 2e-3 if vnni else 1e-5
        assert (got - want).abs().max().item() <= tol * max(1.0, scale), quant
