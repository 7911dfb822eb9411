"""FP8 block-scaled checkpoints (DeepSeek-V3's release format) and the extra
next-token-prediction layer: a tiny synthetic FP8 checkpoint converts, its weights come
back as ``fp8 * scale_inv`` per 128 x 128 block, and the model matches transformers run
on those dequantized weights."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file
from tiny import build, deepseek_v3_config, save_tokenizer

from flint.convert import ConvertOptions, convert
from flint.format import FtwFile
from flint.models import FtwSource, SafetensorsSource, load_model
from flint.models.fp8 import FP8_BLOCK, dequantize_fp8

CPU = torch.device("cpu")
FP8_MAX = 448.0  # largest finite float8_e4m3fn


def quantize_fp8(w: torch.Tensor, block: int = FP8_BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """The test's own block quantizer: (fp8 [R, C], scale_inv [ceil(R/b), ceil(C/b)])."""
    rows, cols = w.shape
    scale = torch.empty(-(-rows // block), -(-cols // block))
    q = torch.empty(rows, cols, dtype=torch.float8_e4m3fn)
    for i in range(scale.shape[0]):
        for j in range(scale.shape[1]):
            part = w[i * block : (i + 1) * block, j * block : (j + 1) * block].float()
            s = part.abs().max().clamp(min=1e-12) / FP8_MAX
            scale[i, j] = s
            q[i * block : (i + 1) * block, j * block : (j + 1) * block] = (part / s).to(
                torch.float8_e4m3fn
            )
    return q, scale


def test_dequantize_spreads_each_scale_over_its_block() -> None:
    torch.manual_seed(0)
    w = torch.randn(300, 200) * 3
    q, scale = quantize_fp8(w)
    assert scale.shape == (3, 2)
    got = dequantize_fp8(q, scale)
    assert got.dtype == torch.bfloat16
    for r, c in [(0, 0), (127, 127), (128, 0), (299, 199), (200, 150), (5, 130)]:
        want = (q[r, c].float() * scale[r // 128, c // 128]).to(torch.bfloat16)
        assert got[r, c] == want, (r, c)
    assert (got.float() - w).abs().max().item() <= 0.07 * w.abs().max().item()
    with pytest.raises(ValueError, match="scale_inv"):
        dequantize_fp8(q, scale[:2])


def _is_quantized(name: str, t: torch.Tensor) -> bool:
    """What DeepSeek's release stores in FP8: the 2-D linear weights (not embeddings, the
    head, norms or the router)."""
    skip = ("embed_tokens", "lm_head", "norm", "mlp.gate.weight")
    return t.ndim == 2 and name.endswith(".weight") and not any(s in name for s in skip)


@pytest.fixture(scope="module")
def fp8_checkpoint(
    tmp_path_factory: pytest.TempPathFactory, tiny_tokenizer_json: str
) -> tuple[Path, Path, Any]:
    """(FP8 checkpoint with an extra layer at num_hidden_layers, the same model's
    dequantized fp32 checkpoint, transformers loaded from the latter)."""
    import transformers as tf

    root = tmp_path_factory.mktemp("fp8")
    src = root / "src"
    build("deepseek_v3", src, seed=4, config=deepseek_v3_config(hidden_size=160))
    tensors = load_file(src / "model.safetensors")
    layers = json.loads((src / "config.json").read_text())["num_hidden_layers"]
    fp8: dict[str, torch.Tensor] = {}
    dequant: dict[str, torch.Tensor] = {}
    for name, t in tensors.items():
        if _is_quantized(name, t):
            q, scale = quantize_fp8(t)
            fp8[name], fp8[name + "_scale_inv"] = q, scale
            dequant[name] = dequantize_fp8(q, scale).float()
        else:
            fp8[name] = dequant[name] = t
    # the next-token-prediction module, stored as one more layer (never run)
    mtp = f"model.layers.{layers}."
    q, scale = quantize_fp8(torch.randn(160, 320))
    fp8[mtp + "eh_proj.weight"], fp8[mtp + "eh_proj.weight_scale_inv"] = q, scale
    fp8[mtp + "mlp.experts.0.gate_proj.weight"] = torch.randn(16, 160)
    fp8[mtp + "enorm.weight"] = torch.ones(160)
    for d, data in ((root / "fp8", fp8), (root / "dequant", dequant)):
        d.mkdir()
        save_file(data, d / "model.safetensors", metadata={"format": "pt"})
        shutil.copy(src / "config.json", d / "config.json")
        save_tokenizer(d, tiny_tokenizer_json)
    ref = tf.AutoModelForCausalLM.from_pretrained(root / "dequant", dtype=torch.float32)
    return root / "fp8", root / "dequant", ref.eval()


def test_fp8_checkpoint_converts_to_its_dequantized_weights(
    fp8_checkpoint: tuple[Path, Path, Any], tmp_path: Path
) -> None:
    fp8, dequant, _ = fp8_checkpoint
    out = tmp_path / "m.ftw"
    summary = convert(str(fp8), out, ConvertOptions(quant="none"))
    assert summary["skipped_tensors"] == 4  # the extra layer's tensors, scale included
    assert summary["experts"]["source_fp8"] is True
    want = load_file(dequant / "model.safetensors")
    with FtwFile(out) as f:
        assert not any(".layers.3." in n or n.endswith("_scale_inv") for n in f.tensors)
        name = "model.layers.1.self_attn.kv_b_proj.weight"
        assert f.tensor(name).dtype == torch.bfloat16
        assert torch.equal(f.tensor(name).float(), want[name])
        assert torch.equal(f.tensor("model.norm.weight"), want["model.norm.weight"])
    src = FtwSource(out)
    expert = src.expert(2, 5)
    assert torch.equal(expert.down.float(), want["model.layers.2.mlp.experts.5.down_proj.weight"])
    src.close()


@pytest.mark.parametrize("kind", ["ftw", "checkpoint"])
def test_fp8_model_matches_transformers_on_dequantized_weights(
    fp8_checkpoint: tuple[Path, Path, Any], tmp_path: Path, kind: str
) -> None:
    fp8, _, ref = fp8_checkpoint
    if kind == "ftw":
        convert(str(fp8), tmp_path / "m.ftw", ConvertOptions(quant="none"))
        source: Any = FtwSource(tmp_path / "m.ftw")
    else:
        source = SafetensorsSource(fp8)  # read directly: dequantized at load
    model = load_model(source, CPU, torch.float32, context_length=64)
    for prompt in ([5, 17, 250, 3, 99], list(range(40, 70))):
        with torch.no_grad():
            want = ref(torch.tensor([prompt])).logits[0]
        model.reset()
        got = model.forward(torch.tensor(prompt), all_logits=True)
        assert (got - want).abs().max().item() <= 1e-4
        assert want.abs().max().item() > 1.0


def test_fp8_weight_without_its_scale_is_refused(tmp_path: Path) -> None:
    from flint.convert.source import Checkpoint

    d = tmp_path / "ck"
    d.mkdir()
    save_file({"w.weight": torch.zeros(4, 4, dtype=torch.float8_e4m3fn)}, d / "model.safetensors")
    (d / "config.json").write_text("{}")
    ck = Checkpoint.open(d)
    with pytest.raises(ValueError, match="scale_inv"):
        ck.get("w.weight")
