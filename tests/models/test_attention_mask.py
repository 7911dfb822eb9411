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
