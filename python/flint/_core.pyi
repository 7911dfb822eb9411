"""Type stub for the compiled module flint._core (checked by tests/test_stub.py)."""

__all__: list[str]
__version__: str
