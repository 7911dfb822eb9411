"""``flint synth``: random-weight models with the exact geometry of real MoE models,
written straight to .ftw (no checkpoint, no transformers), for benchmarks and tests.

Random routing is close to uniform: the pessimistic case for expert caches."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from flint._version import __version__
from flint.format.constants import DEFAULT_INT4_GROUP, DENSE_QUANTS
from flint.format.quant import dense_quantized, int4_bytes, int8_bytes
from flint.format.writer import FtwFileWriter

# Bumped whenever the weights synth writes change, so caches of synthetic models (the
# demo's) are made again: 2 = zero-mean weights and a x16 embedding (near-uniform
# routing; revision 1 made a quarter of the weights positive and routing collapsed).
WEIGHTS_REVISION = 2

_QWEN3_BASE: dict[str, Any] = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "hidden_act": "silu",
    "attention_bias": False,
    "rms_norm_eps": 1e-6,
    "norm_topk_prob": True,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "tie_word_embeddings": False,
    "bos_token_id": 0,
    "eos_token_id": 1,
}
GEOMETRIES: dict[str, dict[str, Any]] = {
    "tiny": {
        **_QWEN3_BASE,
        "hidden_size": 128,
        "intermediate_size": 256,
        "moe_intermediate_size": 64,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "num_experts": 16,
        "num_experts_per_tok": 4,
        "vocab_size": 512,
        "max_position_embeddings": 2048,
        "rope_theta": 10000.0,
    },
    # `flint demo`: ~3.2 GB of bf16 experts, quick to compute on a small CPU; its
    # vocabulary is exactly the synthetic byte tokenizer's (2 specials + 256 bytes).
    "demo": {
        **_QWEN3_BASE,
        "hidden_size": 1024,
        "intermediate_size": 2048,
        "moe_intermediate_size": 512,
        "num_hidden_layers": 16,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": 128,
        "num_experts": 64,
        "num_experts_per_tok": 8,
        "vocab_size": 258,
        "max_position_embeddings": 4096,
        "rope_theta": 10000.0,
    },
    "qwen3-30b-a3b": {
        **_QWEN3_BASE,
        "hidden_size": 2048,
        "intermediate_size": 6144,
        "moe_intermediate_size": 768,
        "num_hidden_layers": 48,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
        "head_dim": 128,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "vocab_size": 151936,
        "max_position_embeddings": 40960,
        "rope_theta": 1000000.0,
    },
    "mixtral-8x7b": {
        "architectures": ["MixtralForCausalLM"],
        "model_type": "mixtral",
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
        "vocab_size": 32000,
        "max_position_embeddings": 32768,
        "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-5,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
    },
    "deepseek-v2-lite": {
        "architectures": ["DeepseekV2ForCausalLM"],
        "model_type": "deepseek_v2",
        "hidden_size": 2048,
        "intermediate_size": 10944,
        "moe_intermediate_size": 1408,
        "num_hidden_layers": 27,
        "first_k_dense_replace": 1,
        "num_attention_heads": 16,
        "num_key_value_heads": 16,
        "n_routed_experts": 64,
        "n_shared_experts": 2,
        "num_experts_per_tok": 6,
        "kv_lora_rank": 512,
        "q_lora_rank": None,
        "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64,
        "v_head_dim": 128,
        "vocab_size": 102400,
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 163840,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "bos_token_id": 100000,
        "eos_token_id": 100001,
    },
}


def _n_experts(cfg: dict[str, Any]) -> int:
    for k in ("num_experts", "num_local_experts", "n_routed_experts"):
        if k in cfg:
            return int(cfg[k])
    raise KeyError("no expert count in geometry")


def _expert_width(cfg: dict[str, Any]) -> int:
    return int(cfg.get("moe_intermediate_size") or cfg["intermediate_size"])


def _moe_layers(cfg: dict[str, Any]) -> list[int]:
    first_dense = int(cfg.get("first_k_dense_replace", 0))
    return list(range(first_dense, int(cfg["num_hidden_layers"])))


def dense_shapes(cfg: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Every dense tensor of the geometry, with Hugging Face names."""
    h, v, L = cfg["hidden_size"], cfg["vocab_size"], cfg["num_hidden_layers"]
    out: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (v, h)}
    moe = set(_moe_layers(cfg))
    for i in range(L):
        p = f"model.layers.{i}."
        out[p + "input_layernorm.weight"] = (h,)
        out[p + "post_attention_layernorm.weight"] = (h,)
        out.update({p + k: s for k, s in _attention_shapes(cfg).items()})
        if i in moe:
            out[p + "mlp.gate.weight"] = (_n_experts(cfg), h)
            if cfg.get("n_shared_experts"):
                si = _expert_width(cfg) * int(cfg["n_shared_experts"])
                for n, s in (("gate_proj", (si, h)), ("up_proj", (si, h)), ("down_proj", (h, si))):
                    out[p + f"mlp.shared_experts.{n}.weight"] = s
        else:
            di = int(cfg["intermediate_size"])
            for n, s in (("gate_proj", (di, h)), ("up_proj", (di, h)), ("down_proj", (h, di))):
                out[p + f"mlp.{n}.weight"] = s
    out["model.norm.weight"] = (h,)
    out["lm_head.weight"] = (v, h)
    return out


def _attention_shapes(cfg: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    h, nh = cfg["hidden_size"], cfg["num_attention_heads"]
    if cfg["model_type"] == "deepseek_v2":  # multi-head latent attention
        qk = cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"]
        r, rope = cfg["kv_lora_rank"], cfg["qk_rope_head_dim"]
        return {
            "self_attn.q_proj.weight": (nh * qk, h),
            "self_attn.kv_a_proj_with_mqa.weight": (r + rope, h),
            "self_attn.kv_a_layernorm.weight": (r,),
            "self_attn.kv_b_proj.weight": (nh * (cfg["qk_nope_head_dim"] + cfg["v_head_dim"]), r),
            "self_attn.o_proj.weight": (h, nh * cfg["v_head_dim"]),
        }
    hd, nkv = cfg["head_dim"], cfg["num_key_value_heads"]
    out: dict[str, tuple[int, ...]] = {
        "self_attn.q_proj.weight": (nh * hd, h),
        "self_attn.k_proj.weight": (nkv * hd, h),
        "self_attn.v_proj.weight": (nkv * hd, h),
        "self_attn.o_proj.weight": (h, nh * hd),
    }
    if cfg["model_type"] == "qwen3_moe":
        out["self_attn.q_norm.weight"] = (hd,)
        out["self_attn.k_norm.weight"] = (hd,)
    return out


def byte_tokenizer_json() -> str:
    """A byte-level tokenizer (256 byte tokens + 2 specials) for synthetic models."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {"<|endoftext|>": 0, "<|im_end|>": 1}
    vocab.update({ch: i + 2 for i, ch in enumerate(sorted(alphabet))})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|endoftext|>", "<|im_end|>"])
    return str(tok.to_str())


def _random_bf16(n: int, gen: torch.Generator) -> torch.Tensor:
    """n bf16 values with random sign and mantissa and magnitude in [2^-7, 2^-6): built
    from random bits, ~10x faster than normal_() on a small CPU. The sign comes from bit
    8 of each 16-bit word: ``random_`` never sets an int64's top bit, so bit 15 of every
    fourth word is 0 (using it biased a quarter of the weights positive, and routing
    collapsed onto a few experts per layer). The sign is shifted into place, not made
    through a mask of booleans: the same bits in fewer passes (0.51-0.68 GB/s of bf16
    against 0.39-0.47 on the CPU box; ``flint synth`` as a whole unchanged there,
    docs/benchmarks.md "flint synth")."""
    bits = torch.empty((n + 3) // 4, dtype=torch.int64).random_(generator=gen)
    x = bits.view(torch.int16)[:n]
    sign = torch.bitwise_left_shift(x, 7).bitwise_and_(-32768)  # bit 8 to bit 15
    x.bitwise_and_(0x7F).bitwise_or_(120 << 7)  # mantissa, exponent 120: [2^-7, 2^-6)
    return x.bitwise_or_(sign).view(torch.bfloat16)


def _random_bytes(n: int, gen: torch.Generator) -> torch.Tensor:
    return torch.empty((n + 7) // 8, dtype=torch.int64).random_(generator=gen).view(torch.uint8)[:n]


def _random_int8(shape: tuple[int, ...], gen: torch.Generator) -> tuple[torch.Tensor, ...]:
    """A random int8 matrix in [-127, 127] (the converter's range) and its f32 row
    scales, of about the bf16 matrices' magnitude (|q| averages ~64)."""
    q = _random_bytes(_numel(shape), gen).view(torch.int8).view(shape).clamp_(-127, 127)
    return q, torch.full((shape[0],), 2.0**-12, dtype=torch.float32)


def synth_projection(
    rows: int, cols: int, quant: str, group: int, gen: torch.Generator
) -> torch.Tensor:
    """One random projection in its stored form."""
    if quant in ("none", "bf16"):
        return _random_bf16(rows * cols, gen)
    if quant == "int8":
        raw = _random_bytes(int8_bytes(rows, cols), gen)
        raw[-rows * 4 :].view(torch.float32).fill_(0.02 / 74)
        return raw
    raw = _random_bytes(int4_bytes(rows, cols, group), gen)
    n_scales = rows * (cols // group)
    raw[-n_scales * 2 :].view(torch.bfloat16).copy_(_random_bf16(n_scales, gen) * 0.5)
    return raw


def synth(
    geometry: str,
    quant: str,
    out: Path,
    seed: int = 0,
    n_layers: int | None = None,
    progress: Callable[[int], None] | None = None,
    on_start: Callable[[int], None] | None = None,
    dense_quant: str = "none",
) -> int:
    """Writes a random model of ``geometry``; returns the file size. ``dense_quant``
    "int8": the matrices ``flint convert --dense-quant int8`` quantizes are stored as
    int8 with row scales, as it stores them."""
    if geometry not in GEOMETRIES:
        raise ValueError(f"unknown geometry {geometry!r}; known: {', '.join(GEOMETRIES)}")
    if quant not in ("none", "bf16", "int8", "int4"):
        raise ValueError(f"--quant must be none, bf16, int8 or int4, not {quant!r}")
    if dense_quant not in DENSE_QUANTS:
        raise ValueError(
            f"--dense-quant must be one of {', '.join(DENSE_QUANTS)}, not {dense_quant!r}"
        )
    cfg = dict(GEOMETRIES[geometry])
    if n_layers is not None:
        if not 1 <= n_layers <= cfg["num_hidden_layers"]:
            raise ValueError(f"--layers must be in 1..{cfg['num_hidden_layers']} for {geometry}")
        cfg["num_hidden_layers"] = n_layers
    gen = torch.Generator().manual_seed(seed)
    tick = progress or (lambda n: None)
    h, inter, n_exp = cfg["hidden_size"], _expert_width(cfg), _n_experts(cfg)
    shapes = ((inter, h), (inter, h), (h, inter))
    scheme = {"none": "raw", "bf16": "raw", "int8": "int8", "int4": "int4"}[quant]
    group = DEFAULT_INT4_GROUP if quant == "int4" else 0
    dense = dense_shapes(cfg)
    layers = _moe_layers(cfg)
    if on_start:
        per_expert = sum(r * c for r, c in shapes) * 2
        on_start(sum(_numel(s) * 2 for s in dense.values()) + per_expert * n_exp * len(layers))
    dense_int8: list[str] = []
    with FtwFileWriter(out) as w:
        for name, shape in dense.items():
            if len(shape) == 2 and dense_quantized(name, dense_quant):
                q, scale = _random_int8(shape, gen)
                w.add_tensor(name, q)
                w.add_tensor(name + "_scale", scale)
                dense_int8.append(name)
                tick(q.numel() * 2)
                continue
            t = (
                torch.ones(shape, dtype=torch.bfloat16)
                if len(shape) == 1
                else _random_bf16(_numel(shape), gen).view(shape) * _scale(name)
            )
            w.add_tensor(name, t)
            tick(t.numel() * 2)
        dtype = "bf16" if scheme == "raw" else ("i8" if scheme == "int8" else "u8")
        w.begin_experts(int(cfg["num_hidden_layers"]), n_exp, scheme, dtype, group, shapes)
        for layer in layers:
            for e in range(n_exp):
                w.add_expert(
                    layer, e, [synth_projection(r, c, quant, group or 32, gen) for r, c in shapes]
                )
                tick(sum(r * c for r, c in shapes) * 2)
        meta = {
            "format": "ftw",
            "arch": cfg["model_type"],
            "config": cfg,
            "generation_config": {"eos_token_id": cfg["eos_token_id"]},
            "tokenizer": byte_tokenizer_json(),
            "chat_template": None,
            "quant": {
                "experts": {
                    "scheme": scheme,
                    "dtype": dtype,
                    "group_size": group,
                    "source_dtype": "bf16",
                    "moe_layers": layers,
                },
                "dense": {"scheme": dense_quant, "tensors": dense_int8},
            },
            "source": {"synthetic": geometry, "seed": seed},
            "converter": f"flint {__version__}",
        }
        return w.finish(meta)


# A power of two (exact in bf16) on the embedding's [2^-7, 2^-6) random weights, so the
# residual stream carries each token's own embedding against attention, which averages
# over positions: routing then varies token to token (near-uniform over a run, the
# pessimistic case for caches) and drifts from layer to layer. Measured on the demo
# geometry over 64 random tokens: 61-64 of 64 experts used per layer, lookahead recall
# 0.78 / 0.70 at distance 1 / 2 (tiny-code-moe, trained: 0.75 / 0.63); unscaled, routing
# collapsed to 16-28 experts in later layers, scaled x64 lookahead was a trivial 0.99.
_DENSE_SCALES = {"embed_tokens.weight": 2.0**4}


def _scale(name: str) -> float:
    return next((v for k, v in _DENSE_SCALES.items() if name.endswith(k)), 1.0)


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
