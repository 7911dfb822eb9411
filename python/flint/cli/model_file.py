"""``flint convert``, ``inspect``, ``verify`` and ``synth``: making and checking .ftw files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from flint import _core
from flint.cli.progress import byte_progress
from flint.format.reader import FtwFile


def _fail(console: Any, msg: str, code: int = 2) -> typer.Exit:
    # soft_wrap: one line however narrow the terminal, so paths stay whole.
    console.print(f"[bold red]error:[/] {msg}", soft_wrap=True, markup=True, highlight=False)
    return typer.Exit(code)


def register(app: typer.Typer, console: Any) -> None:
    @app.command()
    def convert(
        source: Annotated[
            str,
            typer.Argument(
                help="Checkpoint directory, or a repo id (org/name) already in the local"
                " Hugging Face cache."
            ),
        ],
        output: Annotated[Path, typer.Option("-o", "--output", help="The .ftw file to write.")],
        quant: Annotated[
            str,
            typer.Option(
                help="Routed experts: none (source dtype), bf16, int8 (per channel),"
                " int4 (groups, 4.5 bits/weight)."
            ),
        ] = "none",
        dense_quant: Annotated[
            str,
            typer.Option(
                help="Attention (DeltaNet too), shared-expert, dense-layer and LM head"
                " matrices: none or int8 (row scales; the embedding and router stay as"
                " they are)."
            ),
        ] = "none",
        group_size: Annotated[int, typer.Option(help="int4 group size.")] = 32,
    ) -> None:
        """Convert a Hugging Face MoE checkpoint to one .ftw file.

        Architectures: Qwen3-MoE, Qwen2-MoE, Mixtral, OLMoE, DeepSeek-V2/V3 (Kimi K2),
        GLM-4.5 (Ling 2.0), GPT-OSS, Qwen3-Next. Works offline.
        """
        from flint.convert import ConvertOptions
        from flint.convert import convert as run

        opts = ConvertOptions(quant=quant, dense_quant=dense_quant, group_size=group_size)
        try:
            with byte_progress("converting", console) as bar:
                s = run(source, output, opts, progress=bar.advance, on_start=bar.start)
        except (ValueError, FileNotFoundError, _core.FlintError) as e:
            raise _fail(console, str(e)) from None
        console.print(
            f"wrote {s['path']}: {s['arch']}, {s['bytes'] / 2**30:.2f} GiB, experts "
            f"{s['experts']['scheme']} ({s['experts']['dtype']}), {s['seconds']:.1f} s"
        )

    @app.command()
    def inspect(
        model: Annotated[Path, typer.Argument(help="A .ftw file.")],
        as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    ) -> None:
        """Show a .ftw file's header, architecture, sizes, quantization and expert geometry."""
        info = _open_or_fail(model, console)
        summary = describe(info)
        if as_json:
            print(json.dumps(summary, indent=2))
            return
        t = Table(title=str(model), show_header=False)
        for k, v in summary.items():
            t.add_row(k, json.dumps(v) if isinstance(v, dict | list) else str(v))
        console.print(t)

    @app.command()
    def verify(model: Annotated[Path, typer.Argument(help="A .ftw file.")]) -> None:
        """Check every checksum of a .ftw file.

        Exit code 1 naming the tensor or expert on a mismatch.
        """
        f = _open_or_fail(model, console)
        r = f.core
        total = sum(t.nbytes for t in f.tensors.values()) + sum(e[3] for e in f.experts())
        try:
            with byte_progress("verifying", console) as bar:
                bar.start(total)
                for t in f.tensors.values():
                    r.verify_tensor(t.name)
                    bar.advance(t.nbytes)
                for layer, e, _, n in f.experts():
                    r.verify_expert(layer, e)
                    bar.advance(n)
        except _core.ChecksumError as e:
            raise _fail(console, str(e), 1) from None
        console.print(
            f"[green]ok[/]: {len(f.tensors)} tensors and {len(f.experts())} experts verified"
        )

    @app.command()
    def synth(
        output: Annotated[Path, typer.Option("-o", "--output", help="The .ftw file to write.")],
        geometry: Annotated[
            str,
            typer.Option(help="tiny, demo, qwen3-30b-a3b, mixtral-8x7b or deepseek-v2-lite."),
        ] = "tiny",
        quant: Annotated[
            str, typer.Option(help="Routed experts: bf16 (= none), int8 or int4.")
        ] = "int4",
        seed: Annotated[int, typer.Option(help="Random seed.")] = 0,
        layers: Annotated[
            int | None, typer.Option(help="Keep only the first N layers (smaller files).")
        ] = None,
        dense_quant: Annotated[
            str,
            typer.Option(
                help="Dense attention, MLP and LM head matrices: none (bf16) or int8 (row"
                " scales), as `flint convert --dense-quant` stores them."
            ),
        ] = "none",
    ) -> None:
        """Write a random-weight model with the exact geometry of a real MoE model.

        For benchmarks and tests: routing is near uniform and its text is noise.
        """
        from flint.synth import synth as run

        try:
            with byte_progress(f"synth {geometry}", console) as bar:
                size = run(
                    geometry, quant, output, seed, layers, bar.advance, bar.start, dense_quant
                )
        except ValueError as e:
            raise _fail(console, str(e)) from None
        dense = ", dense int8" if dense_quant == "int8" else ""
        console.print(f"wrote {output}: {geometry}, experts {quant}{dense}, {size / 2**30:.2f} GiB")


def _open_or_fail(model: Path, console: Any) -> FtwFile:
    try:
        return FtwFile(model)
    except FileNotFoundError as e:
        raise _fail(console, str(e), 1) from None
    except (_core.FlintError, OSError) as e:
        raise _fail(console, f"{model}: {e}", 1) from None


def describe(f: FtwFile) -> dict[str, Any]:
    """The facts `flint inspect` shows."""
    meta, cfg, lay = f.metadata, f.config, f.layout
    sections = {k: v[1] for k, v in f.sections().items()}
    out: dict[str, Any] = {
        "file": str(f.path),
        "bytes": f.file_size,
        "format_version": 1,
        "arch": meta.get("arch"),
        "converter": meta.get("converter"),
        "layers": cfg.get("num_hidden_layers"),
        "hidden_size": cfg.get("hidden_size"),
        "vocab_size": cfg.get("vocab_size"),
        "dense_tensors": len(f.tensors),
        "section_bytes": sections,
        "quant": meta.get("quant"),
        "chat_template": meta.get("chat_template") is not None,
        "tokenizer": meta.get("tokenizer") is not None,
    }
    if lay is not None:
        out["experts"] = {
            "count": len(f.experts()),
            "per_layer": lay.n_experts,
            "scheme": lay.scheme,
            "dtype": lay.dtype,
            "group_size": lay.group_size,
            "shapes": {"gate": lay.shapes[0], "up": lay.shapes[1], "down": lay.shapes[2]},
            "slab_bytes": lay.slab_bytes,
            "top_k": cfg.get("num_experts_per_tok"),
        }
    return out
