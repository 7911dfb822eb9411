"""The flags of ``flint chat``, in one place.

Names follow llama.cpp where it has one (-c/--ctx-size, --temp, --top-p, --top-k,
-s/--seed, -n/--n-predict, --system-prompt, --chat-template-file). The runtime group
(device, context, budgets) is meant to move into the runtime options shared by all
commands.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

RUNTIME = "Runtime"
SAMPLING = "Sampling"
CHAT = "Chat"

ModelArg = Annotated[
    str,
    typer.Argument(metavar="MODEL", help="A .ftw file or a Hugging Face checkpoint directory."),
]
DeviceOpt = Annotated[
    str | None,
    typer.Option(
        "--device",
        help="cpu, cuda (every visible GPU, layers split across them), cuda:N, "
        "or a list such as cuda:0,cuda:1 (default: CUDA if present).",
        rich_help_panel=RUNTIME,
    ),
]
CtxSizeOpt = Annotated[
    int | None,
    typer.Option(
        "-c",
        "--ctx-size",
        min=2,
        help="Context size in tokens (default: the model's maximum, capped at 8192).",
        rich_help_panel=RUNTIME,
    ),
]
RamBudgetOpt = Annotated[
    str | None,
    typer.Option(
        "--ram-budget",
        metavar="SIZE",
        help="RAM for the expert cache, e.g. 2G: experts are streamed from the .ftw file "
        "through a cache of this size instead of all being loaded.",
        rich_help_panel=RUNTIME,
    ),
]
VramBudgetOpt = Annotated[
    str | None,
    typer.Option(
        "--vram-budget",
        metavar="SIZE",
        help="GPU memory for the VRAM expert cache when streaming on CUDA, e.g. 8G "
        "(default: what is free after loading; 0: none; over several GPUs, the total).",
        rich_help_panel=RUNTIME,
    ),
]
TempOpt = Annotated[
    float | None,
    typer.Option(
        "--temp",
        "--temperature",
        help="Temperature; 0 = greedy (default: the model's).",
        rich_help_panel=SAMPLING,
    ),
]
TopPOpt = Annotated[
    float | None,
    typer.Option("--top-p", help="Nucleus sampling; 1 = off.", rich_help_panel=SAMPLING),
]
TopKOpt = Annotated[
    int | None,
    typer.Option(
        "--top-k", help="Keep the K most likely tokens; 0 = off.", rich_help_panel=SAMPLING
    ),
]
SeedOpt = Annotated[
    int | None,
    typer.Option(
        "-s",
        "--seed",
        help="Seed of the session: the same seed and inputs give the same replies.",
        rich_help_panel=SAMPLING,
    ),
]
MaxTokensOpt = Annotated[
    int | None,
    typer.Option(
        "-n",
        "--max-tokens",
        "--n-predict",
        min=1,
        help="Most tokens per reply (default: until the model stops or the context is full).",
        rich_help_panel=SAMPLING,
    ),
]
SystemOpt = Annotated[
    str | None,
    typer.Option("--system", "--system-prompt", help="System prompt.", rich_help_panel=CHAT),
]
HideThinkingOpt = Annotated[
    bool,
    typer.Option(
        "--hide-thinking",
        help="Hide reasoning (<think> blocks); a one-line note says how long it took.",
        rich_help_panel=CHAT,
    ),
]
ChatTemplateOpt = Annotated[
    Path | None,
    typer.Option(
        "--chat-template",
        "--chat-template-file",
        metavar="FILE",
        help="A jinja chat template (as in tokenizer_config.json) to use instead of the "
        "model's; lets a base model chat.",
        rich_help_panel=CHAT,
    ),
]
