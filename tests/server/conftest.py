"""Fixtures: a tiny random Qwen3-MoE checkpoint (Qwen3 tokenizer + template) served
live on loopback, and a scripted backend for outputs a random model never writes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

import flint
from flint.server import LLMBackend, ServerConfig, create_app
from flint.tokenizer import Tokenizer
from tests.models.tiny import QWEN3_TEMPLATE, SEEDS, build, save_tokenizer, tokenizer_json
from tests.server.live import LiveServer
from tests.server.scripted import ScriptedBackend

FAMILY = "qwen3_moe"


@pytest.fixture(scope="session")
def tok_json() -> str:
    return tokenizer_json()


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory, tok_json: str) -> Path:
    path = tmp_path_factory.mktemp("serve-tiny")
    build(FAMILY, path, seed=SEEDS[FAMILY])
    save_tokenizer(path, tok_json)
    return path


@pytest.fixture(scope="session")
def llm(tiny_dir: Path) -> Iterator[flint.LLM]:
    with flint.LLM(tiny_dir, device="cpu") as model:
        yield model


@pytest.fixture(scope="module")
def live(llm: flint.LLM) -> Iterator[LiveServer]:
    app = create_app(ServerConfig("tiny", max_waiting=16), LLMBackend(llm))
    with LiveServer(app) as server:
        yield server


def sdk(server: LiveServer, key: str = "unused") -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0, timeout=30)


@pytest.fixture(scope="module")
def client(live: LiveServer) -> Iterator[openai.OpenAI]:
    with sdk(live) as c:
        yield c


TEMPLATE = QWEN3_TEMPLATE.read_text("utf-8")


@pytest.fixture(scope="module")
def scripted_backend(tok_json: str) -> ScriptedBackend:
    return ScriptedBackend(Tokenizer(tok_json, chat_template=TEMPLATE), context_length=4096)


@pytest.fixture
def backend(scripted_backend: ScriptedBackend) -> ScriptedBackend:
    """The scripted backend, reset for each test."""
    b = scripted_backend
    b.script, b.delay_s, b.prompts, b.stats = ["Hello", " world", "!"], 0.0, [], None
    b.chat_template = TEMPLATE
    return b


@pytest.fixture(scope="module")
def scripted(scripted_backend: ScriptedBackend) -> Iterator[LiveServer]:
    app = create_app(ServerConfig("scripted", max_waiting=2), scripted_backend)
    with LiveServer(app) as server:
        yield server


@pytest.fixture(scope="module")
def sclient(scripted: LiveServer) -> Iterator[openai.OpenAI]:
    with sdk(scripted) as c:
        yield c
