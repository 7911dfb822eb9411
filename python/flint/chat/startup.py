"""Starting a chat: load the model behind a spinner, apply --chat-template, and say in
one line what was loaded and planned."""

from __future__ import annotations

import time
from pathlib import Path

import jinja2
from rich.console import Console

from flint.api import LLM
from flint.chat.config import ChatConfig, format_size
from flint.chat_template import compile_template
from flint.tune.profile import resolve_engine

NO_TEMPLATE = (
    "this model has no chat template: your text is continued as it is"
    " (Enter on an empty line continues further; --chat-template FILE to chat)"
)


def read_template(path: Path) -> str:
    """The text of a chat template file; ValueError if unreadable or not valid jinja."""
    try:
        text = path.read_text("utf-8")
    except OSError as err:
        raise ValueError(f"cannot read chat template {path}: {err.strerror}") from err
    try:
        compile_template(text)
    except jinja2.TemplateSyntaxError as err:
        raise ValueError(f"{path}:{err.lineno}: chat template syntax error: {err.message}") from err
    return text


def load(config: ChatConfig, console: Console) -> tuple[LLM, float]:
    """The loaded LLM and the seconds it took; ValueError for a bad model or option."""
    t0 = time.perf_counter()
    with console.status(f"loading {config.model} ...", spinner="dots"):
        ram = None if config.ram_budget is None else config.ram_budget / 2**30
        lookahead, io_workers = resolve_engine(
            Path(config.model), None, None, use_profile=ram is not None, notice=console.print
        )
        llm = LLM(
            config.model,
            device=config.device,
            context_length=config.context_length,
            ram_budget=ram,
            lookahead=lookahead,
            io_workers=io_workers,
            vram_budget=None if config.vram_budget is None else config.vram_budget / 2**30,
        )
    if config.chat_template is not None:
        llm.tokenizer.chat_template = config.chat_template
    return llm, time.perf_counter() - t0


def _budgets(config: ChatConfig) -> str:
    if config.ram_budget is None and config.vram_budget is None:
        return ""
    ram = format_size(config.ram_budget) if config.ram_budget else "none"
    vram = format_size(config.vram_budget) if config.vram_budget else "none"
    streaming = " (streaming experts)" if config.ram_budget else ""
    return f" · budgets RAM {ram}{streaming}, VRAM {vram}"


def plan_line(llm: LLM, config: ChatConfig, seconds: float) -> str:
    """'loaded NAME in 0.6 s · qwen3_moe 8 layers x 64 experts · cpu float32 · ...'"""
    cfg = llm.model.config
    experts = sum(cfg.sparse_layers) * cfg.num_experts
    per_expert = 3 * cfg.moe_intermediate_size * cfg.hidden_size * llm.dtype.itemsize
    dtype = str(llm.dtype).removeprefix("torch.")
    name = Path(config.model).name or config.model
    return (
        f"loaded {name} in {seconds:.1f} s · {cfg.family} {cfg.num_layers} layers x "
        f"{cfg.num_experts} experts · {llm.device.type} {dtype} · ctx {llm.model.context_length}"
        f" · plan: {experts} experts resident ({format_size(experts * per_expert)})"
        + _budgets(config)
    )
