"""flint: run Mixture-of-Experts models larger than GPU memory and RAM, exactly.

The compiled core lives in the private module ``flint._core``; everything public is
re-exported from here.
"""

from __future__ import annotations

import os

# torch's OpenMP threads (GNU libgomp) spin for milliseconds after each parallel region
# by default, on the cores flint's expert kernels and Rust decode step then want: a
# decode layer's fused call ran 2-8x slower right after a torch op (docs/cpu-kernels.md,
# "Threads").
# Passive waiting is read once, when torch loads libgomp, so it is set before torch is
# imported (a program that imported torch first keeps its own); OMP_WAIT_POLICY=ACTIVE
# in the environment keeps spinning.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from flint._version import __version__, core_version
from flint.api import LLM
from flint.generation import Completion, StreamChunk, Timings
from flint.models.weights import ExpertWeights, SafetensorsSource, WeightSource
from flint.sampling import SamplingParams
from flint.tokenizer import Tokenizer

__all__ = [
    "LLM",
    "Completion",
    "ExpertWeights",
    "SafetensorsSource",
    "SamplingParams",
    "StreamChunk",
    "Timings",
    "Tokenizer",
    "WeightSource",
    "__version__",
    "core_version",
]
