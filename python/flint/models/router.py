"""DeepSeek's fp32 group-limited routers: the sigmoid router of DeepSeek-V3 (and
GLM-4.5, Ling) and the softmax router of DeepSeek-V2.

Sigmoid (transformers' ``DeepseekV3TopkRouter``): each expert's score is
``sigmoid(logit)``. A per-expert correction bias is added to the scores only to choose:
experts are split into ``n_group`` equal groups, each group is ranked by the sum of its
two best biased scores, only the best ``topk_group`` groups stay eligible, and the top-k
biased scores among them are selected. The weights are the unbiased scores of the
selected experts, optionally renormalised to sum to 1, times ``routed_scaling_factor``.

Softmax (``DeepseekV2TopkRouter``): scores are the softmax over all experts; with
``group_limited_greedy`` each group is ranked by its best score and the experts outside
the best ``topk_group`` groups are zeroed (``greedy``: one group, all eligible). The
weights are the chosen scores times ``routed_scaling_factor``, never renormalised.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from flint.models.config import GroupRouterConfig

# T = tokens, H = hidden, E = experts, G = groups, K = top-k


def eligible_choice(choice: torch.Tensor, cfg: GroupRouterConfig) -> torch.Tensor:
    """Choice scores [T, E] with the experts outside each token's ``topk_group`` best
    groups masked: -inf for the sigmoid router (ranked by the sum of their two best
    scores), 0 for the softmax router (ranked by their best score), as each router does."""
    if cfg.topk_group == cfg.n_group:
        return choice  # every group eligible
    tokens, experts = choice.shape
    per_group = choice.view(tokens, cfg.n_group, experts // cfg.n_group)  # [T, G, E/G]
    if cfg.scoring == "softmax":
        group_scores = per_group.max(dim=-1).values  # [T, G]
    else:
        group_scores = per_group.topk(2, dim=-1).values.sum(dim=-1)  # [T, G]
    best_groups = torch.topk(group_scores, cfg.topk_group, dim=-1).indices  # [T, topk_group]
    keep = torch.zeros_like(group_scores, dtype=torch.bool)
    keep.scatter_(1, best_groups, True)
    eligible = keep.unsqueeze(-1).expand_as(per_group).reshape(tokens, experts)  # [T, E]
    fill = 0.0 if cfg.scoring == "softmax" else float("-inf")
    return choice.masked_fill(~eligible, fill)


def selection_scores(
    logits: torch.Tensor,  # [T, E] fp32
    bias: torch.Tensor | None,  # [E] fp32, the sigmoid router's correction bias
    cfg: GroupRouterConfig,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(scores [T, E], choice [T, E]): the scores the weights come from, and the
    scores the top-k picks from (biased, ineligible groups masked)."""
    if cfg.scoring == "softmax":
        scores = torch.softmax(logits, dim=-1)
        return scores, eligible_choice(scores, cfg)
    scores = torch.sigmoid(logits)
    assert bias is not None, "the sigmoid router needs its correction bias"
    return scores, eligible_choice(scores + bias, cfg)


def route_grouped(
    x: torch.Tensor,  # [T, H], any float dtype
    router: torch.Tensor,  # [E, H] fp32
    bias: torch.Tensor | None,  # [E] fp32, the correction bias (None: softmax router)
    cfg: GroupRouterConfig,
    top_k: int,
    normalize: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns (ids [T, K] int64, weights [T, K] fp32), ids in descending order of
    their choice score (the router-rank order the expert sum follows)."""
    scores, choice = selection_scores(F.linear(x.to(torch.float32), router), bias, cfg)
    ids = torch.topk(choice, top_k, dim=-1).indices  # [T, K]
    weights = scores.gather(1, ids)  # [T, K]
    if normalize and cfg.scoring == "sigmoid":
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return ids, weights * cfg.routed_scaling_factor
