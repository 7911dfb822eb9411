"""DeepSeek-V2: tiny random models against transformers (logits, greedy decoding, the
softmax group router, the interleaved rope), conversion (per-expert and fused keys),
converted files streamed == resident, config checks, and a synthetic V2-Lite file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file
from tiny import _COMMON, build, save_tokenizer
from variants import (
    assert_incremental_equals_full,
    assert_logits_match,
    assert_streamed_equals_resident,
)

import flint
from flint.convert import ConvertOptions, convert
from flint.models import parse_config
from flint.models.router import route_grouped

CPU = torch.device("cpu")
PROMPTS = ([5, 17, 250, 3, 99], list(range(40, 77)), [11])


def deepseek_v2_config(**overrides: Any) -> Any:
    """A tiny DeepSeek-V2: low-rank queries, 8 experts with greedy top-2 and a scaling
    factor, two shared experts, one dense layer, yarn rope with mscale_all_dim."""
    import transformers as tf

    fields: dict[str, Any] = {
        **_COMMON,
        "num_key_value_heads": 4,
        "intermediate_size": 48,
        "moe_intermediate_size": 16,
        "n_routed_experts": 8,
        "n_shared_experts": 2,
        "first_k_dense_replace": 1,
        "q_lora_rank": 24,
        "kv_lora_rank": 16,
        "qk_nope_head_dim": 8,
        "qk_rope_head_dim": 8,
        "v_head_dim": 12,
        "topk_method": "greedy",
        "routed_scaling_factor": 1.5,
        "rope_parameters": {
            "rope_type": "yarn",
            "rope_theta": 10000.0,
            "factor": 2.0,
            "original_max_position_embeddings": 64,
            "mscale": 0.707,
            "mscale_all_dim": 0.707,
        },
    }
    fields.update(overrides)
    return tf.DeepseekV2Config(**fields)


VARIANTS: dict[str, dict[str, Any]] = {
    "greedy": {},
    # V2-Lite's shape: full-rank q_proj, plain rope, scaling 1
    "lite_full_rank_q": {
        "q_lora_rank": None,
        "routed_scaling_factor": 1.0,
        "num_experts_per_tok": 3,
        "rope_parameters": {"rope_type": "default", "rope_theta": 5000.0},
    },
    # V2's shape: 16 experts in 4 groups ranked by their best score, 2 eligible, top-3,
    # scaling 16, q_a/kv_a/o biases, one shared expert, every layer MoE
    "group_limited": {
        "topk_method": "group_limited_greedy",
        "n_routed_experts": 16,
        "n_group": 4,
        "topk_group": 2,
        "num_experts_per_tok": 3,
        "routed_scaling_factor": 16.0,
        "attention_bias": True,
        "n_shared_experts": 1,
        "first_k_dense_replace": 0,
    },
    # one group of four eligible: the choice is confined to it
    "one_group_of_four": {
        "topk_method": "group_limited_greedy",
        "n_routed_experts": 16,
        "n_group": 4,
        "topk_group": 1,
        "num_experts_per_tok": 2,
    },
}
SEEDS = {"greedy": 0, "lite_full_rank_q": 1, "group_limited": 0, "one_group_of_four": 2}


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def variant(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    tiny_tokenizer_json: str,
) -> tuple[Path, Any]:
    path = tmp_path_factory.mktemp(request.param)
    config = deepseek_v2_config(**VARIANTS[request.param])
    model = build("deepseek_v2", path, seed=SEEDS[request.param], config=config)
    save_tokenizer(path, tiny_tokenizer_json)
    return path, model


def test_variant_logits_match_transformers(variant: tuple[Path, Any]) -> None:
    path, ref = variant
    model = assert_logits_match(path, ref, PROMPTS)
    # decoding token by token reads the latent cache: same logits as the full forward
    assert_incremental_equals_full(model, PROMPTS[1][:12])


def test_greedy_generation_matches_transformers(variant: tuple[Path, Any]) -> None:
    path, ref = variant
    prompt = [5, 17, 250, 3, 99, 42]
    ref.generation_config.eos_token_id = None
    with torch.no_grad():
        out = ref.generate(
            torch.tensor([prompt]), max_new_tokens=32, do_sample=False, pad_token_id=0
        )
    want = out[0, len(prompt) :].tolist()
    with flint.LLM(path, device="cpu", context_length=64) as llm:
        got = llm.generate(prompt, max_tokens=32, temperature=0.0, ignore_eos=True)
    assert list(got.token_ids) == want
    assert len(set(want)) > 3  # the tokens are not one repeated token


def test_converted_streamed_equals_resident(variant: tuple[Path, Any], tmp_path: Path) -> None:
    path, ref = variant
    stats = assert_streamed_equals_resident(path, tmp_path, PROMPTS, (11, 42))
    assert stats["demands"] > 0
    with flint.LLM(tmp_path / "m.ftw", device="cpu", context_length=64) as converted:
        for ids in PROMPTS:  # the converted file is the model
            converted.model.reset()
            got = converted.model.forward(torch.tensor(ids), all_logits=True)
            with torch.no_grad():
                hf = ref(torch.tensor([ids])).logits[0]
            assert (got - hf).abs().max().item() <= 1e-4


def test_fused_expert_keys_convert_to_the_same_model(
    variant: tuple[Path, Any], tmp_path: Path, tiny_tokenizer_json: str
) -> None:
    """The experts as transformers holds them in memory (gate_up_proj [E, 2I, H],
    down_proj [E, H, I]) convert to the same logits as the per-expert keys."""
    path, ref = variant
    tensors = load_file(path / "model.safetensors")
    fused_dir = tmp_path / "fused"
    fused_dir.mkdir()
    out: dict[str, torch.Tensor] = {}
    experts = ref.config.n_routed_experts
    for layer in range(ref.config.num_hidden_layers):
        p = f"model.layers.{layer}.mlp.experts."
        if p + "0.gate_proj.weight" not in tensors:
            continue
        gate = [tensors.pop(f"{p}{e}.gate_proj.weight") for e in range(experts)]
        up = [tensors.pop(f"{p}{e}.up_proj.weight") for e in range(experts)]
        down = [tensors.pop(f"{p}{e}.down_proj.weight") for e in range(experts)]
        out[p + "gate_up_proj"] = torch.stack([torch.cat(gu) for gu in zip(gate, up, strict=True)])
        out[p + "down_proj"] = torch.stack(down)
    save_file({**tensors, **out}, fused_dir / "model.safetensors")
    (fused_dir / "config.json").write_text((path / "config.json").read_text())
    save_tokenizer(fused_dir, tiny_tokenizer_json)
    convert(str(fused_dir), tmp_path / "fused.ftw", ConvertOptions(quant="none"))
    convert(str(path), tmp_path / "per_expert.ftw", ConvertOptions(quant="none"))
    ids = torch.tensor(PROMPTS[1])
    with (
        flint.LLM(tmp_path / "fused.ftw", device="cpu", context_length=64) as fused,
        flint.LLM(tmp_path / "per_expert.ftw", device="cpu", context_length=64) as per,
    ):
        got = fused.model.forward(ids, all_logits=True)
        assert torch.equal(got, per.model.forward(ids, all_logits=True))


@pytest.mark.parametrize(
    ("method", "experts", "groups", "best", "top_k"),
    [
        ("greedy", 8, None, None, 2),
        ("greedy", 16, 4, 1, 6),  # greedy ignores the groups
        ("group_limited_greedy", 16, 4, 2, 3),
        ("group_limited_greedy", 12, 3, 1, 4),
        ("group_limited_greedy", 8, 8, 3, 2),  # one expert per group
    ],
)
def test_router_matches_transformers_router(
    method: str, experts: int, groups: int | None, best: int | None, top_k: int
) -> None:
    from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2TopkRouter

    hf = deepseek_v2_config(
        topk_method=method,
        n_routed_experts=experts,
        n_group=groups,
        topk_group=best,
        num_experts_per_tok=top_k,
        routed_scaling_factor=16.0,
    )
    torch.manual_seed(experts + top_k)
    ref = DeepseekV2TopkRouter(hf)
    with torch.no_grad():
        ref.weight.normal_(0.0, 0.5)
    x = torch.randn(64, hf.hidden_size)
    with torch.no_grad():
        _, want_w, want_ids = ref(x)
    config = parse_config(hf.to_dict())
    cfg = config.group_router
    assert cfg is not None and cfg.scoring == "softmax"
    ids, weights = route_grouped(x, ref.weight.data, None, cfg, top_k, config.norm_topk_prob)
    # transformers' top-k is unsorted: compare per token as expert -> weight maps
    for t in range(x.shape[0]):
        got = dict(zip(ids[t].tolist(), weights[t].tolist(), strict=True))
        want = dict(zip(want_ids[t].tolist(), want_w[t].tolist(), strict=True))
        assert got.keys() == want.keys(), t
        assert all(abs(got[e] - want[e]) <= 1e-6 for e in got)
    probs = torch.softmax(x @ ref.weight.data.T, dim=-1)
    ranked = probs.gather(1, ids)
    assert bool((ranked[:, :-1] >= ranked[:, 1:]).all()), "router-rank order"
    if method == "group_limited_greedy" and groups is not None and best is not None:
        assert all(len(set(g)) <= best for g in (ids // (experts // groups)).tolist())


def test_group_limit_changes_the_choice() -> None:
    """Against plain top-k, the group limit picks differently for some tokens."""
    hf = deepseek_v2_config(
        topk_method="group_limited_greedy", n_routed_experts=16, n_group=4, topk_group=1
    )
    cfg = parse_config(hf.to_dict()).group_router
    assert cfg is not None
    torch.manual_seed(3)
    router, x = torch.randn(16, 32), torch.randn(100, 32)
    greedy = parse_config(deepseek_v2_config(n_routed_experts=16).to_dict()).group_router
    assert greedy is not None
    ids, _ = route_grouped(x, router, None, cfg, 2, False)
    free, _ = route_grouped(x, router, None, greedy, 2, False)
    assert not torch.equal(ids, free)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_pairs_match_transformers(dtype: torch.dtype) -> None:
    """The rotation keeps pairs interleaved and computes in fp32, as V2's complex rotation."""
    from transformers.models.deepseek_v2.modeling_deepseek_v2 import apply_rotary_emb

    from flint.models.mla import apply_rope_interleaved, apply_rope_pairs

    torch.manual_seed(0)
    heads, tokens, dim = 3, 5, 8
    angles = torch.rand(tokens, dim // 2) * 6
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    q = torch.randn(1, heads, tokens, dim).to(dtype)
    k = torch.randn(1, 1, tokens, dim).to(dtype)
    want_q, want_k = apply_rotary_emb(q, k, torch.polar(torch.ones_like(angles), angles)[None])
    got_q, got_k = apply_rope_pairs(q[0], cos, sin), apply_rope_pairs(k[0], cos, sin)
    assert got_q.dtype == dtype
    assert (got_q.float() - want_q[0].float()).abs().max().item() <= 1e-6
    assert (got_k.float() - want_k[0].float()).abs().max().item() <= 1e-6
    assert not torch.equal(apply_rope_interleaved(q[0], cos, sin), got_q), "V3's order differs"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"topk_method": "noaux_tc"}, "topk_method"),
        ({"norm_topk_prob": True}, "norm_topk_prob"),
        ({"topk_method": "group_limited_greedy", "n_group": 3, "topk_group": 1}, "divide"),
        ({"topk_method": "group_limited_greedy", "n_group": 4, "topk_group": 5}, "topk_group"),
        (
            {"topk_method": "group_limited_greedy", "n_group": 8, "topk_group": 1},
            "exceeds",
        ),
        ({"num_key_value_heads": 2}, "num_key_value_heads"),
        ({"mlp_bias": True}, "mlp_bias"),
    ],
)
def test_bad_configs_are_refused(overrides: dict[str, Any], message: str) -> None:
    hf = deepseek_v2_config().to_dict()
    hf.update(overrides)
    with pytest.raises(ValueError, match=message):
        parse_config(hf)


def test_absent_keys_take_transformers_defaults() -> None:
    hf = deepseek_v2_config().to_dict()
    for key in ("topk_method", "routed_scaling_factor", "n_shared_experts", "n_group"):
        hf.pop(key, None)
    config = parse_config(hf)
    assert config.group_router is not None
    assert (config.group_router.n_group, config.group_router.routed_scaling_factor) == (1, 1.0)
    assert config.shared_expert_intermediate_size == 2 * 16
    assert config.mla is not None and config.mla.rope_pairs_kept


@pytest.mark.slow
def test_synthetic_v2_lite_file_loads_and_runs(tmp_path: Path) -> None:
    """``flint synth --geometry deepseek-v2-lite --layers 2`` (one dense, one MoE layer)
    loads, resident and streamed, and gives the same finite logits."""
    from flint.synth import synth

    out = tmp_path / "v2lite.ftw"
    synth("deepseek-v2-lite", "int4", out, n_layers=2)
    ids = torch.tensor([3, 100, 7, 250, 9])
    with flint.LLM(out, device="cpu", context_length=32) as resident:
        assert resident.model.config.family == "deepseek_v2"
        want = resident.model.forward(ids, all_logits=True)
    with flint.LLM(out, device="cpu", context_length=32, ram_budget=1e-6, lookahead=1) as s:
        got = s.model.forward(ids, all_logits=True)
    assert want.shape == (5, 102400) and bool(torch.isfinite(want).all())
    assert torch.equal(got, want)


def test_layers_split_over_two_devices_give_the_same_logits(
    variant: tuple[Path, Any],
) -> None:
    """DeepSeek-V2 split over two device names (its fp32 rope tables and latent KV
    cache per device; see test_split.py): bit-identical to the whole model."""
    path, _ = variant
    with (
        flint.LLM(path, device="cpu", context_length=64) as whole,
        flint.LLM(path, device="cpu,cpu:0", context_length=64) as split,
    ):
        assert len(split.model.place.devices) == 2
        for ids in ([5, 17, 250, 3, 99, 4, 8], [11], [42]):
            want = whole.model.forward(torch.tensor(ids), all_logits=True)
            assert torch.equal(split.model.forward(torch.tensor(ids), all_logits=True), want)


@pytest.mark.interpreter
def test_the_graph_step_follows_the_eager_layer_loop(variant: tuple[Path, Any]) -> None:
    """Latent attention with each rope variant (pairs kept in fp32, plain), low- and
    full-rank queries, group routers, dense first layers: the CUDA graph step (run
    uncaptured on the CPU, its kernels in Triton's interpreter) gives the eager loop's
    greedy tokens, logits within bf16 rounding. torch's kernels, as on CUDA: the step's
    pools are the resident torch backend's."""
    from test_graphs import _decode

    from flint.graphs.decode import GraphDecoder, expert_pools

    path, _ = variant
    with flint.LLM(
        path, device="cpu", dtype="bfloat16", context_length=64, expert_kernels="torch"
    ) as llm:
        model = llm.model
        prompt = list(range(40, 77))
        want_tokens, want = _decode(model, prompt, 8)
        pools = expert_pools(model.experts)
        assert pools is not None
        model.decoder = GraphDecoder(model, pools, capture=False)
        got_tokens, got = _decode(model, prompt, 8)
    assert got_tokens == want_tokens
    assert (got - want).abs().max().item() <= 0.03 * want.abs().max().item()
