"""The one Python home of the .ftw format's constants (mirrors crates/ftw_format/src/consts.rs;
tests/format/test_constants.py checks that both agree)."""

from __future__ import annotations

import torch

MAGIC = b"FLINTFTW"
FOOTER_MAGIC = b"FTWFOOT1"
FORMAT_VERSION = 1
ALIGN = 4096
HEADER_PAGE = 4096
HEADER_STRUCT_SIZE = 192
SCALE_ALIGN = 64
EXPERT_RECORD_SIZE = 80
EXPERT_LAYOUT_SIZE = 40
MAX_METADATA_BYTES = 256 << 20
MAX_TENSORS = 1 << 20
MAX_NAME_BYTES = 1024
MAX_DIMS = 8

# dtype name -> (code, bytes per element)
DTYPES: dict[str, tuple[int, int]] = {
    "f32": (0, 4),
    "f16": (1, 2),
    "bf16": (2, 2),
    "i8": (3, 1),
    "u8": (4, 1),
    "i32": (5, 4),
    "i64": (6, 8),
}
# expert quantization scheme name -> code
SCHEMES: dict[str, int] = {"raw": 0, "int8": 1, "int4": 2}

TORCH_DTYPES: dict[str, torch.dtype] = {
    "f32": torch.float32,
    "f16": torch.float16,
    "bf16": torch.bfloat16,
    "i8": torch.int8,
    "u8": torch.uint8,
    "i32": torch.int32,
    "i64": torch.int64,
}
DTYPE_NAMES: dict[torch.dtype, str] = {v: k for k, v in TORCH_DTYPES.items()}

# Quantization choices of `flint convert --quant`: "none" keeps the source dtype.
EXPERT_QUANTS = ("none", "bf16", "int8", "int4")
DENSE_QUANTS = ("none", "int8")
DEFAULT_INT4_GROUP = 32
PROJ_NAMES = ("gate", "up", "down")
