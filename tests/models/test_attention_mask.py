"""The causal mask a prompt chunk's attention gets: a bool tensor on the CPU, torch's
lower-right causal bias on CUDA (the same mask, which lets SDPA pick flash kernels)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch.nn.attention.bias import CausalBias

import flint
from flint.models.attention import Attention, causal_mask

ATTEND = Attention.__call__  # unwrapped, whatever the tests below patch in


@pytest.mark.parametrize(("start", "tokens"), [(0, 5), (3, 4), (0, 1), (7, 1), (9, 2)])
def test_cuda_bias_is_the_cpu_mask(start: int, tokens: int) -> None:
    cpu = causal_mask(start, tokens, torch.device("cpu"))
    cuda = causal_mask(start, tokens, torch.device("cuda"))  # no CUDA memory is touched
    if tokens == 1:
        assert cpu is None and cuda is None, "one new token sees every key: no mask"
        return
    assert cpu is not None and cpu.dtype == torch.bool and cpu.shape == (tokens, start + tokens)
    assert isinstance(cuda, CausalBias)
    assert torch.equal(cuda._materialize(torch.device("cpu")), cpu)
    assert bool(cpu[0, start]) and (start + 1 >= start + tokens or not bool(cpu[0, start + 1]))


def test_bias_gives_the_masked_attention() -> None:
    """SDPA with the bias equals SDPA with the bool mask (the CPU materialises it)."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 4, 3, 8, generator=g)
    k, v = (torch.randn(1, 2, 7, 8, generator=g) for _ in range(2))
    mask = causal_mask(4, 3, torch.device("cpu"))
    bias = causal_mask(4, 3, torch.device("cuda"))
    want = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, enable_gqa=True
    )
    got = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias, enable_gqa=True)
    torch.testing.assert_close(got, want)


def test_whole_prompt_attention_only_on_cuda_past_a_chunk(monkeypatch: pytest.MonkeyPatch) -> None:
    """The rule for one attention call over a whole prompt (the call itself is the GPU
    test ``test_whole_prompt_attention_follows_the_chunks``)."""
    from flint.models import parse_config
    from flint.models.attention import whole_prompt_attention

    cfg = parse_config(
        {"model_type": "qwen3_moe", "hidden_size": 64, "num_attention_heads": 4,
         "num_key_value_heads": 2, "head_dim": 16, "num_hidden_layers": 2,
         "intermediate_size": 64, "moe_intermediate_size": 32, "num_experts": 8,
         "num_experts_per_tok": 2, "vocab_size": 300, "max_position_embeddings": 64,
         "rms_norm_eps": 1e-6, "rope_theta": 10000.0}
    )  # fmt: skip
    cuda, cpu, bf16 = torch.device("cuda"), torch.device("cpu"), torch.bfloat16
    assert whole_prompt_attention(cfg, 8192, 8192, 512, cuda, bf16)
    assert not whole_prompt_attention(cfg, 512, 512, 512, cuda, bf16), "one chunk already"
    assert not whole_prompt_attention(cfg, 8192, 8192, 512, cpu, torch.float32), "CPU: chunks"
    monkeypatch.setenv("FLINT_WHOLE_ATTENTION", "0")
    assert not whole_prompt_attention(cfg, 8192, 8192, 512, cuda, bf16)


def _prompt_runs(path: Path, monkeypatch: pytest.MonkeyPatch, whole: bool) -> dict[str, Any]:
    """A 48-token prompt, a 40-token continuation at position 48 (chunks of 16) and 6
    greedy steps after them, on the CPU with the whole-prompt rule allowed there when
    ``whole`` (torch's flash SDPA runs on the CPU with a bool mask); the row counts the
    attention saw."""
    from flint.models import transformer

    monkeypatch.setattr(transformer, "whole_prompt_attention", lambda c, t, s, k, d, dt: whole)
    rows: list[int] = []

    def spy(self: Attention, x: torch.Tensor, *args: Any) -> torch.Tensor:
        rows.append(x.shape[0])
        return ATTEND(self, x, *args)

    monkeypatch.setattr(Attention, "__call__", spy)
    ids = [(7 * i + 3) % 290 + 5 for i in range(88)]
    with flint.LLM(path, device="cpu", context_length=128) as llm:
        model = llm.model
        first = model.forward(torch.tensor(ids[:48]), all_logits=True, chunk=16)
        second = model.forward(torch.tensor(ids[48:]), all_logits=True, chunk=16)
        tokens = []
        for _ in range(6):
            tokens.append(int(second[-1].argmax()))
            second = torch.cat([second, model.forward(torch.tensor(tokens[-1:]))])
        ok = [layer.whole_ok for layer in model.layers]
        failed = [layer.failed for layer in model.layers]
    return {
        "logits": torch.cat([first, second]),
        "tokens": tokens,
        "rows": rows,
        "ok": ok,
        "failed": failed,
    }


def test_whole_prompt_attention_equals_the_chunks(
    tiny_ftw: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The one-call path (``DecoderLayer._whole``) over a prompt and over a continuation
    that starts at position 48 (the lower-right causal offset), run on the CPU: logits
    within fp32 rounding of the chunks, the same greedy tokens after it."""
    chunks = _prompt_runs(tiny_ftw["qwen3_moe"], monkeypatch, whole=False)
    whole = _prompt_runs(tiny_ftw["qwen3_moe"], monkeypatch, whole=True)
    assert max(chunks["rows"]) == 16 and {48, 40} <= set(whole["rows"])
    a, b = whole["logits"], chunks["logits"]
    assert ((a - b).norm() / b.norm()).item() <= 1e-5
    assert whole["tokens"] == chunks["tokens"] and all(whole["ok"])


def test_whole_prompt_attention_falls_back_only_for_a_missing_kernel(
    tiny_ftw: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """No linear-memory SDPA kernel for the layer: it goes by chunks from then on, with
    the chunks' exact logits (the keys and values the failed call wrote are rewritten);
    an out-of-memory error is raised, not taken for a missing kernel."""
    from torch.nn.attention import SDPBackend

    from flint.models import transformer

    chunks = _prompt_runs(tiny_ftw["qwen3_moe"], monkeypatch, whole=False)
    monkeypatch.setattr(
        transformer, "LINEAR_MEMORY", [SDPBackend.EFFICIENT_ATTENTION]
    )  # none on the CPU
    fallen = _prompt_runs(tiny_ftw["qwen3_moe"], monkeypatch, whole=True)
    assert torch.equal(fallen["logits"], chunks["logits"]) and not any(fallen["ok"])

    def out_of_memory(*_: Any) -> torch.Tensor:
        raise torch.OutOfMemoryError("CUDA out of memory (simulated)")

    monkeypatch.setattr(transformer, "LINEAR_MEMORY", [SDPBackend.FLASH_ATTENTION])
    monkeypatch.setattr(Attention, "__call__", out_of_memory)
    with (
        flint.LLM(tiny_ftw["qwen3_moe"], device="cpu", context_length=64) as llm,
        pytest.raises(torch.OutOfMemoryError),
    ):
        llm.model.forward(torch.arange(5, 45), chunk=16)


def test_a_cudnn_error_drops_cudnn_for_the_layer(
    tiny_ftw: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An error from cuDNN's attention (simulated on the CPU: raised while cuDNN's
    backend is enabled) makes the layer try again without it: the one-call path's
    exact logits, cuDNN marked failed, no fallback to chunks."""
    from torch.nn.attention import SDPBackend

    want = _prompt_runs(tiny_ftw["qwen3_moe"], monkeypatch, whole=True)
    monkeypatch.undo()
    calls = {"cudnn": 0}
    attend = ATTEND

    def flaky(self: Attention, x: torch.Tensor, *args: Any) -> torch.Tensor:
        if torch.backends.cuda.cudnn_sdp_enabled():
            calls["cudnn"] += 1
            raise RuntimeError("cuDNN Frontend error: simulated")
        return attend(self, x, *args)

    monkeypatch.setitem(globals(), "ATTEND", flaky)  # what _prompt_runs' spy calls
    got = _prompt_runs(tiny_ftw["qwen3_moe"], monkeypatch, whole=True)
    assert torch.equal(got["logits"], want["logits"]) and all(got["ok"])
    assert all(f == {SDPBackend.CUDNN_ATTENTION} for f in got["failed"])
    assert not any(want["failed"])
    assert calls["cudnn"] == len(got["ok"]), "once per layer, not again after"
