"""GPT-OSS specifics: MXFP4 dequantization and the clamped GLU against transformers' own
functions, an MXFP4 checkpoint converted and run (resident, streamed, int8), router
lookahead with the router's bias, and the pieces a wrong implementation would miss
(sinks, the sliding window, the clamp) shown to matter on the tiny model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from tiny import build, gpt_oss_config, save_tokenizer

import flint
from flint.convert import ConvertOptions, convert
from flint.models import FtwSource, SafetensorsSource, load_model
from flint.models.config import ExpertActivation
from flint.models.loading import Placement
from flint.models.mlp import activate
from flint.models.moe import ResidentExperts, route
from flint.models.mxfp4 import dequantize_mxfp4
from flint.models.norm import rms_norm
from flint.models.quant_experts import QuantizedResidentExperts
from flint.stream.lookahead import Lookahead
from flint.stream.plan import GIB

CPU = torch.device("cpu")
PROMPTS = ([5, 17, 250, 3, 99], list(range(40, 77)), [11])


def _random_mxfp4(shape: tuple[int, ...], g: torch.Generator) -> tuple[torch.Tensor, ...]:
    """Blocks [*shape, G, 16] and scales [*shape, G] of a random MXFP4 tensor whose
    values stay O(0.1-1) (scales 2**-4 .. 2**-1)."""
    *rows, cols = shape
    groups = cols // 32
    blocks = torch.randint(0, 256, (*rows, groups, 16), generator=g, dtype=torch.uint8)
    scales = torch.randint(123, 127, (*rows, groups), generator=g, dtype=torch.uint8)
    return blocks, scales


def test_mxfp4_dequantization_equals_transformers() -> None:
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    g = torch.Generator().manual_seed(0)
    blocks = torch.randint(0, 256, (3, 10, 4, 16), generator=g, dtype=torch.uint8)
    scales = torch.randint(0, 256, (3, 10, 4), generator=g, dtype=torch.uint8)  # every exponent
    for dtype in (torch.bfloat16, torch.float32):
        want = convert_moe_packed_tensors(blocks, scales, dtype=dtype)  # [3, 128, 10]
        got = dequantize_mxfp4(blocks, scales, dtype)  # [3, 10, 128]
        assert torch.equal(got.transpose(1, 2), want)
    # bf16 holds every MXFP4 value exactly: the converter's choice of bf16 loses nothing
    finite = scales.clamp(max=200)
    assert torch.equal(
        dequantize_mxfp4(blocks, finite).float(), dequantize_mxfp4(blocks, finite, torch.float32)
    )
    with pytest.raises(ValueError, match="do not match"):
        dequantize_mxfp4(blocks, scales[..., :3])


def test_clamped_glu_equals_transformers() -> None:
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssExperts

    experts = GptOssExperts(gpt_oss_config(swiglu_limit=7.0))
    g = torch.Generator().manual_seed(1)
    gate_up = 6 * torch.randn(50, 32, generator=g)  # well past +-7 in places
    want = experts._apply_gate(gate_up)
    got = activate(ExpertActivation("gpt_oss", 1.702, 7.0), gate_up[:, 0::2], gate_up[:, 1::2])
    assert torch.equal(got, want)
    assert (gate_up.abs() > 7).any(), "the clamp was exercised"


def _mxfp4_checkpoint(src: Path, dst: Path) -> Any:
    """The tiny GPT-OSS checkpoint at ``src`` with random MXFP4 experts written as
    ``*_blocks``/``*_scales`` to ``dst``; returns transformers' model holding the same
    experts dequantized by transformers (fp32)."""
    import transformers as tf
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    model = tf.AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    model.eval()
    cfg = model.config
    e, h, i = cfg.num_local_experts, cfg.hidden_size, cfg.intermediate_size
    tensors = load_file(src / "model.safetensors")
    g = torch.Generator().manual_seed(2)
    for n, layer in enumerate(model.model.layers):
        p = f"model.layers.{n}.mlp.experts."
        for name, rows, cols in (("gate_up_proj", 2 * i, h), ("down_proj", h, i)):
            blocks, scales = _random_mxfp4((e, rows, cols), g)
            del tensors[p + name]
            tensors[p + name + "_blocks"], tensors[p + name + "_scales"] = blocks, scales
            with torch.no_grad():  # [E, in, out] as transformers holds them
                getattr(layer.mlp.experts, name).copy_(
                    convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)
                )
    dst.mkdir()
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    for f in src.iterdir():
        if f.name != "model.safetensors":
            (dst / f.name).write_bytes(f.read_bytes())
    config = json.loads((dst / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "mxfp4"}  # as the released models say
    (dst / "config.json").write_text(json.dumps(config))
    return model


@pytest.fixture(scope="module")
def mxfp4(
    tiny_tokenizer_json: str, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, dict[str, Path], Any]:
    """(MXFP4 checkpoint, quant -> its .ftw, the transformers reference): the tiny
    GPT-OSS with an expert intermediate size of 32, one MXFP4 group."""
    root = tmp_path_factory.mktemp("mxfp4")
    build("gpt_oss", root / "fp32", seed=0, config=gpt_oss_config(intermediate_size=32))
    save_tokenizer(root / "fp32", tiny_tokenizer_json)
    ref = _mxfp4_checkpoint(root / "fp32", root / "ckpt")
    files = {}
    for quant in ("none", "int8"):
        files[quant] = root / f"{quant}.ftw"
        summary = convert(str(root / "ckpt"), files[quant], ConvertOptions(quant=quant))
        assert summary["experts"]["source_dtype"] == "bf16"
    return root / "ckpt", files, ref


def _logits(model: Any, prompt: list[int]) -> torch.Tensor:
    model.reset()
    return model.forward(torch.tensor(prompt), all_logits=True)  # type: ignore[no-any-return]


def test_mxfp4_checkpoint_and_its_conversion_match_transformers(
    mxfp4: tuple[Path, dict[str, Path], Any],
) -> None:
    ckpt, files, ref = mxfp4
    direct = load_model(SafetensorsSource(ckpt), CPU, torch.float32, 64)
    converted = load_model(FtwSource(files["none"]), CPU, torch.float32, 64)
    for prompt in PROMPTS:
        with torch.no_grad():
            want = ref(torch.tensor([prompt])).logits[0]
        assert (_logits(direct, prompt) - want).abs().max().item() <= 1e-4
        assert torch.equal(_logits(converted, prompt), _logits(direct, prompt))


def _slab_gib(path: Path, slots: int) -> float:
    with flint.LLM(path, device="cpu", context_length=8) as llm:
        lay = llm.source.expert_layout  # type: ignore[attr-defined]
        layers = sum(llm.model.config.sparse_layers)
    return float(slots * layers * lay.slab_bytes / GIB)


@pytest.mark.parametrize("quant", ["none", "int8"])
def test_streamed_mxfp4_conversion_equals_resident_bit_for_bit(
    quant: str, mxfp4: tuple[Path, dict[str, Path], Any]
) -> None:
    path = mxfp4[1][quant]
    kw: dict[str, Any] = {"device": "cpu", "context_length": 64}
    with (
        flint.LLM(path, **kw) as resident,
        flint.LLM(path, ram_budget=_slab_gib(path, 1), lookahead=2, **kw) as streamed,
    ):
        for prompt in PROMPTS:
            assert torch.equal(_logits(streamed.model, prompt), _logits(resident.model, prompt))
            for step in (11, 42):
                want = resident.model.forward(torch.tensor([step]))
                assert torch.equal(streamed.model.forward(torch.tensor([step])), want)
        stats = streamed.stats()
    assert stats is not None and stats["demands"] > 0 and stats["predictions"] > 0


@pytest.mark.parametrize("mode", ["dequant", "auto"])
def test_int8_experts_equal_their_dequantized_weights(
    mode: str, mxfp4: tuple[Path, dict[str, Path], Any]
) -> None:
    """The quantized backend (biases, clamped GLU around torch's int8 kernel or
    dequantize-then-matmul) against float experts holding the same dequantized weights."""
    source = FtwSource(mxfp4[1]["int8"])
    config = load_model(source, CPU, torch.float32, 8).config
    place = Placement(CPU, torch.float32)
    quant = QuantizedResidentExperts(config, source, place, mode)
    floats = ResidentExperts(config, source, place)  # FtwSource.expert: dequantized f32
    g = torch.Generator().manual_seed(4)
    x = torch.randn(9, config.hidden_size, generator=g)
    router, bias = (source.tensor(f"model.layers.1.mlp.router.{n}") for n in ("weight", "bias"))
    ids, weights = route(x, router, config, bias)
    want = floats(1, x, ids, weights)
    if mode == "dequant":
        assert torch.equal(quant(1, x, ids, weights), want)
    else:
        err = (quant(1, x, ids, weights) - want).abs().max().item()
        assert err <= 0.02 * want.abs().max().item()  # the kernel's rounding only


def test_lookahead_adds_the_router_bias_and_predicts_the_routers_choice() -> None:
    g = torch.Generator().manual_seed(3)
    hidden, experts, k = 32, 8, 2
    config = load_config_for_routing(k)
    look = Lookahead(depth=1, top_k=k, eps=1e-5)
    norm, router = 1 + 0.1 * torch.randn(hidden, generator=g), torch.randn(experts, hidden)
    bias = 3 * torch.randn(experts, generator=g)  # large: changes the choice
    look.add_layer(0, torch.ones(hidden), torch.randn(experts, hidden))
    look.add_layer(1, norm, router, bias=bias)
    h = torch.randn(1, hidden, generator=g)
    _, logits = look.logits(0, h)
    xn = rms_norm(h, norm, 1e-5)
    torch.testing.assert_close(logits[0], F.linear(xn, router, bias)[0], rtol=1e-5, atol=1e-5)
    ids, weights = route(xn, router, config, bias)
    assert look.pending == {} and {e for _, e, _, _ in look.predict(0, h)} == set(ids[0].tolist())
    torch.testing.assert_close(weights.sum(-1), torch.ones(1))


def load_config_for_routing(k: int) -> Any:
    from flint.models import parse_config

    hf = gpt_oss_config(num_experts_per_tok=k).to_dict()
    return parse_config(hf)


def test_sinks_window_and_clamp_each_change_the_logits(
    tiny_models: dict[str, tuple[Path, Any]],
) -> None:
    """The reference tests would catch a model without them: each one, taken out,
    moves the tiny model's logits far past the 1e-4 tolerance."""
    path, ref = tiny_models["gpt_oss"]
    prompt = PROMPTS[1]  # 37 tokens: past the window of 4
    with torch.no_grad():
        want = ref(torch.tensor([prompt])).logits[0]

    def error(change: Any) -> float:
        model = load_model(SafetensorsSource(path), CPU, torch.float32, 64)
        for layer in model.layers:
            change(layer)
        return float((_logits(model, prompt) - want).abs().max().item())

    assert error(lambda layer: None) <= 1e-4
    assert error(lambda layer: layer.attn.sinks.zero_()) > 1e-2
    assert error(lambda layer: setattr(layer.attn, "window", 0)) > 1e-2
    unclamped = ExpertActivation("gpt_oss", 1.702, 1e9)
    assert error(lambda layer: setattr(layer.mlp.backend.math, "act", unclamped)) > 1e-2
