"""The .ftw model file from Python: reader, writer, quantization and constants."""

from flint.format.reader import ExpertLayout, FtwFile, TensorInfo
from flint.format.writer import FtwFileWriter

__all__ = ["ExpertLayout", "FtwFile", "FtwFileWriter", "TensorInfo"]
