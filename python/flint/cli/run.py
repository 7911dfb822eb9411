"""``flint run``: one non-interactive generation, streamed to the terminal or as JSON."""

from __future__ import annotations

import json
import resource
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import torch
import typer

from flint.api import LLM
from flint.cli.errors import USER_ERRORS, fail_from, stderr
from flint.cli.runtime_options import RuntimeOptions, load_or_fail, runtime_options
from flint.generation import Completion, StreamChunk, Timings


def _stream(llm: LLM, prompt: str, chat: bool, options: dict[str, Any]) -> Iterator[StreamChunk]:
    if chat:
        return llm.chat_stream([{"role": "user", "content": prompt}], **options)
    return llm.stream(prompt, **options)


def _complete(llm: LLM, prompt: str, chat: bool, options: dict[str, Any]) -> Completion:
    if chat:
        return llm.chat([{"role": "user", "content": prompt}], **options)
    return llm.generate(prompt, **options)


def expert_kernel(llm: LLM) -> str:
    """What computes the routed experts (``MoEModel.expert_kernel``)."""
    return llm.model.expert_kernel


def _experts_scheme(llm: LLM) -> str:
    layout = getattr(llm.source, "expert_layout", None)
    return f"{layout.scheme} ({layout.dtype})" if layout is not None else "checkpoint"


def timings_dict(t: Timings) -> dict[str, float | int]:
    return {
        "prompt_tokens": t.prompt_tokens,
        "generated_tokens": t.generated_tokens,
        "prefill_s": round(t.prefill_s, 6),
        "decode_s": round(t.decode_s, 6),
        "prefill_tok_s": round(t.prefill_tok_s, 2),
        "decode_tok_s": round(t.decode_tok_s, 2),
    }


def stats_dict(llm: LLM, model: Path, load_s: float, finish_reason: str) -> dict[str, Any]:
    return {
        "model": str(model),
        "arch": llm.model.config.family,
        "device": str(llm.device),
        "dtype": str(llm.dtype).removeprefix("torch."),
        "threads": torch.get_num_threads(),
        "context_length": llm.model.context_length,
        "experts": _experts_scheme(llm),
        "expert_kernel": expert_kernel(llm),
        "decode": llm.model.decode_path,
        "load_s": round(load_s, 3),
        "finish_reason": finish_reason,
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "streaming": llm.stats(),
    }


def streaming_summary(stats: dict[str, Any]) -> str:
    """Per forward step (a prompt counts once): stall, reads, hit rate, recall."""
    n = max(1, int(stats["forward_calls"]))
    head = f"streaming ({stats['mode']} I/O, {stats['slots_per_layer']} slots/layer):"
    parts = [
        f"stall {1000 * stats['stall_s'] / n:.2f} ms/token",
        f"demand reads {stats['reads_demand'] / n:.1f}/token",
        f"prefetch reads {stats['reads_prefetch'] / n:.1f}/token",
        f"read {(stats['bytes_demand'] + stats['bytes_prefetch']) / n / 2**20:.2f} MiB/token",
    ]
    if stats["ram_hit_rate"] is not None:
        parts.append(f"RAM hit rate {stats['ram_hit_rate']:.1%}")
    if stats.get("vram_hit_rate") is not None:
        parts.append(
            f"VRAM hit rate {stats['vram_hit_rate']:.1%} "
            f"({stats['vram_slots_per_layer']} slots/layer, {stats['vram_swaps']} swaps)"
        )
        for key, rate in stats.items():  # layers split across GPUs: each one's cache
            if key.startswith("vram_hit_rate ") and rate is not None:
                parts.append(f"{key.split(' ', 1)[1]} VRAM hit rate {rate:.1%}")
    if stats.get("gpu_experts") or stats.get("cpu_experts"):
        parts.append(f"CPU share of experts {stats['cpu_share']:.1%}")
        parts.append(f"PCIe {stats['pcie_bytes'] / n / 2**20:.2f} MiB/token")
    for d in (1, 2, 3):
        r, p = stats.get(f"recall_d{d}"), stats.get(f"precision_d{d}")
        if r is not None and p is not None:
            parts.append(f"lookahead d{d} recall {r:.1%} precision {p:.1%}")
    return head + " " + ", ".join(parts)


def _print_stream(chunks: Iterator[StreamChunk]) -> StreamChunk:
    last: StreamChunk | None = None
    for chunk in chunks:
        sys.stdout.write(chunk.text)
        sys.stdout.flush()
        last = chunk
    sys.stdout.write("\n")
    assert last is not None and last.timings is not None  # streams end with timings
    return last


def _summary(t: Timings, reason: str) -> str:
    return (
        f"prompt {t.prompt_tokens} tok ({t.prefill_tok_s:.1f} tok/s), generated "
        f"{t.generated_tokens} tok ({t.decode_tok_s:.1f} tok/s decode), finish: {reason}"
    )


def register(app: typer.Typer) -> None:
    @app.command()
    @runtime_options
    def run(
        runtime: RuntimeOptions,
        model: Annotated[Path, typer.Argument(help="A .ftw file or an HF checkpoint directory.")],
        prompt: Annotated[str, typer.Option("-p", "--prompt", help="The prompt text.")],
        max_tokens: Annotated[
            int, typer.Option("-n", "--max-tokens", help="Most tokens to generate.")
        ] = 128,
        temp: Annotated[
            float | None,
            typer.Option("--temp", help="Sampling temperature; 0 = greedy (default: model's)."),
        ] = None,
        seed: Annotated[int | None, typer.Option(help="Random seed: same seed, same text.")] = None,
        chat: Annotated[
            bool, typer.Option(help="Send the prompt as one user message via the chat template.")
        ] = False,
        ignore_eos: Annotated[bool, typer.Option(help="Keep generating after EOS.")] = False,
        show_stats: Annotated[
            bool, typer.Option("--stats", help="Print streaming statistics after the text.")
        ] = False,
        as_json: Annotated[
            bool,
            typer.Option(
                "--json", help='Print one JSON object {"text", "token_ids", "timings", "stats"}.'
            ),
        ] = False,
    ) -> None:
        """Generate a completion of a prompt and print it as it is produced.

        The prompt is encoded raw (no template, no special tokens added) unless --chat.
        Generation stops at EOS (unless --ignore-eos) or after -n tokens.
        Sampling settings not given come from the model's generation config.
        Timings go to stderr; --json prints everything as one object on stdout.
        """
        options: dict[str, Any] = {"max_tokens": max_tokens, "ignore_eos": ignore_eos}
        if temp is not None:
            options["temperature"] = temp
        if seed is not None:
            options["seed"] = seed
        t0 = time.perf_counter()
        llm = load_or_fail(runtime, model)
        load_s = time.perf_counter() - t0
        with llm:
            try:
                if as_json:
                    done = _complete(llm, prompt, chat, options)
                    out = {
                        "text": done.text,
                        "token_ids": list(done.token_ids),
                        "timings": timings_dict(done.timings),
                        "stats": stats_dict(llm, model, load_s, done.finish_reason),
                    }
                    print(json.dumps(out, ensure_ascii=False))
                    return
                last = _print_stream(_stream(llm, prompt, chat, options))
            except USER_ERRORS as err:
                raise fail_from(err) from None
            assert last.timings is not None and last.finish_reason is not None
            stderr.print(_summary(last.timings, last.finish_reason))
            stats = llm.stats()
            if show_stats:
                stderr.print(streaming_summary(stats) if stats else "all experts resident")
