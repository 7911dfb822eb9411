"""The sigmoid, group-limited router of DeepSeek-V3 (and GLM-4.5), in fp32.

Each expert's score is ``sigmoid(logit)``. A per-expert correction bias is added to the
scores only to choose: experts are split into ``n_group`` equal groups, each group is
ranked by the sum of its two best biased scores, only the best ``topk_group`` groups
stay eligible, and the top-k biased scores among them are selected. The weights are the
unbiased scores of the selected experts, optionally renormalised to sum to 1, times
``routed_scaling_factor`` (transformers' ``DeepseekV3TopkRouter``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from flint.models.config import GroupRouterConfig

# T = tokens, H = hidden, E = experts, G = groups, K = top-k


def eligible_choice(choice: torch.Tensor, cfg: GroupRouterConfig) -> torch.Tensor:
    """Biased scores [T, E] with the experts outside each token's ``topk_group`` best
    groups (ranked by the sum of their two best scores) set to -inf."""
    tokens, experts = choice.shape
    per_group = choice.view(tokens, cfg.n_group, experts // cfg.n_group)  # [T, G, E/G]
    group_scores = per_group.topk(2, dim=-1).values.sum(dim=-1)  # [T, G]
    best_groups = torch.topk(group_scores, cfg.topk_group, dim=-1).indices  # [T, topk_group]
    keep = torch.zeros_like(group_scores, dtype=torch.bool)
    keep.scatter_(1, best_groups, True)
    eligible = keep.unsqueeze(-1).expand_as(per_group).reshape(tokens, experts)  # [T, E]
    return choice.masked_fill(~eligible, float("-inf"))


def route_grouped(
    x: torch.Tensor,  # [T, H], any float dtype
    router: torch.Tensor,  # [E, H] fp32
    bias: torch.Tensor,  # [E] fp32, the correction bias
    cfg: GroupRouterConfig,
    top_k: int,
    normalize: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns (ids [T, K] int64, weights [T, K] fp32), ids in descending order of
    their biased score (the router-rank order the expert sum follows)."""
    scores = torch.sigmoid(F.linear(x.to(torch.float32), router))  # [T, E]
    choice = eligible_choice(scores + bias, cfg)  # [T, E]
    ids = torch.topk(choice, top_k, dim=-1).indices  # [T, K]
    weights = scores.gather(1, ids)  # [T, K]
    if normalize:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return ids, weights * cfg.routed_scaling_factor
