"""Resident decode on CUDA: CUDA graphs against the same step launched op by op and the
general eager path, with the HBM roofline of flint's own bytes (issue 10, R0).

Usage: python benches/graph_decode.py MODEL [--tokens 128] [--prompt 64] [--reps 3]
       [--modes on,eager,off] [--profile] [--between] [--torch-dense]
       [--torch-attention] [--no-ahead] [--no-pdl] [--early] [--qkv-after]
       [--early-kernels NAMES] [--kv-ask rope|attention|none] [--rows-every-step]
       [--tokens-copied] [--no-cluster-norm] [--cluster-norm-late 0|1|2]
       [--cluster-barrier] [--cluster-route 0|8|16]

Each mode loads the model once (resident, cuda:0) and decodes ``--tokens`` greedy
tokens after a ``--prompt``-token prompt, ``--reps`` times after a warm-up run (which
captures the graphs); every repetition must give the warm-up's tokens, and the modes
``on`` and ``eager`` (the same step, captured or not) each other's. The roofline:
bytes a decode token must read (every dense weight of the layers, the router, shared
experts, the LM head, and top-k routed experts per MoE layer, as stored) over the
device-to-device copy rate measured here (bytes read + written per second), which is
the ceiling HBM allows. The routed-expert kernels alone are timed on one layer too.
With graphs, ``replay_us`` and ``greedy_us`` time the step's graph replayed back to back
at the same positions, without and with the greedy loop's argmax (``device_loops``;
the same graph since the argmax is made inside the step).
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
from typing import Any

import torch

import flint
from flint.graphs import decode, fused, moe_kernel
from flint.graphs.decode import expert_pools
from flint.graphs.moe_kernel import ExpertPool, moe_experts
from flint.models.transformer import MoEModel


def tensor_bytes(obj: Any, seen: set[int], skip: tuple[str, ...] = ("backend",)) -> int:
    """Bytes of the distinct tensors reachable through ``obj``'s attributes."""
    if isinstance(obj, torch.Tensor):
        key = obj.data_ptr()
        if key in seen:
            return 0
        seen.add(key)
        return obj.numel() * obj.element_size()
    if isinstance(obj, (list, tuple)):
        return sum(tensor_bytes(o, seen, skip) for o in obj)
    fields = getattr(obj, "__dict__", None)
    if fields is None:
        return 0
    return sum(tensor_bytes(v, seen, skip) for k, v in fields.items() if k not in skip)


def pool_bytes(pool: ExpertPool) -> int:
    """Bytes of one expert of ``pool`` (weights and scales of its three projections)."""
    total = 0
    for p in (pool.gate, pool.up, pool.down):
        total += p.weights[0].numel() * p.weights.element_size()
        if p.scales.data_ptr() != p.weights.data_ptr():
            total += p.scales[0].numel() * p.scales.element_size()
    return total


def token_bytes(model: MoEModel, pools: dict[int, ExpertPool], decoder: object = None) -> int:
    """``decoder``'s int8 attention matrices and LM head (``GraphDecoder.int8``,
    ``int8_head``), where it has them, are read in place of the model's dequantized
    q/k/v/o and ``model.lm_head``."""
    int8 = getattr(decoder, "int8", None)
    int8_head = getattr(decoder, "int8_head", None)
    seen: set[int] = {model.embed.data_ptr()}  # one row of it is read
    stored = 0
    for index, matrices in (int8 or {}).items():
        attn = model.layers[index].attn
        seen.update(t.data_ptr() for t in (attn.q_w, attn.k_w, attn.v_w, attn.o_w))
        stored += tensor_bytes(matrices, set())
    if int8_head is not None:
        seen.add(model.lm_head.data_ptr())
        stored += tensor_bytes(int8_head, set())
    dense = stored + tensor_bytes(model.layers, seen) + tensor_bytes(model.lm_head, seen)
    experts = sum(model.config.top_k * pool_bytes(p) for p in pools.values())
    return dense + experts


def copy_rate(device: torch.device, gib: float = 2.0) -> float:
    """Device-to-device copy, bytes read + written per second (median of 10)."""
    n = int(gib * 2**30)
    a = torch.empty(n, dtype=torch.uint8, device=device)
    b = torch.empty_like(a)
    times = []
    for _ in range(12):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        b.copy_(a)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return 2 * n / statistics.median(times[2:])


def kernel_rate(pool: ExpertPool, top_k: int, dtype: torch.dtype, device: torch.device) -> float:
    """The routed-expert kernels of one layer at one token: expert bytes per second."""
    import triton.testing

    x = torch.randn(1, pool.hidden, dtype=dtype, device=device)
    ids = torch.randperm(pool.experts, device=device)[:top_k][None]
    w = torch.rand(1, top_k, dtype=dtype, device=device)
    ms = triton.testing.do_bench(lambda: moe_experts(x, ids, w, pool), return_mode="median")
    return top_k * pool_bytes(pool) / (ms / 1e3)


def profile(llm: flint.LLM, ids: list[int], steps: int = 16) -> None:
    """Kernels of ``steps`` decode tokens by total GPU time (torch.profiler, CUPTI:
    kernels replayed from CUDA graphs are traced one by one)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    llm.generate(ids, max_tokens=4, temperature=0.0, ignore_eos=True)
    model = llm.model
    token = torch.tensor([ids[-1]], device="cuda:0")
    with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            model.forward(token)
        torch.cuda.synchronize()
    print(
        prof.key_averages().table(sort_by="cuda_time_total", row_limit=18, max_name_column_width=60)
    )


def between_steps(llm: flint.LLM, ids: list[int], tokens: int = 24) -> None:
    """What the GPU does between two decode steps of ``llm.generate`` (torch.profiler,
    CUPTI): each token's period (LM head to LM head: the step's last product, the only
    product over 50 us), and the work and idle time from one LM head's end to the next
    step's first kernel (the embedding's index_select), for three tokens, with the
    median of that interval over all."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    llm.generate(ids, max_tokens=4, temperature=0.0, ignore_eos=True)
    with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
        llm.generate(ids, max_tokens=tokens, temperature=0.0, ignore_eos=True)
        torch.cuda.synchronize()
    events = sorted(
        (e.time_range.start, e.time_range.end, e.name)
        for e in prof.events()
        if e.device_type == torch.autograd.DeviceType.CUDA
    )
    heads = [i for i, (a, b, n) in enumerate(events) if "linear_kernel" in n and b - a > 50]
    periods = [events[j][0] - events[i][0] for i, j in itertools.pairwise(heads)]
    gaps = []
    for k, (i, j) in enumerate(itertools.pairwise(heads)):
        first = next((m for m in range(i + 1, j) if "indexSelect" in events[m][2]), j)
        gaps.append(events[first][0] - events[i][1])
        if k in (4, 10, 16):
            at = events[i][1]
            parts = []
            for a, b, name in events[i + 1 : first + 1]:
                parts.append(f"idle {a - at:.1f} | {name[:40]} {b - a:.1f}")
                at = b
            print(json.dumps({"token": k, "between": parts}))
    print(json.dumps({
        "period_us_median": round(statistics.median(periods), 1),
        "between_us_median": round(statistics.median(gaps), 1),
    }))  # fmt: skip


def device_loops(decoder: Any, first: int, tokens: int, vocab: int) -> dict[str, float]:
    """Microseconds per token of the graph step replayed back to back at the generate
    loop's positions (``replay_us``), and of the step with its argmax into the next
    step's input as the greedy loop queues it (``greedy_us``; with the argmax inside
    the step, ``decode.ARGMAX_IN_STEP``, both replay the same graph): with ``1e6 /
    tg_tok_s``, the host's and the token's own work apart from the step's."""
    out = {}
    for name, one in (
        ("replay_us", decoder._replay),
        ("greedy_us", lambda p: decoder.launch_greedy(p, vocab)),
    ):
        one(first)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for position in range(first, first + tokens):
            one(position)
        end.record()
        end.synchronize()
        out[name] = round(start.elapsed_time(end) * 1e3 / tokens, 1)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--prompt", type=int, default=64)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--modes", default="on,eager,off")
    parser.add_argument(
        "--profile", action="store_true", help="print the first mode's kernels per token"
    )
    parser.add_argument(
        "--between",
        action="store_true",
        help="print what the GPU does between the first mode's decode steps",
    )
    parser.add_argument(
        "--torch-dense",
        action="store_true",
        help="the graph step's dense products through F.linear (the A/B of fused.linear)",
    )
    parser.add_argument(
        "--torch-attention",
        action="store_true",
        help="the graph step's attention through SDPA (the A/B of fused.decode_attention)",
    )
    parser.add_argument(
        "--no-ahead",
        action="store_true",
        help="greedy decode reads each token before the next step (the A/B of the "
        "one-step-ahead loop, flint.generation._greedy_ahead; it also takes the argmax "
        "out of the step, decode.ARGMAX_IN_STEP)",
    )
    parser.add_argument(
        "--no-pdl",
        action="store_true",
        help="the step's kernels launched one after the other (the A/B of programmatic "
        "dependent launch, flint.graphs.moe_kernel.PDL)",
    )
    parser.add_argument(
        "--early",
        action="store_true",
        help="the small kernels let the next start before their own wait (the A/B of "
        "flint.graphs.moe_kernel.EARLY = SMALL_KERNELS; gpu156 ran this switch the "
        "other way round, as --no-early, when it was the default)",
    )
    parser.add_argument(
        "--early-kernels",
        metavar="NAMES",
        help="these kernels (comma-separated, of flint.graphs.moe_kernel.EARLY_NAMES) let "
        "the next start before their own wait, e.g. ranked_sum,norm; none: no kernel "
        "(the default)",
    )
    parser.add_argument(
        "--qkv-after",
        action="store_true",
        help="bf16 q/k/v four rows a program read after the wait (the A/B of "
        "flint.graphs.fused.QKV_AFTER_WAIT; gpu159-160 ran it the other way round, as "
        "--qkv-before, while it was the default)",
    )
    parser.add_argument(
        "--route-ranks",
        metavar="MODE,WARPS",
        help="the router's picks without a chain of reductions (the A/B of "
        "flint.graphs.fused.ROUTE_RANKS and ROUTE_RANK_WARPS; default 2,2): MODE 1 counts "
        "ranks, 2 takes a bitonic top-k, on WARPS warps, e.g. 2,1; off: the chain of "
        "reductions on one warp, the default before gpu170",
    )
    parser.add_argument(
        "--kv-ask",
        choices=("rope", "attention", "none"),
        help="the attention's earlier keys and values asked of the L2 before its wait, by "
        "RoPE's launch or the attention's own, or not (the A/B of flint.graphs.fused.KV_ASK)",
    )
    parser.add_argument(
        "--tokens-copied",
        action="store_true",
        help="the greedy loop copies each token in the stream instead of reading it from "
        "pinned memory the step writes (the A/B of flint.graphs.decode.TOKENS_TO_HOST)",
    )
    parser.add_argument(
        "--rows-every-step",
        action="store_true",
        help="the RoPE rows and the mask made at every step's start, used or not (the A/B "
        "of flint.graphs.decode.ROWS_EVERY_STEP, as before the thirty-second session)",
    )
    parser.add_argument(
        "--no-cluster-norm",
        action="store_true",
        help="each MoE block's ranked sum in its own launch, then the next norm's, instead "
        "of both in one cluster launch (the A/B of flint.graphs.fused.CLUSTER_NORM)",
    )
    parser.add_argument(
        "--cluster-norm-late",
        type=int,
        choices=(0, 1, 2),
        help="the cluster norm lets the next kernel's programs start at its wait (0, the "
        "default), once it has the ranks' rows (1) or once it has exchanged its sums of squares "
        "(2): the A/B of flint.graphs.fused.CLUSTER_NORM_LATE",
    )
    parser.add_argument(
        "--cluster-barrier",
        action="store_true",
        help="the cluster norm's sums of squares exchanged through plain stores and a "
        "cluster barrier, not asynchronous stores and a transaction barrier (the A/B of "
        "flint.graphs.fused.CLUSTER_ASYNC)",
    )
    parser.add_argument(
        "--cluster-route",
        type=int,
        choices=(0, 8, 16),
        help="the router's top-k made by its product's launch in one cluster of 8 or 16 "
        "programs, or in its own launch (0, the default): the A/B of "
        "flint.graphs.fused.CLUSTER_ROUTE",
    )
    args = parser.parse_args()
    fused.QKV_AFTER_WAIT = args.qkv_after
    if args.cluster_route is not None:
        fused.CLUSTER_ROUTE = args.cluster_route
    if args.cluster_barrier:
        fused.CLUSTER_ASYNC = False
    if args.no_cluster_norm:
        fused.CLUSTER_NORM = False
    if args.cluster_norm_late is not None:
        fused.CLUSTER_NORM_LATE = args.cluster_norm_late
    if args.kv_ask:
        fused.KV_ASK = "" if args.kv_ask == "none" else args.kv_ask
    decode.ROWS_EVERY_STEP = args.rows_every_step
    decode.TOKENS_TO_HOST = not args.tokens_copied
    if args.route_ranks == "off":
        fused.ROUTE_RANK_WARPS = 0
    elif args.route_ranks:
        try:
            mode, warps = (int(v) for v in args.route_ranks.split(","))
        except ValueError:
            parser.error("--route-ranks: MODE,WARPS, two integers, e.g. 2,1")
        if mode not in (1, 2) or warps not in (1, 2, 4, 8):
            parser.error("--route-ranks: MODE 1 or 2, WARPS 1, 2, 4 or 8")
        fused.ROUTE_RANKS, fused.ROUTE_RANK_WARPS = mode, warps
    moe_kernel.PDL = not args.no_pdl
    if args.early:
        moe_kernel.EARLY = moe_kernel.SMALL_KERNELS
    if args.early_kernels:
        names = frozenset(args.early_kernels.split(",")) - {"none"}
        if not names <= moe_kernel.EARLY_NAMES:
            parser.error(f"--early-kernels: not in {sorted(moe_kernel.EARLY_NAMES)}")
        moe_kernel.EARLY = names
    decode.GraphDecoder.device_greedy = not args.no_ahead
    decode.FUSED_DENSE = not args.torch_dense
    decode.FUSED_SDPA = not args.torch_attention
    device = torch.device("cuda", 0)
    gen = torch.Generator().manual_seed(0)
    result: dict[str, Any] = {"model": args.model, "tokens": args.tokens}
    result["dense"] = "torch" if args.torch_dense else "fused"
    result["attention"] = "torch" if args.torch_attention else "fused"
    result["ahead"] = not args.no_ahead
    result["pdl"] = not args.no_pdl
    result["early"] = sorted(moe_kernel.EARLY)
    result["qkv_after_wait"] = fused.QKV_AFTER_WAIT
    result["route_ranks"] = [fused.ROUTE_RANKS, fused.ROUTE_RANK_WARPS]
    result["kv_ask"] = fused.KV_ASK
    result["rows_every_step"] = decode.ROWS_EVERY_STEP
    result["tokens_to_host"] = decode.TOKENS_TO_HOST
    result["cluster_norm"] = fused.CLUSTER_NORM
    result["cluster_norm_late"] = fused.CLUSTER_NORM_LATE
    result["cluster_async"] = fused.CLUSTER_ASYNC
    result["cluster_route"] = fused.CLUSTER_ROUTE
    result["copy_gb_s"] = round(copy_rate(device) / 1e9, 1)
    ids: list[int] = []
    step_tokens: dict[str, list[int]] = {}  # "on" and "eager": the same step, the same tokens
    for mode in args.modes.split(","):
        with flint.LLM(args.model, device="cuda:0", graphs=mode, context_length=4096) as llm:
            model = llm.model
            vocab = model.config.vocab_size
            ids = ids or torch.randint(2, vocab, (args.prompt,), generator=gen).tolist()
            control = None
            rates = []
            for rep in range(args.reps + 1):
                out = llm.generate(ids, max_tokens=args.tokens, temperature=0.0, ignore_eos=True)
                control = control or out.token_ids
                if out.token_ids != control:
                    raise SystemExit(f"{mode}: tokens differ from the warm-up run")
                if rep:
                    rates.append(out.timings.decode_tok_s)
            if mode in ("on", "eager"):
                step_tokens[mode] = control
                if len(step_tokens) == 2 and step_tokens["on"] != step_tokens["eager"]:
                    raise SystemExit("the captured and uncaptured steps' tokens differ")
            row: dict[str, Any] = {
                "tg_tok_s_mean": round(statistics.mean(rates), 1),
                "tg_tok_s_sd": round(statistics.stdev(rates), 1) if len(rates) > 1 else 0.0,
                "first_tokens": list(control[:8]),
                "distinct_tokens": len(set(control)),
            }
            pools = expert_pools(model.experts)
            if pools is not None:
                nbytes = token_bytes(model, pools, model.decoder)
                roof = result["copy_gb_s"] * 1e9 / nbytes
                row["bytes_per_token_mib"] = round(nbytes / 2**20, 1)
                row["roofline_tok_s"] = round(roof, 1)
                row["share_of_roofline"] = round(row["tg_tok_s_mean"] / roof, 3)
                if mode == args.modes.split(",")[0]:
                    first = min(pools)
                    rate = kernel_rate(pools[first], model.config.top_k, llm.dtype, device)
                    result["moe_kernel_gb_s"] = round(rate / 1e9, 1)
            if isinstance(model.decoder, decode.GraphDecoder) and model.decoder.capture:
                row.update(device_loops(model.decoder, args.prompt, args.tokens, vocab))
            result[mode] = row
            if args.profile and mode == args.modes.split(",")[0]:
                profile(llm, ids)
            if args.between and mode == args.modes.split(",")[0]:
                between_steps(llm, ids)
        torch.cuda.empty_cache()
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
