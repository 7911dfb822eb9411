"""flint: run Mixture-of-Experts models larger than GPU memory and RAM, exactly.

The compiled core lives in the private module ``flint._core``; everything public is
re-exported from here.
"""

from __future__ import annotations

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
