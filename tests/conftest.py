"""Shared pytest setup: tests marked ``gpu`` skip themselves where CUDA is absent."""

from __future__ import annotations

import os

import pytest


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


# Without a GPU, Triton kernels (flint.graphs) run in Triton's CPU interpreter; it is
# chosen when a kernel is defined, so before any test imports flint.graphs.
if not _cuda_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _cuda_available():
        if os.environ.get("TRITON_INTERPRET") != "1":
            skip = pytest.mark.skip(reason="Triton on CPU tensors needs its interpreter")
            for item in items:
                if "interpreter" in item.keywords:
                    item.add_marker(skip)
        return
    skip_gpu = pytest.mark.skip(reason="needs CUDA (no GPU on this machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)
