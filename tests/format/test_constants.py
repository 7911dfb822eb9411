from __future__ import annotations

from flint import _core
from flint.format import constants as c


def test_python_and_rust_constants_agree() -> None:
    rust = _core.format_constants()
    for name in [
        "FORMAT_VERSION",
        "ALIGN",
        "HEADER_PAGE",
        "HEADER_STRUCT_SIZE",
        "SCALE_ALIGN",
        "EXPERT_RECORD_SIZE",
        "EXPERT_LAYOUT_SIZE",
        "MAX_METADATA_BYTES",
        "MAX_TENSORS",
        "MAX_NAME_BYTES",
        "MAX_DIMS",
        "SCHEMES",
    ]:
        assert rust[name] == getattr(c, name), name
    assert bytes(rust["MAGIC"]) == c.MAGIC
    assert bytes(rust["FOOTER_MAGIC"]) == c.FOOTER_MAGIC
    assert {k: tuple(v) for k, v in rust["DTYPES"].items()} == c.DTYPES
    for name, (_, size) in c.DTYPES.items():
        assert c.TORCH_DTYPES[name].itemsize == size
