"""Per-machine, per-model tuned settings (``flint tune``) and how commands use them.

A profile is a JSON file in ``$XDG_CACHE_HOME/flint/profiles`` (``~/.cache`` by
default) named ``<machine key>-<model key>.json``. The machine key hashes what the
settings depend on and a fresh box of the same kind shares: CPU model and count, RAM,
the GPU, and the file system the model lives on; the model key is the file's name and
size. Commands that stream load it; a flag given on the command line always wins.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil
import torch

VERSION = 1
DEFAULT_LOOKAHEAD = 2
DEFAULT_IO_WORKERS = 8


@dataclass(slots=True, frozen=True)
class Profile:
    """The settings ``flint tune`` picked for one machine and model, and why."""

    io_workers: int
    lookahead: int
    machine: str
    model: str
    measured: dict[str, Any] = field(default_factory=dict)
    version: int = VERSION

    def describe(self) -> str:
        return f"{self.io_workers} I/O workers, lookahead {self.lookahead}"


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_key(model: Path) -> str:
    """Stable across restarts of the same machine type: CPU, cores, RAM (GiB), GPU and
    the model's file system device."""
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "nogpu"
    ram = round(psutil.virtual_memory().total / 2**30)
    dev = os.stat(model).st_dev
    parts = f"{_cpu_name()}|{os.cpu_count()}|{ram}|{gpu}|{dev}"
    digest = hashlib.sha256(parts.encode()).hexdigest()[:10]
    slug = re.sub(r"[^a-z0-9]+", "-", _cpu_name().lower()).strip("-")[:24] or "cpu"
    return f"{slug}-{os.cpu_count()}c-{digest}"


def model_key(model: Path) -> str:
    slug = re.sub(r"[^A-Za-z0-9_.]+", "-", model.stem)[:40]
    return f"{slug}-{os.stat(model).st_size}"


def profile_dir() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "flint" / "profiles"


def profile_path(model: Path) -> Path:
    return profile_dir() / f"{machine_key(model)}-{model_key(model)}.json"


def save_profile(profile: Profile, path: Path) -> None:
    """Writes atomically (a temporary file renamed over the old one)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(profile), indent=2) + "\n")
    tmp.replace(path)


def load_profile(model: Path) -> tuple[Profile, Path] | None:
    """This machine's profile for ``model``; None if there is none, or it is unreadable
    or from another version (then it is ignored)."""
    if not model.is_file():
        return None
    path = profile_path(model)
    try:
        raw = json.loads(path.read_text())
        if raw.get("version") != VERSION:
            return None
        profile = Profile(**raw)
    except (OSError, ValueError, TypeError):
        return None
    if not (1 <= profile.io_workers <= 256 and 0 <= profile.lookahead <= 3):
        return None
    return profile, path


def resolve_engine(
    model: Path,
    lookahead: int | None,
    io_workers: int | None,
    *,
    use_profile: bool,
    notice: Callable[[str], None],
) -> tuple[int, int]:
    """(lookahead, io_workers): the flag when given, else the tuned profile's (one
    ``notice`` line says which profile), else flint's defaults."""
    found = load_profile(model) if use_profile else None
    if found is None or (lookahead is not None and io_workers is not None):
        return (
            DEFAULT_LOOKAHEAD if lookahead is None else lookahead,
            DEFAULT_IO_WORKERS if io_workers is None else io_workers,
        )
    profile, path = found
    look = profile.lookahead if lookahead is None else lookahead
    workers = profile.io_workers if io_workers is None else io_workers
    overridden = (
        " (flags override the rest)" if lookahead is not None or io_workers is not None else ""
    )
    notice(f"flint: tuned profile {path}: {workers} I/O workers, lookahead {look}{overridden}")
    return look, workers
