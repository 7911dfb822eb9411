"""``flint.LLM``: load a model once, then generate, stream and chat.

Example::

    import flint

    with flint.LLM("model.ftw") as llm:  # or a Hugging Face checkpoint directory
        print(llm.generate("def fibonacci(n):", max_tokens=64).text)
        for chunk in llm.stream("import os\\n", max_tokens=32, temperature=0.8, seed=1):
            print(chunk.text, end="", flush=True)
        reply = llm.chat([{"role": "user", "content": "Hi!"}],
                         template_kwargs={"enable_thinking": False})
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import torch

from flint.generation import Completion, StreamChunk, collect, generate_stream
from flint.graphs import check_graph_mode
from flint.markup import kept_special
from flint.models import load_model, parse_config
from flint.models.ftw_source import FtwSource
from flint.models.loading import Placement, indexed
from flint.models.moe import ExpertBackend
from flint.models.qwen3_next import ANCHOR_TOKENS
from flint.models.transformer import MoEModel
from flint.models.weights import SafetensorsSource, WeightSource
from flint.sampling import SamplingParams
from flint.tokenizer import Tokenizer

DEFAULT_CONTEXT = 8192  # KV cache positions when the caller does not say (capped by the model)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(device: str | torch.device | None) -> torch.device:
    """CUDA when present, CPU otherwise; ValueError for a device that is not there."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except RuntimeError as err:
        raise ValueError(f"invalid device {device!r}: {err}") from err
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' requested but CUDA is not available")
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"device {device!r} is not supported (cpu or cuda)")
    return dev


def resolve_devices(device: str | torch.device | None) -> list[torch.device]:
    """The devices to run on: one, several named with commas ("cuda:0,cuda:1"), or
    "cuda" for every visible GPU (``CUDA_VISIBLE_DEVICES`` narrows it); the layers are
    then split across them (``flint.models.split``)."""
    if isinstance(device, str) and "," in device:
        devices = [indexed(resolve_device(d.strip())) for d in device.split(",") if d.strip()]
        if len(set(devices)) != len(devices):
            raise ValueError(f"device {device!r} names a device twice")
        if len({d.type for d in devices}) != 1:
            raise ValueError(f"device {device!r} mixes device types; split over GPUs only")
        return devices
    dev = resolve_device(device)
    if dev.type == "cuda" and dev.index is None:
        count = torch.cuda.device_count()
        return [torch.device("cuda", i) for i in range(count)] if count > 1 else [indexed(dev)]
    return [dev]


def resolve_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    """bf16 on GPU, fp32 on CPU unless asked otherwise."""
    if dtype is None:
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if isinstance(dtype, torch.dtype):
        if dtype not in _DTYPES.values():
            raise ValueError(f"dtype {dtype} is not supported; use one of {sorted(_DTYPES)}")
        return dtype
    if dtype not in _DTYPES:
        raise ValueError(f"dtype {dtype!r} is not supported; use one of {sorted(_DTYPES)}")
    return _DTYPES[dtype]


def _fits_resident(source: WeightSource, device: torch.device, ram_budget: float) -> str | None:
    """On the CPU, the line saying why a model whose routed experts all fit
    ``ram_budget`` (within free memory, as a streamed cache would be planned) is loaded
    resident rather than streamed; None to stream it. Resident, it decodes through the
    Rust decode step (tiny-code-moe: ~14x the streamed layer loop's tokens per second)
    and holds the same bytes; streaming such a model only starts answering sooner."""
    layout = getattr(source, "expert_layout", None)
    if device.type != "cpu" or not isinstance(source, FtwSource) or layout is None:
        return None
    from flint.stream.plan import GIB, plan_cache

    streamed = [i for i, sparse in enumerate(parse_config(source.config).sparse_layers) if sparse]
    plan = plan_cache(streamed, layout.n_experts, layout.slab_bytes, ram_budget)
    if plan.slots_per_layer < layout.n_experts:
        return None
    return (
        f"every routed expert fits the RAM budget ({plan.cache_bytes / GIB:.2f} GiB of "
        f"{ram_budget:g}): loaded resident, which decodes faster on the CPU "
        "(--stream / LLM(stream=True) streams them anyway)"
    )


def _streamed(
    source: WeightSource,
    device: torch.device,
    dtype: torch.dtype,
    ram_budget: float | None,
    lookahead: int,
    io_workers: int,
    expert_kernels: str,
    vram_budget: float | None,
    deterministic: bool,
    host_split: str,
    pin_ram: bool | None = None,
    graphs: str = "auto",
) -> ExpertBackend:
    from flint.models import parse_config
    from flint.models.ftw_source import FtwSource
    from flint.stream import slab_kernels_default, streamed_backend

    if not isinstance(source, FtwSource):
        raise ValueError("streaming needs a .ftw model file (convert it with `flint convert`)")
    return streamed_backend(
        source,
        parse_config(source.config),
        device,
        dtype,
        ram_budget,
        lookahead,
        io_workers,
        expert_kernels=expert_kernels,
        vram_budget_gib=vram_budget,
        deterministic=deterministic,
        host_split=host_split,
        pin_ram=pin_ram,
        # the graph step's kernels on the GPU's side too (grouped from slabs)
        slab_kernels=slab_kernels_default(graphs, device),
    )


def _split(
    source: WeightSource,
    devices: list[torch.device],
    dtype: torch.dtype,
    context_length: int,
    expert_backend: ExpertBackend | None,
) -> tuple[torch.device, ...]:
    """Each decoder layer's device when the layers are split across ``devices``, planned
    from their free memory; one printed line per device."""
    from flint.models import parse_config
    from flint.models.split import layer_costs, plan_split

    config = parse_config(source.config)
    expert = None  # streamed experts are not on the GPUs
    if expert_backend is None:
        layout = getattr(source, "expert_layout", None)
        elt = torch.tensor([], dtype=dtype).element_size()
        expert = (
            layout.slab_bytes
            if layout is not None
            else 3 * config.hidden_size * config.moe_intermediate_size * elt
        )
    costs, embed, head = layer_costs(config, dtype, context_length, expert)
    split = plan_split(devices, costs, embed, head)
    for line in (*split.describe(), *split.notes):
        print(f"flint: {line}", file=sys.stderr)
    return split.layer_devices


def _is_streamed(backend: ExpertBackend) -> bool:
    from flint.stream.backend import StreamedExperts

    return isinstance(backend, StreamedExperts)


def _eos_ids(source: WeightSource) -> list[int]:
    value = source.generation_config.get("eos_token_id", source.config.get("eos_token_id"))
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, list) else [int(value)]


class LLM:
    """A loaded model with its tokenizer, ready to generate for one caller at a time.

    ``model``: a .ftw file, a Hugging Face checkpoint directory, or a ``WeightSource``.
    ``device``: CUDA when present (every visible GPU, layers split across them), else
    the CPU; "cuda:N" for one GPU, "cuda:0,cuda:1" for a list (``flint.models.split``).
    ``dtype``: bf16 on CUDA, f32 on the CPU.
    ``context_length``: KV cache positions (default min(model's, 8192)).
    ``expert_kernels``: "fused" computes every expert scheme with flint's fused CPU
    kernels, one call per layer on ``torch.get_num_threads()`` threads (2 fewer for a
    streamed model when that leaves >= 8: ``flint.models.cpu_kernels``) (CPU only,
    resident and streamed alike; SwiGLU experts without biases, others use "torch"
    with one printed line); "torch" computes each expert with torch, int8/int4 experts
    through its quantized kernels (each probed at load, falling back with one printed
    line); "dequant" dequantizes int8/int4 experts then multiplies. "auto" (default) is
    "fused" on the CPU where the fused kernels compute the family's experts, else
    "torch" (on CUDA, a streamed model's experts computed on the CPU still use the
    fused kernels with "auto" and "fused").
    ``stream``: stream routed experts from the .ftw file through a RAM expert cache of
    ``ram_budget`` GiB (default: what is free) instead of loading them all; None
    streams when ``ram_budget`` is given, except on the CPU when every routed expert
    fits it (then the model is loaded, with one line: it decodes faster resident).
    ``lookahead``: layers of router lookahead (0-3) used to prefetch experts;
    ``io_workers``: reader threads.
    ``vram_budget``: GiB of GPU memory for the VRAM expert cache when streaming on CUDA
    (default: what is free once the model is loaded; 0: none; with several GPUs the
    total, shared by their streamed layers). ``deterministic``:
    every streamed expert computed on the GPU, so output is bit-identical to a resident
    GPU run (otherwise experts in neither VRAM cache slot run on the CPU in parallel).
    ``host_split``: on CUDA, where a decode step's experts outside VRAM are computed:
    "cpu" (all beside the GPU), "fill" (all copied up over PCIe), "q" (split
    between the two so both finish together, from measured bandwidths), or "auto"
    (fill where the int8/int4 slab kernels run, else cpu).
    ``pin_ram``: page-lock the RAM expert cache so copies to the GPU skip staging
    (default: on when streaming on CUDA, unless ``FLINT_PIN_RAM=0``; False: off).
    ``graphs``: decode through CUDA graphs (``flint.graphs``): "auto" where the model
    is covered (one GPU, every family but Qwen3-Next; resident experts, or streamed
    ones between graph segments, unless ``deterministic``), "on" (an error where it
    is not), "eager" (the same step launched op by op: identical output), "off" (the
    general eager path). ``no_graphs`` then says why a model has no step.
    ``activation_budget``: GiB a prompt's activations may take (default: half of the
    free GPU memory on CUDA, of free RAM on the CPU); a longer prompt is prefilled in
    several layer-major passes, with one printed line.
    ``cpu_decode_step``: on the CPU with the fused expert kernels ("auto" or "fused"),
    decode each token through the Rust decode step (``flint.models.cpu_decode``;
    standard-shape families) instead of the per-layer torch ops; False (or
    ``FLINT_CPU_DECODE_STEP=0``) keeps torch.
    """

    def __init__(
        self,
        model: str | Path | WeightSource,
        *,
        device: str | torch.device | None = None,
        dtype: str | torch.dtype | None = None,
        context_length: int | None = None,
        expert_backend: ExpertBackend | None = None,
        expert_kernels: str = "auto",
        stream: bool | None = None,
        ram_budget: float | None = None,
        lookahead: int = 2,
        io_workers: int = 8,
        vram_budget: float | None = None,
        deterministic: bool = False,
        activation_budget: float | None = None,
        host_split: str = "auto",
        pin_ram: bool | None = None,
        graphs: str = "auto",
        cpu_decode_step: bool = True,
    ) -> None:
        check_graph_mode(graphs)
        if activation_budget is not None and not activation_budget > 0:
            raise ValueError(f"activation_budget must be > 0 GiB, got {activation_budget}")
        self.devices = resolve_devices(device)
        self.device = self.devices[0]
        self.dtype = resolve_dtype(dtype, self.device)
        source = open_source(model)
        if source.tokenizer_json is None:
            raise ValueError("the model has no tokenizer (tokenizer.json)")
        max_pos = int(source.config.get("max_position_embeddings") or DEFAULT_CONTEXT)
        ctx = context_length if context_length is not None else min(max_pos, DEFAULT_CONTEXT)
        if isinstance(ctx, bool) or not isinstance(ctx, int) or ctx < 2:
            raise ValueError(f"context_length must be an integer >= 2, got {ctx!r}")
        self.source = source
        # why the model decodes without a CUDA graph step (None: it has one)
        self.no_graphs: str | None = None
        owned = expert_backend is None  # built here: closed here if loading fails
        if expert_backend is None and stream is None and ram_budget is not None:
            why = _fits_resident(source, self.device, ram_budget)
            if why is not None:
                print(f"flint: {why}", file=sys.stderr)
                stream = False
        if expert_backend is None and (stream or (stream is None and ram_budget is not None)):
            expert_backend = _streamed(
                source,
                self.device,
                self.dtype,
                ram_budget,
                lookahead,
                io_workers,
                expert_kernels,
                vram_budget,
                deterministic,
                host_split,
                pin_ram,
                graphs,
            )
        self.expert_backend = expert_backend
        try:
            self._model: MoEModel | None = self._build(
                source,
                ctx,
                expert_backend,
                expert_kernels,
                activation_budget,
                graphs,
                cpu_decode_step,
            )
        except BaseException:
            close = getattr(expert_backend, "close", None)
            if owned and callable(close):  # its reader threads and page-locked cache
                close()
            raise
        self.tokenizer = Tokenizer(
            source.tokenizer_json,
            chat_template=source.chat_template,
            special_tokens=source.special_tokens,
            eos_token_ids=_eos_ids(source),
        )
        self.tokenizer.keep_special_tokens(kept_special(source.config.get("model_type")))
        self.generation_config: dict[str, Any] = dict(source.generation_config)
        if self._model.states is not None:  # Qwen3-Next: checkpoint after these tokens
            anchors = (self.tokenizer.token_to_id(t) for t in ANCHOR_TOKENS)
            self._model.anchor_tokens = frozenset(i for i in anchors if i is not None)

    def _build(
        self,
        source: WeightSource,
        ctx: int,
        expert_backend: ExpertBackend | None,
        expert_kernels: str,
        activation_budget: float | None,
        graphs: str = "auto",
        cpu_decode_step: bool = True,
    ) -> MoEModel:
        """The model on this LLM's devices (layers split when there are several), with
        the expert backend attached (and a CUDA graph decode step where ``graphs`` and
        the model allow)."""
        layer_devices: tuple[torch.device, ...] = ()
        if len(self.devices) > 1:
            layer_devices = _split(source, self.devices, self.dtype, ctx, expert_backend)
        cuda = graphs != "off" and self.device.type == "cuda"
        # resident experts (the backend built here) or streamed ones get a graph step;
        # a backend the caller passed otherwise decodes as it is
        cuda_graphs = cuda and (expert_backend is None or _is_streamed(expert_backend))
        if (
            cuda_graphs
            and expert_backend is None
            and not layer_devices
            and expert_kernels in ("auto", "torch")
        ):
            from flint.graphs.setup import resident_backend  # imports Triton: CUDA only

            config = parse_config(source.config)
            expert_backend = resident_backend(
                config, source, Placement(self.device, self.dtype), graphs
            )
        model = load_model(
            source,
            self.device,
            self.dtype,
            ctx,
            expert_backend,
            expert_kernels,
            layer_devices,
            cpu_decode_step,
        )
        if cuda_graphs or graphs == "on":
            from flint.graphs.setup import attach_decoder

            self.no_graphs = attach_decoder(model, graphs, source=source)
        elif graphs == "off":
            self.no_graphs = "graphs off"
        elif self.device.type != "cuda":
            self.no_graphs = "CUDA graphs need a CUDA device"
        else:
            self.no_graphs = "a caller's expert backend"
        if activation_budget is not None:
            model.activation_budget = int(activation_budget * (1 << 30))
        attach = getattr(expert_backend, "attach", None)
        if callable(attach):
            attach(model)
        return model

    @property
    def model(self) -> MoEModel:
        if self._model is None:
            raise ValueError("this LLM is closed")
        return self._model

    def stats(self) -> dict[str, Any] | None:
        """Streaming statistics (cache hits, reads, stall, prediction recall), or None
        when every expert is resident."""
        stats = getattr(self.expert_backend, "stats", None)
        return stats() if callable(stats) else None

    def cache_stats(self) -> dict[str, float] | None:
        """The numeric part of ``stats()`` (``ram_hit_rate``, ``stall_s``, read counts...),
        for status lines and metrics; None when every expert is resident."""
        stats = self.stats()
        if stats is None:
            return None
        return {
            k: float(v)
            for k, v in stats.items()
            if isinstance(v, int | float) and not isinstance(v, bool)
        }

    def sampling_params(self, **options: Any) -> SamplingParams:
        """The model's generation defaults overridden by ``options`` (validated)."""
        return SamplingParams.build(self.generation_config, **options)

    def _prompt_ids(self, prompt: str | Sequence[int], add_special_tokens: bool) -> list[int]:
        if isinstance(prompt, str):
            return self.tokenizer.encode(prompt, add_special_tokens=add_special_tokens)
        ids = list(prompt)
        vocab = self.model.config.vocab_size
        if not all(isinstance(i, int) and 0 <= i < vocab for i in ids):
            raise ValueError(f"prompt token ids must be integers in [0, {vocab})")
        return ids

    def stream(
        self,
        prompt: str | Sequence[int],
        *,
        add_special_tokens: bool = False,
        reuse_prefix: bool = False,
        **options: Any,
    ) -> Iterator[StreamChunk]:
        """Streams the completion of ``prompt`` (text, or token ids) as text pieces.

        ``options`` are ``SamplingParams`` fields: max_tokens, temperature, top_k,
        top_p, min_p, repetition_penalty, presence_penalty, frequency_penalty, seed,
        stop, ignore_eos. The prompt is encoded raw unless ``add_special_tokens``.
        ``reuse_prefix``: keep the KV cache of the longest prefix this prompt shares
        with the previous request's tokens and prefill only the rest (a conversation's
        next turn); off, the whole prompt is prefilled from an empty cache.
        """
        params = self.sampling_params(**options)
        ids = self._prompt_ids(prompt, add_special_tokens)
        return generate_stream(self.model, self.tokenizer, ids, params, reuse_prefix=reuse_prefix)

    def generate(
        self,
        prompt: str | Sequence[int],
        *,
        add_special_tokens: bool = False,
        reuse_prefix: bool = False,
        **options: Any,
    ) -> Completion:
        """The whole completion of ``prompt``; same options as ``stream``."""
        params = self.sampling_params(**options)
        ids = self._prompt_ids(prompt, add_special_tokens)
        stream = generate_stream(self.model, self.tokenizer, ids, params, reuse_prefix=reuse_prefix)
        return collect(ids, stream)

    def chat_stream(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        template_kwargs: Mapping[str, Any] | None = None,
        reuse_prefix: bool = False,
        **options: Any,
    ) -> Iterator[StreamChunk]:
        """Streams the assistant's reply to ``messages`` through the chat template.

        ``template_kwargs`` reach the template (e.g. ``{"enable_thinking": False}``);
        ``reuse_prefix`` as for ``stream``.
        """
        params = self.sampling_params(**options)
        ids = self.tokenizer.encode_chat(messages, tools=tools, **dict(template_kwargs or {}))
        return generate_stream(self.model, self.tokenizer, ids, params, reuse_prefix=reuse_prefix)

    def chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        template_kwargs: Mapping[str, Any] | None = None,
        reuse_prefix: bool = False,
        **options: Any,
    ) -> Completion:
        """The assistant's whole reply to ``messages``; same options as ``chat_stream``."""
        params = self.sampling_params(**options)
        ids = self.tokenizer.encode_chat(messages, tools=tools, **dict(template_kwargs or {}))
        stream = generate_stream(self.model, self.tokenizer, ids, params, reuse_prefix=reuse_prefix)
        return collect(ids, stream)

    def close(self) -> None:
        """Frees the weights and the KV cache (a streaming backend saves its usage table);
        the LLM cannot be used afterwards."""
        backend_close = getattr(self.expert_backend, "close", None)
        if callable(backend_close):
            backend_close()
        if self._model is not None:  # a graph decoder refers back to the model
            decoder_close = getattr(self._model.decoder, "close", None)
            if callable(decoder_close):
                decoder_close()
            self._model.decoder = None
        self._model = None
        close = getattr(self.source, "close", None)
        if callable(close):
            close()

    def __enter__(self) -> LLM:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def open_source(model: str | Path | WeightSource) -> WeightSource:
    """A .ftw file (any file) -> ``FtwSource``; a directory -> ``SafetensorsSource``."""
    if isinstance(model, str | Path):
        path = Path(model)
        if path.is_dir():
            return SafetensorsSource(path)
        if path.is_file():
            return FtwSource(path)
        raise ValueError(f"{path} does not exist (expected a .ftw file or a checkpoint directory)")
    if isinstance(model, WeightSource):
        return model
    raise ValueError(f"expected a model path or a WeightSource, got {type(model).__name__}")
