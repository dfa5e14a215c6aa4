"""Advantage estimators: group-relative outcome advantages (GRPO, Dr. GRPO, QAE, RLOO, REINFORCE++-baseline) and GAE.

Outcome estimators take one scalar score per response, scores [B], and the group (prompt) id of each
response, group_ids [B] (int), and return one advantage per response [B]; the trainer broadcasts it over the
response's tokens. GAE takes token rewards and values [B, T] and returns per-token advantages and returns.

GRPO (paper, Section 2): A_i = (R_i - mean_G R) / (std_G R + epsilon).

Departures, numbered (all follow verl 0.9.1 core_algos, checked in tests/fixtures/verl_advantages.json):
1. std is the unbiased (n - 1) group std, as torch.std; the paper writes std without saying which.
2. A group of one response uses mean 0 and std 1, so its advantage is its raw score (verl); the trainer warns
   when a configuration makes every group a singleton. A group whose rewards are all equal gets advantage 0 only
   when float32 computes its mean exactly (binary 0/1 rewards do); otherwise the mean's rounding error divided by
   std + epsilon gives every response the same small advantage (grpo's docstring), as verl's GRPO does.
3. RLOO keeps the raw score of a singleton group; REINFORCE++-baseline and GAE whiten over the whole batch
   with the unbiased variance and rsqrt(var + 1e-8).
4. Entrocraft (arXiv 2604.26326) follows its authors' code (lblaoke/entrocraft@26165bd, verl core_algos
   compute_grpo_range_linear_outcome_advantage), which differs from a rule that keeps rollout i iff m A_i >= 0 on
   GRPO's advantages: above the band the advantage is the raw reward clipped at 0 (RAFT++), below it the raw reward
   clipped at 0 from above (NSR), no group baseline in either; inside it GRPO's. Its band anneals with the step
   from (0.6, 0.7) to (0.4, 0.5), the authors' reference script.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from .registry import Registry

__all__ = [
    "ADVANTAGES",
    "TokenLevel",
    "broadcast_advantages",
    "grpo",
    "qae",
    "rloo",
    "reinforce_pp_baseline",
    "gae",
    "masked_whiten",
    "group_stats",
    "entrocraft",
    "entrocraft_band",
    "entrocraft_rule",
]

ADVANTAGES: Registry = Registry("advantage estimator")


def broadcast_advantages(advantages: Tensor, like: Tensor) -> Tensor:
    """Advantages [B] (one per response) or [B, T] (per token) as [B, T], shaped like `like`."""
    if advantages.dim() == 1:
        if advantages.shape[0] != like.shape[0]:
            raise ValueError(f"advantages [{advantages.shape[0]}] do not match the batch of shape {tuple(like.shape)}")
        return advantages.unsqueeze(-1).expand(like.shape)
    if advantages.shape != like.shape:
        raise ValueError(f"advantages {tuple(advantages.shape)} do not match shape {tuple(like.shape)}")
    return advantages


def group_stats(scores: Tensor, group_ids: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Per-response group size, group mean and unbiased group std (0 for singletons), each [B]."""
    if scores.shape != group_ids.shape or scores.dim() != 1:
        raise ValueError(f"scores {tuple(scores.shape)} and group_ids {tuple(group_ids.shape)} must both be [B]")
    _, inverse = torch.unique(group_ids, return_inverse=True)
    n_groups = int(inverse.max()) + 1 if inverse.numel() else 0
    x = scores.float()
    count = torch.zeros(n_groups, dtype=torch.float32, device=x.device).index_add_(0, inverse, torch.ones_like(x))
    total = torch.zeros_like(count).index_add_(0, inverse, x)
    mean = (total / count)[inverse]
    sq = torch.zeros_like(count).index_add_(0, inverse, (x - mean) ** 2)
    var = sq / (count - 1).clamp_min(1.0)
    return count[inverse], mean, var.sqrt()[inverse]


@ADVANTAGES.register("grpo")
def grpo(scores: Tensor, group_ids: Tensor, *, norm_by_std: bool = True, epsilon: float = 1e-6) -> Tensor:
    """GRPO, Section 2: (R - mean_G) / (std_G + epsilon); norm_by_std=False gives Dr. GRPO's R - mean_G.

    A group of equal rewards is not exactly 0 when float32 rounds its mean: R - mean_G is then an error of about
    1e-8 and std_G is of that size too, far below epsilon = 1e-6, so A = error / (std_G + epsilon) is the same
    for the whole group: +0.056 for three rewards of 0.9 and -0.0074 for seven of 0.1, here and in verl 0.9.1's
    GRPO. Its value depends on the summation order (sixteen of 0.9: +0.11 here, -0.056 in verl). Binary 0/1
    rewards give exactly 0."""
    count, mean, std = group_stats(scores, group_ids)
    single = count < 2
    mean = torch.where(single, torch.zeros_like(mean), mean)
    centred = scores.float() - mean
    if not norm_by_std:
        return centred
    std = torch.where(single, torch.ones_like(std), std)
    return centred / (std + epsilon)


@ADVANTAGES.register("dr_grpo")
def dr_grpo(scores: Tensor, group_ids: Tensor) -> Tensor:
    """Dr. GRPO (Liu et al. 2025): the group-centred score without std normalisation."""
    return grpo(scores, group_ids, norm_by_std=False)


@ADVANTAGES.register("rloo")
def rloo(scores: Tensor, group_ids: Tensor) -> Tensor:
    """RLOO: R - mean of the other responses of the group = (R - mean_G) n / (n - 1); a singleton keeps R."""
    count, mean, _ = group_stats(scores, group_ids)
    x = scores.float()
    scale = count / (count - 1).clamp_min(1.0)
    return torch.where(count > 1, x * scale - mean * scale, x)


@ADVANTAGES.register("qae")
def qae(
    scores: Tensor, group_ids: Tensor, *, quantile_k: float = 0.4, norm_by_std: bool = True, epsilon: float = 1e-6
) -> Tensor:
    """QAE, quantile advantage estimation (Wu et al., arXiv 2509.22611): GRPO with the group's K-quantile as the
    baseline in place of its mean, (R - Q_K(R_G)) / (std_G + epsilon), as the authors' README states the change to
    verl's compute_grpo_outcome_advantage (`torch.quantile(scores, quantile_k)` for groups of two or more, linear
    interpolation; the unbiased std and the singleton rule of grpo unchanged; 0 < quantile_k < 1, else the mean as in
    their code). quantile_k 0.4 is their training scripts'. With binary rewards a group with a low success rate gets
    baseline 0 (only its successes move), one with a high success rate baseline 1 (only its failures move); between
    the two, linear interpolation gives a baseline in (0, 1). Computed in the scores' precision, group by group."""
    x = scores if scores.is_floating_point() else scores.float()  # (B,) in the scores' precision, as verl
    baseline, std = torch.zeros_like(x), torch.ones_like(x)  # a singleton keeps baseline 0 and std 1 (grpo's rule)
    for g in torch.unique(group_ids):
        rows = group_ids == g
        if int(rows.sum()) > 1:
            group = x[rows]
            baseline[rows] = torch.quantile(group, quantile_k) if 0 < quantile_k < 1 else group.mean()
            std[rows] = group.std()
    centred = x - baseline
    return centred / (std + epsilon) if norm_by_std else centred


def masked_whiten(values: Tensor, mask: Tensor, *, shift_mean: bool = True) -> Tensor:
    """(x - mean) * rsqrt(var + 1e-8) with mean and unbiased variance over mask (verl's masked_whiten)."""
    m = mask.to(torch.float32)
    n = m.sum()
    mean = (values * m).sum() / (n + 1e-8)
    var = ((values - mean) ** 2 * m).sum() / (n + 1e-8)
    var = var * n / (n - 1).clamp_min(1e-8)
    out = (values - mean) * torch.rsqrt(var + 1e-8)
    return out if shift_mean else out + mean


def reinforce_pp_baseline(scores: Tensor, group_ids: Tensor, mask: Tensor) -> Tensor:
    """REINFORCE++-baseline: R - group mean, broadcast over tokens [B, T], whitened over the batch."""
    count, mean, _ = group_stats(scores, group_ids)
    mean = torch.where(count < 2, torch.zeros_like(mean), mean)
    m = mask.to(torch.float32)
    token_adv = (scores.float() - mean).unsqueeze(-1) * m
    return masked_whiten(token_adv, m) * m


def gae(
    token_rewards: Tensor, values: Tensor, mask: Tensor, *, gamma: float = 1.0, lam: float = 1.0, whiten: bool = True
) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation (paper, Appendix E.4): delta_t = r_t + gamma V_{t+1} - V_t,
    A_t = delta_t + gamma lam A_{t+1}; positions with mask 0 carry V and A through unchanged.

    Returns (advantages, returns) [B, T], returns = raw A + V; advantages whitened over the batch if asked.
    """
    if not (token_rewards.shape == values.shape == mask.shape):
        raise ValueError("token_rewards, values and mask must all be [B, T]")
    m = mask.to(torch.float32)
    next_value = torch.zeros_like(values[:, 0], dtype=torch.float32)
    last_adv = torch.zeros_like(next_value)
    raw = torch.zeros_like(values, dtype=torch.float32)
    for t in reversed(range(values.shape[1])):
        delta = token_rewards[:, t] + gamma * next_value - values[:, t]
        adv_t = delta + gamma * lam * last_adv
        next_value = values[:, t] * m[:, t] + (1 - m[:, t]) * next_value
        last_adv = adv_t * m[:, t] + (1 - m[:, t]) * last_adv
        raw[:, t] = last_adv
    returns = raw + values
    return (masked_whiten(raw, m) if whiten else raw), returns


# ---------------------------------------------------------------------------------------------------------------
# Baselines that reshape rewards or advantages.


def rank_penalty(rewards: Tensor, group_ids: Tensor, seq_logp: Tensor, *, beta: float = 0.25) -> Tensor:
    """Rewarding the unlikely (He et al. 2025): R' = R (1 - beta * rank / G) for responses with R > 0, where
    rank in {0, ..., G - 1} orders a group's responses by mean token log-probability, 0 for the least likely.
    The likeliest correct responses lose the most reward, so the update favours rare correct ones.

    Departure: the original rewards are binary; negative rewards (this project's reward shape) are left as they
    are, so the penalty never makes a wrong answer look better.
    """
    out = rewards.float().clone()
    for g in torch.unique(group_ids):
        idx = (group_ids == g).nonzero().squeeze(-1)
        size = idx.numel()
        order = torch.argsort(seq_logp[idx], stable=True)  # ascending likelihood
        rank = torch.empty_like(order)
        rank[order] = torch.arange(size, device=order.device)
        scale = 1.0 - beta * rank.float() / size
        out[idx] = torch.where(out[idx] > 0, out[idx] * scale, out[idx])
    return out


def advantage_reweight(advantages: Tensor, old_logp: Tensor, *, alpha: float = 0.3) -> Tensor:
    """Advantage reweighting (Yang et al. 2025): A' = (alpha * pi_old + 1 - alpha) * A per token, which damps
    the updates of low-probability tokens; advantages [B] or [B, T], old_logp [B, T]."""
    return (alpha * old_logp.exp() + 1.0 - alpha) * broadcast_advantages(advantages, old_logp)


def overlong_penalty(lengths: Tensor, *, max_len: int, buffer: int, factor: float = 1.0) -> Tensor:
    """DAPO's soft overlong punishment: min(-(L - (L_max - L_cache)) / L_cache, 0) * factor, added to the reward
    of responses longer than L_max - L_cache; lengths [B]."""
    if buffer <= 0:
        return torch.zeros_like(lengths, dtype=torch.float32)
    excess = lengths.float() - (max_len - buffer)
    return (-excess / buffer).clamp(max=0.0) * factor


class TokenLevel:
    """Marks a token-level estimator that needs a critic's values (GAE); the trainer then runs a value head."""

    def __init__(self, fn):
        self.fn = fn

    def __call__(self, *args, **kwargs):
        return self.fn(*args, **kwargs)


ADVANTAGES.register("gae", TokenLevel(gae))


def outcome_token_rewards(rewards: Tensor, mask: Tensor) -> Tensor:
    """Token rewards [B, T] with each response's reward on its last valid token (PPO with outcome rewards)."""
    out = torch.zeros(mask.shape, dtype=torch.float32)
    last = (mask.long().sum(-1) - 1).clamp_min(0)
    out[torch.arange(mask.shape[0]), last] = rewards.float()
    return out * mask


def entrocraft_band(
    step: int,
    total_steps: int,
    *,
    lower_range: Sequence[float] = (0.6, 0.4),
    upper_range: Sequence[float] = (0.7, 0.5),
    schedule: str = "linear",
) -> tuple[float, float]:
    """Entrocraft's entropy band (h_low, h_high) at `step` of `total_steps` (the authors' global step, 1-based):
    each bound moves from its range's first value to its second, linearly in step / total_steps ("linear",
    grpo_range_linear) or along 0.5 (1 - cos(pi step / total_steps)) ("cos", grpo_range_cos)."""
    if schedule not in ("linear", "cos"):
        raise ValueError(f"entrocraft schedule must be 'linear' or 'cos', got {schedule!r}")
    if total_steps < 1 or not 0 <= step <= total_steps:
        raise ValueError(f"step must be in [0, total_steps] with total_steps >= 1, got {step} of {total_steps}")
    for name, pair in (("lower_range", lower_range), ("upper_range", upper_range)):
        if len(pair) != 2 or not all(isinstance(v, (int, float)) and 0 <= v < math.inf for v in pair):
            raise ValueError(f"entrocraft {name} must be two finite entropies >= 0 (start, end), got {pair!r}")
    t = step / total_steps
    progress = t if schedule == "linear" else 0.5 * (1 - math.cos(math.pi * t))
    low = lower_range[0] + (lower_range[1] - lower_range[0]) * progress
    high = upper_range[0] + (upper_range[1] - upper_range[0]) * progress
    return low, high


def entrocraft(
    scores: Tensor, advantages: Tensor, *, entropy: float, low: float, high: float
) -> tuple[Tensor, dict[str, float]]:
    """Entrocraft's advantages (departure 4; lblaoke/entrocraft compute_grpo_range_outcome_advantage): with the
    batch's mean entropy above `high`, RAFT++'s max(R, 0); below `low`, NSR's min(R, 0); otherwise `advantages`
    (the group estimator's, GRPO in the authors' runs). scores, advantages (B,). Metrics: the regime (+1 RAFT++,
    -1 NSR, 0 the estimator's) and the band."""
    if entropy > high:
        regime, out = 1.0, scores.clamp(min=0.0)
    elif entropy < low:
        regime, out = -1.0, scores.clamp(max=0.0)
    else:
        regime, out = 0.0, advantages
    return out.to(advantages.dtype), {"regime": regime, "band_low": low, "band_high": high}


def entrocraft_rule(
    scores: Tensor,
    advantages: Tensor,
    *,
    entropy: float,
    step: int,
    total_steps: int,
    lower_range: Sequence[float] = (0.6, 0.4),
    upper_range: Sequence[float] = (0.7, 0.5),
    schedule: str = "linear",
) -> tuple[Tensor, dict[str, float]]:
    """entrocraft at the band entrocraft_band gives for `step` of `total_steps` (the authors' grpo_range_linear, or
    grpo_range_cos with schedule "cos")."""
    low, high = entrocraft_band(step, total_steps, lower_range=lower_range, upper_range=upper_range, schedule=schedule)
    return entrocraft(scores, advantages, entropy=entropy, low=low, high=high)
