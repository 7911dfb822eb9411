"""Ling / Bailing-V2 onto the GLM-4.5 path: a tiny GLM-4.5 model's tensors and config
renamed to Ling's, converted, give the GLM-4.5 reference's logits."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file
from tiny import build, glm4_moe_config, save_tokenizer

import flint
from flint.convert import ConvertOptions, convert
from flint.convert.ling import glm_config, is_ling

PROMPTS = ([5, 17, 250, 3, 99], list(range(40, 77)), [11])


def ling_tensors(glm: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """GLM-4.5 tensors under Ling's names: q/k/v fused into query_key_value (q heads,
    then k heads, then v heads), dense, query/key_layernorm, expert_bias, word_embeddings."""
    out: dict[str, torch.Tensor] = {}
    renames = {
        "self_attn.o_proj.weight": "attention.dense.weight",
        "self_attn.q_norm.weight": "attention.query_layernorm.weight",
        "self_attn.k_norm.weight": "attention.key_layernorm.weight",
        "mlp.gate.e_score_correction_bias": "mlp.gate.expert_bias",
    }
    for name, t in glm.items():
        if name == "model.embed_tokens.weight":
            out["model.word_embeddings.weight"] = t
        elif ".self_attn.q_proj." in name:
            prefix, kind = name.split(".self_attn.q_proj.")
            parts = [glm[f"{prefix}.self_attn.{p}_proj.{kind}"] for p in "qkv"]
            out[f"{prefix}.attention.query_key_value.{kind}"] = torch.cat(parts)
        elif ".self_attn.k_proj." in name or ".self_attn.v_proj." in name:
            continue
        else:
            suffix = next((s for s in renames if name.endswith(s)), None)
            out[name.replace(suffix, renames[suffix]) if suffix else name] = t
    return out


def ling_config(glm: dict[str, Any], rotary: str, nextn: int) -> dict[str, Any]:
    """The tiny GLM-4.5's config.json as a Ling 2.0 release writes it."""
    partial = glm["rope_parameters"]["partial_rotary_factor"]
    cfg: dict[str, Any] = {
        "architectures": ["BailingMoeV2ForCausalLM"],
        "model_type": "bailing_moe",
        "vocab_size": glm["vocab_size"],
        "hidden_size": glm["hidden_size"],
        "intermediate_size": glm["intermediate_size"],
        "moe_intermediate_size": glm["moe_intermediate_size"],
        "num_hidden_layers": glm["num_hidden_layers"] + nextn,
        "num_nextn_predict_layers": nextn,
        "num_attention_heads": glm["num_attention_heads"],
        "num_key_value_heads": glm["num_key_value_heads"],
        "head_dim": glm["head_dim"],
        "hidden_act": "silu",
        "rms_norm_eps": glm["rms_norm_eps"],
        "max_position_embeddings": glm["max_position_embeddings"],
        "rope_theta": glm["rope_parameters"]["rope_theta"],
        "rope_scaling": None,
        "use_qkv_bias": glm["attention_bias"],
        "use_bias": False,
        "use_qk_norm": glm["use_qk_norm"],
        "num_experts": glm["n_routed_experts"],
        "num_shared_experts": glm["n_shared_experts"],
        "num_experts_per_tok": glm["num_experts_per_tok"],
        "n_group": glm["n_group"],
        "topk_group": glm["topk_group"],
        "routed_scaling_factor": glm["routed_scaling_factor"],
        "first_k_dense_replace": glm["first_k_dense_replace"],
        "score_function": "sigmoid",
        "moe_router_enable_expert_bias": True,
        "norm_topk_prob": True,
        "tie_word_embeddings": False,
        "eos_token_id": 2,
    }
    if rotary == "rotary_dim":  # Ling-1T's form
        cfg["rotary_dim"] = int(glm["head_dim"] * partial)
    else:
        cfg["partial_rotary_factor"] = partial
    return cfg


@pytest.fixture(scope="module")
def glm(tmp_path_factory: pytest.TempPathFactory, tiny_tokenizer_json: str) -> tuple[Path, Any]:
    path = tmp_path_factory.mktemp("glm")
    model = build("glm4_moe", path, seed=0, config=glm4_moe_config())
    save_tokenizer(path, tiny_tokenizer_json)
    return path, model


def write_ling(glm_dir: Path, out: Path, rotary: str, nextn: int) -> None:
    out.mkdir()
    tensors = ling_tensors(load_file(glm_dir / "model.safetensors"))
    config = json.loads((glm_dir / "config.json").read_text())
    cfg = ling_config(config, rotary, nextn)
    for layer in range(config["num_hidden_layers"], cfg["num_hidden_layers"]):
        # an MTP layer: inside num_hidden_layers, never run
        p = f"model.layers.{layer}."
        tensors[p + "enorm.weight"] = torch.ones(config["hidden_size"])
        tensors[p + "attention.query_key_value.weight"] = torch.randn(96, config["hidden_size"])
    save_file({k: v.contiguous() for k, v in tensors.items()}, out / "model.safetensors")
    (out / "config.json").write_text(json.dumps(cfg))
    for f in ("tokenizer.json", "tokenizer_config.json"):
        (out / f).write_text((glm_dir / f).read_text())


@pytest.mark.parametrize(("rotary", "nextn"), [("partial_rotary_factor", 0), ("rotary_dim", 1)])
def test_converted_ling_matches_the_glm_reference(
    glm: tuple[Path, Any], tmp_path: Path, rotary: str, nextn: int
) -> None:
    glm_dir, ref = glm
    write_ling(glm_dir, tmp_path / "ling", rotary, nextn)
    ftw = tmp_path / "ling.ftw"
    summary = convert(str(tmp_path / "ling"), ftw, ConvertOptions(quant="none"))
    assert summary["arch"] == "glm4_moe"
    assert summary["skipped_tensors"] == 2 * nextn
    with (
        flint.LLM(ftw, device="cpu", context_length=64) as resident,
        flint.LLM(ftw, device="cpu", context_length=64, ram_budget=1e-6, lookahead=2) as s,
    ):
        assert resident.model.config.family == "glm4_moe"
        for ids in PROMPTS:
            resident.model.reset()
            s.model.reset()
            got = resident.model.forward(torch.tensor(ids), all_logits=True)
            with torch.no_grad():
                want = ref(torch.tensor([ids])).logits[0]
            assert (got - want).abs().max().item() <= 1e-4
            assert want.abs().max().item() > 1.0
            assert torch.equal(s.model.forward(torch.tensor(ids), all_logits=True), got)
        stats = s.stats()
    assert stats is not None and stats["demands"] > 0


def test_greedy_generation_of_converted_ling_matches_glm(
    glm: tuple[Path, Any], tmp_path: Path
) -> None:
    glm_dir, ref = glm
    write_ling(glm_dir, tmp_path / "ling", "partial_rotary_factor", 0)
    convert(str(tmp_path / "ling"), tmp_path / "ling.ftw", ConvertOptions(quant="none"))
    prompt = [5, 17, 250, 3, 99, 42]
    ref.generation_config.eos_token_id = None
    with torch.no_grad():
        out = ref.generate(
            torch.tensor([prompt]), max_new_tokens=32, do_sample=False, pad_token_id=0
        )
    want = out[0, len(prompt) :].tolist()
    with flint.LLM(tmp_path / "ling.ftw", device="cpu", context_length=64) as llm:
        got = llm.generate(prompt, max_tokens=32, temperature=0.0, ignore_eos=True)
    assert list(got.token_ids) == want
    assert len(set(want)) > 3


def test_ling_without_expert_bias_routes_with_a_zero_bias(
    glm: tuple[Path, Any], tmp_path: Path
) -> None:
    """moe_router_enable_expert_bias false: the checkpoint has no expert_bias and the
    router runs with zeros (Ling's buffer); the GLM reference with zeroed biases agrees."""
    glm_dir, ref = glm
    write_ling(glm_dir, tmp_path / "ling", "partial_rotary_factor", 0)
    path = tmp_path / "ling" / "model.safetensors"
    tensors = {k: v for k, v in load_file(path).items() if not k.endswith("expert_bias")}
    save_file(tensors, path)
    convert(str(tmp_path / "ling"), tmp_path / "ling.ftw", ConvertOptions(quant="none"))
    ids = torch.tensor(PROMPTS[1])
    saved = {}
    with torch.no_grad():
        for name, buf in ref.named_buffers():
            if name.endswith("e_score_correction_bias"):
                saved[name] = buf.clone()
                buf.zero_()
        want = ref(ids[None]).logits[0]
        for name, buf in ref.named_buffers():
            if name in saved:
                buf.copy_(saved[name])
        biased = ref(ids[None]).logits[0]
    with flint.LLM(tmp_path / "ling.ftw", device="cpu", context_length=64) as llm:
        got = llm.model.forward(ids, all_logits=True)
    assert (got - want).abs().max().item() <= 1e-4
    assert (got - biased).abs().max().item() > 1e-3, "the bias mattered in this model"


def test_which_configs_are_ling() -> None:
    assert is_ling({"model_type": "bailing_moe_v2"})
    assert is_ling({"model_type": "bailing_moe", "architectures": ["BailingMoeV2ForCausalLM"]})
    assert not is_ling({"model_type": "bailing_moe", "architectures": ["BailingMoeForCausalLM"]})
    assert not is_ling({"model_type": "glm4_moe"})


def test_ling_config_maps_onto_glm() -> None:
    base = {
        "model_type": "bailing_moe_v2",
        "vocab_size": 100,
        "hidden_size": 64,
        "intermediate_size": 96,
        "moe_intermediate_size": 16,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_experts": 16,
        "num_experts_per_tok": 1,
        "num_shared_experts": None,
        "rotary_dim": 8,
    }
    cfg = glm_config(base)
    assert cfg["head_dim"] == 16 and cfg["partial_rotary_factor"] == 0.5
    assert cfg["norm_topk_prob"] is False, "top-1: the Ling router does not renormalise"
    assert cfg["n_shared_experts"] == 0
    assert (cfg["rope_theta"], cfg["rms_norm_eps"], cfg["n_group"]) == (600000.0, 1e-6, 8)
    with pytest.raises(ValueError, match="use_bias"):
        glm_config({**base, "use_bias": True})
