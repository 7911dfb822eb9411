"""The kernels' ``pack`` against the formulation it replaced (a few ops less per
projection): the packed tensors must be the same bytes, since streamed experts are packed
per use and resident ones at load, and their outputs must agree bit for bit.
``_convert_weight_to_int4pack`` is CUDA-only: on the CPU its inputs are compared."""

from __future__ import annotations

import pytest
import torch

from flint.format.quant import encode_projection, split_int4
from flint.models import quant_linear as ql

CUDA = torch.device("cuda")
HERE = CUDA if torch.cuda.is_available() else torch.device("cpu")
# (rows, cols, group): odd row counts; cols for 8, 4 and 2 inner K tiles (256, 192, 96)
INT4_SHAPES = [(7, 256, 32), (33, 192, 64), (65, 256, 128), (24, 96, 32), (40, 384, 128)]
CUDA_INT4_SHAPES = [(8, 256, 32), (40, 192, 64), (72, 256, 128), (24, 96, 32), (768, 2048, 32)]


def _old_swapped(packed: torch.Tensor) -> torch.Tensor:
    return ((packed & 0x0F) << 4) | (packed >> 4)


def _old_scales_and_zeros(scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    s = scale.to(dtype).t()
    return torch.stack([s, torch.zeros_like(s)], dim=-1).contiguous()


def _old_int4_cuda_pack(
    kernel: ql.Int4MmCuda, raw: torch.Tensor, rows: int, cols: int
) -> ql.Packed:
    packed, scale = split_int4(raw, rows, cols, kernel.group)
    tiles = next((t for t in (8, 4, 2) if cols % (16 * t) == 0), 2)
    w = torch.ops.aten._convert_weight_to_int4pack(_old_swapped(packed).to(kernel.device), tiles)
    return w, _old_scales_and_zeros(scale, kernel.dtype).to(kernel.device)


def _old_int8_pack(kernel: ql.Int8Mm, raw: torch.Tensor, rows: int, cols: int) -> ql.Packed:
    q = raw[: rows * cols].view(torch.int8).reshape(rows, cols)
    off = rows * cols + (-rows * cols % 64)
    scale = raw[off : off + rows * 4].view(torch.float32)
    return q.to(kernel.device).contiguous(), scale.to(kernel.device, kernel.dtype).contiguous()


def _same_bytes(got: ql.Packed, want: ql.Packed) -> None:
    """Equal dtypes, shapes and bits (torch.equal on floats would let -0 pass for +0)."""
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape and g.device == w.device
        assert g.is_contiguous()
        assert torch.equal(g.view(torch.uint8), w.view(torch.uint8))


def _raw(rows: int, cols: int, scheme: str, group: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return encode_projection(torch.randn(rows, cols, generator=gen), scheme, group)


@pytest.mark.parametrize(("rows", "cols", "group"), INT4_SHAPES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_int4_packer_inputs_equal_the_old_ops(
    rows: int, cols: int, group: int, dtype: torch.dtype
) -> None:
    packed, scale = split_int4(_raw(rows, cols, "int4", group, rows), rows, cols, group)
    _same_bytes((ql._swap_nibbles(packed),), (_old_swapped(packed),))
    for s in (scale, -scale):  # a set sign bit must not leak into the zero beside it
        _same_bytes((ql._scales_and_zeros(s, dtype),), (_old_scales_and_zeros(s, dtype),))
    assert ql._inner_k_tiles(cols) == {256: 8, 384: 8, 192: 4, 96: 2}[cols]


@pytest.mark.parametrize(("rows", "cols", "group"), INT4_SHAPES)
def test_int4_cuda_pack_feeds_the_packer_as_before(
    rows: int, cols: int, group: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # torch's packer replaced by one that returns its input: the rest of the CUDA pack
    # (split, packer inputs, tiles) runs anywhere
    tiles: list[int] = []

    def packer(swapped: torch.Tensor, inner_k_tiles: int) -> torch.Tensor:
        tiles.append(inner_k_tiles)
        return swapped

    monkeypatch.setattr(torch.ops.aten, "_convert_weight_to_int4pack", packer)
    kernel = ql.Int4MmCuda(group, HERE, torch.bfloat16)
    raw = _raw(rows, cols, "int4", group, rows)
    want = _old_int4_cuda_pack(kernel, raw, rows, cols)
    _same_bytes(kernel.pack(raw, rows, cols), want)
    assert len(tiles) == 2 and tiles[0] == tiles[1]


def test_packer_inputs_have_the_nibble_order_and_transposition_torch_wants() -> None:
    # element 0 (low nibble of byte 0) = 1, element 1 = 2: torch's packer wants 0x12
    packed = torch.tensor([[0x21, 0xF0], [0x00, 0x7E]], dtype=torch.uint8, device=HERE)
    scale = torch.tensor([[1.0, -2.0, 3.0], [-4.0, 5.0, -6.0]], dtype=torch.bfloat16)  # [N, G]
    swapped, sz = ql.torch_packer_inputs(packed, scale.to(HERE))  # sz [G, N, 2]
    assert swapped.tolist() == [[0x12, 0x0F], [0x00, 0xE7]]
    assert sz.shape == (3, 2, 2) and sz.dtype == torch.bfloat16
    assert sz[..., 0].tolist() == scale.t().tolist() and sz[..., 1].eq(0).all()
    assert not sz[..., 1].signbit().any()  # +0, as zeros_like made it


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_int8_pack_equals_the_old_ops(dtype: torch.dtype) -> None:
    kernel = ql.Int8Mm(torch.device("cpu"), dtype)
    for rows, cols in [(7, 64), (48, 128), (33, 96)]:
        raw = _raw(rows, cols, "int8", 32, rows)
        _same_bytes(kernel.pack(raw, rows, cols), _old_int8_pack(kernel, raw, rows, cols))


@pytest.mark.gpu
@pytest.mark.parametrize(("rows", "cols", "group"), CUDA_INT4_SHAPES)  # rows by 8 on CUDA
def test_int4_cuda_pack_equals_the_old_ops(rows: int, cols: int, group: int) -> None:
    kernel = ql.Int4MmCuda(group, CUDA, torch.bfloat16)
    raw = _raw(rows, cols, "int4", group, rows)
    want = _old_int4_cuda_pack(kernel, raw, rows, cols)
    _same_bytes(kernel.pack(raw, rows, cols), want)  # bytes on the host
    _same_bytes(kernel.pack(raw.to(CUDA), rows, cols), want)  # a staged copy in VRAM


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_int8_cuda_pack_equals_the_old_ops(dtype: torch.dtype) -> None:
    kernel = ql.Int8Mm(CUDA, dtype)
    for rows, cols in [(7, 64), (768, 2048)]:
        raw = _raw(rows, cols, "int8", 32, rows)
        want = _old_int8_pack(kernel, raw, rows, cols)
        _same_bytes(kernel.pack(raw, rows, cols), want)
        _same_bytes(kernel.pack(raw.to(CUDA), rows, cols), want)
