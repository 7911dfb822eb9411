"""Version of the Python package and of the Rust core it was built with."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from flint import _core

try:
    __version__: str = version("flint")
except PackageNotFoundError:  # running from a source tree without an install
    __version__ = _core.__version__


def core_version() -> str:
    """The version of the compiled Rust core (``flint._core``)."""
    return _core.__version__
