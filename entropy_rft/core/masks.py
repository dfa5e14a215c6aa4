"""Token filters: which tokens of a batch keep their gradient.

Every filter has one signature: `fn(score, advantages, mask, **options) -> (keep, metrics)` where score is the
per-token statistic it reads ([B, T]: S* for Clip_B and the S-sign filters, S_c for Clip_V), advantages are [B]
or [B, T], mask and keep are bool [B, T] (keep is False at padded positions) and metrics is a dict of floats.
Masked tokens leave the loss and its token-mean denominator (the trainer multiplies the loss mask by keep).

Implements:
- clip_b: Algorithm 1 (Clip_B), eq. 15: keep tokens with -mu_minus sigma <= S* - mean(S*) <= mu_plus sigma.
- clip_v: Algorithm 2 (Clip_V), eq. 16: keep tokens with -mu_minus sigma' <= S_c <= mu_plus sigma'.
- s_sign: the selective updates of Figure 1 (retain only, or mask, tokens with S* > 0 or S* < 0 in positive or
  negative samples).
- top_entropy: forking tokens (Wang et al. 2025), the highest-entropy 20% of the batch's tokens.
- rsi_band: RSI-S (arXiv 2606.31575; the port in smellslikeml/open-instruct): keep the tokens whose relative
  surprisal index RSI = -log p / (H + eps) lies in [rsi_lower_bound, rsi_upper_bound] (RSI > 1 exactly where S* < 0).
- stare_weights: STARE's token weights (hp-luo/STARE, compute_stare_token_weights): within each advantage sign,
  the top P% of tokens by surprisal -log p (L+ and L-) get weight W (and M on L-, variant C2), under the gate below.
- entropy_gate: STARE's closed-loop target gate (hp-luo/STARE, STAREController): a gated filter acts only while
  the batch's mean entropy is below a target (methods.Method.apply composes it with Clip_B and Clip_V).
Statistics (mean, std) are always taken over all valid tokens of the whole batch passed in, never per
micro-batch.

Departures, numbered, from the paper and from the authors' code (Trinity-RFT 0.6.0, ClipBAdvantageFn and
ClipVAdvantageFn, reproduced exactly by the defaults; tests/fixtures/clip_b.json and clip_v.json):
1. Defaults follow the authors' code, not eq. 15/16 as printed: one-sided (mu_plus = inf, only the lower tail
   is clipped) and applied to negative-advantage tokens only (side="negative"), the setting of the paper's
   Section 5.3. Pass mu_plus and side="all" for the two-sided form of eq. 15/16.
2. Clip_V, as the authors' code, does not centre S_c by its batch mean (Corollary 2 says it is about 0), and
   also filters zero-advantage tokens (clip_zero_advantage=True), which Clip_B does not.
3. Clip_V caps the clipped count as the authors' code does (max_frac): when more than max_frac of the tokens
   violate, only the k = max(int(max_frac n), 1) violators with non-zero advantage and the largest |S_c| are
   clipped, plus every zero-advantage violator. The cap is therefore not a hard global cap.
4. Std is the population std over valid tokens; if it is below 1e-12 every token is kept. mu = 0 is accepted,
   as in the authors' code: every token on the filtered side below the mean (Clip_B) or below 0 (Clip_V) is
   clipped. A non-finite score at a valid token raises (a NaN compares false, so it would keep every token).
6. top_entropy (forking tokens) keeps exactly round(frac n) tokens by torch.topk; TRL's top_entropy_quantile
   keeps the tokens at or above the quantile, which can keep more on ties.
5. The metrics frac_clipped_pos / _neg follow the authors' definition 1 - kept / max(total, 1), which reads 1.0
   when a batch has no positive (negative) token. `clipped_fractions` gives the same fractions with 0.0 for an
   empty side; the trainer logs those. frac_clipped over a mask with no valid token is 0.0 (none was clipped), where
   the authors' formula reads 1.0.
7. STARE ranks the whole batch's tokens of each advantage sign by the behaviour policy's surprisal, once per step;
   the authors' code ranks each micro-batch's tokens by the current policy's (in its loss, per micro-batch), which is
   the same set when the batch is one micro-batch on-policy (its scripts: one gradient step per batch). Its gate
   reads the batch's token-mean entropy over every valid token, as the authors' trainer does under token-mean
   aggregation.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import Tensor

from .advantages import broadcast_advantages

Side = Literal["negative", "positive", "all"]

__all__ = [
    "clip_b",
    "clip_v",
    "s_sign",
    "top_entropy",
    "entropy_gate",
    "stare_weights",
    "rsi_band",
    "clipped_fractions",
    "broadcast_advantages",
]

_STD_FLOOR = 1e-12


def _check(score: Tensor, mask: Tensor, **mus: float | None) -> None:
    """Shapes match; every threshold is a number >= 0 (0 clips every token below the mean on the filtered side);
    the score is finite at every valid token (a NaN would fail every comparison and so keep every token)."""
    if score.shape != mask.shape:
        raise ValueError(f"score {tuple(score.shape)} and mask {tuple(mask.shape)} must have the same shape [B, T]")
    for name, value in mus.items():
        if value is not None and not value >= 0:  # also rejects NaN
            raise ValueError(
                f"{name} must be >= 0 (a multiple of the batch std), got {value}; "
                "the paper uses mu = 2.5 for Clip_B and 8.5 for Clip_V"
            )
    bad = mask.bool() & ~torch.isfinite(score)
    if bad.any():
        where = bad.nonzero().tolist()
        shown = ", ".join(f"({b}, {t})" for b, t in where[:8]) + (", ..." if len(where) > 8 else "")
        raise ValueError(
            f"the filter's score is not finite at {len(where)} valid token(s), (row, position): {shown}; "
            "S* and S_c are finite for finite logits, so check the policy's logits (NaN or inf from "
            "an overflow, a bad checkpoint or a -inf logit mask)"
        )


def _side_mask(adv: Tensor, side: Side, zero: bool) -> Tensor:
    if side == "negative":
        return adv <= 0 if zero else adv < 0
    if side == "positive":  # A = 0 counts as negative (clip_zero_advantage), never as positive
        return adv > 0
    if side == "all":
        return torch.ones_like(adv, dtype=torch.bool)
    raise ValueError(f"side must be 'negative', 'positive' or 'all', got {side!r}")


def _masked_mean_std(x: Tensor, m: Tensor) -> tuple[Tensor, Tensor]:
    """Batch mean and population std of x over m (float32 0/1), the authors' float32 formulas."""
    x = torch.where(m > 0, x, 0.0)  # a NaN at a padded position must not reach the sums
    n = m.sum().clamp_min(1.0)
    mean = (x * m).sum() / n
    var = ((x - mean) ** 2 * m).sum() / n
    return mean, var.sqrt()


def clipped_fractions(mask: Tensor, keep: Tensor, advantages: Tensor, *, empty: float = 0.0) -> dict[str, float]:
    """Fractions of valid tokens removed by a filter: overall, in positive (A > 0) and negative (A < 0) samples.

    `empty` is the value reported for a side with no tokens, and overall for an empty mask (the authors' code
    reports 1.0).
    """
    adv = broadcast_advantages(advantages, mask)
    m = mask.bool()
    kept = keep.bool() & m

    def frac(sel: Tensor) -> float:
        total = int((m & sel).sum())
        if total == 0:
            return empty
        return 1.0 - int((kept & sel).sum()) / total

    n = int(m.sum())
    return {
        "frac_clipped": 1.0 - int(kept.sum()) / n if n else empty,  # no valid token: none was clipped
        "frac_clipped_pos": frac(adv > 0),
        "frac_clipped_neg": frac(adv < 0),
    }


def _reference_fractions(mask: Tensor, keep: Tensor, adv: Tensor) -> dict[str, float]:
    """The authors' float32 metric formulas (departure 5), kept bit-for-bit for parity."""
    m = mask.to(torch.float32)
    new = m * keep.to(torch.float32)
    n = m.sum().clamp_min(1.0)
    pos, neg = (adv > 0).to(torch.float32), (adv < 0).to(torch.float32)
    return {
        "frac_clipped": float(1.0 - new.sum() / n) if m.any() else 0.0,  # no valid token: none was clipped (dep. 5)
        "frac_clipped_pos": float(1.0 - (new * pos).sum() / (m * pos).sum().clamp_min(1.0)),
        "frac_clipped_neg": float(1.0 - (new * neg).sum() / (m * neg).sum().clamp_min(1.0)),
    }


def clip_b(
    s_star: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    mu: float = 2.5,
    mu_minus: float | None = None,
    mu_plus: float | None = None,
    side: Side = "negative",
) -> tuple[Tensor, dict[str, float]]:
    """Clip_B, Algorithm 1 / eq. 15: batch-normalised entropy-discriminator clipping.

    A token on the filtered side is clipped when S* - mean_B(S*) < -mu_minus * std_B(S*) (mu_minus defaults to
    mu) or, if mu_plus is given, when S* - mean_B(S*) > mu_plus * std_B(S*). side picks the tokens the filter
    applies to by the sign of their advantage: "negative" (A < 0, the authors' default), "positive" (A > 0) or
    "all". Metrics: frac_clipped, frac_clipped_pos, frac_clipped_neg (authors' definitions), ES, varS.
    """
    _check(s_star, mask, mu=mu, mu_minus=mu_minus, mu_plus=mu_plus)
    adv = broadcast_advantages(advantages, mask)
    m = mask.to(torch.float32)
    s = s_star.float()
    mean, std = _masked_mean_std(s, m)
    lower = -(mu if mu_minus is None else mu_minus) * std
    outlier = (s - mean) < lower
    if mu_plus is not None:
        outlier = outlier | ((s - mean) > mu_plus * std)
    clipped = outlier & _side_mask(adv, side, zero=False) & (std >= _STD_FLOOR)
    keep = mask.bool() & ~clipped
    metrics = _reference_fractions(mask, keep, adv)
    metrics.update(ES=float(mean), varS=float(std * std))
    return keep, metrics


def clip_v(
    s_centered: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    mu: float = 8.5,
    max_frac: float | None = 1e-4,
    mu_minus: float | None = None,
    mu_plus: float | None = None,
    side: Side = "negative",
    clip_zero_advantage: bool = True,
) -> tuple[Tensor, dict[str, float]]:
    """Clip_V, Algorithm 2 / eq. 16: vocabulary-normalised entropy-discriminator clipping.

    A token on the filtered side is a violator when S_c < -mu_minus * std_B(S_c) (mu_minus defaults to mu) or,
    if mu_plus is given, S_c > mu_plus * std_B(S_c). With clip_zero_advantage, tokens with A = 0 count as on
    the negative side, as in the authors' code. max_frac caps the clipped count (module docstring, departure
    3); None clips every violator. Metrics: frac_clipped, frac_clipped_pos, frac_clipped_neg, stdD.
    """
    _check(s_centered, mask, mu=mu, mu_minus=mu_minus, mu_plus=mu_plus)
    if max_frac is not None and not 0 < max_frac <= 1:
        raise ValueError(f"max_frac must be in (0, 1] or None, got {max_frac}; the paper uses 1e-4")
    adv = broadcast_advantages(advantages, mask)
    valid = mask.bool()
    m = valid.to(torch.float32)
    d = -s_centered.float()  # D = E_p[S] - S*, the authors' variable
    _, std = _masked_mean_std(d, m)
    violator = d > (mu if mu_minus is None else mu_minus) * std
    if mu_plus is not None:
        violator = violator | (-d > mu_plus * std)
    violator = violator & valid & _side_mask(adv, side, zero=clip_zero_advantage)
    if float(std) < _STD_FLOOR:
        violator = torch.zeros_like(violator)
    n = max(int(valid.sum()), 1)
    n_violators = int(violator.sum())
    clipped = violator
    if max_frac is not None and n_violators / n > max_frac:
        k = max(int(max_frac * n), 1)
        signed = violator & (adv != 0)
        if int(signed.sum()) > k:
            rank = torch.where(signed, d.abs(), torch.full_like(d, -math.inf)).flatten()
            top = torch.zeros(rank.shape[0], dtype=torch.bool, device=rank.device)
            top[torch.topk(rank, k).indices] = True
            clipped = top.view_as(violator) | (violator & (adv == 0))
    keep = valid & ~clipped
    metrics = _reference_fractions(mask, keep, adv)
    metrics["stdD"] = float(std)
    return keep, metrics


def s_sign(
    s_star: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    action: Literal["retain", "mask"] = "retain",
    sign: Literal["positive", "negative"] = "positive",
    samples: Literal["positive", "negative"] = "positive",
) -> tuple[Tensor, dict[str, float]]:
    """Figure 1's selective updates: the tokens with S* of the given sign in samples of the given advantage
    sign are selected; action="retain" keeps only them (every other token is masked, so the step shows their
    own entropy effect), action="mask" removes them and keeps all others.

    Theorem 1 predicts sign(dH) = -sign(A) * sign(S*) for the selected tokens.
    """
    if s_star.shape != mask.shape:
        raise ValueError(f"s_star {tuple(s_star.shape)} and mask {tuple(mask.shape)} must have the same shape")
    if (
        action not in ("retain", "mask")
        or sign not in ("positive", "negative")
        or samples not in ("positive", "negative")
    ):
        raise ValueError(
            f"s_sign takes action in retain/mask, sign and samples in positive/negative; got "
            f"{action!r}, {sign!r}, {samples!r}"
        )
    adv = broadcast_advantages(advantages, mask)
    in_samples = adv > 0 if samples == "positive" else adv < 0
    by_sign = s_star > 0 if sign == "positive" else s_star < 0
    selected = in_samples & by_sign
    keep = mask.bool() & (selected if action == "retain" else ~selected)
    return keep, clipped_fractions(mask, keep, adv)


def top_entropy(
    entropy: Tensor, advantages: Tensor, mask: Tensor, *, frac: float = 0.2
) -> tuple[Tensor, dict[str, float]]:
    """Forking tokens (Wang et al. 2025, "Beyond the 80/20 rule"): keep the gradient of the k = max(1,
    round(frac * n)) valid tokens of the batch with the highest entropy (frac 0.2 in the paper), whatever the
    advantage sign. Ties at the threshold are broken by position (torch.topk), so the count is exact."""
    if entropy.shape != mask.shape:
        raise ValueError(f"entropy {tuple(entropy.shape)} and mask {tuple(mask.shape)} must have the same shape")
    if not 0 < frac <= 1:
        raise ValueError(f"frac must be in (0, 1], got {frac}; the forking-tokens paper keeps the top 0.2")
    valid = mask.bool()
    n = int(valid.sum())
    keep = torch.zeros(valid.numel(), dtype=torch.bool, device=valid.device)
    if n:
        ranked = torch.where(valid, entropy.float(), torch.full_like(entropy, -math.inf, dtype=torch.float32)).flatten()
        keep[torch.topk(ranked, max(1, round(frac * n))).indices] = True
    keep = keep.view_as(valid) & valid
    return keep, clipped_fractions(mask, keep, advantages)


def entropy_gate(
    keep: Tensor, advantages: Tensor, mask: Tensor, entropy: Tensor, *, target: float
) -> tuple[Tensor, dict[str, float]]:
    """STARE's closed-loop target gate (hp-luo/STARE, STAREController.update: gate_on = 1[H_bar < target_entropy]):
    a filter's keep mask where the batch's mean entropy H_bar over the mask's tokens is strictly below `target`,
    and every valid token otherwise (the filter does not act). Metrics: gate_open (1 or 0), gate_entropy (H_bar)
    and the authors' fractions of the keep mask returned (frac_clipped, ...: 0 while the gate is closed).
    keep, mask, entropy (B, T); advantages (B,) or (B, T); target in nats, > 0 and finite."""
    valid = mask.bool()
    open_, gate_metrics = entropy_gate_open(entropy, valid, target=target)
    gated = torch.where(open_, keep.bool() & valid, valid)
    metrics = _reference_fractions(mask, gated, broadcast_advantages(advantages, mask))
    metrics.update(gate_metrics)
    return gated, metrics


def entropy_gate_open(entropy: Tensor, mask: Tensor, *, target: float) -> tuple[Tensor, dict[str, float]]:
    """(open, metrics): whether the batch's mean entropy over the mask's tokens is strictly below `target` (a 0-dim
    bool tensor; STAREController.update: gate_on = 1[H_bar < target_entropy]); metrics gate_open and gate_entropy.
    target in nats, > 0 and finite."""
    if not (isinstance(target, (int, float)) and not isinstance(target, bool) and 0 < target < math.inf):
        raise ValueError(f"entropy_gate must be a finite entropy > 0 in nats, got {target!r}; STARE uses 0.3")
    m = mask.to(torch.float32)
    mean = (entropy.float() * m).sum() / m.sum().clamp_min(1.0)
    open_ = mean < target
    return open_, {"gate_open": float(open_), "gate_entropy": float(mean)}


StareVariant = Literal["O1", "C2"]


def _top_surprisal(surprisal: Tensor, candidates: Tensor, top_p_ratio: float) -> Tensor:
    """(B, T) bool: the k = max(1, int(n top_p_ratio + 0.999999)) candidates (n of them) with the largest surprisal,
    none when n = 0 or top_p_ratio = 0; chosen by torch.topk over the candidates in row-major order, as the
    authors' code does (so ties resolve the same way). int(x + 0.999999) is the authors' ceiling: 30 x 0.1 =
    3.0000000000000004 gives 3 where math.ceil gives 4."""
    chosen = torch.zeros_like(candidates, dtype=torch.bool)
    n = int(candidates.sum())
    if n == 0 or top_p_ratio <= 0.0:
        return chosen
    k = min(max(1, int(n * top_p_ratio + 0.999999)), n)
    index = candidates.reshape(-1).nonzero(as_tuple=False).squeeze(-1)[torch.topk(surprisal[candidates], k=k).indices]
    chosen.reshape(-1)[index] = True
    return chosen


def stare_weights(
    logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    entropy: Tensor,
    *,
    variant: StareVariant = "O1",
    top_p_ratio: float = 0.1,
    reweight_w: float = 1.1,
    reweight_m: float = 0.9,
    entropy_gate: float | None = 0.3,
) -> tuple[Tensor, dict[str, float]]:
    """STARE's token weights omega (hp-luo/STARE, verl core_algos.compute_stare_token_weights; defaults from its
    scripts): the valid tokens with A > 0 form T+, those with A < 0 T-; within each, the top_p_ratio share with the
    largest surprisal -log p is L+ (L-). omega = reweight_w on L+, and with variant C2 reweight_m on L-, else 1;
    every omega is 1 while the gate is closed (batch mean entropy over the mask not below entropy_gate; None: always
    open). The authors multiply each token's clipped surrogate by omega (J_STARE = mean omega J_GRPO).

    logp, mask, entropy (B, T); advantages (B,) or (B, T). Returns omega (B, T) float32 (1 off the mask) and
    metrics: gate_open, gate_entropy (when gated), frac_reweighted_pos / _neg (|L+|, |L-| over the valid tokens),
    mean_weight over the valid tokens. Departure 7: the whole batch at once, with the behaviour policy's log p."""
    if variant not in ("O1", "C2"):
        raise ValueError(f"STARE variant must be 'O1' (weight L+ only, the default) or 'C2' (also L-), got {variant!r}")
    if not 0.0 <= top_p_ratio <= 1.0:
        raise ValueError(f"top_p_ratio must be in [0, 1], got {top_p_ratio!r}; STARE uses 0.1")
    for name, value in (("reweight_w", reweight_w), ("reweight_m", reweight_m)):
        if not (isinstance(value, (int, float)) and 0 < value < math.inf):
            raise ValueError(f"{name} must be a finite weight > 0, got {value!r}; STARE uses W 1.1 and M 0.9")
    adv = broadcast_advantages(advantages, mask)
    valid = mask.bool()
    surprisal = -logp.detach().float()
    l_plus = _top_surprisal(surprisal, valid & (adv > 0), top_p_ratio)
    l_minus = _top_surprisal(surprisal, valid & (adv < 0), top_p_ratio) if variant == "C2" else torch.zeros_like(valid)
    omega = torch.ones(mask.shape, dtype=torch.float32, device=mask.device)
    omega = torch.where(l_plus, torch.full_like(omega, reweight_w), omega)
    omega = torch.where(l_minus, torch.full_like(omega, reweight_m), omega)
    metrics: dict[str, float] = {}
    if entropy_gate is not None:
        open_, gate_metrics = entropy_gate_open(entropy, valid, target=entropy_gate)
        omega = torch.where(open_, omega, torch.ones_like(omega))
        metrics.update(gate_metrics)
    n = valid.sum().clamp_min(1).float()
    metrics.update(
        frac_reweighted_pos=float(l_plus.sum() / n),
        frac_reweighted_neg=float(l_minus.sum() / n),
        mean_weight=float((omega * valid).sum() / n),
    )
    return omega, metrics


RSI_EPS = 1e-6  # the port's eps in RSI = -log p / (H + eps)


def rsi_band(
    stats,
    advantages: Tensor,
    mask: Tensor,
    *,
    rsi_lower_bound: float | None = None,
    rsi_upper_bound: float | None = None,
    eps: float = RSI_EPS,
) -> tuple[Tensor, dict[str, float]]:
    """RSI-S (arXiv 2606.31575), as smellslikeml/open-instruct's port computes it (compute_rsi_selection): the
    relative surprisal index RSI = -log p / (H + eps) of each token (float32, as the port); tokens with RSI below
    rsi_lower_bound (redundant, likely) or above rsi_upper_bound (the unstable unlikely tail) leave the loss, on
    both advantage signs and with no batch baseline. RSI > 1 exactly where S* < 0 (log p < -H), so the band is a
    two-sided cut on the paper's sign. None leaves a side open (the port writes 0.0 for that); at least one bound
    is needed, since neither the paper nor the port publishes a default band.

    stats: TokenStats (log p and H read), (B, T) each; advantages (B,) or (B, T) (metrics only); mask (B, T).
    Metrics: the authors' fractions (frac_clipped, ...), rsi_drop_low and rsi_drop_high (over the valid tokens)."""
    if rsi_lower_bound is None and rsi_upper_bound is None:
        raise ValueError(
            "RSI-S needs a band: give rsi_lower_bound and/or rsi_upper_bound (neither the paper nor the port "
            "publishes a default; the port's 0 / 0 keeps every token)"
        )
    for name, value in (("rsi_lower_bound", rsi_lower_bound), ("rsi_upper_bound", rsi_upper_bound)):
        if value is not None and not (isinstance(value, (int, float)) and 0 <= value < math.inf):
            raise ValueError(f"{name} must be a finite RSI >= 0, got {value!r}")
    if rsi_lower_bound is not None and rsi_upper_bound is not None and rsi_lower_bound >= rsi_upper_bound:
        raise ValueError(f"rsi_lower_bound ({rsi_lower_bound}) must be below rsi_upper_bound ({rsi_upper_bound})")
    if not 0 < eps < math.inf:
        raise ValueError(f"eps must be > 0, got {eps!r}; the port uses 1e-6")
    valid = mask.bool()
    rsi = (-stats.logp.float()) / (stats.entropy.float() + eps)
    low = valid & (rsi < rsi_lower_bound) if rsi_lower_bound is not None else torch.zeros_like(valid)
    high = valid & (rsi > rsi_upper_bound) if rsi_upper_bound is not None else torch.zeros_like(valid)
    keep = valid & ~low & ~high
    n = valid.sum().clamp_min(1).float()
    metrics = _reference_fractions(mask, keep, broadcast_advantages(advantages, mask))
    metrics.update(rsi_drop_low=float(low.sum() / n), rsi_drop_high=float(high.sum() / n))
    return keep, metrics
