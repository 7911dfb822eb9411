"""``flint serve``: the OpenAI-compatible server (flint.server) over one model."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Annotated, Any

import typer

from flint.cli.model_file import _fail

_HELP = (
    "Serve MODEL over an OpenAI-compatible HTTP API.\n\n"
    "Endpoints: GET /health, GET /v1/models, GET /metrics, POST /v1/chat/completions, "
    "POST /v1/completions and llama.cpp's POST /completion (see docs/server.md).\n\n"
    "The port opens at once; /health answers 503 until the model is loaded. One request "
    "generates at a time; up to --queue more wait, further ones get 429 with Retry-After."
)


def _load_template(path: Path | None) -> str | None:
    if path is None:
        return None
    from flint.chat_template import compile_template

    try:
        text = path.read_text("utf-8")
        compile_template(text)
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"cannot read chat template {path}: {err}") from None
    except Exception as err:  # jinja2 syntax errors
        raise ValueError(f"chat template {path} does not compile: {err}") from None
    return text


class _Loader:
    """Loads the model in a thread while the server already answers /health."""

    def __init__(self, model: str, template: str | None, options: dict[str, Any]) -> None:
        self.model, self.template, self.options = model, template, options
        self.error: BaseException | None = None

    def start(self, state: Any, server: Any) -> None:
        threading.Thread(target=self._run, args=(state, server), daemon=True).start()

    def _run(self, state: Any, server: Any) -> None:
        import flint
        from flint.server import LLMBackend

        try:
            llm = flint.LLM(self.model, **self.options)
            state.attach(LLMBackend(llm, chat_template=self.template))
            typer.echo(f"flint serve: ready, context {llm.model.context_length} tokens")
        except Exception as err:  # reported by the command once the server stops
            self.error = err
            server.should_exit = True


def serve_command(
    model: Annotated[str, typer.Argument(help="Model: a .ftw file or an HF checkpoint directory.")],
    host: Annotated[str, typer.Option(help="Address to listen on (loopback by default).")] = (
        "127.0.0.1"
    ),
    port: Annotated[int, typer.Option(help="TCP port.", min=1, max=65535)] = 8080,
    api_key: Annotated[
        str | None,
        typer.Option(
            envvar="FLINT_API_KEY",
            help="Require 'Authorization: Bearer KEY' on all endpoints but /health and /v1/models.",
        ),
    ] = None,
    alias: Annotated[
        str | None, typer.Option(help="Model id shown to clients (default: MODEL's name).")
    ] = None,
    ctx_size: Annotated[
        int | None, typer.Option("-c", "--ctx-size", help="Context length in tokens.", min=2)
    ] = None,
    chat_template: Annotated[
        Path | None,
        typer.Option(help="Jinja chat template file, for models without one (or to override)."),
    ] = None,
    device: Annotated[
        str | None,
        typer.Option(
            help="cpu, cuda (every visible GPU, layers split across them), cuda:N, "
            "or a list such as cuda:0,cuda:1 (default: CUDA if present)."
        ),
    ] = None,
    dtype: Annotated[str | None, typer.Option(help="float32, bfloat16 or float16.")] = None,
    ram_budget: Annotated[
        float | None,
        typer.Option(
            help="GiB of RAM for the expert cache: stream routed experts from the .ftw file "
            "instead of loading them all.",
            min=0,
        ),
    ] = None,
    vram_budget: Annotated[
        float | None,
        typer.Option(
            help="GiB of GPU memory for the VRAM expert cache when streaming on CUDA "
            "(default: what is free after loading; 0: none; over several GPUs, the total).",
            min=0,
        ),
    ] = None,
    queue: Annotated[int, typer.Option(help="Requests that may wait; more get 429.", min=1)] = 8,
    max_body_mb: Annotated[float, typer.Option(help="Request body cap in MiB.")] = 4.0,
    tool_parser: Annotated[
        str,
        typer.Option(
            help="Tool-call syntax: auto (from the template), qwen, glm4, deepseek, kimi, none."
        ),
    ] = "auto",
) -> None:
    import uvicorn

    from flint.cli import console
    from flint.server import ServerConfig, create_app
    from flint.tune.profile import resolve_engine

    try:
        if not Path(model).exists():
            raise ValueError(f"{model} does not exist")
        template = _load_template(chat_template)
        name = alias or Path(model).name.removesuffix(".ftw")
        config = ServerConfig(name, api_key, queue, int(max_body_mb * (1 << 20)), tool_parser)
    except ValueError as err:
        raise _fail(console, str(err)) from None
    app = create_app(config)
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="info"))
    lookahead, io_workers = resolve_engine(
        Path(model), None, None, use_profile=ram_budget is not None, notice=console.print
    )
    options: dict[str, Any] = {"device": device, "dtype": dtype, "context_length": ctx_size}
    options |= {"ram_budget": ram_budget, "lookahead": lookahead, "io_workers": io_workers}
    options |= {"vram_budget": vram_budget}
    loader = _Loader(model, template, options)
    console.print(f"flint serve: http://{host}:{port}/v1 (model '{name}'), loading {model}")
    loader.start(app.state.flint, server)
    server.run()
    if loader.error is not None:
        code = 2 if isinstance(loader.error, ValueError) else 1
        raise _fail(console, f"cannot load {model}: {loader.error}", code)


serve_command.__doc__ = _HELP
