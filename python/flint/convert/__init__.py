"""Hugging Face checkpoint -> .ftw conversion."""

from flint.convert.convert import ConvertOptions, convert

__all__ = ["ConvertOptions", "convert"]
