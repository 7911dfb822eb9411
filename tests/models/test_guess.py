"""Guessing each MoE layer's experts before its gate/up's wait (decode.GUESS_EXPERTS):
the attention's launch writes the top-k of the guessing rows' logits, gate/up reads the
guessed experts' rows early, and the step's output keeps its bits whatever was guessed.
Without a GPU the kernels run in Triton's CPU interpreter (tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tiny import greedy_decode

import flint
from flint.graphs import decode as decode_module
from flint.graphs import fused, moe_kernel
from flint.graphs.decode import GraphDecoder, expert_pools, guess_rows, stack_qkv
from flint.models.attention import Attention


@pytest.mark.interpreter
@pytest.mark.parametrize("experts,k,span", [(128, 8, 256), (60, 4, 512), (8, 8, 256), (5, 1, 256)])
def test_the_attentions_launch_writes_the_top_k_of_the_logits(
    experts: int, k: int, span: int
) -> None:
    """``decode_attention`` with a guess: the attention's output unchanged, bit for bit,
    and the ids of the k largest logits (negative ones, ties to the lower id, a span of
    two chunks) in descending order, as a stable sort gives them."""
    torch.manual_seed(experts)
    heads, kv_heads, dim, position = 8, 2, 32, 300
    q = torch.randn(heads, 1, dim)
    keys, values = (torch.randn(kv_heads, 600, dim) for _ in range(2))
    parts = fused.attention_parts(heads, dim, 600, torch.device("cpu"))
    at = torch.tensor([position])
    logits = (torch.randn(experts) * 4).round().bfloat16()  # many ties
    picks = torch.full((k,), -7, dtype=torch.int64)
    outs = [torch.zeros(1, heads * dim) for _ in range(2)]
    fused.decode_attention(q, keys, values, at, span, outs[0], parts)
    fused.decode_attention(q, keys, values, at, span, outs[1], parts, (logits, picks))
    assert torch.equal(outs[0], outs[1])
    want = torch.sort(-logits.float(), stable=True).indices[:k]
    assert picks.tolist() == want.tolist()


def test_guessing_rows_give_the_routers_logits_where_the_attention_adds_nothing() -> None:
    """``guess_rows``: times the input norm of x they give the router's product with
    the post-attention norm of x (fp32; a zero input-norm weight zeroes its column)."""
    from types import SimpleNamespace

    from flint.models.moe import MoEBlock

    torch.manual_seed(0)
    hidden, experts = 16, 6
    router = torch.randn(experts, hidden)
    w_in, w_post = torch.rand(hidden) + 0.5, torch.randn(hidden)
    mlp = MoEBlock.__new__(MoEBlock)
    mlp.router = router
    layer = SimpleNamespace(mlp=mlp, input_norm=w_in, post_norm=w_post)
    rows = guess_rows(layer)  # type: ignore[arg-type]
    x = torch.randn(hidden)
    rms = x / x.pow(2).mean().sqrt()
    torch.testing.assert_close(rows @ (rms * w_in), router @ (rms * w_post))
    w_in[3] = 0.0
    assert bool((guess_rows(layer)[:, 3] == 0).all())  # type: ignore[arg-type]


def test_stacked_guessing_rows_leave_q_k_v_as_they_were() -> None:
    """Rows stacked under q/k/v: q, k, v (and biases) stay views of the stack, with the
    same values, and the extra rows' bias is zero."""
    torch.manual_seed(1)
    attn = Attention.__new__(Attention)
    attn.q_w, attn.k_w, attn.v_w = torch.randn(8, 4), torch.randn(2, 4), torch.randn(2, 4)
    attn.q_b, attn.k_b, attn.v_b = torch.randn(8), torch.randn(2), torch.randn(2)
    before = [t.clone() for t in (attn.q_w, attn.k_w, attn.v_w, attn.q_b, attn.k_b, attn.v_b)]
    extra = torch.randn(3, 4)
    weight, bias = stack_qkv(attn, extra)
    assert weight.shape == (15, 4) and bias is not None and bias.shape == (15,)
    after = (attn.q_w, attn.k_w, attn.v_w, attn.q_b, attn.k_b, attn.v_b)
    for a, b in zip(before, after, strict=True):
        assert torch.equal(a, b)
    assert attn.v_w.data_ptr() == weight[10:].data_ptr()
    assert torch.equal(weight[12:], extra) and bool((bias[12:] == 0).all())


@pytest.mark.interpreter
@pytest.mark.parametrize("file", ["int4", "dense-int8"])
def test_guessing_keeps_the_steps_bits(
    file: str, wide_files: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The step with guesses (fixed, and predicted from the rows under q/k/v; reading
    ahead as under dependent launch) and without: the same tokens and logits, bit for
    bit. Predicted guesses are written each step: distinct experts in range, not the
    fixed 0..K-1 they start as. int4 experts (gate/up guesses) with bf16 attention, and
    bf16 experts (no guessing kernel) with int8 q/k/v (the rows stored int8)."""
    from flint.graphs.slab_experts import SlabResidentExperts
    from flint.models.ftw_source import FtwSource
    from flint.models.loading import Placement

    monkeypatch.setattr(moe_kernel, "AHEAD_WITHOUT_PDL", True)
    path = wide_files[file]
    prompt = [5, 17, 250, 3, 99, 42, 7]
    kw: dict[str, object] = {"expert_kernels": "torch"}
    if file == "int4":
        with flint.LLM(path, device="cpu", dtype="bfloat16", context_length=64) as probe:
            cpu = Placement(torch.device("cpu"), torch.bfloat16)
            kw = {"expert_backend": SlabResidentExperts(probe.model.config, probe.source, cpu)}
    runs = {}
    with flint.LLM(path, device="cpu", dtype="bfloat16", context_length=64, **kw) as llm:
        model, config = llm.model, llm.model.config
        pools = expert_pools(model.experts)
        assert pools
        for mode in ("off", "fixed", "predicted"):
            monkeypatch.setattr(decode_module, "GUESS_EXPERTS", mode)
            stored = FtwSource(path)
            try:
                model.decoder = decoder = GraphDecoder(model, pools, capture=False, source=stored)
            finally:
                stored.close()
            runs[mode] = greedy_decode(model, prompt, 4)
            moe = sorted(pools)
            if mode == "off":
                assert not decoder.guess_row and not decoder.predicted
                continue
            assert sorted(decoder.guess_row) == moe
            k = config.top_k
            if mode == "predicted":
                assert decoder.predicted == frozenset(moe)
                for row in decoder.guesses.tolist():
                    assert len(set(row)) == k and all(0 <= e < config.num_experts for e in row)
                assert decoder.guesses.tolist() != [list(range(k))] * len(moe)
            else:
                assert decoder.guesses.tolist() == [list(range(k))] * len(moe)
    assert runs["fixed"][0] == runs["off"][0] == runs["predicted"][0]
    assert torch.equal(runs["fixed"][1], runs["off"][1])
    assert torch.equal(runs["predicted"][1], runs["off"][1])


@pytest.mark.gpu
def test_captured_guessing_keeps_the_steps_bits_on_cuda(
    wide_files: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Captured steps under dependent launch (gate/up reading the guessed rows before
    its wait) with guesses fixed, predicted and none: the same tokens and logits, bit
    for bit, over 24 tokens; gate/up launched guessing."""
    prompt = [(7 * i + 3) % 300 + 2 for i in range(12)]
    runs = {}
    for mode in ("off", "fixed", "predicted"):
        monkeypatch.setattr(decode_module, "GUESS_EXPERTS", mode)
        with flint.LLM(wide_files["int4"], device="cuda:0", context_length=128, graphs="on") as llm:
            decoder = llm.model.decoder
            assert isinstance(decoder, GraphDecoder)
            assert bool(decoder.guess_row) == (mode != "off")
            runs[mode] = greedy_decode(llm.model, prompt, 24)
            if mode == "predicted":
                assert decoder.guesses.tolist() != [list(range(llm.model.config.top_k))] * len(
                    decoder.guess_row
                )
    assert runs["fixed"][0] == runs["off"][0] == runs["predicted"][0]
    assert torch.equal(runs["fixed"][1], runs["off"][1])
    assert torch.equal(runs["predicted"][1], runs["off"][1])
