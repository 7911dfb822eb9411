"""``flint bench``: the one way flint is measured (llama-bench's rows plus streaming)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import torch
import typer

from flint.bench import MODES, Case, Engine, Plan, Setup, run_plan, to_json, to_markdown
from flint.bench.modes import mode_of
from flint.bench.suite import CONTROL, Outcome
from flint.cli.errors import USER_ERRORS, fail, fail_from, stderr
from flint.cli.progress import spinner
from flint.graphs import check_graph_mode
from flint.tune.profile import resolve_engine

MISMATCH_EXIT = 3
ENGINE = "Streaming engine (mode full)"
RUNTIME = "Runtime"


def parse_counts(value: str, flag: str) -> list[int]:
    """ "512" or "128,256" -> [512] / [128, 256]; 0 entries are dropped (no test)."""
    try:
        counts = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"{flag} takes token counts like 512 or 64,512, not {value!r}") from None
    if any(n < 0 for n in counts):
        raise ValueError(f"{flag} counts must be >= 0, got {value!r}")
    return [n for n in counts if n > 0]


def parse_modes(value: str) -> tuple[str, ...]:
    modes = tuple(m.strip() for m in value.split(",") if m.strip())
    for m in modes:
        try:
            mode_of(m)
        except ValueError as err:
            raise ValueError(f"--mode: {err} (a comma list of {', '.join(MODES)})") from None
    return modes


def _context(tests: list[Case]) -> int:
    """KV positions for the longest test (the tg prompt is short: 64 positions spare)."""
    return max(t.n + 64 for t in tests) + 1


def _report_mismatches(out: Outcome, doc: dict[str, Any]) -> None:
    for m in out.mismatches:
        stderr.print(
            f"[bold red]MISMATCH[/]: mode {m.mode}, {m.test}, rep {m.rep + 1}: generated token "
            f"{m.index} is {m.got}, the {CONTROL} control has {m.want}"
        )
    steps = [doc.get(key) for key in ("decode", "streamed_decode")]
    if any(path not in (None, "layer loop") for path in steps):
        # decode steps are within rounding of the layer loop (docs/streaming.md)
        stderr.print(
            "flint: a decode step ran (resident: "
            f"{doc.get('decode') or '-'}; streamed: {doc.get('streamed_decode') or '-'}); it is "
            "within rounding of the layer loop, so a near-tie can flip a token. The bit-exact "
            "comparison: --graphs off (CUDA) or FLINT_CPU_DECODE_STEP=0 (CPU)."
        )


def register(app: typer.Typer) -> None:
    @app.command()
    def bench(
        model: Annotated[
            Path, typer.Argument(help="A .ftw file (a checkpoint dir: resident only).")
        ],
        n_prompt: Annotated[
            str, typer.Option("-p", "--n-prompt", help="Prompt lengths for pp rows (0: none).")
        ] = "512",
        n_gen: Annotated[
            str, typer.Option("-n", "--n-gen", help="Generated tokens for tg rows (0: none).")
        ] = "128",
        reps: Annotated[int, typer.Option("-r", "--repetitions", help="Runs of each row.")] = 3,
        output: Annotated[str, typer.Option("-o", "--output", help="md (a table) or json.")] = "md",
        mode: Annotated[
            str,
            typer.Option(
                help="Comma list of resident, full, naive, nowait: run interleaved, "
                "greedy tokens of full and naive checked against resident. A streamed "
                "mode may name its own --host-split as MODE:SPLIT (full:cpu,full:fill).",
            ),
        ] = "resident,full",
        tg_random: Annotated[
            bool,
            typer.Option(
                "--tg-random",
                help="Feed tg steps seeded random token ids instead of the greedy tokens "
                "(rows tgNr): honest routing for random-weight models, whose greedy text "
                "repeats.",
            ),
        ] = False,
        warm: Annotated[
            bool,
            typer.Option(
                help="One model per mode for every run (after a warm-up) instead of "
                "a fresh, cold one per run."
            ),
        ] = False,
        ram_budget: Annotated[
            float | None,
            typer.Option(
                help="GiB of RAM for the expert cache of the streamed modes (default: what is "
                "free, minus headroom).",
                rich_help_panel=ENGINE,
            ),
        ] = None,
        vram_budget: Annotated[
            float | None,
            typer.Option(
                help="CUDA: GiB of GPU memory for the VRAM expert cache of the streamed modes "
                "(default: what is free; 0: none; over several GPUs, the total).",
                rich_help_panel=ENGINE,
            ),
        ] = None,
        deterministic: Annotated[
            bool,
            typer.Option(
                help="CUDA: compute every streamed expert on the GPU, none on the CPU.",
                rich_help_panel=ENGINE,
            ),
        ] = False,
        host_split: Annotated[
            str,
            typer.Option(
                help="CUDA: a decode step's experts outside VRAM on the cpu, copied up (fill), "
                "split between both (q, the q* rule), or auto (fill where the int8/int4 "
                "slab kernels run, else cpu).",
                rich_help_panel=ENGINE,
            ),
        ] = "auto",
        gpu_waves: Annotated[
            bool,
            typer.Option(
                "--gpu-waves/--no-gpu-waves",
                help="CUDA: stage a prompt's experts outside VRAM through double-buffered "
                "VRAM copies on a side stream (off: copied per projection).",
                rich_help_panel=ENGINE,
            ),
        ] = True,
        lookahead: Annotated[
            int | None,
            typer.Option(
                help="Layers of router lookahead, 0-3 (default: the tuned profile's, else 2).",
                rich_help_panel=ENGINE,
            ),
        ] = None,
        lookahead_from: Annotated[
            str,
            typer.Option(
                help="Predict from each layer's MoE input (residual after attention; earlier)"
                " or its output (after the MoE add; closer to the next layers).",
                rich_help_panel=ENGINE,
            ),
        ] = "output",
        io_workers: Annotated[
            int | None,
            typer.Option(
                help="Expert reader threads (default: the tuned profile's, else 8).",
                rich_help_panel=ENGINE,
            ),
        ] = None,
        chunking: Annotated[
            bool,
            typer.Option(
                "--chunking/--no-chunking",
                help="Split prefetches into 512 KiB chunks so demands pass between them.",
                rich_help_panel=ENGINE,
            ),
        ] = True,
        policy: Annotated[
            str,
            typer.Option(help="RAM cache eviction: decay, lru or lfu.", rich_help_panel=ENGINE),
        ] = "decay",
        profile: Annotated[
            bool,
            typer.Option(
                "--profile/--no-profile",
                help="Use this machine's tuned profile for the model (`flint tune`).",
                rich_help_panel=ENGINE,
            ),
        ] = True,
        device: Annotated[
            str,
            typer.Option(
                help="cpu, cuda (every visible GPU, layers split across them), cuda:N, "
                "or a list such as cuda:0,cuda:1, or auto.",
                rich_help_panel=RUNTIME,
            ),
        ] = "auto",
        dtype: Annotated[
            str,
            typer.Option(
                help="float32, bfloat16, float16 or auto (bf16 on CUDA, f32 on the CPU).",
                rich_help_panel=RUNTIME,
            ),
        ] = "auto",
        threads: Annotated[
            int | None,
            typer.Option("-t", "--threads", help="torch CPU threads.", rich_help_panel=RUNTIME),
        ] = None,
        expert_kernels: Annotated[
            str,
            typer.Option(
                help="Expert kernels: auto (fused on the CPU, torch on CUDA), fused, torch or"
                " dequant (see flint run --help).",
                rich_help_panel=RUNTIME,
            ),
        ] = "auto",
        graphs: Annotated[
            str,
            typer.Option(
                help="CUDA graph decode, resident and streamed modes: auto (CUDA graphs"
                " where the model is covered; streamed: the dense parts in graph segments"
                " between the expert hops), on, eager (the graph step launched op by op),"
                " off (the general eager path).",
                rich_help_panel=RUNTIME,
            ),
        ] = "auto",
    ) -> None:
        """Measure prompt (pp) and generation (tg) speed, llama-bench style.

        Every row is mean ± sd tok/s over -r runs; the modes given run interleaved
        (for each repetition and test, each mode in turn), each run in a fresh model
        whose expert cache starts empty unless --warm. Streamed modes add, per
        generated token (tg) or prompt token (pp): SSD stall, demand and prefetch reads,
        MiB read, RAM hit rate, lookahead recall/precision; tg rows also Belady ms/tok
        (the time to read what Belady-optimal caching would still read over the run's
        own routing, at the drive's direct-read rate measured at start: the bound the
        stall is measured against; a stall below it means reads were overlapped, or
        the drive ran faster than measured) and, on CUDA, the VRAM hit rate, PCIe MiB,
        CPU share and CPU ms per token.

        Modes: resident (all experts loaded: the ceiling and the control), full (the
        streaming engine with the flags below), naive (on-demand reads, no lookahead,
        no chunking, LRU), nowait (every expert computed from a slot filled at start:
        the compute ceiling; its output is garbage by construction and not checked).
        A streamed mode whose greedy tokens differ from resident's is reported on
        stderr and the exit status is 3. Results go to stdout, progress to stderr.
        """
        try:
            if output not in ("md", "json"):
                raise ValueError(f"-o must be md or json, not {output!r}")
            tests = [Case("pp", n) for n in parse_counts(n_prompt, "-p")]
            tests += [Case("tg", n, tg_random) for n in parse_counts(n_gen, "-n")]
            plan = Plan(parse_modes(mode), tuple(tests), reps, warm)
            plan.validate()
            check_graph_mode(graphs)
            if threads is not None:
                if threads < 1:
                    raise ValueError(f"--threads must be >= 1, got {threads}")
                torch.set_num_threads(threads)
            streams = any(m != CONTROL for m in plan.modes)
            look, workers = resolve_engine(
                model, lookahead, io_workers, use_profile=profile and streams, notice=stderr.print
            )
            engine = Engine(
                ram_budget,
                look,
                workers,
                chunking,
                policy,
                vram_budget=vram_budget,
                deterministic=deterministic,
                lookahead_from=lookahead_from,
                host_split=host_split,
                gpu_waves=gpu_waves,
            )
            engine.validate()
            setup = Setup(
                model,
                None if device == "auto" else device,
                None if dtype == "auto" else dtype,
                _context(tests),
                expert_kernels,
                engine,
                graphs,
            )
            with spinner("loading", stderr) as say:
                out = run_plan(
                    plan,
                    setup,
                    notice=lambda line: stderr.print(f"flint: {line}"),
                    step=say,
                )
        except USER_ERRORS as err:
            raise fail_from(err, model) from None
        doc = to_json(plan, setup, out)
        if output == "json":
            print(json.dumps(doc, indent=2))
        else:
            print(to_markdown(doc))
        if out.mismatches:
            _report_mismatches(out, doc)
            raise fail("streamed output differs from the resident control", MISMATCH_EXIT)
        if not out.checked and streams:
            stderr.print("flint: no resident mode in this run, so outputs were not checked")
