"""The trained tiny-code-moe (Qwen3-MoE, bf16 weights) against transformers, in fp32."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from tiny import SHARED

import flint

MODEL = SHARED / "models" / "tiny-code-moe"
PROMPTS = [
    "def fibonacci(n):\n",
    'import os\n\n\ndef read_config(path):\n    """Read a config file."""\n',
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, x):\n",
]
TEXT = (
    "import json\nfrom pathlib import Path\n\n\ndef load(path):\n"
    '    """Load a JSON file and return its content."""\n'
    "    with open(path, encoding='utf-8') as f:\n        return json.load(f)\n\n\n"
    "def save(path, data):\n    Path(path).write_text(json.dumps(data, indent=2))\n"
)


@pytest.fixture(scope="module")
def models() -> tuple[flint.LLM, Any]:
    import transformers as tf

    ref = tf.AutoModelForCausalLM.from_pretrained(MODEL.resolve(), dtype=torch.float32).eval()
    return flint.LLM(MODEL.resolve(), device="cpu", context_length=512), ref


@pytest.mark.slow
def test_logits_and_perplexity_match_transformers(models: tuple[flint.LLM, Any]) -> None:
    llm, ref = models
    for text in [*PROMPTS, TEXT]:
        ids = llm.tokenizer.encode(text)
        with torch.no_grad():
            want = ref(torch.tensor([ids])).logits[0]
        llm.model.reset()
        got = llm.model.forward(torch.tensor(ids), all_logits=True)
        assert (got - want).abs().max().item() <= 1e-4
    target = torch.tensor(ids[1:])
    nll_ours = F.cross_entropy(got[:-1], target).item()
    nll_ref = F.cross_entropy(want[:-1], target).item()
    assert abs(nll_ours - nll_ref) / nll_ref <= 1e-3
    assert nll_ours < 3.0  # the trained model actually predicts Python


@pytest.mark.slow
@pytest.mark.parametrize("prompt", PROMPTS[:2])
def test_greedy_32_tokens_match_transformers(models: tuple[flint.LLM, Any], prompt: str) -> None:
    llm, ref = models
    ids = llm.tokenizer.encode(prompt)
    with torch.no_grad():
        out = ref.generate(torch.tensor([ids]), max_new_tokens=32, do_sample=False)
    want = out[0, len(ids) :].tolist()
    got = llm.generate(prompt, max_tokens=32, temperature=0.0)
    assert list(got.token_ids) == want
    assert got.text == llm.tokenizer.decode(want)
