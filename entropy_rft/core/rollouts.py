"""Rollout-level rules: which rollouts of each group train, and with which advantage.

- grpo_dropout: GRPODropout (hexuandeng/GRPODropout@4ad3b3b, verl examples/grpo_dropout, its main variant
  "balance": select_method balanced_push_zero, adv_p_center_mode weighted_center). Per rollout g of a group, with
  s_g = -mean_t log pi_old(y_g,t) (the code's default basis "avg") and H the group's mean s, the push
  h_g = A_g (s_g - H) says whether the rollout's update raises (h > 0) or lowers the entropy proxy (the paper writes
  h_g / G, the group's share; the sign is the same). Every rollout with h > 0 is kept; those with h < 0 join,
  closest to 0 first, while the kept pushes still sum to more than 0; the rest are deleted (they leave the loss and
  its token-mean denominator). The group's advantages are then recomputed over the kept rollouts (the run's
  estimator, GRPO in the authors' runs) and recentred: A' = A - b with b = sum_g e^{-s_g} A_g / sum_g e^{-s_g}
  (a softmax of the mean log-probs over the kept rollouts).

Departures from the issue's summary of the paper, following the code, numbered (docs/design.md lists them too):
1. Deleted rollouts are the negative-push ones of either advantage sign, not only positive-advantage ones: the code
   ranks every h < 0 rollout and stops adding them at the first that would bring the kept sum to <= 1e-12.
2. s_g is the mean token log-prob (basis "avg"); basis "sum" (the sequence log-prob, the paper's -log pi(y)) is an
   option.
3. Rollouts whose push is 0 (|h| <= 1e-12) are deleted unless the group would keep fewer than max(1, G // 4); a
   group whose pushes are all 0 (every reward equal, so every A is 0) keeps G // 4 of them (at least 1) chosen at
   random: from the passed torch.Generator here, from Python's random seeded by the group's uuid in the code. A group
   with pushes of one sign only keeps its positive ones, then zero-push ones, then the negative ones closest to 0,
   up to max(1, G // 4).
4. The code selects only when its n_update_samples_per_prompt (7 in its scripts, with 8 rollouts) is below the group
   size, and that number plays no other part in balanced_push_zero; here the rule always selects.
5. The recentring weights and s_g read the behaviour policy's log p over each rollout's valid tokens (the code's
   old_log_probs); A_g is the estimator's sequence advantage (the code takes the masked mean of its token
   advantages, equal up to float32 rounding).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch
from torch import Tensor

__all__ = ["grpo_dropout", "rollout_pushes", "GRPO_DROPOUT_EPS"]

GRPO_DROPOUT_EPS = 1e-12  # the code's tolerance for a push's sign and for the kept sum staying above 0
Basis = Literal["avg", "sum"]


def _seq_logp(logp: Tensor, mask: Tensor, basis: Basis) -> Tensor:
    """(B,) each rollout's mean (avg) or summed (sum) log p over its valid tokens, in log p's float32."""
    m = mask.to(logp.dtype)
    total = (logp.detach() * m).sum(-1)
    return total if basis == "sum" else total / m.sum(-1).clamp_min(1.0)


def rollout_pushes(
    advantages: Tensor, logp: Tensor, mask: Tensor, group_ids: Tensor, *, basis: Basis = "avg"
) -> Tensor:
    """(B,) float64 GRPODropout's push h_g = A_g (s_g - H) of each rollout: s_g = -(its mean or summed log p), H the
    mean s of its group (the code's traj_entropy_push_before_*). advantages (B,), logp and mask (B, T)."""
    if basis not in ("avg", "sum"):
        raise ValueError(
            f"GRPODropout basis must be 'avg' (mean token log p, the code's default) or 'sum', got {basis!r}"
        )
    s = -_seq_logp(logp, mask, basis).double()
    _, inverse = torch.unique(group_ids, return_inverse=True)
    n = int(inverse.max()) + 1 if inverse.numel() else 0
    count = torch.zeros(n, dtype=torch.float64, device=s.device).index_add_(0, inverse, torch.ones_like(s))
    centre = (torch.zeros_like(count).index_add_(0, inverse, s) / count)[inverse]
    return advantages.double() * (s - centre)


def _select_group(push: Tensor, generator: torch.Generator | None, eps: float) -> Tensor:
    """(G,) bool: the code's select_balanced_push_zero on one group's pushes (module docstring, departure 3)."""
    g = push.numel()
    min_keep = max(1, g // 4)
    pos, neg = push > eps, push < -eps
    zero = ~pos & ~neg
    keep = torch.zeros(g, dtype=torch.bool, device=push.device)
    if bool(zero.all()):
        keep[torch.randperm(g, generator=generator)[:min_keep].to(push.device)] = True
        return keep
    keep |= pos
    if bool(pos.any()) and bool(neg.any()):
        order = torch.argsort(push.masked_fill(~neg, -torch.inf), descending=True, stable=True)[: int(neg.sum())]
        running = push[pos].sum() + torch.cumsum(push[order], 0)  # the kept sum after each negative, closest first
        keep[order[: int((running > eps).cumprod(0).sum())]] = True
    for pool, descending in ((zero, False), (neg & ~keep, True)):  # fill up to min_keep: zeros by index, then the
        short = min_keep - int(keep.sum())  # negatives closest to 0 (reached only with pushes of one sign)
        if short <= 0:
            break
        if descending and bool(pos.any()):
            break  # with both signs the code fills with zeros only
        idx = pool.nonzero().squeeze(-1)
        if descending:
            idx = idx[torch.argsort(push[idx], descending=True, stable=True)]
        keep[idx[:short]] = True
    return keep


def grpo_dropout(
    scores: Tensor,
    advantages: Tensor,
    group_ids: Tensor,
    logp: Tensor,
    mask: Tensor,
    *,
    estimator: Callable[[Tensor, Tensor], Tensor],
    basis: Basis = "avg",
    recenter: bool = True,
    generator: torch.Generator | None = None,
) -> tuple[Tensor, Tensor, dict[str, float]]:
    """GRPODropout's rollout deletion and recentred advantages (module docstring; the code's balance variant).

    scores (B,) the rewards the estimator reads; advantages (B,) the estimator's over the whole groups; group_ids (B,);
    logp, mask (B, T) the behaviour policy's log p of each response token and the valid tokens. estimator(scores,
    group_ids) -> (B,) recomputes the advantages over the kept rollouts (the run's: GRPO in the authors' scripts).
    recenter: subtract the group's e^{-s}-weighted mean advantage (adv_p_center_mode weighted_center; False: "none").
    Returns (advantages (B,) float32, 0 at deleted rollouts; keep (B,) bool; metrics): rollouts_kept_frac,
    push_mean_before / push_mean_after (the group mean push h, averaged over groups, before and over the kept ones),
    frac_groups_all_zero (groups whose pushes are all 0) and frac_groups_one_sign."""
    if advantages.dim() != 1 or advantages.shape != scores.shape or scores.shape != group_ids.shape:
        raise ValueError(
            f"GRPODropout acts on one advantage per rollout: scores {tuple(scores.shape)}, advantages "
            f"{tuple(advantages.shape)} and group_ids {tuple(group_ids.shape)} must all be (B,)"
        )
    if logp.shape != mask.shape or logp.shape[0] != scores.shape[0]:
        raise ValueError(f"logp {tuple(logp.shape)} and mask {tuple(mask.shape)} must be (B, T) with B rollouts")
    push = rollout_pushes(advantages, logp, mask, group_ids, basis=basis)  # (B,) float64
    keep = torch.zeros_like(group_ids, dtype=torch.bool)
    before, after, all_zero, one_sign = [], [], 0, 0
    groups = torch.unique(group_ids)
    for gid in groups:
        rows = (group_ids == gid).nonzero().squeeze(-1)
        h = push[rows]
        keep[rows] = _select_group(h, generator, GRPO_DROPOUT_EPS)
        nonzero = h.abs() > GRPO_DROPOUT_EPS
        all_zero += int(not bool(nonzero.any()))
        one_sign += int(
            bool(nonzero.any()) and not (bool((h > GRPO_DROPOUT_EPS).any()) and bool((h < -GRPO_DROPOUT_EPS).any()))
        )
        before.append(float(h.mean()))
        after.append(float(h[keep[rows]].mean()))
    out = torch.zeros_like(advantages, dtype=torch.float32)
    if bool(keep.all()):
        out = advantages.float().clone()
    else:  # the code recomputes every group's advantages over the kept rollouts once any rollout is deleted
        out[keep] = estimator(scores[keep], group_ids[keep]).float()
    if recenter:
        seq = _seq_logp(logp, mask, basis)  # (B,) float32: the softmax's logits, e^{-s_g} up to a constant
        for gid in groups:
            rows = ((group_ids == gid) & keep).nonzero().squeeze(-1)
            w = torch.softmax(seq[rows], dim=0)
            out[rows] = out[rows] - (w * out[rows]).sum()
    n_groups = max(len(groups), 1)
    metrics = {
        "rollouts_kept_frac": float(keep.float().mean()) if keep.numel() else 1.0,
        "push_mean_before": sum(before) / n_groups,
        "push_mean_after": sum(after) / n_groups,
        "frac_groups_all_zero": all_zero / n_groups,
        "frac_groups_one_sign": one_sign / n_groups,
    }
    return out, keep, metrics
