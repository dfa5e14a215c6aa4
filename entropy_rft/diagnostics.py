"""The per-step diagnostics of the paper's figures, as plain floats over a batch's response tokens.

`watch_metrics` is the monitor of an engine's own loss (the TRL and verl adapters' monitor mode): what moves the
batch's entropy, and what Clip_B and Clip_V would change in it, without changing the loss."""

from __future__ import annotations

import torch
from torch import Tensor

from .advantages import broadcast_advantages
from .dynamics import TokenStats, batch_covariance, corollary4_entropy_change
from .methods import METHODS

# the filters whose effect the monitor reports, each at its default options (the authors' mu)
WOULD_CLIP = ("clip_b", "clip_v")


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> float:
    """Mean of x over the mask's tokens, as a float (0 for an empty mask)."""
    m = mask.float()
    return float((x.float() * m).sum() / m.sum().clamp_min(1.0))


def watch_metrics(stats: TokenStats, advantages: Tensor, mask: Tensor, loss_mask: Tensor,
                  step: float | Tensor | None) -> dict[str, float | None]:
    """The monitor's metrics of one batch (every tensor the whole batch, gathered from every process):

    - entropy (over every valid response token, `mask`), s_star_mean and s_centered_mean (Figure 3, Corollary 2)
      over the same tokens; cov_a_sc, Cov_B(A, S_c) over the loss's tokens (`loss_mask`, Figure 5);
    - entropy_change/predicted: Corollary 4 in logit space (eq. 14), each token stepped by the loss's own
      step = lr w_t (losses.step_sizes for the loss's aggregation), None where the step is unknown;
    - for Clip_B and Clip_V at their default options (methods.METHODS): would_<name>/frac, the fraction of the
      loss's tokens the filter would drop, and would_<name>/entropy_change, their share of eq. 23's sum
      sum_t -step_t A_t S_c,t / |T| (the terms the token samples carry): to first order, the entropy change the
      step would lose by dropping them, before the token count of the loss shrinks.

    stats, mask, loss_mask (B, T); advantages (B,) or (B, T); step a float or (B, T) (0 off loss_mask)."""
    adv = broadcast_advantages(advantages, stats.s_centered)
    valid, used = mask.bool(), loss_mask.bool() & mask.bool()
    out: dict[str, float | None] = {
        "entropy": masked_mean(stats.entropy, valid),
        "s_star_mean": masked_mean(stats.s_star, valid),
        "s_centered_mean": masked_mean(stats.s_centered, valid),
        "cov_a_sc": float(batch_covariance(adv, stats.s_centered, used)),
        "entropy_change/predicted": None,
    }
    terms = None
    if step is not None:
        # lr is unused where step is given: step already carries it (lr w_t)
        out["entropy_change/predicted"] = float(corollary4_entropy_change(adv, stats.s_centered, used, lr=0.0, step=step))
        size = torch.as_tensor(step, dtype=torch.float64, device=adv.device)
        terms = -size * adv.double() * stats.s_centered.double() * used.double() / used.sum().clamp_min(1)  # eq. 23
    n = used.sum().clamp_min(1)
    for name in WOULD_CLIP:
        keep, _ = METHODS.get(name).apply(stats, advantages, used)
        dropped = used & ~keep
        out[f"would_{name}/frac"] = float(dropped.sum() / n)
        out[f"would_{name}/entropy_change"] = None if terms is None else float((terms * dropped).sum())
    return out
