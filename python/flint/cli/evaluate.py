"""``flint eval``: perplexity on a text file; with --ref, KL and top-1 against another file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from flint.api import LLM
from flint.cli.errors import USER_ERRORS, fail, fail_from, stderr
from flint.cli.progress import count_progress
from flint.cli.runtime_options import RuntimeOptions, load_or_fail, runtime_options
from flint.evaluate import EvalResult, check_inputs, evaluate, scored_positions

DEFAULT_WINDOW = 512


def _read_text(path: Path) -> str:
    try:
        return path.read_text("utf-8")
    except FileNotFoundError:
        raise ValueError(f"no such text file: {path}") from None
    except (UnicodeDecodeError, IsADirectoryError) as err:
        raise ValueError(f"{path} is not a UTF-8 text file ({err})") from None


def _check_same_model(llm: LLM, ref: LLM) -> None:
    if ref.source.tokenizer_json != llm.source.tokenizer_json:
        raise ValueError("--ref uses a different tokenizer: it is not the same model")
    if ref.model.config != llm.model.config:
        raise ValueError("--ref has a different config: it is not the same model")


def _report(result: EvalResult, model: Path, ref: Path | None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "model": str(model),
        "tokens": result.tokens,
        "windows": result.windows,
        "nll": round(result.nll, 6),
        "perplexity": round(result.perplexity, 4),
    }
    if ref is not None and result.ref_perplexity is not None:
        out |= {
            "ref": str(ref),
            "ref_perplexity": round(result.ref_perplexity, 4),
            "mean_kl": result.kl,
            "top1_agreement": result.top1,
        }
    return out


def _print(report: dict[str, Any]) -> None:
    print(f"perplexity {report['perplexity']:.4f} over {report['tokens']} tokens")
    if "ref" in report:
        print(f"reference perplexity {report['ref_perplexity']:.4f} ({report['ref']})")
        print(f"mean KL(ref || model) {report['mean_kl']:.6f} nats/token")
        print(f"top-1 agreement {100 * report['top1_agreement']:.2f}%")


def _score(
    llm: LLM, ref_llm: LLM | None, text: str, window: int | None, max_tokens: int | None
) -> EvalResult:
    ids = llm.tokenizer.encode(text)[:max_tokens]
    limit = min(llm.model.context_length, ref_llm.model.context_length if ref_llm else 1 << 30)
    size = window if window is not None else min(DEFAULT_WINDOW, limit)
    ref_model = ref_llm.model if ref_llm is not None else None
    check_inputs(llm.model, len(ids), size, ref_model)
    with count_progress("evaluating", scored_positions(len(ids), size), stderr) as bar:
        return evaluate(llm.model, ids, size, ref_model, bar.advance)


def register(app: typer.Typer) -> None:
    @app.command(name="eval")
    @runtime_options
    def eval_command(
        runtime: RuntimeOptions,
        model: Annotated[Path, typer.Argument(help="A .ftw file or an HF checkpoint directory.")],
        file: Annotated[Path, typer.Argument(help="A UTF-8 text file to score.")],
        ref: Annotated[
            Path | None,
            typer.Option(help="Another file of the same model (e.g. bf16) to compare against."),
        ] = None,
        window: Annotated[
            int | None,
            typer.Option(help=f"Tokens per window (default {DEFAULT_WINDOW}, at most --ctx)."),
        ] = None,
        max_tokens: Annotated[
            int | None, typer.Option(help="Score only the first N tokens of the file.")
        ] = None,
        as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    ) -> None:
        """Perplexity of a model on a text file (raw text, non-overlapping windows).

        Each window starts from an empty cache; every token after a window's first is scored.
        With --ref (e.g. the bf16 file when MODEL is int4): the reference's perplexity,
        the mean KL(ref || model) per token, and how often both rank the same token first.
        """
        if max_tokens is not None and max_tokens < 2:
            raise fail(f"--max-tokens must be >= 2, got {max_tokens}")
        try:
            text = _read_text(file)
        except ValueError as err:
            raise fail(str(err)) from None
        with load_or_fail(runtime, model) as llm:
            ref_llm = load_or_fail(runtime, ref) if ref is not None else None
            try:
                if ref_llm is not None:
                    _check_same_model(llm, ref_llm)
                result = _score(llm, ref_llm, text, window, max_tokens)
            except USER_ERRORS as err:
                raise fail_from(err) from None
            finally:
                if ref_llm is not None:
                    ref_llm.close()
        report = _report(result, model, ref)
        if as_json:
            print(json.dumps(report))
        else:
            _print(report)
