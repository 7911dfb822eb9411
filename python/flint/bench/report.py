"""``flint bench`` results as a markdown table (llama-bench's shape plus the streaming
columns of BENCHMARKS.md) or one JSON object with the same content."""

from __future__ import annotations

import os
import resource
import subprocess
import time
from pathlib import Path
from typing import Any

from flint.bench.modes import Engine, Setup, mode_of
from flint.bench.runner import MIB
from flint.bench.suite import CONTROL, UNCHECKED, Outcome, Plan, summary

STREAM_KEYS = (
    "stall_ms",
    "demand_reads",
    "prefetch_reads",
    "demand_misses",
    "read_mib",
    "ram_hit_rate",
    "vram_hit_rate",
    "pcie_mib",
    "cpu_share",
    "cpu_ms",
    "belady_mib",
    "recall_d1",
    "precision_d1",
    "recall_d2",
    "precision_d2",
)


_SPLITS = {
    "auto": "auto (fill with the slab kernels, else CPU)",
    "cpu": "on the CPU",
    "fill": "copied up (fill)",
    "q": "q* split (fill + CPU)",
}


def _split(doc: dict[str, Any]) -> str:
    """The header's host split: "auto" with what it resolved to on this machine."""
    split, resolved = doc["host_split"], doc.get("host_split_resolved")
    if split == "auto" and resolved in _SPLITS and resolved != "auto":
        return f"auto, here {_SPLITS[resolved]}"
    return _SPLITS[split]


def git_commit() -> str:
    """The commit of the flint source tree this package runs from, "-dirty" when it has
    uncommitted changes; "unknown" outside a checkout."""
    here = Path(__file__).resolve().parent
    try:
        head = subprocess.run(
            ["git", "-C", str(here), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=False,
        )
        dirty = subprocess.run(
            ["git", "-C", str(here), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=False,
        )
    except OSError:
        return "unknown"
    commit = head.stdout.strip()
    if head.returncode or not commit:
        return "unknown"
    return commit + ("-dirty" if dirty.stdout.strip() else "")


def _mean(values: list[float | None]) -> dict[str, float] | None:
    known = [v for v in values if v is not None]
    return summary(known) if known else None


def _exact(plan: Plan, out: Outcome, mode: str, test: str) -> bool | None:
    if mode == CONTROL or mode_of(mode)[0] in UNCHECKED or not out.checked:
        return None
    return not any(m.mode == mode and m.test == test for m in out.mismatches)


def to_json(plan: Plan, setup: Setup, out: Outcome) -> dict[str, Any]:
    """Everything the run measured (means and sds; ``values`` per run for tok/s)."""
    rows = []
    for test in plan.tests:
        for mode in plan.modes:
            samples = out.samples[(mode, test.name)]
            tok_s = [s.tok_s for s in samples]
            row: dict[str, Any] = {
                "mode": mode,
                "test": test.name,
                "n_prompt": test.n if test.kind == "pp" else None,
                "n_gen": test.n if test.kind == "tg" else None,
                "tok_s": {**summary(tok_s), "values": tok_s},
                "ttft_ms": summary([s.ttft_ms for s in samples]),
                "exact": _exact(plan, out, mode, test.name),
            }
            streamed = any(s.streaming for s in samples)
            for key in STREAM_KEYS:
                row[key] = _mean([s.streaming.get(key) for s in samples]) if streamed else None
            row["belady_stall_ms"] = _stall_bound(row.get("belady_mib"), out.info.get("disk_gb_s"))
            row["pcie_bound_tok_s"] = pcie_bound(row.get("pcie_mib"), out.info.get("pcie_gb_s"))
            per_gpu = {k for s in samples for k in s.streaming if k.startswith("vram_hit_rate ")}
            for key in sorted(per_gpu):  # layers split across GPUs: each one's hit rate
                row[key] = _mean([s.streaming.get(key) for s in samples])
            rows.append(row)
    return {
        "model": str(setup.model),
        **_meta(setup, out),
        "reps": plan.reps,
        "warm": plan.warm,
        "control": CONTROL if out.checked else None,
        "exact": not out.mismatches if out.checked else None,
        "mismatches": [
            {"mode": m.mode, "test": m.test, "rep": m.rep, "index": m.index}
            | {"got": m.got, "want": m.want}
            for m in out.mismatches
        ],
        "results": rows,
    }


def pcie_bound(mib: dict[str, float] | None, gb_s: float | None) -> dict[str, float] | None:
    """Tokens per second if copying ``mib`` (the run's PCIe MiB per token) at ``gb_s``
    (pinned host-to-device) were all a token cost: issue 8's PCIe bound for a prompt
    (every expert outside VRAM copied once per layer), as a summary of its mean."""
    if mib is None or not gb_s or mib["mean"] <= 0:
        return None
    return {"mean": gb_s * 1e9 / (mib["mean"] * MIB), "sd": 0.0}


def _stall_bound(mib: dict[str, float] | None, gb_s: float | None) -> dict[str, float] | None:
    """ms per token to read ``mib`` (the Belady bytes per token) at ``gb_s``, as a
    summary like the other columns' (its sd from the runs' spread of bytes)."""
    if mib is None or not gb_s:
        return None
    ms = 1000 * MIB / (gb_s * 1e9)
    return {k: v * ms for k, v in mib.items()}


def openmp_wait() -> str:
    """How torch's OpenMP threads wait, as the environment set it before torch loaded
    (``import flint`` sets PASSIVE when nothing else is set: docs/cpu-kernels.md)."""
    policy = os.environ.get("OMP_WAIT_POLICY", "default")
    spin = os.environ.get("GOMP_SPINCOUNT")
    return policy + (f", GOMP_SPINCOUNT={spin}" if spin else "")


def _meta(setup: Setup, out: Outcome) -> dict[str, Any]:
    e: Engine = setup.engine
    info = out.info
    return {
        "experts": info.get("experts"),
        "device": info.get("device"),
        "dtype": info.get("dtype"),
        "threads": info.get("threads"),
        "openmp_wait": openmp_wait(),
        "disk_gb_s": info.get("disk_gb_s"),
        "pcie_gb_s": info.get("pcie_gb_s"),
        "ram_budget_gib": e.ram_budget,
        "vram_budget_gib": e.vram_budget,
        "vram_slots_per_layer": info.get("vram_slots_per_layer"),
        "deterministic": e.deterministic,
        "host_split": e.host_split,
        "host_split_resolved": info.get("host_split_resolved"),
        "gpu_waves": e.gpu_waves,
        "slots_per_layer": info.get("slots_per_layer"),
        "n_experts": info.get("n_experts"),
        "cache_gib": info.get("cache_gib"),
        "experts_gib": info.get("experts_gib"),
        "io_mode": info.get("io_mode"),
        "decode": info.get("decode", "layer loop"),
        "expert_kernel": info.get("expert_kernel"),
        "streamed_decode": info.get("streamed_decode"),
        "streamed_gpu_experts": info.get("streamed_gpu_experts"),
        "no_graphs": info.get("no_graphs"),
        "graphs": setup.graphs,
        "engine": {
            "lookahead": e.lookahead,
            "lookahead_from": e.lookahead_from,
            "io_workers": e.io_workers,
            "chunking": e.chunking,
            "policy": e.policy,
        },
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "commit": git_commit(),
        "date": time.strftime("%Y-%m-%d"),
    }


def _pm(v: dict[str, float] | None, fmt: str = ".2f") -> str:
    if v is None:
        return "-"
    return f"{v['mean']:{fmt}} ± {v['sd']:{fmt}}"


def _num(v: dict[str, float] | None, fmt: str = ".2f") -> str:
    return "-" if v is None else f"{v['mean']:{fmt}}"


def _pair(a: dict[str, float] | None, b: dict[str, float] | None) -> str:
    return "-" if a is None or b is None else f"{a['mean']:.2f} / {b['mean']:.2f}"


def _header(doc: dict[str, Any]) -> str:
    parts = [
        f"model {Path(doc['model']).name} (experts {doc['experts']})",
        f"{doc['device']} {doc['dtype']}, {doc['threads']} threads"
        + (f", OpenMP wait {doc['openmp_wait']}" if doc.get("openmp_wait") else ""),
    ]
    if doc.get("expert_kernel"):
        parts.append(f"resident experts: {doc['expert_kernel']}")
    if doc.get("decode") and doc["decode"] != "layer loop":
        parts.append(f"resident decode: {doc['decode']}")
    if doc.get("streamed_decode"):
        parts.append(f"streamed decode: {doc['streamed_decode']}")
    if doc.get("streamed_gpu_experts"):
        parts.append(f"streamed GPU experts: {doc['streamed_gpu_experts']}")
    if doc.get("no_graphs") and doc.get("graphs") != "off":
        parts.append(f"no CUDA graph step: {doc['no_graphs']}")
    if doc["slots_per_layer"] is not None:
        e = doc["engine"]
        budget = "free memory" if doc["ram_budget_gib"] is None else f"{doc['ram_budget_gib']:g}"
        share = doc["cache_gib"] / doc["experts_gib"] if doc["experts_gib"] else 0.0
        parts.append(
            f"RAM budget {budget} GiB = {doc['slots_per_layer']}/{doc['n_experts']} slots/layer"
            f" ({share:.0%} of {doc['experts_gib']:.3f} GiB of experts), {doc['io_mode']} I/O"
        )
        if doc.get("vram_slots_per_layer"):
            vb = doc["vram_budget_gib"]
            parts.append(
                f"VRAM budget {'free memory' if vb is None else f'{vb:g}'} GiB = "
                f"{doc['vram_slots_per_layer']}/{doc['n_experts']} slots/layer"
                + (", deterministic (all experts on the GPU)" if doc["deterministic"] else "")
                + (
                    f", experts outside VRAM: {_split(doc)}"
                    + (
                        " (a row named MODE:SPLIT: that split)"
                        if any(":" in r["mode"] for r in doc["results"])
                        else ""
                    )
                    if doc.get("host_split") and not doc["deterministic"]
                    else ""
                )
            )
        if doc.get("pcie_gb_s"):
            parts.append(
                f"PCIe {doc['pcie_gb_s']:.2f} GB/s pinned host-to-device (PCIe bound t/s: "
                "the rate if copying each token's PCIe bytes at it were all a token cost)"
            )
        if doc.get("disk_gb_s"):
            parts.append(
                f"disk {doc['disk_gb_s']:.2f} GB/s {doc.get('io_mode') or 'direct'} reads, "
                "measured at start (Belady ms/tok: reading what Belady-optimal caching "
                "would still read, at that rate)"
            )
        parts.append(
            f"full: lookahead {e['lookahead']} from the MoE {e['lookahead_from']}, "
            f"{e['policy']}, chunking "
            f"{'on' if e['chunking'] else 'off'}, {e['io_workers']} I/O workers"
        )
    run = "warm" if doc["warm"] else "cold"
    parts.append(f"{doc['reps']} interleaved reps ({run}), commit {doc['commit']}, {doc['date']}")
    return "\n".join(f"{p}  " for p in parts)  # two spaces: a markdown line break


def _footer(doc: dict[str, Any]) -> str:
    line = f"peak RSS {doc['peak_rss_mib']:.0f} MiB."
    if doc["control"] is None:
        return line + " No resident control in this run: outputs were not checked."
    if doc["exact"]:
        return line + " Greedy tokens of every checked mode identical to resident in every run."
    return line + " MISMATCH: greedy tokens differ from resident (see stderr)."


def _per_gpu(row: dict[str, Any]) -> str:
    """The per-GPU VRAM hit rates of a split, as ' (0.412 cuda:0, 0.398 cuda:1)'; else ''."""
    rates = [(k.split(" ", 1)[1], v) for k, v in row.items() if k.startswith("vram_hit_rate ")]
    if not rates:
        return ""
    return " (" + ", ".join(f"{_num(v, '.3f')} {d}" for d, v in rates) + ")"


def to_markdown(doc: dict[str, Any]) -> str:
    """The table of ``to_json``'s document; per-token columns are per generated token
    for ``tg`` rows and per prompt token for ``pp`` rows."""
    head = (
        "| model | mode | test | t/s | ttft ms | stall ms/tok | Belady ms/tok | demand rd/tok "
        "| prefetch rd/tok | read MiB/tok | RAM hit | recall/prec d1 | recall/prec d2 | exact |"
    )
    gpu = any(r.get("cpu_share") is not None for r in doc["results"])
    if gpu:  # the CUDA columns: VRAM cache, PCIe traffic, experts computed on the CPU
        head = head[: -len(" exact |")] + (
            " VRAM hit | PCIe MiB/tok | PCIe bound t/s | CPU share | CPU ms/tok | exact |"
        )
    lines = [_header(doc), "", head, "|" + "---|" * (head.count("|") - 1)]
    name = Path(doc["model"]).name
    for r in doc["results"]:
        exact = {None: "-", True: "yes", False: "**NO**"}[r["exact"]]
        lines.append(
            f"| {name} | {r['mode']} | {r['test']} | {_pm(r['tok_s'])}"
            f" | {_num(r['ttft_ms'], '.1f')}"
            f" | {_num(r['stall_ms'])} | {_num(r.get('belady_stall_ms'))}"
            f" | {_num(r['demand_reads'])} | {_num(r['prefetch_reads'])}"
            f" | {_num(r['read_mib'], '.3f')} | {_num(r['ram_hit_rate'], '.3f')}"
            f" | {_pair(r['recall_d1'], r['precision_d1'])}"
            f" | {_pair(r['recall_d2'], r['precision_d2'])}"
            + (
                f" | {_num(r.get('vram_hit_rate'), '.3f')}{_per_gpu(r)}"
                f" | {_num(r.get('pcie_mib'), '.2f')}"
                f" | {_num(r.get('pcie_bound_tok_s'), '.0f')}"
                f" | {_num(r.get('cpu_share'), '.3f')}"
                f" | {_num(r.get('cpu_ms'), '.1f')}"
                if gpu
                else ""
            )
            + f" | {exact} |"
        )
    lines += ["", _footer(doc)]
    return "\n".join(lines)
