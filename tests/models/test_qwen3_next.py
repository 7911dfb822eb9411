"""Qwen3-Next: the hybrid gated-DeltaNet / gated-attention family against transformers,
its recurrent state across forwards, prefix reuse, conversion and streaming."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file
from tiny import build, qwen3_next_config, save_tokenizer
from variants import assert_streamed_equals_resident

from flint.convert import ConvertOptions, convert
from flint.generation import collect, generate_stream
from flint.models import FtwSource, SafetensorsSource, load_model, parse_config
from flint.models.qwen3_next import gated_delta_rule
from flint.sampling import SamplingParams
from flint.tokenizer import Tokenizer

CPU = torch.device("cpu")
SEED = 2  # a tiny model whose greedy decode does not repeat one token
# 100 tokens: two delta-rule blocks (64 + 36)
LONG = torch.randint(0, 320, (100,), generator=torch.Generator().manual_seed(1)).tolist()
PROMPTS = (LONG, [5, 17, 250, 3, 99], [11])


@pytest.fixture(scope="module")
def qwen3_next(
    tmp_path_factory: pytest.TempPathFactory, tiny_tokenizer_json: str
) -> tuple[Path, Any]:
    path = tmp_path_factory.mktemp("qwen3_next")
    model = build("qwen3_next", path, seed=SEED, config=qwen3_next_config())
    save_tokenizer(path, tiny_tokenizer_json)
    return path, model


def _load(path: Path, context: int = 160) -> Any:
    return load_model(SafetensorsSource(path), CPU, torch.float32, context_length=context)


def test_config_layout(qwen3_next: tuple[Path, Any]) -> None:
    path, ref = qwen3_next
    cfg = parse_config(ref.config.to_dict())
    assert cfg.linear_attention is not None
    assert cfg.linear_attention.layers == (True, False, True, False)
    assert cfg.rope.partial_rotary_factor == 0.25
    assert cfg.sparse_layers == (False, True, True, True)
    assert cfg.norm_offset and cfg.attn_output_gate
    hf = ref.config.to_dict()
    del hf["layer_types"]
    hf["full_attention_interval"] = 4  # transformers' default rule
    assert parse_config(hf).linear_attention.layers == (True, True, True, False)  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="layer_types"):
        parse_config({**ref.config.to_dict(), "layer_types": ["full_attention"]})
    with pytest.raises(ValueError, match="multiple"):
        parse_config({**ref.config.to_dict(), "linear_num_value_heads": 3})
    model = _load(path)
    assert model.cache.keys.shape[0] == 2  # KV slots for the 2 full-attention layers only
    assert model.states is not None and model.states.recurrent.shape == (2, 4, 8, 12)


def test_logits_match_transformers(qwen3_next: tuple[Path, Any]) -> None:
    path, ref = qwen3_next
    model = _load(path)
    for prompt in PROMPTS:
        with torch.no_grad():
            want = ref(torch.tensor([prompt])).logits[0]
        model.reset()
        got = model.forward(torch.tensor(prompt), all_logits=True)
        assert (got - want).abs().max().item() <= 1e-4
        assert want.abs().max().item() > 1.0


def test_incremental_decode_equals_full_forward(qwen3_next: tuple[Path, Any]) -> None:
    """Prompt, then token by token (the recurrent step and the conv state carried), then
    in uneven pieces with small attention chunks: each equals one full forward."""
    model = _load(qwen3_next[0])
    ids = torch.tensor(LONG)
    full = model.forward(ids, all_logits=True)
    model.reset()
    steps = [model.forward(ids[:37], all_logits=True)]
    steps += [model.forward(ids[i : i + 1], all_logits=True) for i in range(37, 100)]
    assert (torch.cat(steps) - full).abs().max().item() <= 1e-4
    model.reset()
    pieces = [model.forward(ids[s : s + 30], all_logits=True, chunk=7) for s in range(0, 100, 30)]
    assert (torch.cat(pieces) - full).abs().max().item() <= 1e-4
    model.reset()  # a reset clears the states: the same logits again
    assert (model.forward(ids, all_logits=True) - full).abs().max().item() == 0.0


def test_greedy_matches_transformers_generate(qwen3_next: tuple[Path, Any]) -> None:
    """32 greedy tokens equal transformers' generate (its cached, recurrent decode)."""
    path, ref = qwen3_next
    prompt = [5, 17, 250, 3, 99, 41, 7]
    with torch.no_grad():
        out = ref.generate(
            torch.tensor([prompt]), max_new_tokens=32, do_sample=False, eos_token_id=None
        )
    want = out[0, len(prompt) :].tolist()
    model = _load(path)
    logits = model.forward(torch.tensor(prompt))
    got = []
    for _ in range(32):
        got.append(int(logits[0].argmax()))
        logits = model.forward(torch.tensor(got[-1:]))
    assert got == want
    assert len(set(got)) > 3  # not one repeated token


def _delta_inputs(tokens: int, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(7)
    q = torch.randn(tokens, 2, 8, generator=gen, dtype=dtype)
    k = torch.randn(tokens, 2, 8, generator=gen, dtype=dtype)
    v = torch.randn(tokens, 4, 12, generator=gen, dtype=dtype)
    g = -torch.rand(tokens, 4, generator=gen, dtype=dtype) * 2.0
    beta = torch.rand(tokens, 4, generator=gen, dtype=dtype)
    state = torch.randn(4, 8, 12, generator=gen, dtype=dtype)
    return q, k, v, g, beta, state


def test_delta_rule_matches_transformers_kernels() -> None:
    """The chunked (prompt) and recurrent (decode) forms against transformers' torch
    fallbacks, from a non-zero state: outputs and final states."""
    from transformers.models.qwen3_next import modeling_qwen3_next as hf

    q, k, v, g, beta, state = _delta_inputs(150, torch.float32)
    kw = {"initial_state": state[None], "output_final_state": True, "use_qk_l2norm_in_kernel": True}
    batch = [t[None] for t in (q, k, v)]
    want, want_state = hf.torch_chunk_gated_delta_rule(*batch, g=g[None], beta=beta[None], **kw)
    mine = state.clone()
    got = gated_delta_rule(q, k, v, g, beta, mine)
    assert (got - want[0]).abs().max().item() <= 1e-5
    assert (mine - want_state[0]).abs().max().item() <= 1e-5
    step = state.clone()
    outs = [
        gated_delta_rule(
            q[t : t + 1], k[t : t + 1], v[t : t + 1], g[t : t + 1], beta[t : t + 1], step
        )
        for t in range(150)
    ]
    want_rec, rec_state = hf.torch_recurrent_gated_delta_rule(
        *batch, g=g[None], beta=beta[None], **kw
    )
    assert (torch.cat(outs) - want_rec[0]).abs().max().item() <= 1e-5
    assert (step - rec_state[0]).abs().max().item() <= 1e-5


def test_delta_rule_blocks_equal_steps_in_fp64() -> None:
    """Any block size gives the token-by-token recurrence, to fp64 rounding."""
    q, k, v, g, beta, state = _delta_inputs(40, torch.float64)
    step = state.clone()
    want = torch.cat(
        [
            gated_delta_rule(
                q[t : t + 1], k[t : t + 1], v[t : t + 1], g[t : t + 1], beta[t : t + 1], step
            )
            for t in range(40)
        ]
    )
    for block in (64, 16, 5, 2):
        s = state.clone()
        got = gated_delta_rule(q, k, v, g, beta, s, block=block)
        assert (got - want).abs().max().item() <= 1e-10
        assert (s - step).abs().max().item() <= 1e-10


def test_reset_and_prefix_reuse(qwen3_next: tuple[Path, Any]) -> None:
    """The recurrent state cannot be rewound: reset keeps all positions or none, and
    prefix reuse continues only from the whole cache (else a full prefill)."""
    model = _load(qwen3_next[0])
    prompt = LONG[:20]
    model.forward(torch.tensor(prompt))
    with pytest.raises(ValueError, match="rewind"):
        model.reset(10)
    assert model.cache.length == 20
    assert model.cached_prefix([*prompt, 4, 5]) == 20
    assert model.cached_prefix(prompt) == 0  # nothing left to run after the cache
    assert model.cached_prefix([*prompt[:10], 7, 8, 9]) == 0  # diverges inside the cache
    model.reset(20)  # keeping everything is allowed
    assert model.cache.length == 20


def test_generation_reuses_only_a_whole_cached_prefix(
    qwen3_next: tuple[Path, Any], tiny_tokenizer_json: str
) -> None:
    """A next turn extending the cached tokens prefills only its new tokens; an edited
    turn prefills everything; both continue exactly as a cold prefill."""
    path = qwen3_next[0]
    tok = Tokenizer(tiny_tokenizer_json)
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    warm, cold = _load(path), _load(path)

    def run(model: Any, ids: list[int], reuse: bool) -> Any:
        return collect(ids, generate_stream(model, tok, ids, params, reuse_prefix=reuse))

    first = run(warm, LONG[:20], True)
    # the next turn: the first prompt, its reply, then new tokens
    turn = LONG[:20] + list(first.token_ids) + [9, 10, 11]
    second = run(warm, turn, True)
    assert second.timings.cached_tokens == 20 + len(first.token_ids) - 1
    assert second.token_ids == run(cold, turn, False).token_ids
    edited = [*LONG[:15], 3, 3, 3]
    third = run(warm, edited, True)
    assert third.timings.cached_tokens == 0
    assert third.token_ids == run(cold, edited, False).token_ids


def test_converts_from_fused_experts_and_streams(
    qwen3_next: tuple[Path, Any], tmp_path: Path, tiny_tokenizer_json: str
) -> None:
    """The checkpoint with its experts fused (gate_up_proj [E, 2I, H], down_proj [E, H, I])
    converts to the same model; mtp.* tensors are left out."""
    path, ref = qwen3_next
    tensors = load_file(path / "model.safetensors")
    fused: dict[str, torch.Tensor] = {}
    experts: dict[int, dict[int, dict[str, torch.Tensor]]] = {}
    for name, t in tensors.items():
        parts = name.split(".")
        if ".mlp.experts." in name:
            experts.setdefault(int(parts[2]), {}).setdefault(int(parts[5]), {})[parts[6]] = t
        else:
            fused[name] = t
    for layer, by_expert in experts.items():
        order = sorted(by_expert)
        p = f"model.layers.{layer}.mlp.experts."
        fused[p + "gate_up_proj"] = torch.stack(
            [torch.cat((by_expert[e]["gate_proj"], by_expert[e]["up_proj"])) for e in order]
        )
        fused[p + "down_proj"] = torch.stack([by_expert[e]["down_proj"] for e in order])
    fused["mtp.fc.weight"] = torch.ones(4, 4)
    src = tmp_path / "fused"
    src.mkdir()
    save_file(fused, src / "model.safetensors", metadata={"format": "pt"})
    (src / "config.json").write_text((path / "config.json").read_text())
    save_tokenizer(src, tiny_tokenizer_json)
    ftw = tmp_path / "m.ftw"
    convert(str(src), ftw, ConvertOptions(quant="none"))
    source = FtwSource(ftw)
    assert not source.has_tensor("mtp.fc.weight")
    model = load_model(source, CPU, torch.float32, context_length=160)
    with torch.no_grad():
        want = ref(torch.tensor([LONG])).logits[0]
    assert (model.forward(torch.tensor(LONG), all_logits=True) - want).abs().max().item() <= 1e-4


def test_streamed_equals_resident(qwen3_next: tuple[Path, Any], tmp_path: Path) -> None:
    prompts = (LONG[:50], [5, 17, 250, 3, 99], [11])
    stats = assert_streamed_equals_resident(qwen3_next[0], tmp_path, prompts, (42, 7, 300))
    assert stats["demands"] > 0


ANCHOR = 2  # <|im_end|> in the tiny tokenizer


def _states(model: Any) -> tuple[torch.Tensor, torch.Tensor]:
    return model.states.conv.clone(), model.states.recurrent.clone()


def test_anchor_checkpoints_resume_like_a_cold_prefill(qwen3_next: tuple[Path, Any]) -> None:
    """States are checkpointed after anchor tokens, inside a prompt's forward (one in
    each delta-rule block, one at a block's end) and in a decode step; rewinding to one
    and running an edited suffix equals a cold prefill of the edited prompt."""
    path = qwen3_next[0]
    prompt = list(LONG)
    for i in (9, 63, 80):
        prompt[i] = ANCHOR
    model, cold = _load(path), _load(path)
    model.anchor_tokens = frozenset({ANCHOR})
    model.forward(torch.tensor(prompt))
    model.forward(torch.tensor([ANCHOR]))  # a decoded anchor: checkpoint 101
    model.forward(torch.tensor([5]))
    assert sorted(model.states.checkpoints) == [10, 64, 81, 101]
    seq = [*prompt, ANCHOR]
    for cut in (10, 64, 81, 101):  # each checkpoint is the state a cold prefill ends with
        cold.reset()
        cold.forward(torch.tensor(seq[:cut]))
        ((conv, rec),) = model.states.checkpoints[cut]  # fp32: equal up to rounding
        assert (conv - cold.states.conv).abs().max().item() <= 1e-4
        assert (rec - cold.states.recurrent).abs().max().item() <= 1e-4
        assert rec.abs().max().item() > 0.1
    edited = [*prompt[:85], 7, 8, 9]  # an edit after the anchor at 80
    assert model.cached_prefix(edited) == 81
    assert model.cached_prefix([*prompt[:30], 1, 2]) == 10
    assert model.cached_prefix([1, *prompt]) == 0
    model.reset(81)
    assert sorted(model.states.checkpoints) == [10, 64, 81]  # later ones dropped
    got = model.forward(torch.tensor(edited[81:]), all_logits=True)
    cold.reset()
    want = cold.forward(torch.tensor(edited), all_logits=True)[81:]
    assert (got - want).abs().max().item() <= 1e-4
    with pytest.raises(ValueError, match="no checkpoint"):
        model.reset(50)


def test_delta_rule_cuts_change_nothing() -> None:
    q, k, v, g, beta, state = _delta_inputs(90, torch.float64)
    plain = state.clone()
    want = gated_delta_rule(q, k, v, g, beta, plain)
    seen: dict[int, torch.Tensor] = {}
    s = state.clone()
    got = gated_delta_rule(
        q, k, v, g, beta, s, cuts=(3, 64, 70, 90), on_cut=lambda c, st: seen.update({c: st.clone()})
    )
    assert (got - want).abs().max().item() <= 1e-10 and (s - plain).abs().max().item() <= 1e-10
    assert sorted(seen) == [3, 64, 70, 90]
    s3 = state.clone()
    gated_delta_rule(q[:3], k[:3], v[:3], g[:3], beta[:3], s3)
    assert (seen[3] - s3).abs().max().item() <= 1e-10


def test_llm_edit_after_the_last_anchor_prefills_only_the_suffix(
    qwen3_next: tuple[Path, Any], tmp_path: Path
) -> None:
    """Through flint.LLM (anchors from the tokenizer's special tokens): a request that
    edits the conversation after its last anchor prefills only what follows it, and
    continues as a cold prefill does."""
    import flint

    ftw = tmp_path / "m.ftw"
    convert(str(qwen3_next[0]), ftw, ConvertOptions(quant="none"))
    with (
        flint.LLM(ftw, device="cpu", context_length=160) as warm,
        flint.LLM(ftw, device="cpu", context_length=160) as cold,
    ):
        assert ANCHOR in warm.model.anchor_tokens
        turn = [*LONG[:40], ANCHOR, *LONG[40:50]]
        opts = {"max_tokens": 5, "temperature": 0.0, "ignore_eos": True}
        collect(turn, warm.stream(turn, reuse_prefix=True, **opts))
        edited = [*turn[:41], 17, 250, 3]  # everything after the anchor rewritten
        got = collect(edited, warm.stream(edited, reuse_prefix=True, **opts))
        assert got.timings.cached_tokens == 41  # only the 3 new tokens were prefilled
        want = collect(edited, cold.stream(edited, **opts))
        assert got.token_ids == want.token_ids
