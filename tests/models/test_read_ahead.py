"""Reading ahead of the wait (issue 10, ``moe_kernel.AHEAD``): under dependent launch a
kernel of the resident step reads what the kernels two or more back wrote (and its
constants) before it waits for the kernel just before. Only when the loads are issued
changes, so each kernel gives the same bits either way. In the interpreter there is no
dependent launch: ``AHEAD_WITHOUT_PDL`` turns the early reads on alone (the CUDA test
of dependent launch, test_graphs.py, compares the captured step with and without)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from test_graphs import _decode, _slabs

import flint
from flint.graphs import fused, moe_kernel
from flint.graphs.decode import GraphDecoder
from flint.graphs.moe_kernel import moe_experts, slab_pool


def _both(monkeypatch: pytest.MonkeyPatch, run: Callable[[], object]) -> tuple[object, object]:
    """``run()`` reading ahead, then as before."""
    got = []
    for on in (True, False):
        monkeypatch.setattr(moe_kernel, "AHEAD_WITHOUT_PDL", on)
        got.append(run())
    return got[0], got[1]


def _same(a: object, b: object) -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))  # NaN and -0 too
    else:
        assert isinstance(a, (tuple, list)) and isinstance(b, (tuple, list))
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _same(x, y)


def _spy(monkeypatch: pytest.MonkeyPatch, name: str, switch: str) -> list[int]:
    """The ``switch`` argument of each launch of moe_kernel's kernel ``name`` from here
    on (each launch then made as asked)."""
    launched: list[int] = []
    kernel = getattr(moe_kernel, name)

    class Spy:
        def __getitem__(self, grid: object) -> Callable[..., None]:
            def launch(*args: object, **kw: int) -> None:
                launched.append(kw[switch])
                kernel[grid](*args, **kw)

            return launch

    monkeypatch.setattr(moe_kernel, name, Spy())
    return launched


def test_read_ahead_only_where_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    """``ahead`` names a kernel's early reads under dependent launch only (or with
    ``AHEAD_WITHOUT_PDL``), and only for kernels in ``AHEAD``."""
    monkeypatch.setattr(moe_kernel, "_pdl_capable", lambda index: True)
    gpu, cpu = torch.device("cuda", 0), torch.device("cpu")
    assert moe_kernel.ahead("down", gpu) == {}
    with moe_kernel.dependent_launch():
        assert moe_kernel.ahead("down", gpu) == {"AHEAD": True}
        assert moe_kernel.ahead("down", cpu) == {}
        monkeypatch.setattr(moe_kernel, "AHEAD", frozenset({"norm"}))
        assert moe_kernel.ahead("down", gpu) == {}
        assert moe_kernel.ahead("norm", gpu) == {"AHEAD": True}
    monkeypatch.setattr(moe_kernel, "AHEAD_WITHOUT_PDL", True)
    assert moe_kernel.ahead("norm", cpu) == {"AHEAD": True}


@pytest.mark.interpreter
@pytest.mark.parametrize(
    ("hidden", "inter", "group"),
    [(32, 768, 32), (16, 1000, 8), (16, 1104, 8), (48, 40, 8)],
)
def test_down_reads_its_rows_ahead_to_the_same_bits(
    hidden: int, inter: int, group: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """int4 words: down's rows read whole before the wait (3 whole tiles, 4 with a
    masked last one, 1 masked) give the bits of the loop; rows of 5 tiles keep the loop."""
    # fewer, larger programs than on a GPU: the interpreter's time goes by program
    monkeypatch.setattr(moe_kernel, "WORDS_GATE_UP_BLOCK", (128, 512, 4))
    monkeypatch.setattr(moe_kernel, "WORDS_DOWN_BLOCK", (64, 256, 4))
    torch.manual_seed(inter)
    experts, k = 3, 2
    shapes = ((inter, hidden), (inter, hidden), (hidden, inter))
    slabs, offsets, _ = _slabs("int4", experts, shapes, group)
    pool = slab_pool(slabs, "int4", group, shapes, offsets)
    x = (torch.randn(2, hidden) / hidden**0.5).bfloat16()
    ids = torch.stack([torch.randperm(experts)[:k] for _ in range(2)])
    w = torch.rand(2, k).bfloat16()
    launched = _spy(monkeypatch, "down_kernel", "AHEAD")
    on, off = _both(monkeypatch, lambda: moe_experts(x, ids, w, pool))
    assert isinstance(on, torch.Tensor) and torch.isfinite(on).all()
    _same(on, off)
    tiles = -(-inter // 256)
    assert launched == [tiles if tiles <= 4 else 0, 0]


@pytest.mark.interpreter
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_attention_reads_its_position_ahead_to_the_same_bits(
    dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The position read before the wait: the same bits in the first block, at its
    edges, past it, and in a later chunk (the chunks past the position empty)."""
    heads, kv_heads, dim, ctx = 8, 2, 32, 800
    torch.manual_seed(1)
    q = torch.randn(heads, 1, dim).to(dtype)
    keys, values = (torch.randn(kv_heads, ctx, dim).to(dtype) for _ in range(2))
    parts = fused.attention_parts(heads, dim, ctx, torch.device("cpu"))
    for position, span in [(0, 256), (5, 256), (63, 256), (64, 256), (130, 256), (300, 512),
                           (511, 512), (520, 768)]:  # fmt: skip

        def run(position: int = position, span: int = span) -> torch.Tensor:
            out = torch.full((1, heads * dim), float("nan"), dtype=dtype)
            at = torch.tensor([position])
            return fused.decode_attention(q, keys, values, at, span, out, parts).clone()

        on, off = _both(monkeypatch, run)
        assert isinstance(on, torch.Tensor) and torch.isfinite(on).all(), position
        _same(on, off)


@pytest.mark.interpreter
def test_norms_and_products_read_ahead_to_the_same_bits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The norms with their weights read ahead (GPT-OSS's fp32 weight too, the residual
    add, the router's launch), int8 and bf16 products with scales, biases and a
    residual: the same bits."""
    torch.manual_seed(2)
    eps = 1e-6
    h, delta = torch.randn(1, 200).bfloat16(), torch.randn(1, 200).bfloat16()
    weight = torch.randn(200).bfloat16()
    router = torch.randn(40, 200).bfloat16()
    for w32 in (False, True):
        _same(*_both(monkeypatch, lambda w32=w32: fused.rms_norm(h, weight, eps, w32)))
        _same(*_both(monkeypatch, lambda w32=w32: fused.add_rms_norm(h, delta, weight, eps, w32)))
        _same(*_both(monkeypatch, lambda w32=w32: fused.norm_linear(h, weight, eps, router, w32)))
    x = torch.randn(1, 300).bfloat16()
    w8 = torch.randint(-127, 128, (70, 300), dtype=torch.int8)
    scale, bias = torch.rand(70) / 100, torch.randn(70).bfloat16()
    residual = torch.randn(1, 70).bfloat16()
    wb = torch.randn(70, 300).bfloat16()
    _same(*_both(monkeypatch, lambda: fused.linear(x, w8, bias, residual, scale)))
    _same(*_both(monkeypatch, lambda: fused.linear(x, wb, bias, residual)))
    _same(*_both(monkeypatch, lambda: fused.linear(x, wb)))


@pytest.mark.interpreter
def test_qkv_after_the_wait_gives_the_same_bits(monkeypatch: pytest.MonkeyPatch) -> None:
    """``fused.QKV_AFTER_WAIT`` (a q/k/v-shaped bf16 product's whole rows read after the
    wait, four a program instead of two) changes when and by which program each row is
    read, not its sum: the same bits, with and without a residual."""
    torch.manual_seed(3)
    x, w = torch.randn(1, 300).bfloat16(), torch.randn(1100, 300).bfloat16()
    residual = torch.randn(1, 1100).bfloat16()
    real, launches = fused.linear_kernel, []

    class Spy:  # the launch's arguments, then the real launch
        def __getitem__(self, grid: tuple[int]) -> Callable[..., object]:
            def launch(*args: object, **kwargs: object) -> object:
                launches.append((grid, kwargs))
                return real[grid](*args, **kwargs)

            return launch

    monkeypatch.setattr(fused, "linear_kernel", Spy())
    got = []
    for on in (False, True):
        monkeypatch.setattr(fused, "QKV_AFTER_WAIT", on)
        got.append((fused.linear(x, w), fused.linear(x, w, residual=residual)))
    _same(got[0], got[1])
    told = [(g, k["FIRST_AHEAD"], k["BN"], k["num_warps"]) for g, k in launches]
    assert told == [((550,), True, 2, 4)] * 2 + [((275,), False, 4, 8)] * 2


@pytest.mark.interpreter
def test_the_int4_step_reads_ahead_to_the_same_bits(
    wide_files: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The whole step on int4 slab experts (every kernel reading ahead): the same
    tokens and logits, bit for bit, as the step without."""
    from flint.graphs.slab_experts import SlabResidentExperts
    from flint.models.loading import Placement

    path = wide_files["int4"]
    prompt = [5, 17, 250, 3, 99, 42, 7, 7, 120]
    with flint.LLM(path, device="cpu", dtype="bfloat16", context_length=64) as plain:
        config, source = plain.model.config, plain.source
        backend = SlabResidentExperts(
            config, source, Placement(torch.device("cpu"), torch.bfloat16)
        )
    with flint.LLM(
        path, device="cpu", dtype="bfloat16", context_length=64, expert_backend=backend
    ) as slabs:
        model = slabs.model

        def run() -> tuple[list[int], torch.Tensor]:
            model.decoder = GraphDecoder(model, backend.pools, capture=False)
            return _decode(model, prompt, 3)

        on, off = _both(monkeypatch, run)
    assert on[0] == off[0]
    _same(on[1], off[1])


def _gate_up_whole_agrees(
    hidden: int,
    inter: int,
    group: int,
    device: torch.device,
    monkeypatch: pytest.MonkeyPatch,
    dtype: torch.dtype = torch.bfloat16,
) -> None:
    """int4 words: gate/up with every tile of its rows loaded at once
    (``WHOLE_GATE_UP``) and with the loop, the same bits; rows of five tiles keep the
    loop, and byte tiles (groups under 8) never load at once. In fp32 gate and up
    reach the output unrounded, so a changed order of their sums would show."""
    torch.manual_seed(hidden + group)
    experts, k, tokens = 3, 2, 2
    shapes = ((inter, hidden), (inter, hidden), (hidden, inter))
    slabs, offsets, _ = _slabs("int4", experts, shapes, group)
    pool = slab_pool(slabs.to(device), "int4", group, shapes, offsets)
    x = (torch.randn(tokens, hidden) / hidden**0.5).to(dtype).to(device)
    ids = torch.stack([torch.randperm(experts)[:k] for _ in range(tokens)]).to(device)
    w = torch.rand(tokens, k).to(dtype).to(device)
    launched = _spy(monkeypatch, "gate_up_kernel", "WHOLE")
    got = []
    for whole in (True, False):
        monkeypatch.setattr(moe_kernel, "WHOLE_GATE_UP", whole)
        got.append(moe_experts(x, ids, w, pool))
    assert torch.isfinite(got[0]).all()
    _same(got[0], got[1])
    tiles = -(-hidden // max(moe_kernel.words_gate_up_block(hidden)[1], group))
    assert launched == [tiles if tiles <= 4 and group >= 8 else 0, 0]


# gate/up's default block (two warps, whole rows of up to 2,048 columns in one tile), the
# one warp and 1,024 columns of the twenty-fifth session, and the four warps and 512
# columns of before, which rows wider than ``NARROW_COLS`` still take
BLOCKS = [None, (4, 1024, 1), (4, 512, 4)]


@pytest.mark.interpreter
@pytest.mark.parametrize("block", BLOCKS)
@pytest.mark.parametrize(
    ("hidden", "inter", "group"),
    [(2048, 32, 32), (1000, 16, 8), (1536, 64, 64), (24, 48, 8), (2560, 32, 32), (64, 32, 4)],
)
def test_gate_up_loads_its_rows_at_once_to_the_same_bits(
    hidden: int,
    inter: int,
    group: int,
    block: tuple[int, int, int] | None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The default block: one whole tile; one masked (three times); rows wider than
    2,048 (the four-warp block's five tiles: the loop); byte tiles (the loop). With
    1,024 columns a tile: two whole tiles; one masked; two, the last masked; one masked.
    With 512: four whole tiles; two, the last masked; three whole ones; one masked one;
    the same loops."""
    monkeypatch.setattr(moe_kernel, "WORDS_DOWN_BLOCK", (64, 256, 4))
    if block is not None:
        monkeypatch.setattr(moe_kernel, "WORDS_GATE_UP_BLOCK", block)
    _gate_up_whole_agrees(hidden, inter, group, torch.device("cpu"), monkeypatch)


@pytest.mark.gpu
@pytest.mark.parametrize("block", BLOCKS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize(
    ("hidden", "inter", "group"), [(2048, 768, 32), (1536, 64, 64), (1000, 64, 8)]
)
def test_gate_up_loads_its_rows_at_once_to_the_same_bits_on_cuda(
    hidden: int,
    inter: int,
    group: int,
    dtype: torch.dtype,
    block: tuple[int, int, int] | None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same compiled: the tiles' layouts, and so the sums' order, must not change
    (one whole tile, then one masked, twice; with 1,024 columns a tile two, two with
    the last masked, and one masked; with 512 four, three, and two)."""
    if block is not None:
        monkeypatch.setattr(moe_kernel, "WORDS_GATE_UP_BLOCK", block)
    _gate_up_whole_agrees(hidden, inter, group, torch.device("cuda"), monkeypatch, dtype)


def test_rows_wider_than_one_tile_take_the_four_warp_block() -> None:
    narrow, wide = moe_kernel.WORDS_GATE_UP_BLOCK, moe_kernel.WORDS_GATE_UP_WIDE
    assert narrow[1] >= moe_kernel.NARROW_COLS and wide[2] == 4  # narrow: whole rows
    assert moe_kernel.words_gate_up_block(moe_kernel.NARROW_COLS) == narrow
    assert moe_kernel.words_gate_up_block(moe_kernel.NARROW_COLS + 1) == wide


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize(
    "block", [(4, 1024, 1), (4, 512, 4), (4, 512, 1), (4, 2048, 1), (2, 1024, 1)]
)
def test_gate_up_blocks_against_the_default_on_cuda(
    block: tuple[int, int, int], dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    """int4 words' gate/up at other blocks than the default (two warps a program, four
    rows, whole rows of 2,048 columns), the one warp and the four warps of before among
    them, in the 30B-A3B's shapes. The groups' partial sums add in an order that
    follows the block's layout (gpu142: (2, 1024, 1) differs in fp32 too), so in fp32,
    where gate and up reach the output unrounded, within a rounding; in bf16 the same
    bits for this seed (gpu139, gpu140, gpu142, gpu149's bench)."""
    torch.manual_seed(11)
    gpu = torch.device("cuda")
    hidden, inter, group, experts = 2048, 768, 32, 4
    shapes = ((inter, hidden), (inter, hidden), (hidden, inter))
    slabs, offsets, _ = _slabs("int4", experts, shapes, group)
    pool = slab_pool(slabs.to(gpu), "int4", group, shapes, offsets)
    x = (torch.randn(1, hidden) / hidden**0.5).to(dtype).to(gpu)
    ids = torch.randperm(experts)[:2].view(1, 2).to(gpu)
    w = torch.rand(1, 2).to(dtype).to(gpu)
    want = moe_experts(x, ids, w, pool)
    default = moe_kernel.WORDS_GATE_UP_BLOCK
    monkeypatch.setattr(moe_kernel, "WORDS_GATE_UP_BLOCK", block)
    got = moe_experts(x, ids, w, pool)
    assert torch.isfinite(got).all()
    assert block != default
    if dtype == torch.bfloat16:
        _same(got, want)
    else:
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
