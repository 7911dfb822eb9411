"""``flint chat``: an interactive chat in the terminal."""

from __future__ import annotations

import typer
from rich.console import Console
from rich.markup import escape
from rich.text import Text

from flint.chat.app import ChatApp
from flint.chat.config import ChatConfig, Settings, default_history_file, parse_size
from flint.chat.startup import NO_TEMPLATE, load, plan_line, read_template
from flint.cli.chat_options import (
    ChatTemplateOpt,
    CtxSizeOpt,
    DeviceOpt,
    HideThinkingOpt,
    MaxTokensOpt,
    ModelArg,
    RamBudgetOpt,
    SeedOpt,
    SystemOpt,
    TempOpt,
    TopKOpt,
    TopPOpt,
    VramBudgetOpt,
)
from flint.sampling import SamplingParams

HINT = "/help for commands · Esc+Enter for a new line · Ctrl-C stops a reply · Ctrl-D quits"


def _fail(console: Console, message: str) -> typer.Exit:
    console.print(f"[bold red]error:[/] {escape(message)}")
    return typer.Exit(2)


def register(app: typer.Typer, console: Console) -> None:
    @app.command()
    def chat(
        model: ModelArg,
        system: SystemOpt = None,
        ctx_size: CtxSizeOpt = None,
        temp: TempOpt = None,
        top_p: TopPOpt = None,
        top_k: TopKOpt = None,
        seed: SeedOpt = None,
        max_tokens: MaxTokensOpt = None,
        hide_thinking: HideThinkingOpt = False,
        chat_template: ChatTemplateOpt = None,
        device: DeviceOpt = None,
        ram_budget: RamBudgetOpt = None,
        vram_budget: VramBudgetOpt = None,
    ) -> None:
        """Chat with a model in the terminal.

        Replies stream as they are generated and are shown as markdown; reasoning is
        dimmed, then collapsed to one line. Enter sends, Esc+Enter adds a line, Ctrl-C
        stops a reply (the conversation stays), Ctrl-D quits. /help lists the commands
        (/set, /system, /clear, /retry, /save, /load, /stats, /think). Input history is
        kept in the user data directory. A base model without a chat template continues
        your text as it is.
        """
        try:
            settings = Settings(temp, top_p, top_k, max_tokens, seed)
            SamplingParams.build(None, temperature=temp, top_p=top_p, top_k=top_k, seed=seed)
            config = ChatConfig(
                model=model,
                system=system,
                context_length=ctx_size,
                device=device,
                chat_template=read_template(chat_template) if chat_template else None,
                hide_thinking=hide_thinking,
                ram_budget=parse_size(ram_budget) if ram_budget else None,
                vram_budget=parse_size(vram_budget) if vram_budget else None,
                history_file=default_history_file(),
            )
        except ValueError as err:
            raise _fail(console, str(err)) from None
        _run(config, settings, console)


def _run(config: ChatConfig, settings: Settings, console: Console) -> None:
    try:
        llm, seconds = load(config, console)
    except ValueError as err:
        raise _fail(console, str(err)) from None
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    with llm:
        console.print(Text(plan_line(llm, config, seconds), style="dim"))
        if llm.tokenizer.chat_template is None:
            console.print(Text(NO_TEMPLATE, style="yellow"))
        console.print(Text(HINT, style="dim"))
        from flint.chat.input import MessageReader  # prompt_toolkit: only when chatting

        reader = MessageReader(config.history_file)
        app = ChatApp(
            llm,
            console,
            reader.read,
            settings,
            system=config.system,
            hide_thinking=config.hide_thinking,
        )
        app.run()
