"""RMSNorm as each family's transformers class computes it, bit for bit in bf16."""

from __future__ import annotations

import torch
from transformers.models.gpt_oss.modeling_gpt_oss import GptOssRMSNorm
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeRMSNorm

from flint.models.norm import rms_norm


def _weights(hidden: int) -> torch.Tensor:
    return 1 + 0.3 * torch.randn(hidden, generator=torch.Generator().manual_seed(1))


def test_weight_after_the_cast_like_qwen3_moe() -> None:
    x = 5 * torch.randn(7, 96, generator=torch.Generator().manual_seed(0)).bfloat16()
    ref = Qwen3MoeRMSNorm(96, eps=1e-6)
    ref.weight.data = _weights(96).bfloat16()
    with torch.no_grad():
        want = ref(x)
    assert torch.equal(rms_norm(x, ref.weight.data, 1e-6), want)


def test_weight_in_fp32_before_the_cast_like_gpt_oss() -> None:
    x = 5 * torch.randn(7, 96, generator=torch.Generator().manual_seed(0)).bfloat16()
    ref = GptOssRMSNorm(96, eps=1e-5)  # transformers keeps this weight in fp32
    ref.weight.data = _weights(96).bfloat16().float()
    with torch.no_grad():
        want = ref(x)
    w = ref.weight.data.bfloat16()  # as flint loads it, in the model's dtype
    got = rms_norm(x, w, 1e-5, weight_in_fp32=True)
    assert got.dtype == torch.bfloat16 and torch.equal(got, want)
    assert not torch.equal(rms_norm(x, w, 1e-5), want), "the order matters in bf16"


def test_gpt_oss_configs_multiply_in_fp32() -> None:
    from tiny import gpt_oss_config

    from flint.models import parse_config

    assert parse_config(gpt_oss_config().to_dict()).norm_weight_fp32
