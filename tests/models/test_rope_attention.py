"""q/k/v RoPE and the attention in one launch (``flint.graphs.rope_attention``, issue
10): the cache rows ``fused.qkv_rope`` writes, bit for bit, and the attention of
``fused.decode_attention`` within a rounding, in the interpreter and on CUDA; the step
with it against the model's own decode."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_graphs import _decode
from tiny import assert_follows

import flint
from flint.graphs import decode, fused
from flint.graphs.decode import GraphDecoder, expert_pools
from flint.graphs.rope_attention import SPAN, rope_attention, takes


def _agrees(
    heads: int, kv_heads: int, dim: int, rot: int, norm: bool, dtype: torch.dtype,
    device: torch.device,
) -> None:  # fmt: skip
    """Each position (the first, block edges, the span's last): the same cache rows as
    ``qkv_rope``, the output within one rounding of the dtype of ``decode_attention``'s
    (fp32: 1e-5 of its scale)."""
    torch.manual_seed(heads + dim + rot)
    ctx = SPAN + 40
    y = torch.randn((heads + 2 * kv_heads) * dim).to(dtype).to(device)
    qn, kn = ((torch.rand(dim) + 0.5).to(dtype).to(device) if norm else None for _ in "qk")
    cos, sin = (torch.randn(ctx, rot).to(dtype).to(device) for _ in "cs")
    parts = fused.attention_parts(heads, dim, ctx, device)
    for pos in (0, 1, 7, 63, 64, 129, SPAN - 1):
        keys = torch.randn(kv_heads, ctx, dim).to(dtype).to(device)
        values = torch.randn(kv_heads, ctx, dim).to(dtype).to(device)
        k2, v2 = keys.clone(), values.clone()
        at = torch.tensor([pos], device=device)
        q = torch.empty(heads, 1, dim, dtype=dtype, device=device)
        fused.qkv_rope(y, qn, kn, cos, sin, at, q, keys, values, 1e-6)
        want = torch.empty(1, heads * dim, dtype=dtype, device=device)
        fused.decode_attention(q, keys, values, at, SPAN, want, parts)
        got = torch.full((1, heads * dim), float("nan"), dtype=dtype, device=device)
        rope_attention(y, qn, kn, cos, sin, at, k2, v2, got, heads, 1e-6)
        assert torch.equal(keys, k2) and torch.equal(values, v2), pos
        scale = want.float().abs().max().item()
        tol = 1e-5 * scale if dtype == torch.float32 else 2**-7 * scale
        assert (got.float() - want.float()).abs().max().item() <= tol, pos


@pytest.mark.interpreter
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("rot", "norm"), [(32, True), (16, False)])
def test_one_launch_follows_rope_then_attention(dtype: torch.dtype, rot: int, norm: bool) -> None:
    """Four query heads a key/value head, per-head norms with full rotation, and no
    norms with partial rotation."""
    _agrees(8, 2, 32, rot, norm, dtype, torch.device("cpu"))


@pytest.mark.gpu
def test_one_launch_follows_rope_then_attention_on_cuda() -> None:
    """The same compiled, in the 30B-A3B's heads (32 query, 4 key/value, 128 dims)."""
    _agrees(32, 4, 128, 128, True, torch.bfloat16, torch.device("cuda"))


def test_it_takes_short_spans_only() -> None:
    assert takes(256, 128) and not takes(512, 128) and not takes(256, 512)


@pytest.mark.interpreter
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_step_with_one_launch_follows_the_models_decode(
    dtype: str, tiny_ftw: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """qwen3_moe's step (uncaptured, on the CPU) with ``ROPE_ATTENTION``, across the
    span boundary (the later span takes the two launches), against the model's own
    decode: the same tokens (fp32) or up to a flipped tie (bf16)."""
    monkeypatch.setattr(decode, "ROPE_ATTENTION", True)
    calls: list[int] = []

    def counted(*args: object) -> torch.Tensor:
        calls.append(1)
        return rope_attention(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(decode, "rope_attention", counted)
    with flint.LLM(
        tiny_ftw["qwen3_moe"], device="cpu", dtype=dtype, context_length=SPAN + 16,
        expert_kernels="torch",
    ) as llm:  # fmt: skip
        model = llm.model
        pools = expert_pools(model.experts)
        assert pools is not None
        prompt = [(7 * i + 3) % 300 + 2 for i in range(SPAN - 3)]
        want_tokens, want = _decode(model, prompt, 8)
        model.decoder = GraphDecoder(model, pools, capture=False)
        got_tokens, got = _decode(model, prompt, 8)
        if dtype == "float32":
            assert got_tokens == want_tokens
            assert (got - want).abs().max().item() <= 1e-4 * want.abs().max().item()
        else:
            assert_follows(got_tokens, got, want_tokens, want, min_same=5)
    layers = len(model.layers)
    assert len(calls) == 3 * layers, len(calls)  # the three steps inside the first span
