"""flint: run Mixture-of-Experts models larger than GPU memory and RAM, exactly.

The compiled core lives in the private module ``flint._core``; everything public is
re-exported from here.
"""

from __future__ import annotations

from flint._version import __version__, core_version

__all__ = ["__version__", "core_version"]
