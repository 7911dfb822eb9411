"""Converting tiny transformers checkpoints: every tensor reads back as written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from flint import _core
from flint.convert import ConvertOptions, convert
from flint.convert.experts import map_experts
from flint.convert.source import Checkpoint
from flint.format import FtwFile
from flint.format.quant import decode_projection, encode_projection
from tests.format.conftest import ARCHS


def _source_tensors(d: Path) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for f in sorted(d.glob("*.safetensors")):
        out.update(load_file(f))
    return out


def _check_file(src: Path, ftw: Path, quant: str) -> None:
    tensors = _source_tensors(src)
    ck = Checkpoint.open(src)
    em = map_experts(ck)
    expert_names = em.expert_names()
    with FtwFile(ftw) as f:
        assert set(f.tensors) == set(tensors) - expert_names
        for name, info in f.tensors.items():
            assert torch.equal(f.tensor(name), tensors[name]), name
            assert info.shape == tuple(tensors[name].shape)
        lay = f.layout
        assert lay is not None and lay.n_experts == em.n_experts
        assert len(f.experts()) == em.n_experts * len(em.layers())
        for layer in em.layers():
            for e in range(em.n_experts):
                want = em.load(ck, layer, e)
                got = f.expert(layer, e)
                for w, g in zip(want, got, strict=True):
                    if quant == "none":
                        assert g.dtype == w.dtype and torch.equal(g, w)
                    else:
                        ref = decode_projection(
                            encode_projection(w, quant, 32), quant, "", *w.shape, 32
                        )
                        assert torch.equal(g, ref)
        meta = f.metadata
        assert meta["config"] == json.loads((src / "config.json").read_text())
        assert set(meta["source"]["sha256"]) >= {"config.json"}
    ck.close()


@pytest.mark.parametrize("arch", ARCHS)
def test_convert_each_architecture_exactly(
    arch: str, checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    out = tmp_path / "m.ftw"
    convert(str(checkpoints[arch]), out, ConvertOptions())
    _check_file(checkpoints[arch], out, "none")


@pytest.mark.parametrize("quant", ["int8", "int4"])
def test_convert_quantized_experts(
    quant: str, checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    out = tmp_path / "m.ftw"
    convert(str(checkpoints["qwen3_moe"]), out, ConvertOptions(quant=quant, group_size=16))
    with FtwFile(out) as f:
        assert f.layout is not None and f.layout.scheme == quant
    ck = Checkpoint.open(checkpoints["qwen3_moe"])
    em = map_experts(ck)
    with FtwFile(out) as f:
        w = em.load(ck, 1, 3)
        for src, got in zip(w, f.expert(1, 3), strict=True):
            ref = decode_projection(encode_projection(src, quant, 16), quant, "", *src.shape, 16)
            assert torch.equal(got, ref)
    ck.close()


def test_convert_sharded_checkpoint(checkpoints: dict[str, Path], tmp_path: Path) -> None:
    src = checkpoints["qwen3_moe-sharded"]
    assert len(list(src.glob("*.safetensors"))) > 1
    out = tmp_path / "m.ftw"
    convert(str(src), out, ConvertOptions())
    _check_file(src, out, "none")


def test_convert_fused_expert_keys(checkpoints: dict[str, Path], tmp_path: Path) -> None:
    """The transformers-5 in-memory layout: experts.gate_up_proj [E, 2I, H], down_proj [E, H, I]."""
    src = checkpoints["qwen3_moe"]
    tensors = _source_tensors(src)
    fused = {k: v for k, v in tensors.items() if ".experts." not in k}
    for layer in (1,):
        p = f"model.layers.{layer}.mlp.experts."
        gate = [tensors[f"{p}{e}.gate_proj.weight"] for e in range(4)]
        up = [tensors[f"{p}{e}.up_proj.weight"] for e in range(4)]
        down = [tensors[f"{p}{e}.down_proj.weight"] for e in range(4)]
        fused[p + "gate_up_proj"] = torch.stack(
            [torch.cat([g, u]) for g, u in zip(gate, up, strict=True)]
        )
        fused[p + "down_proj"] = torch.stack(down)
    d = tmp_path / "fused"
    d.mkdir()
    save_file(fused, d / "model.safetensors")
    (d / "config.json").write_text((src / "config.json").read_text())
    convert(str(d), tmp_path / "f.ftw", ConvertOptions())
    convert(str(src), tmp_path / "p.ftw", ConvertOptions())
    with FtwFile(tmp_path / "f.ftw") as f, FtwFile(tmp_path / "p.ftw") as p:
        assert f.experts() == p.experts()
        for e in range(4):
            assert all(
                torch.equal(a, b) for a, b in zip(f.expert(1, e), p.expert(1, e), strict=True)
            )


def test_unsupported_architecture_is_named(checkpoints: dict[str, Path], tmp_path: Path) -> None:
    d = tmp_path / "llama"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "llama"}))
    save_file({"x": torch.zeros(2)}, d / "model.safetensors")
    with pytest.raises(ValueError, match="unsupported architecture 'llama'"):
        convert(str(d), tmp_path / "x.ftw", ConvertOptions())
    assert not (tmp_path / "x.ftw").exists()


def test_missing_source_names_where_it_looked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    with pytest.raises(FileNotFoundError, match=r"looked in:.*models--nobody--nothing"):
        convert("nobody/nothing", tmp_path / "x.ftw", ConvertOptions())


def test_repo_id_resolves_from_the_offline_cache(
    checkpoints: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "hub"
    snap = cache / "models--acme--tiny" / "snapshots" / "abc123"
    snap.parent.mkdir(parents=True)
    snap.symlink_to(checkpoints["olmoe"], target_is_directory=True)
    (cache / "models--acme--tiny" / "refs").mkdir()
    (cache / "models--acme--tiny" / "refs" / "main").write_text("abc123")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    convert("acme/tiny", tmp_path / "o.ftw", ConvertOptions())
    assert FtwFile(tmp_path / "o.ftw").metadata["arch"] == "olmoe"


def test_bad_options_are_rejected(checkpoints: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="--quant"):
        convert(str(checkpoints["mixtral"]), tmp_path / "x.ftw", ConvertOptions(quant="int3"))


def test_dense_int8_quantizes_the_dense_matrices(
    checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    """Attention, shared experts and the LM head; not the embedding or the router."""
    out = tmp_path / "d.ftw"
    convert(str(checkpoints["qwen2_moe"]), out, ConvertOptions(dense_quant="int8"))
    with FtwFile(out) as f:
        q = f.metadata["quant"]["dense"]["tensors"]
        assert "model.layers.0.self_attn.q_proj.weight" in q
        assert "model.layers.0.mlp.shared_expert.up_proj.weight" in q
        assert "lm_head.weight" in q and f.tensors["lm_head.weight"].dtype == "i8"
        assert all("embed" not in n and "mlp.gate." not in n for n in q)
        assert f.tensors["model.layers.0.self_attn.q_proj.weight"].dtype == "i8"
        assert f.tensors["model.layers.0.self_attn.q_proj.weight_scale"].dtype == "f32"


def test_corrupt_file_raises_checksum_error(checkpoints: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "m.ftw"
    convert(str(checkpoints["mixtral"]), out, ConvertOptions())
    with FtwFile(out) as f:
        off = f.tensors["model.embed_tokens.weight"].offset
    data = bytearray(out.read_bytes())
    data[off + 3] ^= 0x10
    out.write_bytes(bytes(data))
    with FtwFile(out) as f, pytest.raises(_core.ChecksumError, match="embed_tokens"):
        f.tensor("model.embed_tokens.weight")


def test_truncated_file_raises_format_error(checkpoints: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "m.ftw"
    convert(str(checkpoints["mixtral"]), out, ConvertOptions())
    out.write_bytes(out.read_bytes()[:-100])
    with pytest.raises(_core.FormatError, match="truncated"):
        FtwFile(out)
