"""The causal mask a prompt chunk's attention gets: a bool tensor on the CPU, torch's
lower-right causal bias on CUDA (the same mask, which lets SDPA pick flash kernels)."""

from __future__ import annotations

import pytest
import torch
from torch.nn.attention.bias import CausalBias

from flint.models.attention import causal_mask


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
