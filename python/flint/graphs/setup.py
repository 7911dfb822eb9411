"""Which models decode through CUDA graphs, and the wiring that makes them."""

from __future__ import annotations

from flint.graphs import check_graph_mode
from flint.graphs.decode import GraphDecoder, expert_pools, model_unsupported, unsupported
from flint.graphs.moe_kernel import ACTIVATIONS, available, slab_unsupported
from flint.graphs.slab_experts import SlabResidentExperts
from flint.graphs.streamed import StreamedDecoder
from flint.models.config import ModelConfig
from flint.models.loading import Placement
from flint.models.moe import ExpertBackend
from flint.models.quant_experts import PackedExpertSource
from flint.models.quant_linear import Notice, stderr_notice
from flint.models.transformer import MoEModel
from flint.models.weights import WeightSource
from flint.stream.backend import StreamedExperts


def family_unsupported(config: ModelConfig) -> str | None:
    """Why ``config``'s family has no graph step (None: it has one)."""
    if config.linear_attention:
        return f"{config.family}'s linear-attention layers"
    if config.attn_output_gate:
        return f"{config.family}'s attention"
    if config.expert_act.kind not in ACTIVATIONS:
        return f"{config.family}'s expert activation {config.expert_act.kind!r}"
    return available()


def resident_backend(
    config: ModelConfig, source: WeightSource, place: Placement, mode: str
) -> ExpertBackend | None:
    """The resident backend a graph step computes from, when ``mode`` asks for one and
    the model is covered: int8/int4 experts kept as the file's slabs; None otherwise
    (float experts: the usual resident backend has them stacked already)."""
    check_graph_mode(mode)
    if mode == "off" or place.device.type != "cuda" or len(place.devices) > 1:
        return None
    if family_unsupported(config) is not None or not isinstance(source, PackedExpertSource):
        return None
    layout = source.expert_layout
    if layout is None or layout.scheme not in ("int8", "int4"):
        return None
    if slab_unsupported(layout.scheme, layout.group_size) is not None:
        return None  # the usual quantized backend; attach_decoder says why, if asked
    return SlabResidentExperts(config, source, place)


def streamed_unsupported(model: MoEModel, mode: str) -> str | None:
    """None when ``model`` (its experts streamed) can decode through ``StreamedDecoder``
    in ``mode``, else why not. In "auto", ``deterministic`` streaming keeps the general
    path: its output is bit-identical to a resident ``--graphs off`` run, the step's
    dense ops only within rounding ("on" and "eager" ask for the step regardless)."""
    why = model_unsupported(model)
    if why is None and mode == "auto" and getattr(model.experts, "deterministic", False):
        return "deterministic streaming keeps the general path"
    return why


def attach_decoder(
    model: MoEModel,
    mode: str,
    notice: Notice = stderr_notice,
    source: WeightSource | None = None,
) -> str | None:
    """Gives ``model`` a graph decode step as ``mode`` says; returns why not when it
    has none (mode "on" raises instead): ``GraphDecoder`` for resident experts,
    ``StreamedDecoder`` for streamed ones. In "auto", a step that fails to build (GPU
    memory for its buffers), compile or capture leaves the model eager, with one line
    to ``notice``. ``source``: the
    model's weights, whose int8-stored attention matrices the step reads as stored."""
    check_graph_mode(mode)
    if mode == "off":
        return "graphs off"
    streamed = isinstance(model.experts, StreamedExperts)
    why = family_unsupported(model.config)
    if why is None:
        why = streamed_unsupported(model, mode) if streamed else unsupported(model, model.experts)
    if why is not None:
        if mode == "on":
            raise ValueError(f"no CUDA graph decode for this model: {why}")
        return why
    decoder: GraphDecoder | None = None
    try:
        if streamed:
            decoder = StreamedDecoder(model, mode != "eager", source)
        else:
            pools = expert_pools(model.experts)
            assert pools is not None
            decoder = GraphDecoder(model, pools, mode != "eager", source)
        if decoder.capture:
            decoder.warm_up()
    except Exception as err:  # GPU memory for its buffers (the int8 attention copies
        # too), a kernel or a capture this GPU refuses: "auto" decodes eagerly
        if mode != "auto":
            raise
        if decoder is not None:
            decoder.close()
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        notice(f"flint: CUDA graph decode failed to start ({reason}); decoding eagerly")
        return reason
    model.decoder = decoder
    return None
