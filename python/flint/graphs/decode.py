"""One decode step of a resident model, with every buffer at a fixed address, replayed
from a CUDA graph.

Eager decode launches a few dozen kernels per layer from Python and synchronises on
the router's choice before the experts run; at batch 1 the GPU mostly waits for the
host. This step is written so the GPU never waits: the token and its position live in
device tensors, the KV cache is written at that position with ``index_copy_``,
attention reads a fixed span of cache positions (the context rounded up to
``SPAN_STEP``) under a mask of the positions filled, and the routed experts are
computed by slot index from the router's ids on the GPU (``moe_kernel``). Each span
gets its own graph, captured the first time a step needs it; replaying one costs a
launch for the whole model.

``capture=False`` runs the very same step launch by launch: identical output, bit for
bit (the same kernels on the same shapes), for comparison (``--no-graphs``).

Covered: standard attention (``Attention``: GQA, q/k norms, biases, partial rotary),
GPT-OSS's ``SinkAttention`` and DeepSeek's ``LatentAttention``, with MoE or dense MLPs,
every layer on one GPU, every expert resident (docs/cuda-graphs.md lists the families).
``unsupported`` and ``flint.graphs.setup.family_unsupported`` say why a model is not
(it then decodes eagerly as before).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import torch
import torch.nn.functional as F

from flint.format.quant import LM_HEAD
from flint.graphs import fused
from flint.graphs.moe_kernel import (
    ExpertPool,
    available,
    dependent_launch,
    eighths_buffer,
    moe_experts,
    moe_pair_outputs,
    on_device,
    slab_unsupported,
    stacked_pool,
)
from flint.graphs.slab_experts import SlabResidentExperts
from flint.models.attention import Attention
from flint.models.kv_cache import SplitKVCache
from flint.models.mla import LatentAttention
from flint.models.moe import MoEBlock, ResidentExperts
from flint.models.norm import Norm
from flint.models.rope import apply_rope
from flint.models.sink_attention import SinkAttention
from flint.models.transformer import DecoderLayer, MoEModel

# H = hidden, V = vocabulary, S = span of cache positions attended, D = head dim,
# K = top-k, I = expert intermediate

SPAN_STEP = 256  # cache positions per graph: spans are multiples of this
# The experts' input in the word kernels' layout written by the post-attention norm's
# launch (``fused.rms_norm(eighths=)``) instead of a launch of its own per layer:
# False for an A/B in benches.
EIGHTHS_IN_NORM = True
# The dense matrix-vector products (q/k/v, o with the residual add, router, LM head)
# through ``fused.linear`` instead of ``F.linear``: False for an A/B in benches.
FUSED_DENSE = True
# Plain attention's query against the cache through ``fused.decode_attention`` instead
# of ``F.scaled_dot_product_attention``: False for an A/B in benches.
FUSED_SDPA = True
# The router's product computes the post-attention norm itself (``fused.norm_linear``)
# instead of waiting for the norm's own launch: one launch fewer per MoE layer. False
# for an A/B in benches.
NORM_IN_ROUTER = True
# A --dense-quant int8 file's LM head read as stored (``int8_head``), half the bytes of
# the bf16 copy: False for an A/B in benches.
INT8_HEAD = True
# The step ends with the argmax of its logits into its own input buffer
# (``fused.argmax``: two small launches inside the graph, under dependent launch), so
# the greedy loop's next step follows with no launch of its own between the graphs.
# A caller that samples writes its token into the buffer before each step, as always.
# False for an A/B in benches.
ARGMAX_IN_STEP = True
# The step's argmax also written into pinned host memory (``host_tokens``, slot
# position % 2), which the greedy loop reads once the step is done, instead of a copy
# of the token in the stream between the steps: False for an A/B in benches.
TOKENS_TO_HOST = True
# The RoPE rows and the span's mask made at the start of every step, used or not (as
# before the thirty-second session): True for an A/B in benches. Off, ``StepRows``
# makes them where a path first takes them.
ROWS_EVERY_STEP = False


@dataclass(frozen=True, eq=False)
class Ranked:
    """A MoE block's output not yet summed: each rank's expert output [K, H] fp32 and
    the routing weights [1, K], which the next norm's launch adds in rank order
    (``fused.ranked_add_rms_norm``)."""

    rows: torch.Tensor
    weights: torch.Tensor


Delta = torch.Tensor | Ranked | None  # a layer's MLP output, not yet added to the residual


class StepRows:
    """A step's RoPE rows at its position (``cos``, ``sin`` [1, R]) and its span's mask
    [1, S], for the paths that take them: the attention through its torch ops, latent
    attention, torch's SDPA. Each is made on first use, inside the step (and so inside
    its graph), so a step whose kernels read the position themselves (the fused q/k/v
    RoPE and attention) launches none of these three ops."""

    def __init__(self, decoder: GraphDecoder, span: int) -> None:
        self.decoder, self.span = decoder, span
        if ROWS_EVERY_STEP:
            _ = self.cos, self.sin, self.mask

    @cached_property
    def cos(self) -> torch.Tensor:
        return self.decoder.model.cos.index_select(0, self.decoder.position)

    @cached_property
    def sin(self) -> torch.Tensor:
        return self.decoder.model.sin.index_select(0, self.decoder.position)

    @cached_property
    def mask(self) -> torch.Tensor:
        decoder = self.decoder
        return (decoder.positions[: self.span] <= decoder.position)[None, :]


def expert_pools(backend: object) -> dict[int, ExpertPool] | None:
    """The slot-indexed pools of a resident backend (None: not one that has them)."""
    if isinstance(backend, SlabResidentExperts):
        return backend.pools
    if isinstance(backend, ResidentExperts):
        return {
            layer: stacked_pool(
                backend.gate[layer], backend.up[layer], backend.down[layer]
            ).with_math(backend.math, layer)
            for layer in backend.gate
        }
    return None


def model_unsupported(model: MoEModel) -> str | None:
    """None when ``model``'s dense parts (attention, norms, router) can run through the
    graph step's ops on one CUDA device, else why not."""
    why = available()
    if why is not None:
        return why
    if model.place.device.type != "cuda":
        return "CUDA graphs need a CUDA device"
    if len(model.place.devices) > 1 or isinstance(model.cache, SplitKVCache):
        return "layers split across GPUs"
    kinds = (Attention, SinkAttention, LatentAttention)
    if any(type(layer.attn) not in kinds for layer in model.layers):
        return f"{model.config.family}'s attention"
    return None


def unsupported(model: MoEModel, backend: object) -> str | None:
    """None when ``model`` (as loaded, with ``backend``) can decode through
    ``GraphDecoder``, else why not (``flint.graphs.setup`` checks the family first)."""
    why = model_unsupported(model)
    if why is not None:
        return why
    if expert_pools(backend) is None:
        layout = getattr(backend, "layout", None)  # quantized experts kept otherwise
        why = None if layout is None else slab_unsupported(layout.scheme, layout.group_size)
        return why or "experts that are not all resident"
    return None


def stack_qkv(attn: Attention) -> tuple[torch.Tensor, torch.Tensor | None]:
    """q, k and v projections as one weight (and bias); the attention's own tensors
    become views of it (no second copy; contiguous row blocks, so the eager path
    computes from them as before)."""
    weight = torch.cat([attn.q_w, attn.k_w, attn.v_w])
    q_rows, k_rows = attn.q_w.shape[0], attn.k_w.shape[0]
    k_end = q_rows + k_rows
    attn.q_w, attn.k_w, attn.v_w = weight[:q_rows], weight[q_rows:k_end], weight[k_end:]
    bias = None
    if attn.q_b is not None and attn.k_b is not None and attn.v_b is not None:
        bias = torch.cat([attn.q_b, attn.k_b, attn.v_b])
        attn.q_b, attn.k_b, attn.v_b = bias[:q_rows], bias[q_rows:k_end], bias[k_end:]
    return weight, bias


Int8 = tuple[torch.Tensor, torch.Tensor]  # an int8 matrix [N, K] and its f32 row scales [N]


def int8_attention(model: MoEModel, source: object) -> dict[int, tuple[Int8, Int8]]:
    """layer -> (q, k and v stacked, o) as the file stores them, where it stores them
    as int8 (``--dense-quant int8``), on the model's device: ``fused.linear`` reads
    these bytes, half of the dequantized matrices' (which the model keeps for its
    other paths). Empty for a source without int8 matrices."""
    read = getattr(source, "int8_matrix", None)
    if read is None:
        return {}
    out = {}
    device = model.place.device
    for layer in model.layers:
        if not isinstance(layer.attn, Attention):
            continue
        p = f"model.layers.{layer.index}.self_attn."
        parts = [read(p + n + "_proj.weight") for n in ("q", "k", "v", "o")]
        if any(part is None for part in parts):
            continue
        q, k, v, o = parts
        qkv = (torch.cat([q[0], k[0], v[0]]), torch.cat([q[1], k[1], v[1]]))
        out[layer.index] = (
            (qkv[0].to(device), qkv[1].to(device)),
            (o[0].to(device), o[1].to(device)),
        )
    return out


def int8_head(model: MoEModel, source: object) -> Int8 | None:
    """The LM head as the file stores it, where it stores it as int8 (``--dense-quant
    int8``; a tied head is the embedding, never int8), on the model's device; None
    otherwise, or where its rows are not the logits' (the vocabulary's). The model
    keeps the dequantized matrix for its other paths."""
    read = getattr(source, "int8_matrix", None)
    stored = None if read is None else read(LM_HEAD)
    shape = model.lm_head.shape
    if stored is None or stored[0].shape != shape or shape[0] != model.config.vocab_size:
        return None
    device = model.place.device
    return stored[0].to(device), stored[1].to(device)


class GraphDecoder:
    """Decodes one token at a time for ``model`` (resident, one GPU)."""

    # greedy decode may run ahead on the device (``launch_greedy``): no host work inside
    # a step (the streamed step's hops between its segments are host work)
    device_greedy = True

    def __init__(
        self,
        model: MoEModel,
        pools: dict[int, ExpertPool],
        capture: bool = True,
        source: object = None,
    ):
        """``source``: the model's weight source; where it stores the attention's
        matrices or the LM head as int8, the step reads those (``int8_attention``,
        ``int8_head``)."""
        self.model, self.pools, self.capture = model, pools, capture
        cfg, device = model.config, model.place.device
        self.device = device
        self.token = torch.zeros(1, dtype=torch.int64, device=device)
        self.position = torch.zeros(1, dtype=torch.int64, device=device)
        self.positions = torch.arange(model.context_length, device=device)  # [S]
        self.logits = torch.zeros(1, cfg.vocab_size, dtype=torch.float32, device=device)
        top_k, inter = cfg.top_k, cfg.moe_intermediate_size
        self.scratch = (
            torch.empty(top_k, inter, dtype=model.place.dtype, device=device),
            torch.empty(top_k, cfg.hidden_size, dtype=torch.float32, device=device),
        )
        self.moe_out = torch.empty(1, cfg.hidden_size, dtype=model.place.dtype, device=device)
        # MoE layer -> its experts' input in the eighths layout, where the norm writes it
        self.eighths: dict[int, torch.Tensor] = {}
        # the small ops fused into one kernel each where the family's ops are the plain ones
        self.fused_norm = not cfg.norm_offset  # Qwen3-Next's 1 + w keeps torch's ops
        self.norm_fp32 = cfg.norm_weight_fp32  # GPT-OSS: the weight multiplied in fp32
        self.fused_attention = cfg.qk_norm in ("per_head", "none") and cfg.clip_qkv is None
        self.fused_router = (
            cfg.group_router is None and not cfg.router_topk_first and not cfg.router_bias
        )
        self.fused_dense = FUSED_DENSE
        # on CUDA its products run on tensor cores: TF32 for an fp32 model, which keeps
        # SDPA's fp32 products instead
        tf32 = device.type == "cuda" and model.place.dtype == torch.float32
        self.fused_sdpa = FUSED_SDPA and self.fused_attention and not tf32
        heads = cfg.num_heads
        if self.fused_sdpa:
            self.attn_parts = fused.attention_parts(
                heads, cfg.head_dim, model.context_length, device
            )
            self.attn_out = torch.empty(
                1, heads * cfg.head_dim, dtype=model.place.dtype, device=device
            )
        self.cos_table, self.sin_table = model.cos.contiguous(), model.sin.contiguous()
        # layer -> q, k and v stacked in one weight [(Nq + 2 Nkv) D, H] (and bias): one
        # matrix-vector product instead of three
        self.qkv: dict[int, tuple[torch.Tensor, torch.Tensor | None]] = {}
        if self.fused_attention:
            for layer in model.layers:
                if isinstance(layer.attn, Attention):  # SinkAttention is one too
                    self.qkv[layer.index] = stack_qkv(layer.attn)
        self.int8: dict[int, tuple[Int8, Int8]] = {}
        if self.fused_attention and self.fused_dense and source is not None:
            self.int8 = int8_attention(model, source)
        self.int8_head = int8_head(model, source) if self.fused_dense and INT8_HEAD else None
        # the streamed step's hops read the router's ids on the host: no greedy ahead
        self.argmax_in_step = ARGMAX_IN_STEP and self.device_greedy
        # the greedy loop reads each token from here (``flint.generation``)
        self.host_tokens: torch.Tensor | None = None
        if self.argmax_in_step:
            self.argmax_parts = fused.argmax_parts(cfg.vocab_size, device)
            if device.type == "cuda" and TOKENS_TO_HOST:
                self.host_tokens = torch.zeros(2, dtype=torch.int64, pin_memory=True)
        if self.fused_norm and EIGHTHS_IN_NORM:
            for index, pool in pools.items():
                buffer = eighths_buffer(pool, 1, device)
                if buffer is not None:
                    self.eighths[index] = buffer
        self.graphs: dict[int, Any] = {}  # span -> torch.cuda.CUDAGraph
        self.memory: Any = None  # the graphs' shared memory pool
        self.replays = 0

    @property
    def name(self) -> str:
        """How bench and stats name this decode."""
        return "CUDA graphs" if self.capture else "graph step, eager launches"

    def warm_up(self) -> None:
        """Compiles the kernels and captures the first span's graph now (at load), so
        the first reply does not wait for it. It decodes a token at position 0, whose
        keys and values any prompt overwrites (the cache's length is not advanced)."""
        self(torch.zeros(1, dtype=torch.int64, device=self.device), 0)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def span(self, position: int) -> int:
        """Cache positions a step at ``position`` attends over (a multiple of SPAN_STEP)."""
        steps = position // SPAN_STEP + 1
        return min(self.model.context_length, steps * SPAN_STEP)

    def __call__(self, token: torch.Tensor, position: int) -> torch.Tensor:
        """Logits [1, V] (fp32) of ``token`` [1] at ``position``; writes its keys and
        values into the model's cache (the caller advances ``cache.length``)."""
        with on_device(self.device):  # Triton and graph replay use the current device
            self.token.copy_(token, non_blocking=True)
            self._replay(position)
            return self.logits.clone()

    def greedy_first(self, logits: torch.Tensor, vocab: int) -> None:
        """Puts the argmax of ``logits`` [V'] (the prompt's last row; its first ``vocab``
        entries, the first of ties as ``torch.argmax``) into the step's input."""
        with on_device(self.device):
            self.token.copy_(torch.argmax(logits[:vocab]).view(1))

    def tokens_on_host(self, vocab: int) -> torch.Tensor | None:
        """The pinned slots [2] into which the step at position p writes its greedy
        next token (slot p % 2), where the step's own argmax is that token for ``vocab``
        (``launch_greedy``); else None."""
        if self.host_tokens is None or vocab != self.logits.shape[1]:
            return None
        return self.host_tokens

    def launch_greedy(self, position: int, vocab: int) -> None:
        """Enqueues the step of the token in the input buffer at ``position``, then the
        argmax of its logits into that buffer (the next step's input), and returns
        without waiting for either: the host reads a token while the GPU computes the
        next (``flint.generation``). The same kernels on the same inputs as a call.
        With ``argmax_in_step`` the step itself ends with that argmax (``fused.argmax``
        picks as ``torch.argmax`` does) when ``vocab`` is the logits' whole width."""
        with on_device(self.device):
            self._replay(position)
            if not (self.argmax_in_step and vocab == self.logits.shape[1]):
                torch.argmax(self.logits[0, :vocab], dim=0, keepdim=True, out=self.token)

    def _replay(self, position: int) -> None:
        """The step at ``position`` on the token in the input buffer."""
        self.position.fill_(position)
        span = self.span(position)
        if not self.capture:
            self._step(span)
            return
        graph = self.graphs.get(span)
        if graph is None:
            graph = self._record(span)
        graph.replay()
        self.replays += 1

    def close(self) -> None:
        """Drops the graphs and their memory pool (the model drops its decoder)."""
        self.graphs.clear()
        self.memory = None

    def _record(self, span: int) -> Any:
        """Captures the step for ``span``. The capture's eager run computes the step,
        whose argmax (``argmax_in_step``) overwrites its input token: the token is put
        back for the replay that follows."""
        token = self.token.clone()
        graph = self._capture(lambda: self._step(span))
        self.token.copy_(token)
        self.graphs[span] = graph
        return graph

    def _capture(self, step: Callable[[], None]) -> Any:
        """A CUDA graph of ``step`` (after one eager run on a side stream, which
        compiles the kernels and computes this very step), in the shared memory pool."""
        side = torch.cuda.Stream(self.device)  # type: ignore[no-untyped-call]
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            step()
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        if self.memory is None:
            self.memory = torch.cuda.graph_pool_handle()
        # captured on a stream of this device (torch's default capture stream belongs to
        # whichever device asked first); errors from other threads' CUDA calls during
        # the capture (a server's, another model's readers) are theirs, not the capture's
        with torch.cuda.graph(
            graph, pool=self.memory, stream=side, capture_error_mode="thread_local"
        ):
            step()
        return graph

    @torch.inference_mode()
    def _step(self, span: int) -> None:
        model = self.model
        rows = StepRows(self, span)
        x = model.embed.index_select(0, self.token)  # [1, H]
        delta: Delta = None  # the last MLP's output, not yet added to x
        with dependent_launch():  # one stream, kernel after kernel: moe_kernel.PDL
            for layer in model.layers:
                x, delta = self._layer(layer, x, delta, rows)
            self._head(x, delta)
            if self.argmax_in_step:  # the greedy next token, into the input buffer
                parts, host = self.argmax_parts, self.host_tokens
                fused.argmax(self.logits[0], self.token, parts, host, self.position)

    def _head(self, x: torch.Tensor, delta: Delta = None) -> None:
        """The final norm and LM head of x (+ delta) [1, H] into ``logits``."""
        model = self.model
        eps = model.config.rms_norm_eps
        _, normed = self._add_norm(model.final_norm, x, delta, model.norm, eps)
        head = model.lm_head
        int8 = self.int8_head
        if int8 is not None and normed.shape[0] == 1:
            fused.linear(normed, int8[0], scale=int8[1], out=self.logits)
        elif self._fits(normed, head) and head.shape[0] == self.logits.shape[1]:
            fused.linear(normed, head, out=self.logits)
        else:
            self.logits.copy_(F.linear(normed, model.lm_head))

    def _norm(
        self,
        norm: Norm,
        x: torch.Tensor,
        w: torch.Tensor,
        eps: float,
        eighths: torch.Tensor | None = None,  # only where the norm is fused
    ) -> torch.Tensor:
        if self.fused_norm:
            return fused.rms_norm(x, w, eps, self.norm_fp32, eighths)
        assert eighths is None
        return norm(x, w, eps)

    def _add_norm(
        self, norm: Norm, x: torch.Tensor, delta: Delta, w: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The residual x + delta (x when no delta) and its norm, in one kernel where
        the norm is fused (a ``Ranked`` delta's sum too)."""
        if delta is None:
            return x, self._norm(norm, x, w, eps)
        if isinstance(delta, Ranked):
            return fused.ranked_add_rms_norm(x, delta.rows, delta.weights, w, eps, self.norm_fp32)
        if self.fused_norm:
            return fused.add_rms_norm(x, delta, w, eps, self.norm_fp32)
        total = x + delta
        return total, norm(total, w, eps)

    def _fits(self, x: torch.Tensor, w: torch.Tensor) -> bool:
        """Whether ``fused.linear`` takes this product (one token, weights in its dtype)."""
        return self.fused_dense and x.shape[0] == 1 and w.dtype == x.dtype and w.stride(1) == 1

    def _linear(
        self,
        x: torch.Tensor,  # [1, K]
        w: torch.Tensor,  # [N, K]
        b: torch.Tensor | None = None,
        residual: torch.Tensor | None = None,  # [1, N]
        out: torch.Tensor | None = None,
        int8: Int8 | None = None,  # w as the file stores it in int8, if it does
    ) -> torch.Tensor:
        """``residual + F.linear(x, w, b)`` (into ``out`` when given); from the int8
        matrix and its row scales when given."""
        if int8 is not None:
            return fused.linear(x, int8[0], b, residual, int8[1], out)
        if self._fits(x, w):
            return fused.linear(x, w, b, residual, out=out)
        y = F.linear(x, w, b)
        if residual is not None:
            return residual + y if out is None else torch.add(residual, y, out=out)
        return y if out is None else out.copy_(y)

    def _layer(
        self,
        layer: DecoderLayer,
        x: torch.Tensor,
        delta: Delta,
        rows: StepRows,
    ) -> tuple[torch.Tensor, Delta]:
        """The layer on its input x + delta: (the residual after attention, the MLP's
        output), whose sum is the layer's output (added by the next norm's kernel; a
        MoE block's ranks summed there too, where ``fused.ranked_norm_fits``)."""
        x, xs = self._add_norm(layer.norm, x, delta, layer.input_norm, layer.eps)
        eighths = self.eighths.get(layer.index)
        mlp = layer.mlp
        h = self._attended(layer, x, rows, normed_x=xs)
        if not isinstance(mlp, MoEBlock):
            return h, mlp(self._norm(layer.norm, h, layer.post_norm, layer.eps))
        normed, ids, weights = self._moe_input(layer, mlp, h, eighths)
        pool = self.pools[layer.index]
        if mlp.shared is None and self.fused_norm and fused.ranked_norm_fits(h.device):
            per_rank = moe_pair_outputs(normed, ids, pool, self.scratch, eighths)
            return h, Ranked(per_rank, weights)
        out = moe_experts(normed, ids, weights, pool, self.scratch, self.moe_out, eighths)
        if mlp.shared is not None:
            out = out + mlp._shared(normed)
        return h, out

    def _attended(
        self,
        layer: DecoderLayer,
        x: torch.Tensor,
        rows: StepRows,
        h: torch.Tensor | None = None,
        normed_x: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The layer up to its post-attention norm: the residual after attention h [1, H]
        (written into ``h`` when given). ``normed_x``: x's input norm, when the caller
        has it. (A dense layer's norm follows; a MoE layer's: ``_moe_input``.)"""
        xs = normed_x
        if xs is None:
            xs = self._norm(layer.norm, x, layer.input_norm, layer.eps)
        return self._attention(layer.attn, xs, rows, x, h)

    def _moe_input(
        self, layer: DecoderLayer, mlp: MoEBlock, h: torch.Tensor, eighths: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The MoE block's input from the residual after attention h: (its post-attention
        norm [1, H], also into ``eighths`` when given; the router's ids and weights)."""
        fold = NORM_IN_ROUTER and self.fused_norm and self.fused_router
        if fold and self._fits(h, mlp.router) and h.shape[1] <= fused.NORM_LINEAR_COLS:
            if fused.norm_route_fits(h.device, *mlp.router.shape):
                cfg = self.model.config
                dtype = torch.float32 if cfg.router_weights_fp32 else h.dtype
                return fused.norm_route(
                    h, layer.post_norm, layer.eps, mlp.router, self.norm_fp32, eighths,
                    cfg.top_k, cfg.norm_topk_prob, dtype,
                )  # fmt: skip
            logits, normed = fused.norm_linear(
                h, layer.post_norm, layer.eps, mlp.router, self.norm_fp32, eighths
            )
            return normed, *self._top_k(logits)
        normed = self._norm(layer.norm, h, layer.post_norm, layer.eps, eighths)
        return normed, *self._route(mlp, normed)

    def _route(self, mlp: MoEBlock, normed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The router's (ids [1, K], weights [1, K]), on the GPU."""
        if self.fused_router:
            return self._top_k(self._linear(normed, mlp.router))  # logits [1, E]
        return mlp.route(normed)

    def _top_k(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A softmax router's (ids, weights) from its logits [1, E] (``fused.route``)."""
        cfg = self.model.config
        dtype = torch.float32 if cfg.router_weights_fp32 else logits.dtype
        return fused.route(logits, cfg.top_k, cfg.norm_topk_prob, dtype)

    def _attention(
        self,
        attn: object,
        x: torch.Tensor,  # [1, H]
        rows: StepRows,
        residual: torch.Tensor,  # [1, H], the layer's input
        h: torch.Tensor | None,  # where the result goes, if given
    ) -> torch.Tensor:
        """The residual after the layer's attention for the token at ``position``: its
        key and value written into the cache row, the query against the span's filled
        positions, the output projection added to ``residual``."""
        if isinstance(attn, LatentAttention):
            y = self._latent_attention(attn, x, rows)
            return residual + y if h is None else torch.add(residual, y, out=h)
        assert isinstance(attn, Attention)
        cfg, cache, span = attn.cfg, self.model.cache, rows.span
        fused_qkv = self.fused_attention
        q = self._project_fused(attn, x) if fused_qkv else self._project(attn, x, rows)
        keys, values = cache.keys[attn.layer], cache.values[attn.layer]  # [Nkv, ctx, D]
        o8 = self._stored(attn.layer, 1)
        if self.fused_sdpa and not isinstance(attn, SinkAttention):
            out = fused.decode_attention(
                q, keys, values, self.position, span, self.attn_out, self.attn_parts
            )
            return self._linear(out, attn.o_w, attn.o_b, residual, h, o8)
        if isinstance(attn, SinkAttention):
            out = self._attend_with_sinks(attn, q, keys[:, :span], values[:, :span], span)
        else:
            out = F.scaled_dot_product_attention(
                q.unsqueeze(0),
                keys[:, :span].unsqueeze(0),
                values[:, :span].unsqueeze(0),
                attn_mask=rows.mask,
                enable_gqa=cfg.num_heads != cfg.num_kv_heads,
            )[0]  # [Nq, 1, D]
        out = out.transpose(0, 1).reshape(1, -1)
        return self._linear(out, attn.o_w, attn.o_b, residual, h, o8)

    def _stored(self, layer: int, part: int) -> Int8 | None:
        """The layer's stored int8 q/k/v (``part`` 0) or o (1), if the file has them."""
        stored = self.int8.get(layer)
        return None if stored is None else stored[part]

    def _project_fused(self, attn: Attention, x: torch.Tensor) -> torch.Tensor:
        """q [Nq, 1, D], each head normed (q/k norms: both or neither, ``Attention``)
        and rotated in one launch for q, k and v; the key and value go straight into
        the cache row."""
        cfg, cache = attn.cfg, self.model.cache
        heads, dim = cfg.num_heads, cfg.head_dim
        q = torch.empty(heads, 1, dim, dtype=x.dtype, device=x.device)  # [Nq, 1, D]
        y = self._linear(x, *self.qkv[attn.layer], int8=self._stored(attn.layer, 0))[0]
        keys, values = cache.keys[attn.layer], cache.values[attn.layer]  # [Nkv, ctx, D]
        fused.qkv_rope(
            y, attn.q_norm, attn.k_norm, self.cos_table, self.sin_table, self.position, q,
            keys, values, cfg.rms_norm_eps,
        )  # fmt: skip
        return q

    def _project(self, attn: Attention, x: torch.Tensor, rows: StepRows) -> torch.Tensor:
        """``_project_fused`` through the attention's own torch ops (a q/k norm over all
        heads, clipping)."""
        cache = self.model.cache
        cos, sin = rows.cos, rows.sin  # [1, R]
        q = apply_rope(attn._project(x, attn.q_w, attn.q_b, attn.q_norm), cos, sin)  # [Nq, 1, D]
        k = apply_rope(attn._project(x, attn.k_w, attn.k_b, attn.k_norm), cos, sin)
        v = attn._project(x, attn.v_w, attn.v_b, None)  # [Nkv, 1, D]
        cache.keys[attn.layer].index_copy_(1, self.position, k)
        cache.values[attn.layer].index_copy_(1, self.position, v)
        return q

    def _attend_with_sinks(
        self,
        attn: SinkAttention,
        q: torch.Tensor,  # [Nq, 1, D]
        keys: torch.Tensor,  # [Nkv, S, D]
        values: torch.Tensor,  # [Nkv, S, D]
        span: int,
    ) -> torch.Tensor:
        """GPT-OSS attention for one query (``SinkAttention.attend_keys``) over the
        span, the positions after the token or outside its window masked."""
        positions = self.positions[:span]
        visible = positions <= self.position  # [S]
        if attn.window:
            visible = visible & (positions > self.position - attn.window)
        return attn.attend_keys(q, keys, values, visible)  # [Nq, 1, D]

    def _latent_attention(
        self,
        attn: LatentAttention,
        x: torch.Tensor,  # [1, H]
        rows: StepRows,  # cos, sin [1, Dr]; mask [1, S]
    ) -> torch.Tensor:
        """DeepSeek's latent attention (``LatentAttention.__call__``'s ops): the latent
        and rotated shared key written into the cache row, the span's latents expanded
        into keys and values."""
        query, latent, k_rot = attn.project(x, rows.cos, rows.sin)
        latents, k_rots = self.model.cache.keys[attn.layer], self.model.cache.values[attn.layer]
        latents.index_copy_(1, self.position, latent)  # [1, ctx, R]
        k_rots.index_copy_(1, self.position, k_rot)  # [1, ctx, Dr]
        span = rows.span
        return attn.attend(query, latents[:, :span], k_rots[:, :span], rows.mask)
