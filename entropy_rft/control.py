"""Entropy targets (beyond the paper): hold the policy's token entropy near a value the user gives.

MuController sets Clip_B's or Clip_V's mu each step. For each candidate mu it computes the filter's keep mask and
the first-order logit-space change of the policy's mean entropy that an update on the kept tokens K would make,
per unit step: d(mu) = -sum_K A S_c / N, with N the loss's token-mean denominator (|K|, or every valid token with
denominator="all"). That is eq. 23 (Theorem 2 summed over K) with the token mean's 1/N (dynamics, departure 3),
not Corollary 4's -Cov_K(A, S_c): Corollary 4 drops E_K[A] E_K[S_c], which Corollary 2 makes small on the whole
on-policy batch but not on the kept set, whose S_c is biased by the filter and whose advantages need not average
to 0. The step's real change is kappa * d(mu): kappa (the network's tangent kernel and Adam's scaling, unknown a
priori) is fitted online by least squares through the origin on the pairs (d of the chosen mu, the step's
first-order change through the network, forward.EntropyProbe), with exponential forgetting. The first-order change
is the update's own effect without the second-order remainder, so the fit is not fed sampling noise of the
realised change. The controller picks the mu whose predicted entropy H + kappa * d(mu) lands nearest the target,
preferring the largest mu (the fewest clipped tokens) among equals, and no clipping at all (mu = inf) when that is
nearest.

Guards on the scale estimate: a step whose |d| is below min_unit_frac of the running RMS of accepted |d| (or is 0)
is ignored (its ratio would be noise over a tiny denominator); kappa is clamped to [0, kappa_max] (a negative fit
means the prediction has no usable sign yet, and kappa 0 then leaves the update unclipped); until min_observations
steps are accepted kappa is kappa_prior.

AdaptiveEntropyBonus is the usual alternative (Skywork-OR1's adaptive entropy control, the style TRL users
write as a callback): an entropy bonus whose coefficient rises by `delta` while entropy is below the target and
falls by `delta` (not below 0) while above.

When to use which: the bonus adds a gradient that pushes up the entropy of every token, including tokens the
task needs to be sure of; the mu controller only removes the updates that the theory says drive entropy
down, so it cannot raise entropy above where the plain update would leave it, but it never adds a gradient
of its own. Use the controller to stop collapse; use the bonus when entropy must rise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

import torch

from .advantages import broadcast_advantages


def unit_entropy_change(advantages: torch.Tensor, s_centered: torch.Tensor, loss_mask: torch.Tensor,
                        num_tokens: float | None = None) -> float:
    """Eq. 23 on the loss tokens K per unit step, with the token mean's 1/N: -sum_K A S_c / N, N = num_tokens
    (default |K|, i.e. -E_K[A S_c]). Unlike -Cov_K(A, S_c) (Corollary 4) it keeps the term E_K[A] E_K[S_c]."""
    adv = broadcast_advantages(advantages, s_centered).double()
    m = loss_mask.double()
    n = float(m.sum()) if num_tokens is None else float(num_tokens)
    return -float((adv * s_centered.double() * m).sum()) / max(n, 1.0)


@dataclass
class MuController:
    target: float
    grid: tuple[float, ...] = (0.5, 0.75, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 6.0, 8.5)
    forget: float = 0.9  # weight of the past in the least-squares fit of kappa
    kappa_prior: float = 0.0  # until min_observations steps are accepted: no prediction, no clipping
    denominator: str = "kept"  # the loss's token-mean denominator: "kept" (|K|) or "all" (every valid token)
    min_unit_frac: float = 1e-3  # ignore steps whose |d| is below this fraction of the running RMS of |d|
    kappa_max: float = math.inf  # upper clamp of kappa
    min_observations: int = 1
    _sxy: float = field(default=0.0, init=False)
    _sxx: float = field(default=0.0, init=False)
    _n: int = field(default=0, init=False)
    _unit_ms: float = field(default=0.0, init=False)  # exponential mean of d^2 over accepted steps
    last_unit: float = field(default=0.0, init=False)

    @property
    def kappa(self) -> float:
        if self._n < self.min_observations or self._sxx <= 0:
            return self.kappa_prior
        return min(max(self._sxy / self._sxx, 0.0), self.kappa_max)

    def choose(self, method, stats, advantages, mask, entropy_now: float, overrides: dict):
        """(mu, keep, filter metrics) for this step."""
        candidates = [math.inf] + sorted(self.grid, reverse=True)
        n_valid = float(mask.sum())
        best = None
        for mu in candidates:
            if math.isinf(mu):
                keep, metrics = mask.clone(), {}
            else:
                keep, metrics = method.apply(stats, advantages, mask, **{**overrides, "mu": mu})
            unit = unit_entropy_change(advantages, stats.s_centered, mask & keep,
                                       num_tokens=n_valid if self.denominator == "all" else None)
            gap = abs(entropy_now + self.kappa * unit - self.target)
            if best is None or gap < best[0] - 1e-12:
                best = (gap, mu, keep, metrics, unit)
        _, mu, keep, metrics, unit = best
        self.last_unit = unit
        return mu, keep, metrics

    def observe(self, change: float) -> bool:
        """Fit kappa with this step's measured change (the first-order change through the network) against the
        chosen mu's unit prediction; returns False when the step is ignored (non-finite, or |d| tiny)."""
        x = self.last_unit
        if not (math.isfinite(x) and math.isfinite(change)) or x == 0:
            return False
        if self._n > 0 and x * x < (self.min_unit_frac ** 2) * self._unit_ms:
            return False
        self._sxy = self.forget * self._sxy + x * change
        self._sxx = self.forget * self._sxx + x * x
        self._unit_ms = x * x if self._n == 0 else self.forget * self._unit_ms + (1 - self.forget) * x * x
        self._n += 1
        return True

    def state(self) -> dict:
        """What the controller has learnt (every field not set at construction), for a checkpoint; the settings
        come from the config."""
        return {f.name: getattr(self, f.name) for f in fields(self) if not f.init}

    def load_state(self, state: dict) -> None:
        for name, value in state.items():
            setattr(self, name, value)


@dataclass
class AdaptiveEntropyBonus:
    target: float
    delta: float = 0.002  # coefficient change per step
    coef: float = 0.0
    max_coef: float = 0.05

    def update(self, entropy_now: float) -> float:
        step = self.delta if entropy_now < self.target else -self.delta
        self.coef = min(max(self.coef + step, 0.0), self.max_coef)
        return self.coef

    def state(self) -> dict:
        return {"coef": self.coef}

    def load_state(self, state: dict) -> None:
        self.coef = state["coef"]
