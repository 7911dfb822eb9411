"""The runtime settings every model-running command shares (run, eval; later chat,
serve, bench): one set of typer options, parsed into one ``RuntimeOptions``.

A command opts in with ``@runtime_options`` and a ``runtime: RuntimeOptions``
parameter; the decorator adds the options below to the command's signature, so each
is declared, validated and documented once.
"""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, TypeVar

import torch
import typer

from flint.api import LLM
from flint.cli.errors import USER_ERRORS, fail_from
from flint.graphs import GRAPH_MODES
from flint.models.quant_linear import KERNEL_MODES
from flint.stream.qsplit import HOST_SPLITS
from flint.tune.profile import resolve_engine

F = TypeVar("F", bound=Callable[..., Any])
PANEL = "Runtime"


@dataclass(slots=True, frozen=True)
class RuntimeOptions:
    """Where and how a model runs. None means "choose from the machine"."""

    device: str | None = None
    dtype: str | None = None
    threads: int | None = None
    context_length: int | None = None
    expert_kernels: str = "auto"
    stream: bool | None = None
    ram_budget: float | None = None
    lookahead: int | None = None  # None: the tuned profile's, else 2
    io_workers: int | None = None  # None: the tuned profile's, else 8
    profile: bool = True
    vram_budget: float | None = None
    deterministic: bool = False
    host_split: str = "auto"
    graphs: str = "auto"

    def validate(self) -> None:
        if self.ram_budget is not None and not self.ram_budget >= 0:
            raise ValueError(f"--ram-budget must be >= 0 GiB, got {self.ram_budget}")
        if self.vram_budget is not None and not self.vram_budget >= 0:
            raise ValueError(f"--vram-budget must be >= 0 GiB, got {self.vram_budget}")
        if self.lookahead is not None and not 0 <= self.lookahead <= 3:
            raise ValueError(f"--lookahead must be 0..3, got {self.lookahead}")
        if self.io_workers is not None and not 1 <= self.io_workers <= 256:
            raise ValueError(f"--io-workers must be 1..256, got {self.io_workers}")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"--threads must be >= 1, got {self.threads}")
        if self.context_length is not None and self.context_length < 2:
            raise ValueError(f"--ctx must be >= 2, got {self.context_length}")
        if self.expert_kernels not in KERNEL_MODES:
            raise ValueError(f"--expert-kernels must be one of {', '.join(KERNEL_MODES)}")
        if self.host_split not in HOST_SPLITS:
            raise ValueError(f"--host-split must be one of {', '.join(HOST_SPLITS)}")
        if self.graphs not in GRAPH_MODES:
            raise ValueError(f"--graphs must be one of {', '.join(GRAPH_MODES)}")

    def load(self, model: Path) -> LLM:
        """Applies the process-wide settings (threads) and loads ``model``; a streamed
        model takes lookahead and I/O workers not given from this machine's tuned
        profile (one line on stderr says so)."""
        self.validate()
        if self.threads is not None:
            torch.set_num_threads(self.threads)
        streams = self.stream or (self.stream is None and self.ram_budget is not None)
        lookahead, io_workers = resolve_engine(
            model,
            self.lookahead,
            self.io_workers,
            use_profile=bool(streams) and self.profile,
            notice=lambda line: print(line, file=sys.stderr),
        )
        return LLM(
            model,
            device=self.device,
            dtype=self.dtype,
            context_length=self.context_length,
            expert_kernels=self.expert_kernels,
            stream=self.stream,
            ram_budget=self.ram_budget,
            lookahead=lookahead,
            io_workers=io_workers,
            vram_budget=self.vram_budget,
            deterministic=self.deterministic,
            host_split=self.host_split,
            graphs=self.graphs,
        )


def load_or_fail(runtime: RuntimeOptions, model: Path) -> LLM:
    """``runtime.load(model)``, or a one-line error and exit (1 for a bad file, else 2)."""
    try:
        return runtime.load(model)
    except USER_ERRORS as err:
        raise fail_from(err, model) from None


def _auto(value: str) -> str | None:
    return None if value == "auto" else value


_OPTIONS: dict[str, tuple[Any, Any]] = {  # parameter -> (annotation, default)
    "device": (
        Annotated[
            str,
            typer.Option(
                help="cpu, cuda (every visible GPU, layers split across them), cuda:N, a list "
                "such as cuda:0,cuda:1, or auto (CUDA when present).",
                rich_help_panel=PANEL,
            ),
        ],
        "auto",
    ),
    "dtype": (
        Annotated[
            str,
            typer.Option(
                help="Activations and dense weights: float32, bfloat16, float16, or auto"
                " (bfloat16 on CUDA, float32 on the CPU).",
                rich_help_panel=PANEL,
            ),
        ],
        "auto",
    ),
    "threads": (
        Annotated[
            int | None,
            typer.Option(
                help="CPU threads for torch and the fused expert kernels (default: torch's;"
                " a streamed model's kernels leave 2 of >= 8 to the readers and the main thread).",
                rich_help_panel=PANEL,
            ),
        ],
        None,
    ),
    "ctx": (
        Annotated[
            int | None,
            typer.Option(
                "--ctx",
                help="Context length in tokens: the KV cache size (default: the model's, at"
                " most 8192).",
                rich_help_panel=PANEL,
            ),
        ],
        None,
    ),
    "expert_kernels": (
        Annotated[
            str,
            typer.Option(
                help="Expert kernels: auto (fused on the CPU, torch on CUDA), fused (flint's"
                " fused CPU kernels for every scheme: one call per layer on --threads"
                " threads; CPU only; SwiGLU experts without biases, others use torch), torch"
                " (torch's per-expert kernels; int8/int4 through its quantized kernels,"
                " probed at load) or dequant (int8/int4 dequantized then multiplied).",
                rich_help_panel=PANEL,
            ),
        ],
        "auto",
    ),
    "stream": (
        Annotated[
            bool | None,
            typer.Option(
                "--stream/--no-stream",
                help="Stream routed experts from the .ftw file through a RAM cache instead of"
                " loading them all (default: stream when --ram-budget is given, except on"
                " the CPU when every routed expert fits it: then loaded, which decodes"
                " faster).",
                rich_help_panel=PANEL,
            ),
        ],
        None,
    ),
    "ram_budget": (
        Annotated[
            float | None,
            typer.Option(
                help="GiB of RAM the expert cache may use when streaming (default: what is"
                " free, minus headroom). Dense weights and the KV cache are not counted.",
                rich_help_panel=PANEL,
            ),
        ],
        None,
    ),
    "vram_budget": (
        Annotated[
            float | None,
            typer.Option(
                help="GiB of GPU memory the VRAM expert cache may use when streaming on CUDA"
                " (default: what is free after the dense weights and KV cache, minus"
                " headroom; 0: none; over several GPUs, the total).",
                rich_help_panel=PANEL,
            ),
        ],
        None,
    ),
    "deterministic": (
        Annotated[
            bool,
            typer.Option(
                help="Compute every streamed expert on the GPU (none on the CPU), so output is"
                " bit-identical to a resident GPU run whatever the caches hold.",
                rich_help_panel=PANEL,
            ),
        ],
        False,
    ),
    "host_split": (
        Annotated[
            str,
            typer.Option(
                help="Where a streamed decode step's experts outside VRAM are computed on"
                " CUDA: cpu (beside the GPU), fill (copied up over PCIe), q (split so"
                " both finish together, from measured bandwidths), or auto: fill where"
                " the int8/int4 slab kernels run, else cpu.",
                rich_help_panel=PANEL,
            ),
        ],
        "auto",
    ),
    "graphs": (
        Annotated[
            str,
            typer.Option(
                help="CUDA graph decode: auto (where the model is covered: one GPU, every"
                " family but Qwen3-Next; streamed experts computed between graph segments,"
                " except with --deterministic), on (an error where not), eager (the same"
                " step launched op by op: identical output, for comparison), off (the"
                " general eager path).",
                rich_help_panel=PANEL,
            ),
        ],
        "auto",
    ),
    "lookahead": (
        Annotated[
            int | None,
            typer.Option(
                help="Layers of router lookahead used to prefetch experts, 0-3 (default: the"
                " tuned profile's, else 2).",
                rich_help_panel=PANEL,
            ),
        ],
        None,
    ),
    "io_workers": (
        Annotated[
            int | None,
            typer.Option(
                help="Expert reader threads when streaming (default: the tuned profile's, else 8).",
                rich_help_panel=PANEL,
            ),
        ],
        None,
    ),
    "profile": (
        Annotated[
            bool,
            typer.Option(
                "--profile/--no-profile",
                help="Use this machine's tuned profile for the model when streaming"
                " (`flint tune`).",
                rich_help_panel=PANEL,
            ),
        ],
        True,
    ),
}


def _build(values: dict[str, Any]) -> RuntimeOptions:
    return RuntimeOptions(
        device=_auto(values["device"]),
        dtype=_auto(values["dtype"]),
        threads=values["threads"],
        context_length=values["ctx"],
        expert_kernels=values["expert_kernels"],
        stream=values["stream"],
        ram_budget=values["ram_budget"],
        lookahead=values["lookahead"],
        io_workers=values["io_workers"],
        vram_budget=values["vram_budget"],
        deterministic=values["deterministic"],
        host_split=values["host_split"],
        graphs=values["graphs"],
        profile=values["profile"],
    )


def runtime_options(command: F) -> F:
    """Adds the runtime options to ``command``, which receives them as ``runtime``."""
    sig = inspect.signature(command, eval_str=True)
    if "runtime" not in sig.parameters:
        raise TypeError(f"{command.__name__} has no 'runtime' parameter")
    own = [p for p in sig.parameters.values() if p.name != "runtime"]
    extra = [
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=ann)
        for name, (ann, default) in _OPTIONS.items()
    ]

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        values = {name: kwargs.pop(name) for name in _OPTIONS}
        return command(*args, runtime=_build(values), **kwargs)

    params = [*own, *extra]
    wrapper.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
    wrapper.__annotations__ = {p.name: p.annotation for p in params}
    return wrapper  # type: ignore[return-value]
