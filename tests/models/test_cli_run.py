"""``flint run``: streamed text, --json, --chat, seeds, and one-line errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import flint
from flint.cli import app
from flint.convert import ConvertOptions, convert

runner = CliRunner()
PROMPT = "def main(argv):\n"
GREEDY = ["--temp", "0", "--ignore-eos", "--device", "cpu", "--ctx", "64"]


def _run(*args: str | Path) -> Any:
    return runner.invoke(app, ["run", *map(str, args)])


@pytest.fixture(scope="module")
def qwen3(tiny_ftw: dict[str, Path]) -> Path:
    return tiny_ftw["qwen3_moe"]


def test_streams_the_completion_and_reports_timings(qwen3: Path) -> None:
    with flint.LLM(qwen3, device="cpu", context_length=64) as llm:
        want = llm.generate(PROMPT, max_tokens=12, temperature=0.0, ignore_eos=True)
    result = _run(qwen3, "-p", PROMPT, "-n", "12", *GREEDY)
    assert result.exit_code == 0, result.output
    assert result.stdout == want.text + "\n"
    assert "generated 12 tok" in result.stderr and "finish: length" in result.stderr


def test_json_has_text_ids_timings_and_stats(qwen3: Path) -> None:
    result = _run(qwen3, "-p", PROMPT, "-n", "10", "--json", "--threads", "1", *GREEDY)
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert set(out) == {"text", "token_ids", "timings", "stats"}
    assert len(out["token_ids"]) == 10 and out["timings"]["generated_tokens"] == 10
    with flint.LLM(qwen3, device="cpu", context_length=64) as llm:
        assert out["text"] == llm.tokenizer.decode(out["token_ids"])
        assert out["timings"]["prompt_tokens"] == len(llm.tokenizer.encode(PROMPT))
    stats = out["stats"]
    assert stats["finish_reason"] == "length" and stats["device"] == "cpu"
    assert stats["threads"] == 1 and stats["context_length"] == 64
    assert stats["experts"] == "raw (f32)"
    # the CPU default (--expert-kernels auto): the fused kernels and the Rust decode step
    assert stats["expert_kernel"].startswith("flint fused CPU kernels")
    assert stats["decode"] == "Rust CPU decode step"


def test_chat_renders_one_user_message(qwen3: Path) -> None:
    result = _run(qwen3, "-p", "Weather in Tokyo?", "-n", "6", "--chat", "--json", *GREEDY)
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    with flint.LLM(qwen3, device="cpu", context_length=64) as llm:
        messages = [{"role": "user", "content": "Weather in Tokyo?"}]
        want = llm.chat(messages, max_tokens=6, temperature=0.0, ignore_eos=True)
        assert out["timings"]["prompt_tokens"] == len(llm.tokenizer.encode_chat(messages))
    assert out["token_ids"] == list(want.token_ids) and out["text"] == want.text
    raw = json.loads(_run(qwen3, "-p", "Weather in Tokyo?", "-n", "6", "--json", *GREEDY).stdout)
    assert raw["timings"]["prompt_tokens"] < out["timings"]["prompt_tokens"]


def test_same_seed_same_text(qwen3: Path) -> None:
    args = (qwen3, "-p", PROMPT, "-n", "16", "--temp", "1.5", "--ignore-eos", "--json")
    texts = [json.loads(_run(*args, "--seed", str(s)).stdout)["text"] for s in (7, 7, 8)]
    assert texts[0] == texts[1] != texts[2]


@pytest.fixture(scope="module")
def no_template(tiny_models: dict[str, tuple[Path, Any]], tmp_path_factory: Any) -> Path:
    root: Path = tmp_path_factory.mktemp("plain")
    shutil.copytree(tiny_models["olmoe"][0], root / "ckpt")
    (root / "ckpt" / "tokenizer_config.json").write_text('{"eos_token": "<|im_end|>"}')
    convert(str(root / "ckpt"), root / "plain.ftw", ConvertOptions())
    return root / "plain.ftw"


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (("MISSING", "-p", "x"), 2, "does not exist"),
        (("QWEN3", "-p", "x", "--temp", "-1"), 2, "temperature"),
        (("QWEN3", "-p", "", "--device", "cpu"), 2, "empty"),
        (("QWEN3", "-p", "x", "--threads", "0"), 2, "--threads"),
        (("QWEN3", "-p", "x", "--device", "tpu"), 2, "device"),
        (("QWEN3", "-p", "x", "--expert-kernels", "fast"), 2, "--expert-kernels"),
        (("PLAIN", "-p", "x", "--chat"), 2, "no chat template"),
        (("JUNK", "-p", "x"), 1, "junk.ftw"),
    ],
)
def test_errors_are_one_line(
    args: tuple[str, ...], code: int, message: str, qwen3: Path, no_template: Path, tmp_path: Path
) -> None:
    junk = tmp_path / "junk.ftw"
    junk.write_bytes(b"\0" * 8192)
    paths = {"QWEN3": qwen3, "PLAIN": no_template, "JUNK": junk, "MISSING": tmp_path / "nope"}
    result = _run(*(paths.get(a, a) for a in args))
    assert result.exit_code == code
    assert result.stderr.startswith("error:") and message in result.stderr
    assert "Traceback" not in result.output and result.stdout == ""
