"""``flint chat`` end to end: keys typed into prompt_toolkit's pipe input, replies
checked against ``flint.LLM`` run on the same messages."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tiny import QWEN3_TEMPLATE

import flint
from conftest import TINY_CODE_MOE, Chat

GREEDY = ["-c", "512", "-n", "8", "--temp", "0"]
NO_CACHE = "expert cache n/a (all experts resident)"


def flat(text: str) -> str:
    """Output with line wrapping undone (the console is 80 columns wide)."""
    return " ".join(text.split())


def saved(path: Path) -> list[dict[str, str]]:
    messages: list[dict[str, str]] = json.loads(path.read_text("utf-8"))["messages"]
    return messages


def expected_replies(model: Path, messages: list[dict[str, Any]], **kw: Any) -> list[str]:
    """What the API answers to each user turn of ``messages`` (greedy, 8 tokens)."""
    with flint.LLM(model, device="cpu", context_length=512) as llm:
        if kw.get("template"):
            llm.tokenizer.chat_template = kw["template"]
        return [
            llm.chat(messages[:i], temperature=0.0, max_tokens=8).text
            for i, m in enumerate(messages)
            if m["role"] == "assistant"
        ]


def test_two_turn_conversation(chat: Chat, chat_model: Path, tmp_path: Path) -> None:
    out = tmp_path / "c.json"
    keys = f"Hello!\rWeather in Tokyo?\r/save {out}\r"
    result = chat([str(chat_model), *GREEDY, "--system", "Be brief."], keys)
    assert result.exit_code == 0, result.output
    messages = saved(out)
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user", "assistant"]
    assert messages[1]["content"] == "Hello!" and messages[3]["content"] == "Weather in Tokyo?"
    replies = [m["content"] for m in messages if m["role"] == "assistant"]
    assert replies == expected_replies(chat_model, messages)
    assert flat(result.output).count(NO_CACHE) == 2
    assert f"loaded {chat_model.name}" in flat(result.output) and "ctx 512" in flat(result.output)
    history = tmp_path / "data" / "flint" / "chat_history"
    assert "Weather in Tokyo?" in history.read_text("utf-8")


def test_commands(chat: Chat, chat_model: Path, tmp_path: Path) -> None:
    after_retry, after_clear = tmp_path / "a.json", tmp_path / "b.json"
    keys = (
        "/set temp 0.9\r/set temp 0\r/system Talk like a pirate.\rHi\r/retry\r"
        f"/save {after_retry}\r/stats\r/help\r/set top_k -3\r/clear\r/save {after_clear}\r/exit\r"
    )
    result = chat([str(chat_model), "-c", "512", "-n", "8"], keys)
    assert result.exit_code == 0, result.output
    messages = saved(after_retry)
    assert [m["role"] for m in messages] == ["system", "user", "assistant"]
    assert messages[0]["content"] == "Talk like a pirate."
    assert [messages[2]["content"]] == expected_replies(chat_model, messages)
    assert saved(after_clear) == messages[:1]
    text = flat(result.output)
    assert "temperature = 0.9" in text and "time to first token" in text and "/retry" in text
    assert "top_k must be an integer >= 0, got -3" in text
    assert text.count(NO_CACHE) == 2 and "VRAM expert cache hit rate" in text


def test_save_and_load_round_trip(chat: Chat, chat_model: Path, tmp_path: Path) -> None:
    first, second = tmp_path / "first.json", tmp_path / "second.json"
    chat([str(chat_model), *GREEDY, "--system", "Be brief."], f"Hi\r/save {first}\r")
    keys = f"/load {first}\r//and you?\r/save {second}\r"  # "//" escapes a leading slash
    result = chat([str(chat_model), *GREEDY], keys)
    assert result.exit_code == 0, result.output
    assert "loaded 2 messages" in flat(result.output)
    messages = saved(second)
    assert messages[:3] == saved(first) and len(messages) == 5
    assert messages[3] == {"role": "user", "content": "/and you?"}
    assert [m["content"] for m in messages[2::2]] == expected_replies(chat_model, messages)


def test_base_model_continues_raw_text(chat: Chat, tmp_path: Path) -> None:
    out = tmp_path / "raw.json"
    keys = f"def fibonacci(n):\r\r/retry\r/save {out}\r"  # Enter alone continues further
    result = chat([str(TINY_CODE_MOE), "-n", "6", "--temp", "0"], keys)
    assert result.exit_code == 0, result.output
    assert "this model has no chat template" in flat(result.output)
    messages = saved(out)
    assert [m["role"] for m in messages] == ["user", "assistant", "assistant"]
    with flint.LLM(TINY_CODE_MOE, device="cpu") as llm:
        first = llm.generate("def fibonacci(n):", max_tokens=6, temperature=0.0).text
        second = llm.generate("def fibonacci(n):" + first, max_tokens=6, temperature=0.0).text
    assert [messages[1]["content"], messages[2]["content"]] == [first, second]
    assert flat(first) in flat(result.output)
    assert flat(result.output).count(NO_CACHE) == 3  # /retry redid the last piece


def test_chat_template_file_makes_a_base_model_chat(
    chat: Chat, base_model: Path, chat_model: Path, tmp_path: Path
) -> None:
    out = tmp_path / "t.json"
    args = [str(base_model), *GREEDY, "--chat-template", str(QWEN3_TEMPLATE)]
    result = chat(args, f"Hello!\r/save {out}\r")
    assert result.exit_code == 0, result.output
    assert "no chat template" not in flat(result.output)
    messages = saved(out)
    # same weights and template as chat_model: the same reply
    assert [messages[1]["content"]] == expected_replies(chat_model, messages)


def test_budgets_are_shown_in_the_plan_line(chat: Chat, chat_model: Path, tmp_path: Path) -> None:
    from flint.convert import ConvertOptions, convert

    ftw = tmp_path / "m.ftw"
    convert(str(chat_model), ftw, ConvertOptions())
    result = chat([str(ftw), "--ram-budget", "8G", "--vram-budget", "512M"], "")
    assert result.exit_code == 0, result.output
    line = "budgets RAM 8 GiB (streaming experts), VRAM 512 MiB"
    assert line in flat(result.output)
    result = chat([str(chat_model), "--ram-budget", "1G"], "")
    assert result.exit_code == 2 and "streaming needs a .ftw model file" in flat(result.output)


def test_a_message_longer_than_the_context_is_refused(chat: Chat, chat_model: Path) -> None:
    keys = "word " * 100 + "\rHi\r/stats\r"
    result = chat([str(chat_model), "-c", "64", "-n", "4", "--temp", "0"], keys)
    assert result.exit_code == 0, result.output
    assert "the context holds 64" in flat(result.output)
    assert "prompt tokens" in flat(result.output)  # the next message was answered


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["--temp", "-1"], "temperature must be a finite number >= 0.0"),
        (["--top-p", "2"], "top_p must be"),
        (["--ram-budget", "lots"], "invalid size 'lots'"),
        (["--chat-template", "/nonexistent.jinja"], "cannot read chat template"),
        (["--device", "tpu"], "invalid device 'tpu'"),
    ],
)
def test_bad_options_exit_2(chat: Chat, chat_model: Path, args: list[str], error: str) -> None:
    result = chat([str(chat_model), *args])
    assert result.exit_code == 2 and error in flat(result.output), result.output


def test_bad_model_and_template_exit_2(chat: Chat, chat_model: Path, tmp_path: Path) -> None:
    result = chat([str(tmp_path / "missing")])
    assert result.exit_code == 2 and "does not exist" in flat(result.output)
    bad = tmp_path / "bad.jinja"
    bad.write_text("{% for %}", "utf-8")
    result = chat([str(chat_model), "--chat-template", str(bad)])
    assert result.exit_code == 2 and "bad.jinja:1: chat template syntax error" in flat(
        result.output
    )
