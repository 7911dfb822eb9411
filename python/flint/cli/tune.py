"""``flint tune``: measure this machine for a model and save the settings as a profile."""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any

import typer

from flint.bench.modes import Setup
from flint.cli.bench import parse_counts
from flint.cli.errors import USER_ERRORS, fail, fail_from, stderr
from flint.cli.progress import spinner
from flint.tune.profile import profile_path, save_profile
from flint.tune.tuner import TuneOptions, TuneResult, model_exists, tune


def _lines(m: dict[str, Any]) -> list[str]:
    out = [f"reads ({m['io_mode']} I/O, {m['slab_bytes'] / 2**20:.3f} MiB slabs, {m['scheme']}):"]
    for p in m["direct_reads"]:
        out.append(
            f"  {p['workers']:>3} workers: {p['gb_s']:.3f} GB/s, demand latency p50 <="
            f" {p['p50_us']} us, p99 <= {p['p99_us']} us (log2 histogram)"
        )
    h2d = m["pinned_h2d_gb_s"]
    out += [
        f"one read, nothing queued: {m['idle_read_us']:.0f} us",
        f"CPU expert compute: {m['expert_compute_gb_s']:.2f} GB/s of expert bytes"
        f" ({m['experts_us_per_layer']:.0f} us for a layer's top-k, one token)",
        f"layer compute (decode, nothing read): {m['layer_ms']:.3f} ms"
        f" ({m['decode_ms_per_token']:.2f} ms/token)",
        f"a layer's top-k reads at {m['pick_io_workers']} workers: {m['layer_read_us']:.0f} us",
        "pinned host-to-device: " + ("no CUDA" if h2d is None else f"{h2d:.2f} GB/s"),
        f"picked: {m['pick_io_workers']} I/O workers, lookahead {m['pick_lookahead']}",
    ]
    return out


def _verdict(result: TuneResult) -> str:
    p = result.paired
    if p is None:
        return "the picks equal the defaults; nothing to compare"
    d, t = statistics.fmean(p.default), statistics.fmean(p.tuned)
    return (
        f"paired bench (full, tg, {len(p.default)} interleaved cold runs each): defaults"
        f" {d:.2f} tok/s, tuned {t:.2f} tok/s"
    )


def register(app: typer.Typer) -> None:
    @app.command("tune")
    def tune_command(
        model: Annotated[Path, typer.Argument(help="The .ftw file to tune for.")],
        workers: Annotated[
            str, typer.Option(help="Reader thread counts to measure, comma list.")
        ] = "1,2,4,8,16",
        ram_budget: Annotated[
            float | None,
            typer.Option(
                help="GiB of RAM cache for the paired bench: give the budget you run with"
                " (default: what is free).",
            ),
        ] = None,
        tokens: Annotated[
            int, typer.Option("-n", "--tokens", help="Tokens decoded per paired-bench run.")
        ] = 32,
        reps: Annotated[int, typer.Option("-r", "--reps", help="Paired-bench runs each.")] = 3,
        device: Annotated[str, typer.Option(help="cpu, cuda, cuda:N or auto.")] = "auto",
        dtype: Annotated[str, typer.Option(help="float32, bfloat16, float16 or auto.")] = "auto",
        as_json: Annotated[bool, typer.Option("--json", help="Print the profile as JSON.")] = False,
    ) -> None:
        """Measure this machine for MODEL and save the picked settings as a profile.

        Measures direct-read (O_DIRECT) throughput and latency by reader threads on the
        model's drive, CPU expert-compute throughput for the model's quantization,
        decode time per layer, and (with CUDA) pinned host-to-device bandwidth. Picks
        the I/O workers (fewest within 90% of the best throughput) and the lookahead
        distance (a layer's top-k reads vs layer compute time), then runs a paired
        bench (`full`, defaults vs picks, interleaved): the profile is saved only if
        the picks are at least as fast. run, chat, serve and bench load it when they
        stream (one line says so); --lookahead / --io-workers / --no-profile override.
        """
        try:
            model_exists(model)
            counts = parse_counts(workers, "--workers")
            opts = TuneOptions(tuple(counts), ram_budget, tokens, reps)
            opts.validate()
            setup = Setup(
                model,
                None if device == "auto" else device,
                None if dtype == "auto" else dtype,
                context_length=tokens + 80,
            )
            with spinner("tuning", stderr) as say:
                result = tune(setup, opts, say)
        except USER_ERRORS as err:
            raise fail_from(err, model) from None
        except RuntimeError as err:
            raise fail(str(err), 1) from None
        path = profile_path(model)
        if as_json:
            print(json.dumps({"kept": result.kept, "path": str(path), **_doc(result)}, indent=2))
        else:
            print("\n".join([*_lines(result.profile.measured), _verdict(result)]))
        if result.kept:
            save_profile(result.profile, path)
            stderr.print(f"flint: kept the tuned profile: {path}")
        else:
            path.unlink(missing_ok=True)
            stderr.print("flint: tuned settings were slower than the defaults; profile not kept")


def _doc(result: TuneResult) -> dict[str, Any]:
    return {"profile": asdict(result.profile)}
