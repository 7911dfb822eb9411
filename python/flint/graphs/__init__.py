"""Decode without launch overhead: a resident model's decode step captured in CUDA
graphs around fixed-address buffers, its routed experts computed by slot index
(``moe_kernel``) so no step needs the host (issue 10); a streamed model's dense parts
captured in segments between the host's expert hops (``streamed``).
``flint.graphs.setup`` picks the backend and attaches the decoder; this module stays
light (no Triton import)."""

# auto: graphs where the model is covered, else eager without a word; on: graphs or
# an error saying why not; eager: the graph step launched op by op (identical output);
# off: the general eager path (per-expert torch kernels).
GRAPH_MODES = ("auto", "on", "eager", "off")


def check_graph_mode(mode: str) -> None:
    if mode not in GRAPH_MODES:
        raise ValueError(f"graphs must be one of {', '.join(GRAPH_MODES)}, not {mode!r}")
