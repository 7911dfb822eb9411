"""The reader from Python: hostile files, the CLI commands, synth, and the GIL."""

from __future__ import annotations

import itertools
import json
import threading
import time
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from flint import _core
from flint.cli import app
from flint.format import FtwFile
from flint.synth import GEOMETRIES, dense_shapes, synth

HOSTILE = Path(__file__).resolve().parents[2] / "crates" / "ftw_format" / "tests" / "hostile"
runner = CliRunner()


def _corpus() -> list[tuple[str, str]]:
    lines = (HOSTILE / "expected.txt").read_text().splitlines()
    return [tuple(line.split()) for line in lines]  # type: ignore[misc]


@pytest.mark.parametrize(("name", "variant"), _corpus())
def test_hostile_file_raises_a_typed_python_error(name: str, variant: str) -> None:
    path = HOSTILE / f"{name}.ftw"
    want = _core.ChecksumError if "Checksum" in variant else _core.FormatError
    with pytest.raises(want):
        f = FtwFile(path, verify_sample=0)
        for t in f.tensors:
            f.tensor(t)
        for layer, e, _, _ in f.experts():
            f.core.verify_expert(layer, e)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("synth") / "tiny.ftw"
    synth("tiny", "int4", out)
    return out


def test_synth_tiny_matches_its_geometry(tiny: Path) -> None:
    f = FtwFile(tiny)
    cfg = GEOMETRIES["tiny"]
    assert f.config == cfg
    assert set(f.tensors) == set(dense_shapes(cfg))
    assert f.layout is not None and f.layout.scheme == "int4"
    assert len(f.experts()) == cfg["num_experts"] * cfg["num_hidden_layers"]
    gate, _up, down = f.expert(3, 15)
    assert gate.shape == (64, 128) and down.shape == (128, 64)
    assert torch.isfinite(gate).all() and gate.abs().max() < 0.1


def test_synth_random_bf16_keeps_its_bits() -> None:
    """The weights' bits as first written (WEIGHTS_REVISION 2): the sign from bit 8 of
    each 16-bit word, the mantissa from its low 7 bits, exponent 120. The function now
    shifts the sign into place; files synthesised before are still the same."""
    from flint.synth import _random_bf16

    for n in (1, 3, 4, 1001, 1 << 16):
        gen = torch.Generator().manual_seed(n)
        bits = torch.empty((n + 3) // 4, dtype=torch.int64).random_(generator=gen)
        x = bits.view(torch.int16)[:n].to(torch.int32)
        want = (x & 0x7F) | (120 << 7) | ((x >> 8) & 1) << 15
        got = _random_bf16(n, torch.Generator().manual_seed(n)).view(torch.int16)
        assert torch.equal(got.to(torch.int32) & 0xFFFF, want), n
        values = got.view(torch.bfloat16).float().abs()
        assert ((values >= 2.0**-7) & (values < 2.0**-6)).all()


def test_synth_stores_dense_int8_as_convert_does(tmp_path: Path) -> None:
    from flint.models.ftw_source import FtwSource

    out = tmp_path / "tiny-int8.ftw"
    r = runner.invoke(app, ["synth", "-o", str(out), "--dense-quant", "int8"])
    assert r.exit_code == 0, r.output
    assert "dense int8" in r.output
    source = FtwSource(out)
    try:
        name = "model.layers.1.self_attn.o_proj.weight"
        stored = source.int8_matrix(name)
        assert stored is not None
        q, scale = stored
        assert q.dtype == torch.int8 and q.shape == dense_shapes(GEOMETRIES["tiny"])[name]
        assert q.min() >= -127 and scale.shape == (q.shape[0],)
        assert torch.equal(source.tensor(name), q.float() * scale[:, None])
        head = source.int8_matrix("lm_head.weight")  # the untied LM head is int8 too
        assert (
            head is not None and head[0].shape == dense_shapes(GEOMETRIES["tiny"])["lm_head.weight"]
        )
        assert source.int8_matrix("model.layers.1.mlp.gate.weight") is None  # the router
    finally:
        source.close()
    r = runner.invoke(app, ["synth", "-o", str(out), "--dense-quant", "int4"])
    assert r.exit_code != 0 and "--dense-quant must be one of none, int8" in r.output


@pytest.mark.parametrize("geometry", ["qwen3-30b-a3b", "mixtral-8x7b", "deepseek-v2-lite"])
def test_big_geometries_have_the_real_sizes(geometry: str) -> None:
    cfg = GEOMETRIES[geometry]
    params = sum(int(torch.tensor(s).prod()) for s in dense_shapes(cfg).values())
    n_exp = cfg.get("num_experts") or cfg.get("num_local_experts") or cfg["n_routed_experts"]
    width = cfg.get("moe_intermediate_size") or cfg["intermediate_size"]
    moe_layers = cfg["num_hidden_layers"] - cfg.get("first_k_dense_replace", 0)
    params += 3 * cfg["hidden_size"] * width * n_exp * moe_layers
    expected = {"qwen3-30b-a3b": 30.5e9, "mixtral-8x7b": 46.7e9, "deepseek-v2-lite": 15.7e9}
    assert abs(params - expected[geometry]) / expected[geometry] < 0.03


def test_cli_inspect_json(tiny: Path) -> None:
    r = runner.invoke(app, ["inspect", str(tiny), "--json"])
    assert r.exit_code == 0, r.output
    info = json.loads(r.output)
    assert info["arch"] == "qwen3_moe" and info["experts"]["scheme"] == "int4"
    assert info["experts"]["count"] == 64 and info["bytes"] == tiny.stat().st_size


def test_cli_verify_ok_then_names_the_corrupt_expert(tiny: Path, tmp_path: Path) -> None:
    assert runner.invoke(app, ["verify", str(tiny)]).exit_code == 0
    f = FtwFile(tiny)
    layer, e, off, _ = f.experts()[37]
    bad = tmp_path / "bad.ftw"
    data = bytearray(tiny.read_bytes())
    data[off + 10] ^= 0xFF
    bad.write_bytes(bytes(data))
    r = runner.invoke(app, ["verify", str(bad)])
    assert r.exit_code == 1
    assert f"expert {e} of layer {layer}" in r.output


def test_cli_errors_are_one_line_not_tracebacks(tmp_path: Path) -> None:
    r = runner.invoke(app, ["inspect", str(tmp_path / "nope.ftw")])
    assert r.exit_code == 1 and "no such model file" in r.output
    r = runner.invoke(app, ["synth", "-o", str(tmp_path / "x.ftw"), "--geometry", "gpt-9"])
    assert r.exit_code == 2 and "unknown geometry" in r.output


def test_reads_release_the_gil(tmp_path: Path) -> None:
    """A long read in one thread must not stop Python code running in another."""
    from flint.format.writer import FtwFileWriter

    path = tmp_path / "big.ftw"
    with FtwFileWriter(path) as w:
        w.add_tensor("big", torch.zeros(96 << 20, dtype=torch.uint8))
        w.finish({})
    f = FtwFile(path)
    stamps: list[float] = []
    th = threading.Thread(target=lambda: [f.core.verify_tensor("big") for _ in range(4)])
    start = time.perf_counter()
    th.start()
    while th.is_alive():
        stamps.append(time.perf_counter())
    busy = time.perf_counter() - start
    th.join()
    # Holding the GIL would stall this loop for nearly all of `busy`; a released GIL
    # leaves only scheduler hiccups (the machine may be loaded, so allow some).
    stalled = sum(g for a, b in itertools.pairwise(stamps) if (g := b - a) > 0.02)
    assert len(stamps) > 100
    assert stalled < 0.5 * busy, (stalled, busy)


def test_cli_synth_layers_keeps_the_first_layers(tmp_path: Path) -> None:
    out = tmp_path / "two.ftw"
    r = runner.invoke(app, ["synth", "-o", str(out), "--quant", "int8", "--layers", "2"])
    assert r.exit_code == 0, r.output
    f = FtwFile(out)
    assert f.config["num_hidden_layers"] == 2
    assert {layer for layer, *_ in f.experts()} == {0, 1}
    assert f.layout is not None and f.layout.scheme == "int8"
    r = runner.invoke(app, ["synth", "-o", str(out), "--layers", "99"])
    assert r.exit_code == 2 and "--layers must be in 1..4" in r.output
