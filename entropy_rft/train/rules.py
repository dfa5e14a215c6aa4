"""The shape of a run's training step, decided once from its config: `StepRules`.

Every part of the library that depends on how a step is laid out reads it here and nowhere else:

    rows per pass      every forward over the batch (statistics, reference, held forward, probe, the update's
                       micro-batches) runs in consecutive slices of `rows_per_pass` rows (`passes`, the split of
                       forward.passes that every forward uses)
    optimizer steps    Lopti phases x ppo_epochs x mini_batches (`schedule`), each epoch's mini-batch order drawn
                       from the update's generator when there are several mini-batches
    strict on-policy   one optimizer step, at the behaviour weights (`strict`); only then may the statistics be
                       the update's own forward (`reuse`)
    needs              a critic (a token-level advantage: GAE's value head), a reference policy (kl_coef > 0):
                       `needs`, read from the config alone, so the policy can be set up with them
    probe cadence      the entropy probe every `probe_every` steps (every step under the mu controller)
    frozen rows        whether rows with advantage exactly 0 may run without a graph (`may_freeze`)

The step (step.py, which hands forward.py's passes their rows per pass), the memory plan (plan.py), the trainer's
set-up and the invariant checks (invariants.py, through step.Step) all read these; tests/test_rules.py tabulates them
for every shipped recipe. A run builds them once: the trainer sets its policy up from `needs`, then builds the
StepRules (the loaded model's dropout decides `reuse`) and hands them to its step.Step.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import Tensor

from ..config import TrainConfig
from ..core.advantages import ADVANTAGES, TokenLevel
from ..core.control import EntropyControl, make_control
from ..core.objective import Objective
from .forward import pass_size, passes


def needs(cfg: TrainConfig) -> tuple[bool, bool]:
    """(critic, reference): a token-level advantage (GAE) needs a value head, kl_coef > 0 a reference policy. What
    the trainer sets its policy up with, before the model it loads decides the rest of StepRules (its dropout)."""
    return isinstance(ADVANTAGES.get(cfg.advantage), TokenLevel), cfg.kl_coef > 0


def objective_of(cfg: TrainConfig, control: EntropyControl, *, kl: bool, value: bool) -> Objective:
    """The run's objective: the KL term with a reference policy, the value term with a critic, the bonus with a
    fixed or adaptive coefficient, EntroPIC's term with its controller."""
    return Objective.of(
        cfg,
        kl=kl,
        value=value,
        entropy_bonus=cfg.entropy_coef != 0 or control.adds_entropy_bonus,
        entropic=control.adds_entropic_term,
    )


@dataclass(frozen=True)
class StepRules:
    micro_batch_size: int  # rows per pass of every forward over the batch (0: the whole batch)
    phases: int  # 2 under Lopti (low-probability tokens first, then the rest), else 1
    epochs: int  # ppo_epochs
    mini_batches: int  # optimizer steps per epoch and phase
    lopti_eta: float | None  # Lopti's split at pi_old = eta
    strict: bool  # one optimizer step at the behaviour weights (strict on-policy)
    reuse: bool  # the statistics are the update's own held forward
    critic: bool  # a token-level advantage (GAE) needs a value head
    reference: bool  # the KL term needs a reference policy
    probe_every: int  # steps between entropy probes (0: never)
    may_freeze: bool  # responses with advantage 0 may run without a graph (their gradient is exactly 0)

    @classmethod
    def of(
        cls,
        cfg: TrainConfig,
        *,
        objective: Objective | None = None,
        control: EntropyControl | None = None,
        dropout_active: bool = False,
    ) -> StepRules:
        """The rules of cfg's steps. The objective defaults to the one cfg implies (a KL term when kl_coef > 0, a
        value term with a critic); dropout_active (forward's module mode) rules out reusing the update's forward
        under reuse_forward auto."""
        control = control or make_control(cfg)
        critic, reference = needs(cfg)
        if objective is None:
            objective = objective_of(cfg, control, kl=reference, value=critic)
        strict = cfg.ppo_epochs == 1 and cfg.mini_batches == 1 and cfg.lopti_eta is None
        whole = cfg.micro_batch_size == 0 or cfg.micro_batch_size >= cfg.prompts_per_step * cfg.group_size
        # reuse: only strict on-policy, where old log p equals the update's log p; `auto` also needs the update to
        # hold the whole batch's activations anyway (no micro-batching) and no active dropout
        reuse = cfg.reuse_forward != "off" and strict and (cfg.reuse_forward == "on" or (whole and not dropout_active))
        # advantages must be known before the forward: no rank penalty or reweighting from old log p
        freeze = (
            cfg.skip_zero_advantage
            and reuse
            and objective.vanishes_at_zero_advantage
            and cfg.rank_penalty_beta == 0
            and cfg.ar_alpha == 0
        )
        return cls(
            cfg.micro_batch_size,
            1 if cfg.lopti_eta is None else 2,
            cfg.ppo_epochs,
            cfg.mini_batches,
            cfg.lopti_eta,
            strict,
            reuse,
            critic,
            reference,
            1 if control.probes_every_step else cfg.probe_every,
            freeze,
        )

    def rows_per_pass(self, n_rows: int) -> int:
        """Rows per forward pass: the update's micro-batch (the whole batch when micro_batch_size is 0 or larger)."""
        return pass_size(n_rows, self.micro_batch_size) if n_rows else 0

    def passes(self, rows: Tensor | int) -> tuple[Tensor, ...]:
        """The rows of each forward pass over `rows` (module function `passes`)."""
        return passes(rows, self.micro_batch_size)

    def holds_whole_batch(self, n_rows: int) -> bool:
        """reuse_forward on with micro-batches: every micro-batch's forward is held until the filter has run."""
        return self.reuse and self.rows_per_pass(n_rows) < n_rows

    @property
    def optimizer_steps(self) -> int:
        """Optimizer steps per update: phases x epochs x mini-batches."""
        return self.phases * self.epochs * self.mini_batches

    def phase_masks(self, loss_mask: Tensor, old_logp: Tensor) -> list[Tensor]:
        """(B, R) loss tokens of each phase: all of them, or Lopti's low-probability tokens (pi_old < eta), then
        the rest."""
        if self.lopti_eta is None:
            return [loss_mask]
        low = old_logp.exp() < self.lopti_eta
        return [loss_mask & low, loss_mask & ~low]

    def schedule(self, n_rows: int, gen: torch.Generator) -> Iterator[tuple[int, Tensor]]:
        """(phase, rows of the mini-batch) of each optimizer step, in order: phases x epochs x mini-batches. Each
        epoch of each phase draws one permutation of the rows from `gen` when there are several mini-batches, and
        draws nothing otherwise."""
        for phase in range(self.phases):
            for _epoch in range(self.epochs):
                order = torch.randperm(n_rows, generator=gen) if self.mini_batches > 1 else torch.arange(n_rows)
                for rows in order.chunk(self.mini_batches):
                    yield phase, rows

    def probing(self, step: int) -> bool:
        """Whether step (0-based) measures the entropy probe."""
        return self.probe_every > 0 and (step + 1) % self.probe_every == 0
