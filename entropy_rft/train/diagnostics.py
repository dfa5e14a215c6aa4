"""The per-step diagnostics of the paper's figures, as plain floats over a batch's response tokens: reward and
accuracy, entropy (over every valid token and over the kept ones), the clipped fractions, the means of S* and S_c
(Figure 3, Corollary 2), Cov_B(A, S_c) (Figure 5), the first-order entropy change predicted in logit space with the
loss's own per-token step sizes (Corollary 4; losses.step_sizes), and after the update the sampler's log-prob gap
and, on probe steps, the first-order and the realised change of the batch's mean entropy.

`watch_metrics` is the monitor of an engine's own loss (the TRL and verl adapters' monitor mode): what moves the
batch's entropy, and what Clip_B and Clip_V would change in it, without changing the loss."""

from __future__ import annotations

import torch
from torch import Tensor

from ..core.advantages import broadcast_advantages
from ..core.dynamics import (
    TokenStats,
    batch_covariance,
    corollary4_entropy_change,
    entropy_change_by_region,
    region_masks,
)
from ..core.losses import step_sizes
from ..core.masks import clipped_fractions
from ..core.methods import METHODS, POLICY_LOSSES
from ..samples import entropy_terms
from .forward import EntropyProbe, batch_forward

# the filters whose effect the monitor reports, each at its default options (the authors' mu)
WOULD_CLIP = ("clip_b", "clip_v")


def would_clip_label(name: str) -> str:
    """How the inspect page names a WOULD_CLIP filter's mark: 'Clip_B (mu 2.5) would drop it'."""
    options = ", ".join(f"{k} {v}" for k, v in METHODS.get(name).options.items() if v is not None)
    return f"{name.replace('clip_', 'Clip_').replace('_b', '_B').replace('_v', '_V')} ({options}) would drop it"


def float_mean(x: torch.Tensor, mask: torch.Tensor) -> float:
    """Mean of x over the mask's tokens, as a Python float for a metrics line (0 for an empty mask); the loss's own
    tensor-valued mean is losses.masked_mean."""
    m = mask.float()
    return float((x.float() * m).sum() / m.sum().clamp_min(1.0))


def loss_step_sizes(mask, loss_mask, cfg) -> float | torch.Tensor:
    """lr w_t of every kept token at ratio 1 (losses.step_sizes for the policy loss's aggregation: cfg.loss_agg, or
    SAPO's and GMPO's own): the whole batch's token-mean denominator |T_B| (the kept tokens, or every valid token with
    denominator="all") and sequence count. Every policy loss's factor on d log p is 1 at ratio 1."""
    denom = mask if cfg.denominator == "all" else loss_mask
    agg = POLICY_LOSSES.get(cfg.policy_loss).aggregation(cfg)
    return step_sizes(
        loss_mask,
        agg,
        lr=cfg.lr,
        num_tokens=max(float(denom.sum()), 1.0),
        num_seqs=max(float((denom.sum(-1) > 0).sum()), 1.0),
        norm=cfg.max_new_tokens,
    )


def region_metrics(
    stats: TokenStats, advantages: Tensor, mask: Tensor, loss_mask: Tensor, step: float | Tensor
) -> dict[str, float]:
    """The step's predicted entropy change by region (dynamics.entropy_change_by_region over the loss's tokens, at
    the loss's own step sizes: the four values sum to entropy_change/predicted) and, per region, the fraction of its
    valid tokens the method removed from the loss (clip_frac_by_region/<region>; 0 for a region with no token).
    stats, mask, loss_mask (B, T); advantages (B,) or (B, T); step a float or (B, T)."""
    valid, used = mask.bool(), loss_mask.bool() & mask.bool()
    change = entropy_change_by_region(advantages, stats.s_star, stats.s_centered, used, step=step)
    out = {f"entropy_change/by_region/{name}": float(v) for name, v in change.items()}
    for name, where in region_masks(advantages, stats.s_star, valid).items():
        out[f"clip_frac_by_region/{name}"] = int((where & ~used).sum()) / max(int(where.sum()), 1)
    return out


def reweight_metrics(s_star: Tensor, advantages: Tensor, mask: Tensor, weights: Tensor) -> dict[str, float]:
    """For a method with token weights (STARE): per region, the fraction of its valid tokens whose weight is not 1
    (reweight_frac_by_region/<region>; 0 for a region with no token). s_star, mask, weights (B, T); advantages (B,)
    or (B, T), of either sign before or after the weights (> 0)."""
    return {
        f"reweight_frac_by_region/{name}": int((where & (weights != 1)).sum()) / max(int(where.sum()), 1)
        for name, where in region_masks(advantages, s_star, mask.bool()).items()
    }


def step_metrics(step, rewards, correct, adv, stats: TokenStats, mask, keep, rollout, cfg, optimizer) -> dict:
    """The per-step diagnostics of the paper's figures, all over the batch's response tokens."""
    loss_mask = mask & keep
    token_adv = broadcast_advantages(adv, mask)
    fractions = clipped_fractions(mask, keep, adv)
    cov = batch_covariance(token_adv, stats.s_centered, loss_mask)
    sizes = loss_step_sizes(mask, loss_mask, cfg)
    return {
        "step": step + 1,
        "reward_mean": float(rewards.mean()),
        "accuracy": float(correct.float().mean()),
        "entropy": float_mean(stats.entropy, mask),  # the policy's: token-mean over every valid response token
        "entropy_kept": float_mean(stats.entropy, loss_mask),  # over the tokens the filter keeps in the loss
        "clip_frac": fractions["frac_clipped"],
        "clip_frac_pos": fractions["frac_clipped_pos"],
        "clip_frac_neg": fractions["frac_clipped_neg"],
        "s_star_mean": float_mean(stats.s_star, mask),  # Figure 3
        "s_centered_mean": float_mean(stats.s_centered, mask),  # Corollary 2: about 0 on-policy
        "cov_a_sc": float(cov),  # Figure 5 plots -Cov_B(A, S_c)
        # Corollary 4 in logit space, each token stepped by the loss's own lr w_t (losses.step_sizes; lr / |T_B| for
        # the token-mean loss: dynamics, departure 3)
        "entropy_change/predicted": float(
            corollary4_entropy_change(adv, stats.s_centered, loss_mask, lr=cfg.lr, step=sizes)
        ),
        **region_metrics(stats, adv, mask, loss_mask, sizes),  # the same sum, split by region
        "response_length": float(mask.sum(-1).float().mean()),
        "truncation_rate": float((~rollout.finished).float().mean()),
        "frac_zero_advantage": float((adv == 0).float().mean()),  # responses (or tokens) with A = 0
        "lr": optimizer.param_groups[0]["lr"],
    }


def after_update_metrics(
    model, rollout, stats: TokenStats, probe: EntropyProbe | None, cfg, rows_per_pass: int
) -> dict:
    """The sampler's log-probs (HF or vLLM) against the trained policy's on the same tokens; on probe steps, the
    first-order and the realised change of the batch's mean entropy (the `after` pass is built as the statistics
    pass was, so the difference is the update's alone)."""
    mask, out = rollout.response_mask, {}
    if rollout.sampler_logp is not None:
        gap = (stats.logp - rollout.sampler_logp.to(stats.logp.device)).abs()[mask]
        out["rollout/sampler_logp_gap"] = gap.mean().item()
        out["rollout/sampler_logp_gap_max"] = gap.max().item()
    if probe is not None:  # over every valid response token of the batch, before and after the update
        after = batch_forward(
            model, rollout, cfg.temperature, rows_per_pass, precision=cfg.precision, from_hidden=cfg.stats_from_hidden
        )[0]
        out["entropy_change/first_order"] = probe.first_order()
        out["entropy_change/realised"] = float_mean(after.entropy, mask) - float_mean(stats.entropy, mask)
    return out


def watch_metrics(
    stats: TokenStats, advantages: Tensor, mask: Tensor, loss_mask: Tensor, step: float | Tensor | None
) -> dict[str, float | None]:
    """The monitor's metrics of one batch (every tensor the whole batch, gathered from every process):

    - entropy (over every valid response token, `mask`), s_star_mean and s_centered_mean (Figure 3, Corollary 2)
      over the same tokens; cov_a_sc, Cov_B(A, S_c) over the loss's tokens (`loss_mask`, Figure 5);
    - entropy_change/predicted: Corollary 4 in logit space (eq. 14), each token stepped by the loss's own
      step = lr w_t (losses.step_sizes for the loss's aggregation), None where the step is unknown;
    - entropy_change/by_region/<region> and clip_frac_by_region/<region> (region_metrics), where the step is known;
    - for Clip_B and Clip_V at their default options (methods.METHODS): would_<name>/frac, the fraction of the
      loss's tokens the filter would drop, and would_<name>/entropy_change, their share of eq. 23's sum
      sum_t -step_t A_t S_c,t / |T| (the terms the token samples carry): to first order, the entropy change the
      step would lose by dropping them, before the token count of the loss shrinks.

    stats, mask, loss_mask (B, T); advantages (B,) or (B, T); step a float or (B, T) (0 off loss_mask)."""
    adv = broadcast_advantages(advantages, stats.s_centered)
    valid, used = mask.bool(), loss_mask.bool() & mask.bool()
    out: dict[str, float | None] = {
        "entropy": float_mean(stats.entropy, valid),
        "s_star_mean": float_mean(stats.s_star, valid),
        "s_centered_mean": float_mean(stats.s_centered, valid),
        "cov_a_sc": float(batch_covariance(adv, stats.s_centered, used)),
        "entropy_change/predicted": None,
    }
    terms = None
    if step is not None:
        # lr is unused where step is given: step already carries it (lr w_t)
        out["entropy_change/predicted"] = float(
            corollary4_entropy_change(adv, stats.s_centered, used, lr=0.0, step=step)
        )
        terms = entropy_terms(adv, stats.s_centered, used, step)[0]  # eq. 23's term of each token, as the samples'
        out.update(region_metrics(stats, advantages, valid, used, step))
    n = used.sum().clamp_min(1)
    for name in WOULD_CLIP:
        keep, _ = METHODS.get(name).apply(stats, advantages, used)
        dropped = used & ~keep
        out[f"would_{name}/frac"] = float(dropped.sum() / n)
        out[f"would_{name}/entropy_change"] = None if terms is None else float((terms * dropped).sum())
    return out
