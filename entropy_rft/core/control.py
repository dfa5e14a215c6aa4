"""Entropy targets (beyond the paper): hold the policy's token entropy near a value the user gives.

- MuController sets Clip_B's or Clip_V's mu each step from eq. 23's first-order entropy change of the kept tokens,
  scaled by kappa, fitted online on the update's own first-order change (forward.EntropyProbe);
- AdaptiveEntropyBonus (Skywork-OR1's adaptive entropy control): an entropy bonus whose coefficient follows the
  target by +-delta per step;
- EntroPIC (Yang et al. 2025, arXiv 2511.15248; the authors' code github.com/yk7333/EntroPIC): a PI controller's
  alpha reweights the policy-gradient terms of high-probability tokens (T_hi: pi_old > tau).

The trainer sees each through one interface, `EntropyControl` (chosen by name from CONTROLS: entropy_control, or
"none" without an entropy target, `control_name`): it may choose the step's keep mask (mu), set the knobs of the
objective's terms (the bonus's coefficient, EntroPIC's alpha and T_hi), learn from the step's metrics, and carry a
state that a checkpoint saves. The derivations, the guards on the scale estimate and when to use which:
docs/entropy-control.md.

Departures from EntroPIC's code, numbered:
1. One alpha per training step, from the entropy of the whole batch (theirs: per micro-batch).
2. The integral gains e_t once per training step (theirs: once per optimizer mini-batch); equal under one
   mini-batch per step.
3. T_hi is chosen with the behaviour policy's log-probabilities over the whole batch, fixed for all epochs.
4. The adjustment's token mean divides by |T_hi| of the whole mini-batch (theirs: of each micro-batch).
5. Tokens a method's filter removes (Clip_B, Clip_V) leave T_hi too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Literal, Protocol

import torch

from .advantages import broadcast_advantages
from .registry import Registry


def unit_entropy_change(
    advantages: torch.Tensor, s_centered: torch.Tensor, loss_mask: torch.Tensor, num_tokens: float | None = None
) -> float:
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
            unit = unit_entropy_change(
                advantages, stats.s_centered, mask & keep, num_tokens=n_valid if self.denominator == "all" else None
            )
            gap = abs(entropy_now + self.kappa * unit - self.target)
            if best is None or gap < best[0] - 1e-12:
                best = (gap, mu, keep, metrics, unit)
        assert best is not None, "the candidates include mu = inf"
        _, mu, keep, metrics, unit = best
        self.last_unit = unit
        return mu, keep, metrics

    def observe(self, change: float) -> bool:
        """Fit kappa with this step's measured change (the first-order change through the network) against the
        chosen mu's unit prediction; returns False when the step is ignored (non-finite, or |d| tiny)."""
        x = self.last_unit
        if not (math.isfinite(x) and math.isfinite(change)) or x == 0:
            return False
        if self._n > 0 and x * x < (self.min_unit_frac**2) * self._unit_ms:
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


@dataclass
class EntroPIC:
    """EntroPIC's PI controller (module docstring): update(H_t) returns alpha_t for this step's loss."""

    target: float
    k_p: float = 1.0  # proportional gain (authors' default)
    k_i: float = 0.01  # integral gain (authors' default)
    alpha_max: float = 1.0  # alpha is clipped to [-alpha_max, alpha_max] (authors: 1)
    integral: float = field(default=0.0, init=False)  # sum of the errors of earlier steps
    alpha: float = field(default=0.0, init=False)  # the last alpha returned

    def update(self, entropy_now: float) -> float:
        """alpha_t = clip(K_p e_t + K_i sum_{s<t} e_s), then the integral takes e_t."""
        error = entropy_now - self.target
        self.alpha = min(max(self.k_p * error + self.k_i * self.integral, -self.alpha_max), self.alpha_max)
        self.integral += error
        return self.alpha

    def state(self) -> dict:
        return {"integral": self.integral, "alpha": self.alpha}

    def load_state(self, state: dict) -> None:
        self.integral, self.alpha = state["integral"], state["alpha"]


def high_probability_tokens(old_logp: torch.Tensor, mask: torch.Tensor, *, threshold: float = 0.95) -> torch.Tensor:
    """(B, T) bool: valid tokens whose behaviour-policy probability exceeds threshold (EntroPIC's T_hi)."""
    return mask & (old_logp > math.log(threshold))


# ---------------------------------------------------------------------------------------------------------------
# One interface for the trainer


@dataclass
class Knobs:
    """What a control sets for one step's objective: the entropy bonus's coefficient, EntroPIC's alpha and its
    high-probability tokens T_hi (B, R) (None: no EntroPIC term this run)."""

    entropy_coef: float = 0.0
    alpha: float = 0.0
    high: torch.Tensor | None = None


class ControlSettings(Protocol):
    """What the controls read of a run's settings (config.TrainConfig has each; core/ does not import it, and
    tests/test_layout.py holds the two to each other)."""

    entropy_target: float | None
    entropy_control: str
    entropy_coef: float
    denominator: Literal["kept", "all"]
    bonus_delta: float
    bonus_max: float
    pi_kp: float
    pi_ki: float
    pi_alpha_max: float
    pi_threshold: float

    def method_overrides(self) -> dict: ...


class EntropyControl:
    """No entropy target: the method's own filter and the fixed entropy_coef. Subclasses override what they steer."""

    probes_every_step = False  # needs the first-order entropy change of every step (EntropyProbe)
    adds_entropy_bonus = False  # the objective has an entropy-bonus term whatever entropy_coef is
    adds_entropic_term = False  # the objective has EntroPIC's term

    def __init__(self, cfg: ControlSettings):
        self.cfg = cfg

    @property
    def target(self) -> float:
        """The entropy target a steering control holds the run to (control_name picks "none" without one)."""
        if self.cfg.entropy_target is None:
            raise ValueError(
                f"{type(self).__name__} needs an entropy_target (nats); set one or use entropy_control none"
            )
        return self.cfg.entropy_target

    def choose_tokens(self, method, stats, advantages, mask, entropy_now: float) -> tuple[torch.Tensor, dict]:
        """(keep (B, R) bool, filter metrics): the method's filter over the whole batch."""
        return method.apply(stats, advantages, mask, **self.cfg.method_overrides())

    def knobs(self, entropy_now: float, old_logp: torch.Tensor, loss_mask: torch.Tensor) -> Knobs:
        return Knobs(entropy_coef=self.cfg.entropy_coef)

    def metrics(self, knobs: Knobs, mask: torch.Tensor) -> dict:
        return {"entropy_coef": knobs.entropy_coef}

    def observe(self, metrics: dict) -> None:
        """Learn from the step's logged metrics (after the update)."""

    inner: MuController | AdaptiveEntropyBonus | EntroPIC | None = None  # the controller a subclass steers with

    def state(self) -> dict | None:
        """What a checkpoint keeps of the control: its controller's learnt state."""
        return None if self.inner is None else self.inner.state()

    def load_state(self, state: dict) -> None:
        if self.inner is not None:
            self.inner.load_state(state)


class MuControl(EntropyControl):
    probes_every_step = True

    def __init__(self, cfg: ControlSettings):
        super().__init__(cfg)
        self.controller = self.inner = MuController(self.target, denominator=cfg.denominator)

    def choose_tokens(self, method, stats, advantages, mask, entropy_now):
        mu, keep, metrics = self.controller.choose(
            method, stats, advantages, mask, entropy_now, self.cfg.method_overrides()
        )
        return keep, {**metrics, "mu": mu if math.isfinite(mu) else None, "kappa": self.controller.kappa}

    def observe(self, metrics):
        if "entropy_change/first_order" in metrics:  # kappa is fitted on the update's own first-order effect
            self.controller.observe(metrics["entropy_change/first_order"])


class BonusControl(EntropyControl):
    adds_entropy_bonus = True

    def __init__(self, cfg: ControlSettings):
        super().__init__(cfg)
        self.bonus = self.inner = AdaptiveEntropyBonus(self.target, cfg.bonus_delta, cfg.entropy_coef, cfg.bonus_max)

    def knobs(self, entropy_now, old_logp, loss_mask):
        return Knobs(entropy_coef=self.bonus.update(entropy_now))


class PIControl(EntropyControl):
    adds_entropic_term = True

    def __init__(self, cfg: ControlSettings):
        super().__init__(cfg)
        self.pi = self.inner = EntroPIC(self.target, cfg.pi_kp, cfg.pi_ki, cfg.pi_alpha_max)

    def knobs(self, entropy_now, old_logp, loss_mask):
        high = high_probability_tokens(old_logp, loss_mask, threshold=self.cfg.pi_threshold)
        return Knobs(entropy_coef=self.cfg.entropy_coef, alpha=self.pi.update(entropy_now), high=high)

    def metrics(self, knobs, mask):
        return {
            "entropy_coef": knobs.entropy_coef,
            "entropic/alpha": knobs.alpha,
            "entropic/integral": self.pi.integral,
            "entropic/high_prob_frac": float(knobs.high.sum()) / max(float(mask.sum()), 1),
        }


CONTROLS: Registry[type[EntropyControl]] = Registry("entropy control")
CONTROLS.register("none", EntropyControl)
CONTROLS.register("mu", MuControl)
CONTROLS.register("bonus", BonusControl)
CONTROLS.register("pi", PIControl)
LEGACY_STATE_KEYS = {"mu": "controller", "bonus": "bonus", "pi": "pi"}  # checkpoints written before CONTROLS


def control_name(cfg: ControlSettings) -> str:
    """The name in CONTROLS of the run's control: cfg.entropy_control with an entropy target, else "none"."""
    return "none" if cfg.entropy_target is None else cfg.entropy_control


def make_control(cfg: ControlSettings) -> EntropyControl:
    """The run's control (control_name)."""
    return CONTROLS.get(control_name(cfg))(cfg)
