"""flint.LLM end to end on a tiny checkpoint: generate, stream, chat, stops, errors."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest

import flint

PROMPT = "def main(argv):\n"


@pytest.fixture(scope="module")
def llm(tiny_models: dict[str, Any]) -> Any:
    path: Path = tiny_models["olmoe"][0]
    with flint.LLM(path, device="cpu", context_length=96) as model:
        yield model


def test_stream_joins_to_generate(llm: flint.LLM) -> None:
    chunks = list(llm.stream(PROMPT, max_tokens=24, temperature=0.0, ignore_eos=True))
    whole = llm.generate(PROMPT, max_tokens=24, temperature=0.0, ignore_eos=True)
    assert "".join(c.text for c in chunks) == whole.text
    assert tuple(i for c in chunks for i in c.token_ids) == whole.token_ids
    assert len(whole.token_ids) == 24 and whole.finish_reason == "length"
    assert [c.finish_reason for c in chunks[:-1]] == [None] * (len(chunks) - 1)
    assert all(a.elapsed_s <= b.elapsed_s for a, b in itertools.pairwise(chunks))
    timings = chunks[-1].timings
    assert timings is not None and timings.generated_tokens == 24
    assert timings.prompt_tokens == len(whole.prompt_token_ids) and timings.decode_tok_s > 0


def test_seed_gives_the_same_text(llm: flint.LLM) -> None:
    def run(seed: int) -> str:
        return llm.generate(PROMPT, max_tokens=16, temperature=1.5, seed=seed, ignore_eos=True).text

    assert run(3) == run(3)
    assert len({run(s) for s in range(4)}) > 1


def test_stop_string_truncates(llm: flint.LLM) -> None:
    full = llm.generate(PROMPT, max_tokens=32, temperature=0.0, ignore_eos=True).text
    stop = full[9:12]
    cut = llm.generate(PROMPT, max_tokens=32, temperature=0.0, ignore_eos=True, stop=[stop])
    assert cut.finish_reason == "stop"
    assert cut.text == full[: full.index(stop)]
    streamed = "".join(
        c.text
        for c in llm.stream(PROMPT, max_tokens=32, temperature=0.0, ignore_eos=True, stop=stop)
    )
    assert streamed == cut.text


def test_eos_stops_generation(llm: flint.LLM) -> None:
    free = llm.generate(PROMPT, max_tokens=24, temperature=0.0, ignore_eos=True)
    eos = free.token_ids[5]
    llm.tokenizer.eos_token_ids = frozenset({eos})
    try:
        stopped = llm.generate(PROMPT, max_tokens=24, temperature=0.0)
    finally:
        llm.tokenizer.eos_token_ids = frozenset({2})
    assert stopped.finish_reason == "stop"
    assert stopped.token_ids == free.token_ids[: free.token_ids.index(eos) + 1]


def test_chat_uses_the_template(llm: flint.LLM) -> None:
    messages = [{"role": "user", "content": "Weather in Tokyo?"}]
    reply = llm.chat(
        messages,
        max_tokens=8,
        temperature=0.0,
        ignore_eos=True,
        template_kwargs={"enable_thinking": False},
    )
    want = llm.tokenizer.encode(
        "<|im_start|>user\nWeather in Tokyo?<|im_end|>\n<|im_start|>assistant\n"
        "<think>\n\n</think>\n\n"
    )
    assert list(reply.prompt_token_ids) == want
    pieces = llm.chat_stream(
        messages,
        max_tokens=8,
        temperature=0.0,
        ignore_eos=True,
        template_kwargs={"enable_thinking": False},
    )
    assert "".join(c.text for c in pieces) == reply.text


def test_context_end_finishes_with_length(tiny_models: dict[str, Any]) -> None:
    with flint.LLM(tiny_models["qwen3_moe"][0], device="cpu", context_length=10) as small:
        out = small.generate([5, 6, 7, 8], max_tokens=50, temperature=0.0, ignore_eos=True)
        assert out.finish_reason == "length" and len(out.token_ids) == 7
        with pytest.raises(ValueError, match="fills the context"):
            small.generate(list(range(10)))


def test_user_errors(llm: flint.LLM, tiny_models: dict[str, Any], tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="token ids"):
        llm.generate([1, 10_000])
    with pytest.raises(ValueError, match="empty"):
        llm.generate("")
    with pytest.raises(ValueError, match="temperature"):
        llm.generate(PROMPT, temperature=-1.0)
    with pytest.raises(ValueError, match="unknown sampling option"):
        llm.generate(PROMPT, max_new_tokens=3)
    with pytest.raises(ValueError, match="does not exist"):
        flint.LLM(tmp_path / "missing")
    with pytest.raises(ValueError, match="dtype"):
        flint.LLM(tiny_models["olmoe"][0], device="cpu", dtype="int8")
    with pytest.raises(ValueError, match="context_length"):
        flint.LLM(tiny_models["olmoe"][0], device="cpu", context_length=0)
    with pytest.raises(ValueError, match="device"):
        flint.LLM(tiny_models["olmoe"][0], device="tpu")


def test_closed_llm_refuses(tiny_models: dict[str, Any]) -> None:
    llm = flint.LLM(tiny_models["mixtral"][0], device="cpu", context_length=16)
    source = flint.SafetensorsSource(tiny_models["mixtral"][0])
    assert isinstance(flint.LLM(source, device="cpu", context_length=16).tokenizer, flint.Tokenizer)
    llm.close()
    with pytest.raises(ValueError, match="closed"):
        llm.generate("x")
