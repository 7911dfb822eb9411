from __future__ import annotations

import pytest
import torch

from flint.format.quant import (
    decode_projection,
    encode_projection,
    int4_bytes,
    int8_bytes,
    pack_int4,
    quantize_int4,
    unpack_int4,
)


def test_int4_pack_roundtrip_and_nibble_order() -> None:
    q = torch.randint(-8, 8, (5, 64), dtype=torch.int8)
    packed = pack_int4(q)
    assert packed.shape == (5, 32)
    assert torch.equal(unpack_int4(packed), q)
    # element 2j in the low nibble, 2j+1 in the high nibble, stored as q + 8
    assert int(packed[0, 0]) == (int(q[0, 0]) + 8) | ((int(q[0, 1]) + 8) << 4)


@pytest.mark.parametrize("scheme", ["int8", "int4"])
def test_encode_decode_error_is_within_half_a_step(scheme: str) -> None:
    torch.manual_seed(0)
    w = torch.randn(48, 64)
    raw = encode_projection(w, scheme, 32)
    size = int8_bytes(48, 64) if scheme == "int8" else int4_bytes(48, 64, 32)
    assert raw.dtype == torch.uint8 and raw.numel() == size
    back = decode_projection(raw, scheme, "", 48, 64, 32)
    if scheme == "int8":
        step = w.abs().amax(dim=1, keepdim=True) / 127
    else:
        _, scale = quantize_int4(w, 32)
        step = scale.float().repeat_interleave(32, dim=1)
    assert torch.all((back - w).abs() <= step / 2 + 1e-6)


def test_int4_rejects_groups_that_do_not_divide() -> None:
    with pytest.raises(ValueError, match="multiple of group size"):
        quantize_int4(torch.zeros(4, 48), 32)
