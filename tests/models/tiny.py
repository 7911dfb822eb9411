"""Tiny random transformers MoE models, built on the fly, for reference tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[2]
SHARED = REPO / ".." / "shared"
QWEN3_TEMPLATE = SHARED / "templates" / "qwen3.jinja"

SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
)
VOCAB = 320  # model vocabulary; the tokenizer uses the first ~300 ids
_CORPUS = [
    "def main(argv):\n    return sorted(set(argv))\n",
    "The weather in Tokyo is 21 degrees. Weather in Paris? Sunny and warm.",
    "import os\nimport sys\nprint(os.path.join('a', 'b'))\n",
    '{"name": "get_weather", "arguments": {"city": "Tokyo"}}',
    "You are a helpful assistant. Hello! How can I help you today?",
]

FAMILY_NAMES = (
    "qwen3_moe",
    "qwen2_moe",
    "mixtral",
    "olmoe",
    "deepseek_v3",
    "glm4_moe",
    "gpt_oss",
)
# Seeds whose random models do not fall into repeating one token under greedy decoding.
SEEDS = {
    "qwen3_moe": 3,
    "qwen2_moe": 1,
    "mixtral": 2,
    "olmoe": 3,
    "deepseek_v3": 0,
    "glm4_moe": 0,
    "gpt_oss": 0,
}

_COMMON: dict[str, Any] = {
    "vocab_size": VOCAB,
    "hidden_size": 32,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 128,
    "num_experts_per_tok": 2,
    "bos_token_id": 0,
    "eos_token_id": 2,  # <|im_end|>
    "pad_token_id": 0,
}


def hf_config(family: str) -> Any:
    """A tiny transformers config exercising what is special about ``family``."""
    import transformers as tf

    if family == "qwen3_moe":
        return tf.Qwen3MoeConfig(
            **_COMMON,
            head_dim=16,
            intermediate_size=48,
            moe_intermediate_size=16,
            num_experts=6,
            mlp_only_layers=[0],
            norm_topk_prob=True,
            attention_bias=True,
            rope_parameters={
                "rope_type": "yarn",
                "rope_theta": 10000.0,
                "factor": 2.0,
                "original_max_position_embeddings": 64,
            },
        )
    if family == "qwen2_moe":
        return tf.Qwen2MoeConfig(
            **_COMMON,
            intermediate_size=40,
            moe_intermediate_size=16,
            num_experts=6,
            shared_expert_intermediate_size=24,
            decoder_sparse_step=2,
            norm_topk_prob=False,
        )
    if family == "mixtral":
        return tf.MixtralConfig(
            **_COMMON,
            intermediate_size=24,
            num_local_experts=4,
            tie_word_embeddings=True,
            rope_parameters={"rope_type": "linear", "rope_theta": 5000.0, "factor": 2.0},
        )
    if family == "olmoe":
        return tf.OlmoeConfig(
            **_COMMON,
            intermediate_size=16,
            num_experts=6,
            clip_qkv=3.0,
            norm_topk_prob=False,
        )
    if family == "deepseek_v3":
        return deepseek_v3_config()
    if family == "glm4_moe":
        return glm4_moe_config()
    if family == "gpt_oss":
        return gpt_oss_config()
    raise ValueError(family)


def glm4_moe_config(**overrides: Any) -> Any:
    """A tiny GLM-4.5: partial rotary (a quarter of each head), q/k norm, q/k/v bias,
    4 groups of 2 experts with the best 2 eligible, one dense layer, a shared expert."""
    import transformers as tf

    fields: dict[str, Any] = {
        **_COMMON,
        "head_dim": 16,
        "intermediate_size": 48,
        "moe_intermediate_size": 16,
        "n_routed_experts": 8,
        "n_shared_experts": 1,
        "n_group": 4,
        "topk_group": 2,
        "routed_scaling_factor": 1.5,
        "first_k_dense_replace": 1,
        "use_qk_norm": True,
        "attention_bias": True,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10000.0,
            "partial_rotary_factor": 0.25,
        },
    }
    fields.update(overrides)
    return tf.Glm4MoeConfig(**fields)


def deepseek_v3_config(**overrides: Any) -> Any:
    """A tiny DeepSeek-V3: low-rank queries, 4 groups of 2 experts with the best 2 groups
    eligible, one dense layer, a shared expert, interleaved rope with yarn and mscale
    (``overrides`` replace any of these)."""
    import transformers as tf

    fields: dict[str, Any] = {
        **_COMMON,
        "num_key_value_heads": 4,
        "intermediate_size": 48,
        "moe_intermediate_size": 16,
        "n_routed_experts": 8,
        "n_shared_experts": 1,
        "n_group": 4,
        "topk_group": 2,
        "first_k_dense_replace": 1,
        "q_lora_rank": 24,
        "kv_lora_rank": 16,
        "qk_nope_head_dim": 8,
        "qk_rope_head_dim": 8,
        "v_head_dim": 12,
        "routed_scaling_factor": 2.5,
        "rope_interleave": True,
        "rope_parameters": {
            "rope_type": "yarn",
            "rope_theta": 10000.0,
            "factor": 2.0,
            "original_max_position_embeddings": 64,
            "mscale": 1.0,
            "mscale_all_dim": 0.8,
        },
    }
    fields.update(overrides)
    return tf.DeepseekV3Config(**fields)


def gpt_oss_config(**overrides: Any) -> Any:
    """GPT-OSS: sliding (window 4) and full layers, YaRN without truncation, a swiglu
    limit low enough that the tiny model's activations are clamped."""
    import transformers as tf

    kw: dict[str, Any] = {
        **_COMMON,
        "head_dim": 8,
        "intermediate_size": 16,
        "num_local_experts": 6,
        "sliding_window": 4,
        "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
        "swiglu_limit": 1.5,
        "rope_parameters": {
            "rope_type": "yarn",
            "rope_theta": 150000.0,
            "factor": 4.0,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "truncate": False,
            "original_max_position_embeddings": 32,
        },
    }
    kw.update(overrides)
    return tf.GptOssConfig(**kw)


def qwen3_next_config(**overrides: Any) -> Any:
    """A tiny Qwen3-Next: linear attention, full (gated) attention, linear, full; 2 key
    heads of 8 dims serving 4 value heads of 12; a quarter of each attention head
    rotates; the first layer's MLP dense, the others MoE with a gated shared expert."""
    import transformers as tf

    kw: dict[str, Any] = {
        **_COMMON,
        "num_hidden_layers": 4,
        "head_dim": 16,
        "intermediate_size": 40,
        "moe_intermediate_size": 16,
        "shared_expert_intermediate_size": 24,
        "num_experts": 6,
        "mlp_only_layers": [0],
        "norm_topk_prob": True,
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 4,
        "linear_key_head_dim": 8,
        "linear_value_head_dim": 12,
        "linear_conv_kernel_dim": 4,
        "full_attention_interval": 2,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10000.0,
            "partial_rotary_factor": 0.25,
        },
    }
    kw.update(overrides)
    return tf.Qwen3NextConfig(**kw)


# routers far from near-ties; GPT-OSS's sinks large enough to matter
_ROUTERS_AND_SINKS = (
    "mlp.gate.weight",
    "block_sparse_moe.gate.weight",
    "mlp.router.weight",
    "self_attn.sinks",
)


def build(family: str, path: Path, seed: int = 0, config: Any = None) -> Any:
    """Builds, re-initialises (large router weights: no near-ties) and saves a model
    (``config``: a transformers config to use instead of the family's tiny one)."""
    import transformers as tf

    torch.manual_seed(seed)
    config = config if config is not None else hf_config(family)
    model = tf.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    zero_centred = config.model_type == "qwen3_next"
    with torch.no_grad():
        for name, buf in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buf.uniform_(-0.3, 0.3)  # large enough to change which experts win
        for name, param in model.named_parameters():
            if name.endswith(_ROUTERS_AND_SINKS):
                param.normal_(0.0, 1.0)
            elif name.endswith("A_log"):  # Qwen3-Next: decays from slow to fast
                param.uniform_(-4.0, 0.5)
            elif name.endswith("norm.weight") and zero_centred and "linear_attn" not in name:
                param.uniform_(-0.5, 0.5)  # Qwen3-Next scales by 1 + weight
            elif name.endswith("norm.weight"):
                param.uniform_(0.5, 1.5)
            elif name.endswith("bias"):
                param.normal_(0.0, 0.1)
            else:
                param.normal_(0.0, 0.3)
    model.eval()
    model.save_pretrained(path)
    return model


def tokenizer_json() -> str:
    """A byte-level BPE tokenizer trained on a few lines, with Qwen's special tokens.

    Its vocabulary is tiny, so most multi-byte characters span several tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS, trainer=trainer)
    return str(tok.to_str())


def save_tokenizer(path: Path, tok_json: str) -> None:
    """tokenizer.json + tokenizer_config.json carrying the Qwen3 chat template."""
    (path / "tokenizer.json").write_text(tok_json, "utf-8")
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "chat_template": QWEN3_TEMPLATE.resolve().read_text("utf-8"),
    }
    (path / "tokenizer_config.json").write_text(json.dumps(config), "utf-8")


def save_wide_qwen3(path: Path, tok_json: str, vocab_size: int, positions: int, seed: int) -> Path:
    """A tiny random Qwen3-MoE whose experts fit torch's int4 kernels (K % 32 == 0,
    N % 16 == 0), its routers far from near-ties, saved with the tiny tokenizer as a
    checkpoint in ``path`` (returned)."""
    import transformers as tf

    torch.manual_seed(seed)
    config = tf.Qwen3MoeConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        head_dim=16,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        moe_intermediate_size=32,
        num_experts=8,
        num_experts_per_tok=2,
        max_position_embeddings=positions,
        eos_token_id=2,
    )
    model = tf.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("mlp.gate.weight"):
                param.normal_(0.0, 1.0)  # routers far from near-ties
    model.save_pretrained(path)
    save_tokenizer(path, tok_json)
    return path


def greedy_decode(model: Any, prompt: list[int], steps: int) -> tuple[list[int], torch.Tensor]:
    """Greedy tokens and their logits [steps, V] (fp32, CPU) after an eager prefill of
    ``prompt`` (``model``: a ``flint.models.transformer.MoEModel``)."""
    model.reset()
    logits = model.forward(torch.tensor(prompt))[-1]
    tokens, rows = [], []
    for _ in range(steps):
        token = int(logits.argmax())
        tokens.append(token)
        logits = model.forward(torch.tensor([token]))[-1]
        rows.append(logits.float().cpu())
    return tokens, torch.stack(rows)


def assert_follows(
    got_tokens: list[int],
    got: torch.Tensor,
    want_tokens: list[int],
    want: torch.Tensor,
    min_same: int = 0,
) -> None:
    """bf16 decode (``greedy_decode``'s tokens and logits) through other kernels than
    the reference's, each rounding where torch rounds: on a random tiny model a changed
    summation order can flip an exact tie, or a router's near-tie (another expert, so a
    row far off). The same tokens up to a tie within 3% of the logits' scale (not before
    ``min_same``), compared up to it: three rows in four within 3% (a flipped expert
    may put a row anywhere)."""
    scale = want.abs().max().item()
    tol = 0.03 * scale
    steps = len(want_tokens)
    pairs = zip(got_tokens, want_tokens, strict=True)
    same = next((i for i, (a, b) in enumerate(pairs) if a != b), steps)
    if same < steps:
        assert same > 0 and same >= min_same, (got_tokens, want_tokens)
        top2 = want[same - 1].topk(2).values
        assert (top2[0] - top2[1]).item() <= tol, (got_tokens, want_tokens)
    rows = (got[:same] - want[:same]).abs().amax(dim=1)
    assert (rows <= tol).float().mean().item() >= 0.75, rows
