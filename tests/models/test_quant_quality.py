"""How much int8 and int4 experts change tiny-code-moe on held-out Python (issue 6
targets: int8 mean KL <= 0.002 and >= 98% same top-1; int4 <= 0.05 and >= 90%).

The text is the start of ``logging/handlers.py`` from the standard library, a file the
model's training held out. Measured values are in docs/benchmarks.md (``flint eval``).
"""

from __future__ import annotations

import inspect
import logging.handlers

import pytest
from tiny import SHARED

import flint
from flint.convert import ConvertOptions, convert
from flint.evaluate import EvalResult, evaluate

MODEL = SHARED / "models" / "tiny-code-moe"
TOKENS = 1000
WINDOW = 512  # the model was trained on 512-token windows
TARGETS = {"int8": (0.002, 0.98), "int4": (0.05, 0.90)}  # (max mean KL, min top-1)


@pytest.fixture(scope="module")
def scores(tmp_path_factory: pytest.TempPathFactory) -> dict[str, EvalResult]:
    root = tmp_path_factory.mktemp("tiny-code-moe")
    files = {}
    for quant in ("none", "int8", "int4"):
        files[quant] = root / f"{quant}.ftw"
        convert(str(MODEL.resolve()), files[quant], ConvertOptions(quant=quant))
    text = inspect.getsource(logging.handlers)
    with flint.LLM(files["none"], device="cpu", context_length=WINDOW) as ref:
        ids = ref.tokenizer.encode(text)[:TOKENS]
        out = {}
        for quant in ("int8", "int4"):
            with flint.LLM(files[quant], device="cpu", context_length=WINDOW) as llm:
                out[quant] = evaluate(llm.model, ids, WINDOW, ref.model)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("quant", ["int8", "int4"])
def test_quantized_experts_stay_close_to_bf16(quant: str, scores: dict[str, EvalResult]) -> None:
    r = scores[quant]
    max_kl, min_top1 = TARGETS[quant]
    print(
        f"{quant}: mean KL {r.kl:.5f}, top-1 {r.top1:.4f}, ppl {r.perplexity:.4f} "
        f"(bf16 {r.ref_perplexity:.4f}) over {r.tokens} tokens"
    )
    assert r.tokens == TOKENS - 2  # two windows, each scores all but its first token
    assert r.kl is not None and r.top1 is not None and r.ref_perplexity is not None
    assert 0 < r.kl <= max_kl and r.top1 >= min_top1
    assert r.ref_perplexity < 10  # the bf16 model does predict this Python
    assert abs(r.perplexity / r.ref_perplexity - 1) < 10 * max_kl
