"""Policy losses, regularisers and loss aggregation.

- ppo_clip_loss: the clipped surrogate of GRPO/PPO (paper eq. 1) with asymmetric clipping (eps_low,
  eps_high; DAPO's clip-higher is eps_high = 0.28) and dual clip for negative advantages (constant c).
  In strict on-policy training the ratio is 1 and no clipping is active (Section 2).
- kl_penalty: the k3 ("low-variance") estimator of KL(pi || pi_ref).
- aggregate: the loss aggregation modes token-mean, seq-mean-token-mean, seq-mean-token-sum,
  seq-mean-token-sum-norm and token-sum; `Aggregation` binds a mode to its denominators, and every loss takes one.
- the losses engines ship beyond the paper, under verl 0.9.1's names: cispo_loss, sapo_loss, dppo_tv_loss,
  dppo_kl_loss, geo_mean_loss, and erc_loss (Kwai-Klear/ERC); each has a `*_ratio` function, the factor it puts on
  d log p_t, which step_sizes takes as `ratio` (1 at ratio 1 for all of them).
- token_weights, step_sizes: the per-token step-size rule of each aggregation (and of GSPO's sequence-level ratio):
  how far one optimizer step of plain gradient descent moves each token's log p, the alpha of Theorem 2 (eq. 10).
  The metrics (entropy_change/*), the token samples, the inspect page and the TRL adapter all take it from here.

All functions take tensors [B, T] and a bool/0-1 loss mask [B, T]; they return (loss, metrics) where metrics
are 0-dim tensors (no host sync inside loss math). Tokens removed by a method's filter are simply absent from
the mask, so they leave both the numerator and the token-mean denominator (the authors' Clip_B/Clip_V code
edits the response mask the same way).

Denominators are explicit: for gradient accumulation over micro-batches, pass an Aggregation with num_tokens /
num_seqs of the whole mini-batch and the sum of the micro-batch losses equals the full-batch loss (tested).
aggregate, token_weights and step_sizes keep the keyword form (mode, num_tokens=, num_seqs=, norm=), as the engine
adapters call them.

Departures, numbered, from verl 0.9.1 (compute_policy_loss_vanilla and agg_loss, checked against
tests/fixtures/verl_policy_losses.json; the engines' losses against engine_policy_losses.json):
1. The token-mean denominator is num_tokens exactly (verl adds no epsilon either when the count is global);
   the per-sequence mean of seq-mean-token-mean divides by (count + 1e-8), as verl does.
2. Metrics also report the high and low clip fractions separately (clipfrac_high for A > 0 and ratio above
   1 + eps_high, clipfrac_low for A < 0 and ratio below 1 - eps_low).
3. Clip-Cov and KL-Cov (Cui et al. 2025; verl compute_policy_loss_clip_cov / _kl_cov, parity-tested on verl's
   cases): the token selection is a separate function run once per training batch over all its tokens, with the
   behaviour policy's log-probs, from a seeded torch.Generator. verl selects inside the loss, per micro-batch,
   with the current log-probs (so the selection changes with the micro-batch size, verl #7829). For a single
   on-policy update the two log-probs are equal and no token is PPO-clipped, so Clip-Cov's exclusion of
   clipped tokens is empty in both.
4. GSPO matches verl's compute_policy_loss_gspo (sequence ratio from the length-normalised log-ratio, clamped
   at 10 in log space, no dual clip); the default clip range is the GSPO paper's (3e-4, 4e-4).
5. verl's SAPO always aggregates seq-mean-token-mean and its GMPO always the mean over rows, whatever
   loss_agg_mode says; sapo_loss takes agg (default that), the registry fixes it (methods.PolicyLoss.agg), and
   geo_mean_loss refuses another agg. GMPO's mean counts the sequences with a loss token (num_seqs), verl's every row
   of the micro-batch. CISPO's upper_only option is TRL 1.16's different loss of the same name.
6. token-sum is the sum at one rank: verl multiplies it by its data-parallel size (DDP then averages gradients).
7. seq-mean-token-sum-norm (Dr. GRPO) needs its constant norm passed (the trainer passes max_new_tokens); verl
   defaults it to the response tensor's width, which is the budget there only because verl pads every batch to
   max_response_length. Here batches are padded to their longest response, so that default would make the loss
   depend on the batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, cast

import torch
from torch import Tensor

from .advantages import broadcast_advantages

__all__ = [
    "AGG_MODES",
    "Aggregation",
    "aggregate",
    "masked_mean",
    "ppo_clip_loss",
    "kl_penalty",
    "token_weights",
    "step_sizes",
    "token_ratio",
    "sequence_ratio",
    "cispo_loss",
    "sapo_loss",
    "dppo_tv_loss",
    "dppo_kl_loss",
    "geo_mean_loss",
    "erc_loss",
]

AggMode = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm", "token-sum"]
AGG_MODES: tuple[str, ...] = (
    "token-mean",
    "seq-mean-token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-sum-norm",
    "token-sum",
)


def masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    """Mean of x over mask with denominator sum(mask) + 1e-8 (verl's masked_mean)."""
    m = mask.to(x.dtype)
    return (x * m).sum() / (m.sum() + 1e-8)


def aggregate(
    loss_mat: Tensor,
    mask: Tensor,
    mode: AggMode = "token-mean",
    *,
    num_tokens: Tensor | float | None = None,
    num_seqs: Tensor | float | None = None,
    norm: float | None = None,
) -> Tensor:
    """Reduce a per-token loss [B, T] to a scalar.

    token-mean: sum over valid tokens / num_tokens (default: valid tokens here).
    seq-mean-token-mean: mean over sequences of each sequence's token mean.
    seq-mean-token-sum: mean over sequences of each sequence's token sum.
    seq-mean-token-sum-norm: as seq-mean-token-sum with each sum divided by the constant norm, Dr. GRPO
    (required: the generation budget, max_new_tokens, as verl's loss_scale_factor and TRL's
    max_completion_length; the batch's padded width T would change the loss with the longest response).
    token-sum: the sum over valid tokens (verl 0.9.1's token-sum at one data-parallel rank; no denominator).
    Sequence means divide by num_seqs (default: sequences with at least one valid token here).
    """
    for name, count in (("num_tokens", num_tokens), ("num_seqs", num_seqs)):
        if count is not None and not isinstance(count, Tensor) and not count > 0:
            raise ValueError(
                f"{name} is a loss denominator (a count of tokens or sequences): it must be > 0, got "
                f"{count}; clamp the count to >= 1 (a batch with no loss token has a zero loss)"
            )
    m = mask.to(loss_mat.dtype)
    if mode == "token-mean":
        denom = m.sum() if num_tokens is None else num_tokens
        return (loss_mat * m).sum() / denom
    if mode == "token-sum":
        return (loss_mat * m).sum()
    if mode == "seq-mean-token-mean":
        per_seq = (loss_mat * m).sum(-1) / (m.sum(-1) + 1e-8)
    elif mode == "seq-mean-token-sum":
        per_seq = (loss_mat * m).sum(-1)
    elif mode == "seq-mean-token-sum-norm":
        if norm is None:
            raise ValueError(
                "loss aggregation 'seq-mean-token-sum-norm' (Dr. GRPO) divides each sequence's sum by a "
                "constant: pass norm= the generation budget (max_new_tokens), not the padded width"
            )
        per_seq = (loss_mat * m).sum(-1) / norm
    else:
        raise ValueError(f"unknown loss aggregation {mode!r}; choose one of {', '.join(AGG_MODES)}")
    has_tokens = (m.sum(-1) > 0).to(loss_mat.dtype)
    denom = has_tokens.sum() if num_seqs is None else num_seqs
    return (per_seq * has_tokens).sum() / denom


@dataclass(frozen=True)
class Aggregation:
    """How a loss reduces its per-token values (B, T) over its mask to a scalar: the mode and `aggregate`'s
    denominators. num_tokens / num_seqs are the whole mini-batch's counts when micro-batch losses are summed (None:
    the mask's own); norm is Dr. GRPO's constant (seq-mean-token-sum-norm). Every loss here takes one as `agg`, or a
    mode's name for Aggregation(mode)."""

    mode: AggMode = "token-mean"
    num_tokens: Tensor | float | None = None
    num_seqs: Tensor | float | None = None
    norm: float | None = None

    @classmethod
    def of(cls, agg: Aggregation | str) -> Aggregation:
        return agg if isinstance(agg, Aggregation) else cls(cast(AggMode, agg))

    def __call__(self, loss_mat: Tensor, mask: Tensor) -> Tensor:
        """aggregate(loss_mat, mask) in this mode with these denominators."""
        return aggregate(loss_mat, mask, self.mode, num_tokens=self.num_tokens, num_seqs=self.num_seqs, norm=self.norm)


def token_weights(
    mask: Tensor,
    mode: AggMode = "token-mean",
    *,
    num_tokens: Tensor | float | None = None,
    num_seqs: Tensor | float | None = None,
    norm: float | None = None,
) -> Tensor | float:
    """Each token's weight w_t in `aggregate(loss_mat, mask, mode, ...)`: d loss / d loss_mat[b, t].

    token-mean: 1 / num_tokens, the same for every token, returned as a float; the other modes (B, T) float64,
    0 off the mask: token-sum 1, seq-mean-token-mean 1 / (num_seqs (|o_b| + 1e-8)), seq-mean-token-sum 1 / num_seqs,
    seq-mean-token-sum-norm 1 / (num_seqs norm). Defaults of num_tokens and num_seqs as in aggregate."""
    m = mask.to(torch.float64)
    if mode == "token-mean":
        return 1.0 / float(m.sum() if num_tokens is None else num_tokens)
    if mode == "token-sum":
        return m
    has_tokens = (m.sum(-1, keepdim=True) > 0).to(torch.float64)
    seqs = float(has_tokens.sum() if num_seqs is None else num_seqs)
    if mode == "seq-mean-token-mean":
        per_token = 1.0 / (m.sum(-1, keepdim=True) + 1e-8)
    elif mode == "seq-mean-token-sum":
        per_token = torch.ones_like(has_tokens)
    elif mode == "seq-mean-token-sum-norm":
        if norm is None:
            raise ValueError("loss aggregation 'seq-mean-token-sum-norm' (Dr. GRPO) needs norm= the generation budget")
        per_token = torch.full_like(has_tokens, 1.0 / norm)
    else:
        raise ValueError(f"unknown loss aggregation {mode!r}; choose one of {', '.join(AGG_MODES)}")
    return m * per_token * has_tokens / seqs


def token_ratio(logp: Tensor, old_logp: Tensor, mask: Tensor) -> Tensor:
    """The token ratio r_t = exp(log p_t - old log p_t), (B, T): the factor the PPO-clip surrogate -A r_t puts on
    d log p_t where it is not clipped. (mask is unused: the signature is sequence_ratio's.)"""
    return (logp - old_logp).exp()


def sequence_ratio(logp: Tensor, old_logp: Tensor, mask: Tensor) -> Tensor:
    """GSPO's sequence ratio s_b = exp(mean over the response's masked tokens of log r_t), broadcast to (B, T):
    the factor its per-token loss -A s_b puts on d log p_t (gspo_loss's straight-through form)."""
    m = mask.to(logp.dtype)
    seq = ((logp - old_logp) * m).sum(-1) / m.sum(-1).clamp_min(1.0)
    return seq.clamp(max=10.0).exp()[:, None].expand_as(logp)


def step_sizes(
    mask: Tensor,
    mode: AggMode = "token-mean",
    *,
    lr: float,
    ratio: Tensor | None = None,
    num_tokens: Tensor | float | None = None,
    num_seqs: Tensor | float | None = None,
    norm: float | None = None,
) -> Tensor | float:
    """alpha_t / A_t of Theorem 2 (eq. 10) for one gradient step of size lr on the aggregated surrogate -A r:
    lr w_t r_t, so a token's log p moves (in logit space) by lr w_t r_t A_t. `ratio` is the factor the loss puts
    on d log p_t: the token ratio r_t (PPO-clip, unclipped), GSPO's sequence ratio s_b (sequence_ratio); None
    is ratio 1, the strict on-policy step. A float for token-mean without ratios (lr / num_tokens), else
    (B, T) float64, 0 off the mask."""
    if mode == "token-mean" and ratio is None:
        return lr / float(mask.sum() if num_tokens is None else num_tokens)
    w = token_weights(mask, mode, num_tokens=num_tokens, num_seqs=num_seqs, norm=norm)
    if ratio is None:
        return lr * w
    return lr * w * ratio.detach().to(torch.float64) * mask.to(torch.float64)


def ppo_clip_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    dual_clip_c: float | None = 3.0,
    agg: Aggregation | AggMode = "token-mean",
) -> tuple[Tensor, dict[str, Tensor]]:
    """Clipped surrogate, eq. 1: -min(r A, clip(r, 1 - eps_low, 1 + eps_high) A), with dual clip: for A < 0
    the per-token loss is at most -c A. advantages [B] or [B, T]; logp, old_logp, mask [B, T].

    Metrics: clipfrac (tokens where the clipped term is the active one), clipfrac_high, clipfrac_low,
    clipfrac_dual (tokens capped by the dual clip), ppo_kl (mean of old_logp - logp), ratio_mean.
    """
    if dual_clip_c is not None and dual_clip_c <= 1.0:
        raise ValueError(f"dual_clip_c must be > 1 (or None to disable), got {dual_clip_c}")
    loss_mat, metrics = _ppo_clip_terms(
        logp, old_logp, advantages, mask, eps_low=eps_low, eps_high=eps_high, dual_clip_c=dual_clip_c
    )
    return Aggregation.of(agg)(loss_mat, mask), metrics


def _ppo_clip_terms(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    eps_low: float,
    eps_high: float,
    dual_clip_c: float | None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """ppo_clip_loss's per-token loss (B, T) before aggregation, and its metrics."""
    adv = broadcast_advantages(advantages, logp)
    log_ratio = (logp - old_logp).clamp(-20.0, 20.0)
    ratio = log_ratio.exp()
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1.0 - eps_low, 1.0 + eps_high)
    loss_mat = torch.maximum(unclipped, clipped)
    dual = torch.zeros_like(loss_mat, dtype=torch.bool)
    if dual_clip_c is not None:
        cap = -adv * dual_clip_c
        dual = (adv < 0) & (loss_mat > cap)
        loss_mat = torch.where(adv < 0, torch.minimum(loss_mat, cap), loss_mat)
    with torch.no_grad():
        metrics = {
            "clipfrac": masked_mean((clipped > unclipped).float(), mask),
            "clipfrac_high": masked_mean(((adv > 0) & (ratio > 1.0 + eps_high)).float(), mask),
            "clipfrac_low": masked_mean(((adv < 0) & (ratio < 1.0 - eps_low)).float(), mask),
            "clipfrac_dual": masked_mean(dual.float(), mask),
            "ppo_kl": masked_mean(-log_ratio, mask),
            "ratio_mean": masked_mean(ratio, mask),
        }
    return loss_mat, metrics


def kl_penalty(logp: Tensor, ref_logp: Tensor, *, kind: Literal["k1", "k3"] = "k3") -> Tensor:
    """Per-token KL(pi || pi_ref) estimate from sampled-token log-probs. k3 (Schulman's low-variance estimator,
    verl's low_var_kl): exp(ref - logp) - (ref - logp) - 1, clamped to [-10, 10]; k1: logp - ref."""
    if kind == "k1":
        return logp - ref_logp
    if kind == "k3":
        d = (ref_logp - logp).clamp(-20.0, 20.0)
        return (d.exp() - d - 1.0).clamp(-10.0, 10.0)
    raise ValueError(f"unknown KL estimator {kind!r}; choose k1 or k3")


# ---------------------------------------------------------------------------------------------------------------
# Baselines' policy losses: GSPO (Zheng et al. 2025), Clip-Cov and KL-Cov (Cui et al. 2025).
# Token selections are separate functions over the whole batch; the losses take the selection as input, so
# splitting a batch into micro-batches never changes which tokens are selected (verl selects per micro-batch).


def token_covariance(advantages: Tensor, logp: Tensor, mask: Tensor) -> Tensor:
    """Per-token centred cross product (A - mean A)(log p - mean log p), means over valid tokens; 0 at pads.
    Cui et al. 2025's per-token covariance term, the quantity Clip-Cov and KL-Cov select by."""
    adv = broadcast_advantages(advantages, logp)
    m = mask.bool()
    a, lp = adv.detach().float(), logp.detach().float()
    cov = (a - a[m].mean()) * (lp - lp[m].mean())
    return torch.where(m, cov, torch.zeros_like(cov))


def select_kl_cov(advantages: Tensor, logp: Tensor, mask: Tensor, *, ratio: float = 2e-4) -> Tensor:
    """KL-Cov's selection: the k = max(1, int(ratio * n_valid)) valid tokens with the largest covariance.
    `ratio` is a fraction (verl's kl_cov_ratio, default 2e-4); the authors' PRIME code calls the same quantity
    k_percent and gives it in percent (0.2 there = 0.002 here)."""
    cov = token_covariance(advantages, logp, mask)
    m = mask.bool()
    k = max(1, int(int(m.sum()) * ratio))
    ranked = torch.where(m, cov, torch.full_like(cov, -torch.inf)).flatten()
    selected = torch.zeros(ranked.shape[0], dtype=torch.bool, device=cov.device)
    selected[torch.topk(ranked, k).indices] = True
    return selected.view_as(m) & m


def select_clip_cov(
    advantages: Tensor,
    logp: Tensor,
    mask: Tensor,
    *,
    ratio: float = 2e-4,
    lb: float = 1.0,
    ub: float = 5.0,
    exclude: Tensor | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Clip-Cov's selection: among valid tokens not in `exclude` (verl: tokens the PPO clip already clipped)
    with lb < cov < ub, a random subset of min(max(int(ratio * n_valid), 1), #candidates) tokens, drawn with
    torch.randperm from `generator`. Defaults are verl's (clip_cov_ratio 2e-4, lb 1, ub 5)."""
    cov = token_covariance(advantages, logp, mask)
    m = mask.bool()
    candidates = m & (cov > lb) & (cov < ub)
    if exclude is not None:
        candidates = candidates & ~exclude.bool()
    clip_num = max(int(ratio * int(m.sum())), 1)
    idx = candidates.flatten().nonzero().squeeze(-1)
    take = idx[torch.randperm(idx.numel(), generator=generator, device=idx.device)[: min(clip_num, idx.numel())]]
    selected = torch.zeros(m.numel(), dtype=torch.bool, device=m.device)
    selected[take] = True
    return selected.view_as(m)


def kl_cov_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    selected: Tensor,
    kl_coef: float = 1.0,
    agg: Aggregation | AggMode = "token-mean",
) -> tuple[Tensor, dict[str, Tensor]]:
    """KL-Cov: the unclipped surrogate -A r, plus kl_coef |log r| on the selected tokens (no ratio clipping)."""
    adv = broadcast_advantages(advantages, logp)
    log_ratio = logp - old_logp
    loss_mat = -adv * log_ratio.exp() + torch.where(selected, kl_coef * log_ratio.abs(), torch.zeros_like(log_ratio))
    loss = Aggregation.of(agg)(loss_mat, mask)
    with torch.no_grad():
        metrics = {
            "ppo_kl": masked_mean(log_ratio.abs(), mask),
            "cov_selected_frac": masked_mean(selected.float(), mask),
        }
    return loss, metrics


def clip_cov_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    selected: Tensor,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    agg: Aggregation | AggMode = "token-mean",
) -> tuple[Tensor, dict[str, Tensor]]:
    """Clip-Cov: the PPO-clipped surrogate (no dual clip), with the loss of the selected tokens set to 0."""
    adv = broadcast_advantages(advantages, logp)
    log_ratio = (logp - old_logp).clamp(-20.0, 20.0)
    ratio = log_ratio.exp()
    loss_mat = torch.maximum(-adv * ratio, -adv * ratio.clamp(1.0 - eps_low, 1.0 + eps_high))
    loss_mat = loss_mat * (~selected).to(loss_mat.dtype)
    loss = Aggregation.of(agg)(loss_mat, mask)
    with torch.no_grad():
        metrics = {"clipfrac": masked_mean(selected.float(), mask), "ppo_kl": masked_mean(-log_ratio, mask)}
    return loss, metrics


def gspo_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    eps_low: float = 3e-4,
    eps_high: float = 4e-4,
    agg: Aggregation | AggMode = "seq-mean-token-mean",
) -> tuple[Tensor, dict[str, Tensor]]:
    """GSPO (Zheng et al. 2025): the sequence-level ratio s = exp(mean_t log r_t) (length-normalised), clipped
    at the sequence level; per token exp(log p - sg(log p) + sg(log s)) carries the gradient. Defaults are the
    GSPO paper's clip range (3e-4, 4e-4)."""
    adv = broadcast_advantages(advantages, logp)
    m = mask.to(logp.dtype)
    log_ratio = logp - old_logp
    seq_log_ratio = (log_ratio * m).sum(-1) / m.sum(-1).clamp_min(1.0)
    log_s = (logp - logp.detach() + seq_log_ratio.detach().unsqueeze(-1)).clamp(max=10.0)
    s = log_s.exp()
    unclipped, clipped = -adv * s, -adv * s.clamp(1.0 - eps_low, 1.0 + eps_high)
    loss = Aggregation.of(agg)(torch.maximum(unclipped, clipped), mask)
    with torch.no_grad():
        metrics = {
            "clipfrac": masked_mean((clipped > unclipped).float(), mask),
            "ppo_kl": masked_mean(-log_ratio, mask),
        }
    return loss, metrics


def value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    mask: Tensor,
    *,
    clip_range: float | None = 0.5,
    agg: Aggregation | AggMode = "token-mean",
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO's clipped value loss (verl compute_value_loss): 0.5 * agg(max((v - R)^2, (clip(v, v_old +- c) - R)^2)).
    clip_range None disables clipping (verl's default clip is 0.5)."""
    unclipped = (values - returns) ** 2
    if clip_range is None:
        per_token = unclipped
        clipfrac = torch.zeros((), device=values.device)
    else:
        clipped = (old_values + (values - old_values).clamp(-clip_range, clip_range) - returns) ** 2
        per_token = torch.maximum(unclipped, clipped)
        with torch.no_grad():
            clipfrac = masked_mean((clipped > unclipped).float(), mask)
    loss = 0.5 * Aggregation.of(agg)(per_token, mask)
    with torch.no_grad():
        metrics = {"vf_clipfrac": clipfrac, "value_mean": masked_mean(values.detach(), mask)}
    return loss, metrics


def entropic_adjustment(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    high: Tensor,
    *,
    alpha: float,
    agg: Aggregation | AggMode = "token-mean",
):
    """EntroPIC's loss term alpha * agg_{T_hi}(-r |A|), r = exp(log p - old log p); (loss, metrics). Added to the
    token-mean policy loss over N tokens it weighs a high-probability token by (1 + alpha N / N_hi) in a positive
    sample and (1 - alpha N / N_hi) in a negative one (its gradient is alpha * -|A| grad r / N_hi, the policy term's
    -A grad r / N times alpha sign(A) N / N_hi). agg's num_tokens / num_seqs are T_hi's counts over the whole mini-batch
    (control.py, departure 4)."""
    adv = broadcast_advantages(advantages, logp).to(logp.dtype)  # (B, T)
    ratio = (logp - old_logp).exp()
    term = Aggregation.of(agg)(-ratio * adv.abs(), high)
    return alpha * term, {"entropic_term": term.detach()}


# ---------------------------------------------------------------------------------------------------------------
# The policy losses engines ship beyond the paper (verl 0.9.1 core_algos names): CISPO, SAPO, DPPO's binary
# trust-region masks, GMPO (geo_mean) and ERC (Kwai-Klear/ERC). Each `*_ratio` function is the factor its loss puts
# on d log p_t (for step_sizes): d loss / d log p_t = -A_t w_t factor_t, w_t the aggregation's token weight.


def _log_ratio(logp: Tensor, old_logp: Tensor) -> Tensor:
    """log r clamped to [-20, 20] (verl's negative_approx_kl)."""
    return (logp - old_logp).clamp(-20.0, 20.0)


def cispo_ratio(
    logp: Tensor,
    old_logp: Tensor,
    mask: Tensor,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    upper_only: bool = False,
) -> Tensor:
    """CISPO's stop-gradient weight on log p_t: clip(r, 1 - eps_low, 1 + eps_high) of the clamped log-ratio (verl);
    upper_only: min(r, eps_high) of the unclamped ratio (TRL 1.16's loss_type 'cispo')."""
    if upper_only:
        return (logp - old_logp).exp().clamp(max=eps_high).detach()
    return _log_ratio(logp, old_logp).exp().clamp(1.0 - eps_low, 1.0 + eps_high).detach()


def cispo_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    upper_only: bool = False,
    agg: Aggregation | AggMode = "token-mean",
) -> tuple[Tensor, dict[str, Tensor]]:
    """CISPO (MiniMax-M1, arXiv 2506.13585; verl 0.9.1 compute_policy_loss_cispo): -sg(clip(r, 1 - eps_low,
    1 + eps_high)) A log p. Every token keeps a gradient; the clipped ratio only weighs it. Defaults are verl's
    ActorConfig clip_ratio_low / clip_ratio_high (0.2, 0.2).

    upper_only=True is TRL 1.16's form of the same name: -sg(min(r, eps_high)) A log p, capped from above only, at
    the absolute value eps_high (TRL's epsilon_high), without the [-20, 20] clamp of log r. Metric clipfrac: tokens
    whose weight differs from r."""
    adv = broadcast_advantages(advantages, logp)
    ratio = ((logp - old_logp) if upper_only else _log_ratio(logp, old_logp)).detach().exp()
    weight = cispo_ratio(logp, old_logp, mask, eps_low=eps_low, eps_high=eps_high, upper_only=upper_only)
    loss = Aggregation.of(agg)(-weight * adv * logp, mask)
    with torch.no_grad():
        metrics = {
            "clipfrac": masked_mean((ratio != weight).float(), mask),
            "ppo_kl": masked_mean(-_log_ratio(logp, old_logp), mask),
        }
    return loss, metrics


def _sapo_tau(adv: Tensor, tau_pos: float, tau_neg: float, dtype) -> Tensor:
    """tau_pos where A > 0, tau_neg elsewhere, in the loss's precision (1.05 in float32 is not 1.05 in float64)."""
    return torch.where(
        adv > 0,
        torch.tensor(tau_pos, dtype=dtype, device=adv.device),
        torch.tensor(tau_neg, dtype=dtype, device=adv.device),
    )


def sapo_ratio(
    logp: Tensor, old_logp: Tensor, mask: Tensor, *, advantages: Tensor, tau_pos: float = 1.0, tau_neg: float = 1.05
) -> Tensor:
    """SAPO's factor on d log p_t: d g(r) / d log p = 4 sigma (1 - sigma) r with sigma = sigmoid(tau (r - 1)); 0 where
    the log-ratio is past the [-20, 20] clamp (no gradient there). 1 at r = 1."""
    adv = broadcast_advantages(advantages, logp)
    log_r = (logp - old_logp).detach()
    r = log_r.clamp(-20.0, 20.0).exp()
    sig = torch.sigmoid(_sapo_tau(adv, tau_pos, tau_neg, r.dtype) * (r - 1.0))
    return 4.0 * sig * (1.0 - sig) * r * (log_r.abs() < 20.0).to(r.dtype)


def sapo_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
    agg: Aggregation | AggMode = "seq-mean-token-mean",
) -> tuple[Tensor, dict[str, Tensor]]:
    """SAPO (arXiv 2511.20347; verl 0.9.1 compute_policy_loss_sapo): -A g(r), g(r) = sigmoid(tau (r - 1)) 4 / tau, a
    smooth gate in place of the hard clip, tau = tau_pos where A > 0 and tau_neg elsewhere (verl ActorConfig: 1.0,
    1.05). verl aggregates SAPO seq-mean-token-mean whatever loss_agg_mode says; the registry (methods.POLICY_LOSSES)
    does the same, and agg here is that default (TRL 1.16's 'sapo' takes the same per-sequence mean)."""
    adv = broadcast_advantages(advantages, logp)
    log_ratio = _log_ratio(logp, old_logp)
    tau = _sapo_tau(adv, tau_pos, tau_neg, logp.dtype)
    gate = torch.sigmoid(tau * (log_ratio.exp() - 1.0)) * (4.0 / tau)
    loss = Aggregation.of(agg)(-gate * adv, mask)
    with torch.no_grad():
        metrics = {"ppo_kl": masked_mean(-log_ratio, mask)}
    return loss, metrics


def dppo_tv_keep(
    logp: Tensor, old_logp: Tensor, advantages: Tensor, *, eps_low: float = 0.2, eps_high: float = 0.2
) -> Tensor:
    """DPPO-Binary-TV's trust region (arXiv 2602.04879): keep a token unless its probability moved past the bound in
    the advantage's direction: p - p_old <= eps_high where A > 0, p - p_old >= -eps_low elsewhere. (B, T) bool."""
    adv = broadcast_advantages(advantages, logp)
    change = logp.detach().exp() - old_logp.exp()
    return torch.where(adv > 0, change <= eps_high, change >= -eps_low)


def dppo_kl_keep(
    logp: Tensor, old_logp: Tensor, advantages: Tensor, *, eps_low: float = 0.2, eps_high: float = 0.2
) -> Tensor:
    """DPPO-Binary-KL's trust region: the binary KL between Bernoulli(p_old) and Bernoulli(p) of the token,
    p_old log(p_old / p) + (1 - p_old) log((1 - p_old + 1e-8) / (1 - p + 1e-8)), at most eps_high where A > 0 (or
    p fell), at most eps_low elsewhere (or p rose). (B, T) bool."""
    adv = broadcast_advantages(advantages, logp)
    lp = logp.detach()
    p, p_old = lp.exp(), old_logp.exp()
    kl = p_old * (old_logp - lp) + (1 - p_old) * torch.log((1.0 - p_old + 1e-8) / (1.0 - p + 1e-8))
    return torch.where(adv > 0, (kl <= eps_high) | (p <= p_old), (kl <= eps_low) | (p >= p_old))


# DPPO-TV and DPPO-KL differ only in their trust region (dppo_tv_keep, dppo_kl_keep): each public function below
# names its region and hands everything else to the shared body (_dppo_ratio, _dppo_loss).
def _dppo_ratio(keep, logp, old_logp, clip_ratio_c):
    """The stop-gradient weight on log p: min(r, clip_ratio_c) (r when clip_ratio_c is None) where keep, 0 outside."""
    ratio = _log_ratio(logp, old_logp).detach().exp()
    return (ratio if clip_ratio_c is None else ratio.clamp(max=clip_ratio_c)) * keep.to(ratio.dtype)


def dppo_tv_ratio(
    logp: Tensor,
    old_logp: Tensor,
    mask: Tensor,
    *,
    advantages: Tensor,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    clip_ratio_c: float | None = 3.0,
) -> Tensor:
    """DPPO-TV's factor on d log p_t: min(r, clip_ratio_c) inside the trust region, 0 outside."""
    keep = dppo_tv_keep(logp, old_logp, advantages, eps_low=eps_low, eps_high=eps_high)
    return _dppo_ratio(keep, logp, old_logp, clip_ratio_c)


def dppo_kl_ratio(
    logp: Tensor,
    old_logp: Tensor,
    mask: Tensor,
    *,
    advantages: Tensor,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    clip_ratio_c: float | None = 3.0,
) -> Tensor:
    """DPPO-KL's factor on d log p_t: min(r, clip_ratio_c) inside the trust region, 0 outside."""
    keep = dppo_kl_keep(logp, old_logp, advantages, eps_low=eps_low, eps_high=eps_high)
    return _dppo_ratio(keep, logp, old_logp, clip_ratio_c)


def _dppo_loss(keep, logp, old_logp, advantages, mask, clip_ratio_c, agg):
    """-A _dppo_ratio log p aggregated over mask, and the metrics clipfrac (outside the trust region keep),
    clipfrac_trunc (inside it with r > clip_ratio_c) and ppo_kl."""
    adv = broadcast_advantages(advantages, logp)
    weight = _dppo_ratio(keep, logp, old_logp, clip_ratio_c)
    loss = Aggregation.of(agg)(-adv * weight * logp, mask)
    with torch.no_grad():
        log_ratio = _log_ratio(logp, old_logp)
        truncated = torch.zeros_like(keep) if clip_ratio_c is None else log_ratio.exp() > clip_ratio_c
        metrics = {
            "clipfrac": masked_mean((~keep).float(), mask),
            "clipfrac_trunc": masked_mean((truncated & keep).float(), mask),
            "ppo_kl": masked_mean(-log_ratio, mask),
        }
    return loss, metrics


def dppo_tv_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    clip_ratio_c: float | None = 3.0,
    agg: Aggregation | AggMode = "token-mean",
) -> tuple[Tensor, dict[str, Tensor]]:
    """DPPO-Binary-TV (arXiv 2602.04879; verl 0.9.1 compute_policy_loss_dppo_tv; prime-rl's default loss):
    -A sg(min(r, clip_ratio_c)) log p on the tokens inside dppo_tv_keep's trust region, 0 (no gradient) outside.
    eps_low / eps_high are the probability-change bounds (verl's clip_ratio_low / clip_ratio_high, 0.2 each).
    clip_ratio_c truncates the importance weight (None: no truncation): 3.0 is what verl trains with, because its
    ActorConfig sets clip_ratio_c = 3.0 for every loss, though the function falls back to 20 without that field and
    the DPPO paper recommends a large threshold. Metrics: clipfrac (outside the region), clipfrac_trunc (verl's
    pg_clipfrac_lower: inside it and r > clip_ratio_c)."""
    keep = dppo_tv_keep(logp, old_logp, advantages, eps_low=eps_low, eps_high=eps_high)
    return _dppo_loss(keep, logp, old_logp, advantages, mask, clip_ratio_c, agg)


def dppo_kl_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    clip_ratio_c: float | None = 3.0,
    agg: Aggregation | AggMode = "token-mean",
) -> tuple[Tensor, dict[str, Tensor]]:
    """DPPO-Binary-KL (verl 0.9.1 compute_policy_loss_dppo_kl): dppo_tv_loss with dppo_kl_keep's trust region (the
    binary KL bounded by eps_high / eps_low, verl's clip_ratio_high / clip_ratio_low)."""
    keep = dppo_kl_keep(logp, old_logp, advantages, eps_low=eps_low, eps_high=eps_high)
    return _dppo_loss(keep, logp, old_logp, advantages, mask, clip_ratio_c, agg)


def _geo_mean_log_ratio(logp, old_logp, advantages, eps_low, eps_high):
    """GMPO's per-token log-ratio clipped on the advantage's side: sign(A) min(sign(A) x, sign(A) clip(x))."""
    sign = torch.sign(broadcast_advantages(advantages, logp))
    log_ratio = logp - old_logp
    return sign * torch.minimum(sign * log_ratio, sign * log_ratio.clamp(-eps_low, eps_high))


def geo_mean_ratio(
    logp: Tensor, old_logp: Tensor, mask: Tensor, *, advantages: Tensor, eps_low: float = 0.2, eps_high: float = 0.2
) -> Tensor:
    """GMPO's factor on d log p_t: the sequence's geometric-mean ratio R_b, 0 on tokens whose log-ratio is clipped
    (log r > eps_high with A > 0, log r < -eps_low with A < 0)."""
    adv = broadcast_advantages(advantages, logp)
    m = mask.to(logp.dtype)
    lp = logp.detach()
    clipped_log = _geo_mean_log_ratio(lp, old_logp, adv, eps_low, eps_high)
    seq = ((clipped_log * m).sum(-1) / (m.sum(-1) + 1e-8)).exp()[:, None]
    log_ratio = lp - old_logp
    clipped = ((adv > 0) & (log_ratio > eps_high)) | ((adv < 0) & (log_ratio < -eps_low))
    return seq * (~clipped).to(lp.dtype)


def geo_mean_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    agg: Aggregation | AggMode = "seq-mean-token-mean",
) -> tuple[Tensor, dict[str, Tensor]]:
    """GMPO, geometric-mean policy optimisation (arXiv 2507.20673; verl 0.9.1 compute_policy_loss_geo_mean): per
    sequence -A_b R_b, R_b = exp(mean over its tokens of the log-ratio clipped to [-eps_low, eps_high] on the
    advantage's side), A_b the mean of its token advantages (+1e-8 in both denominators, as verl); the mean over
    sequences. GMPO aggregates its own way (verl ignores loss_agg_mode): the gradient's token weights are those of
    seq-mean-token-mean, the only agg accepted. The sequences' count is agg.num_seqs (default: sequences with a loss
    token, as aggregate; verl takes the mean over every row of the micro-batch, empty ones included, and no log-ratio
    clamp). Metrics clipfrac (A > 0, clipped above), clipfrac_low (A < 0, clipped below) as verl's."""
    agg = Aggregation.of(agg)
    if agg.mode != "seq-mean-token-mean":
        raise ValueError(f"geo_mean aggregates per sequence (the weights of seq-mean-token-mean), got agg={agg.mode!r}")
    adv = broadcast_advantages(advantages, logp)
    m = mask.to(logp.dtype)
    length = m.sum(-1) + 1e-8
    seq_ratio = ((_geo_mean_log_ratio(logp, old_logp, adv, eps_low, eps_high) * m).sum(-1) / length).exp()
    seq_adv = (adv * m).sum(-1) / length
    has_tokens = (m.sum(-1) > 0).to(logp.dtype)
    denom = has_tokens.sum() if agg.num_seqs is None else agg.num_seqs
    loss = (-seq_adv * seq_ratio * has_tokens).sum() / denom
    with torch.no_grad():
        log_ratio = logp - old_logp
        clipped = log_ratio != log_ratio.clamp(-eps_low, eps_high)
        metrics = {
            "clipfrac": masked_mean((clipped & (adv > 0)).float(), mask),
            "clipfrac_low": masked_mean((clipped & (adv < 0)).float(), mask),
            "ppo_kl": masked_mean(-log_ratio, mask),
        }
    return loss, metrics


def erc_keep(entropy: Tensor, old_entropy: Tensor, *, erc_low: float = 0.95, erc_high: float = 1.05) -> Tensor:
    """ERC's band (Kwai-Klear/ERC compute_policy_loss_grpo_erc): erc_low < (H + 1e-8) / (H_old + 1e-8) < erc_high,
    H the update's per-token entropy and H_old the behaviour policy's. (B, T) bool. erc_low / erc_high 0.95 / 1.05 are
    the authors' training scripts' (their actor config's defaults are 0.8 / 1.2, their names entropy_mask_low /
    entropy_mask_high)."""
    ratio = (entropy.detach() + 1e-8) / (old_entropy + 1e-8)
    return (ratio > erc_low) & (ratio < erc_high)


def erc_ratio(
    logp: Tensor,
    old_logp: Tensor,
    mask: Tensor,
    *,
    advantages: Tensor,
    band: Tensor,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    dual_clip_c: float | None = 3.0,
) -> Tensor:
    """ERC's factor on d log p_t: r where the dual-clip PPO term is the unclipped one and the token is inside the
    entropy ratio's band (erc_keep), 0 elsewhere (clipped, dual-clipped, past the log-ratio clamp, or outside it)."""
    adv = broadcast_advantages(advantages, logp)
    log_r = (logp - old_logp).detach()
    r = log_r.clamp(-20.0, 20.0).exp()
    active = (-adv * r.clamp(1.0 - eps_low, 1.0 + eps_high) <= -adv * r) & (log_r.abs() < 20.0)
    if dual_clip_c is not None:
        active &= ~((adv < 0) & (-adv * r > -adv * dual_clip_c))
    return r * (active & band).to(r.dtype)


def erc_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    band: Tensor,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    dual_clip_c: float | None = 3.0,
    agg: Aggregation | AggMode = "token-mean",
) -> tuple[Tensor, dict[str, Tensor]]:
    """ERC, entropy ratio clipping (arXiv 2512.05591; Kwai-Klear/ERC compute_policy_loss_grpo_erc): ppo_clip_loss,
    with the gradient of every token outside the entropy-ratio band detached (its loss still counts in the value and
    the denominator, as in the authors' code). band (B, T) bool: erc_keep of the update's forward's and the behaviour
    policy's per-token entropies, computed apart as Clip-Cov's selection is (the registry does it: methods.PolicyLoss
    .entropy). Departure: the
    authors' verl fork aggregates with the older agg_loss (no global counts; seq-mean-token-sum-norm without the
    mean over sequences); this uses `aggregate`. Metric erc_kept_frac: valid tokens inside the band."""
    loss_mat, metrics = _ppo_clip_terms(
        logp, old_logp, advantages, mask, eps_low=eps_low, eps_high=eps_high, dual_clip_c=dual_clip_c
    )
    loss_mat = torch.where(band, loss_mat, loss_mat.detach())
    with torch.no_grad():
        metrics["erc_kept_frac"] = masked_mean(band.float(), mask)
    return Aggregation.of(agg)(loss_mat, mask), metrics
