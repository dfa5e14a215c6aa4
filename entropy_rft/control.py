"""Entropy targets (beyond the paper): hold the policy's token entropy near a value the user gives.

MuController sets Clip_B's or Clip_V's mu each step from Corollary 4. For each candidate mu on a grid it
computes the filter's keep mask and the first-order batch entropy change of the update on the kept tokens,
d(mu) = -Cov_B(A, S_c) (eq. 14, per unit step). The step's real change is kappa * d(mu), where kappa (the
parameter-space step's effect on logits, unknown a priori) is fitted online by least squares through the origin
on the (predicted, realised) pairs the trainer measures each step, with exponential forgetting. The controller
picks the mu whose predicted entropy H + kappa * d(mu) lands nearest the target, preferring the largest mu (the
fewest clipped tokens) among equals, and no clipping at all (mu = inf) when that is nearest.

AdaptiveEntropyBonus is the usual alternative (Skywork-OR1's adaptive entropy control, the style TRL users
write as a callback): an entropy bonus whose coefficient rises by `delta` while entropy is below the target and
falls by `delta` (not below 0) while above.

When to use which: the bonus adds a gradient that pushes up the entropy of every token, including tokens the
task needs to be sure of; the mu controller only removes the updates that Corollary 4 says drive entropy
down, so it cannot raise entropy above where the plain update would leave it, but it never adds a gradient
of its own. Use the controller to stop collapse; use the bonus when entropy must rise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from .advantages import broadcast_advantages
from .dynamics import batch_covariance


def unit_entropy_change(advantages: torch.Tensor, s_centered: torch.Tensor, loss_mask: torch.Tensor) -> float:
    """Corollary 4 per unit step: -Cov_B(A, S_c) over the loss tokens."""
    return -float(batch_covariance(broadcast_advantages(advantages, s_centered), s_centered, loss_mask))


@dataclass
class MuController:
    target: float
    grid: tuple[float, ...] = (0.5, 0.75, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 6.0, 8.5)
    forget: float = 0.9  # weight of the past in the least-squares fit of kappa
    kappa_prior: float = 0.0  # until the first observation: no prediction, no clipping
    _sxy: float = field(default=0.0, init=False)
    _sxx: float = field(default=0.0, init=False)
    last_unit: float = field(default=0.0, init=False)

    @property
    def kappa(self) -> float:
        return self._sxy / self._sxx if self._sxx > 0 else self.kappa_prior

    def choose(self, method, stats, advantages, mask, entropy_now: float, overrides: dict):
        """(mu, keep, filter metrics) for this step."""
        candidates = [math.inf] + sorted(self.grid, reverse=True)
        best = None
        for mu in candidates:
            if math.isinf(mu):
                keep, metrics = mask.clone(), {}
            else:
                keep, metrics = method.apply(stats, advantages, mask, **{**overrides, "mu": mu})
            unit = unit_entropy_change(advantages, stats.s_centered, mask & keep)
            gap = abs(entropy_now + self.kappa * unit - self.target)
            if best is None or gap < best[0] - 1e-12:
                best = (gap, mu, keep, metrics, unit)
        _, mu, keep, metrics, unit = best
        self.last_unit = unit
        return mu, keep, metrics

    def observe(self, realised: float) -> None:
        """Update kappa with this step's realised change against the chosen mu's unit prediction."""
        x = self.last_unit
        self._sxy = self.forget * self._sxy + x * realised
        self._sxx = self.forget * self._sxx + x * x

    def state(self) -> dict:
        """The fitted statistics, for a checkpoint (the settings come from the config)."""
        return {"sxy": self._sxy, "sxx": self._sxx, "last_unit": self.last_unit}

    def load_state(self, state: dict) -> None:
        self._sxy, self._sxx, self.last_unit = state["sxy"], state["sxx"], state["last_unit"]


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
