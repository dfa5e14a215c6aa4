"""One training step over a scored batch: statistics, a decision over the whole batch, then the update.

    statistics  the behaviour policy's log p, H, S*, E_p[S] (and the critic's values) of every response token, (B, R)
    decide      over the whole batch, into plain tensors (`Decision`): shaped rewards -> advantages, the method's
                keep mask (or the entropy control's), Clip-Cov / KL-Cov's token selection, the control's knobs
    update      ppo_epochs x mini_batches optimizer steps (per Lopti phase) on the objective (objective.py), gradient
                accumulation over micro-batches with the mini-batch's own counts, so splitting changes nothing

The update sees only the Decision's tensors, never the filter, so no filter can run per micro-batch. The rules that
shape a step (strict on-policy, the reuse of the update's forward, rows per pass, the probe's cadence, which rows may
run without a graph) are computed once, in `StepRules`, which the trainer, plan.py and invariants.py read.

Departures, numbered:
1. Old log-probs are recomputed by the trainer's forward pass (as verl does), not taken from generation.
2. Exactly on-policy where the weights are the behaviour policy's (as TRL does with num_iterations 1): the first
   optimizer step of each update takes old log p (and the critic's old values) from its own forward, detached, so
   its ratio is exactly 1 in any precision; later steps use the statistics pass's old log p, which the same
   construction computes (forward.py: one construction), so they differ only through the weights' change.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import Tensor

from .advantages import (ADVANTAGES, TokenLevel, advantage_reweight, outcome_token_rewards, overlong_penalty,
                         rank_penalty)
from .config import TrainConfig
from .control import EntropyControl, Knobs, make_control
from .diagnostics import after_update_metrics, masked_mean, step_metrics
from .dropout import has_active_dropout
from .dynamics import TokenStats, corollary4_entropy_change
from .forward import EntropyProbe, HeldForward, batch_forward, policy_forward
from .losses import step_sizes
from .methods import METHODS, POLICY_LOSSES
from .objective import Micro, Objective
from .rollout import Rollout
from .stops import check_finite

MIN_FROZEN_SHARE = 0.2  # below it the frozen rows' own passes cost more than their backward saves (demo policy:
#                        12% of rows frozen 1.01x the time of none, 25% 0.95x)


@dataclass
class Scored:
    """A step's batch: prompts_per_step groups of group_size responses and their rewards, (B,) each."""

    problems: list
    rollout: Rollout
    rewards: Tensor  # (B,) the task's
    correct: Tensor  # (B,) bool
    info: dict = field(default_factory=dict)  # sampling/* metrics

    @property
    def group_ids(self) -> Tensor:
        return torch.arange(len(self.problems)).repeat_interleave(len(self.rewards) // max(len(self.problems), 1))


def strict_on_policy(cfg: TrainConfig) -> bool:
    """One epoch, one mini-batch, no Lopti phases: the update's only optimizer step runs at the behaviour weights."""
    return cfg.ppo_epochs == 1 and cfg.mini_batches == 1 and cfg.lopti_eta is None


def reuses_forward(cfg: TrainConfig, model=None, *, dropout_active: bool | None = None) -> bool:
    """Whether the statistics come from the update's own forward: only strict on-policy, where old log p equals the
    update's log p; `auto` also needs the update to hold the whole batch's activations anyway (no micro-batching)
    and no active dropout."""
    if cfg.reuse_forward == "off" or not strict_on_policy(cfg):
        return False
    if cfg.reuse_forward == "on":
        return True
    whole = cfg.micro_batch_size == 0 or cfg.micro_batch_size >= cfg.prompts_per_step * cfg.group_size
    active = has_active_dropout(model) if dropout_active is None else dropout_active
    return whole and not active


def objective_of(cfg: TrainConfig, control: EntropyControl, *, kl: bool, value: bool) -> Objective:
    """The run's objective: the KL term with a reference policy, the value term with a critic, the bonus with a
    fixed or adaptive coefficient, EntroPIC's term with its controller."""
    return Objective.of(cfg, kl=kl, value=value, entropy_bonus=cfg.entropy_coef != 0 or control.adds_entropy_bonus,
                        entropic=control.adds_entropic_term)


@dataclass(frozen=True)
class StepRules:
    strict: bool  # strict_on_policy
    reuse: bool  # the statistics are the update's own held forward (reuses_forward)
    micro_batch_size: int  # rows per pass of every forward over the batch (0: the whole batch)
    probe_every: int  # steps between entropy probes (0: never)
    may_freeze: bool  # responses with advantage 0 may run without a graph (their gradient is exactly 0)

    @classmethod
    def of(cls, cfg: TrainConfig, *, objective: Objective | None = None, control: EntropyControl | None = None,
           dropout_active: bool = False) -> "StepRules":
        """The rules of cfg's steps; without an objective (plan.py), the one cfg implies without reference or critic
        knowledge beyond cfg itself."""
        control = control or make_control(cfg)
        if objective is None:
            objective = objective_of(cfg, control, kl=cfg.kl_coef > 0,
                                     value=isinstance(ADVANTAGES.get(cfg.advantage), TokenLevel))
        reuse = reuses_forward(cfg, dropout_active=dropout_active)
        # advantages must be known before the forward: no rank penalty or reweighting from old log p
        freeze = (cfg.skip_zero_advantage and reuse and objective.vanishes_at_zero_advantage
                  and cfg.rank_penalty_beta == 0 and cfg.ar_alpha == 0)
        return cls(strict_on_policy(cfg), reuse, cfg.micro_batch_size,
                   1 if control.probes_every_step else cfg.probe_every, freeze)

    def rows_per_pass(self, n_rows: int) -> int:
        """Rows per forward pass: the update's micro-batch (the whole batch when micro_batch_size is 0 or larger)."""
        return min(self.micro_batch_size or n_rows, n_rows)

    def probing(self, step: int) -> bool:
        return self.probe_every > 0 and (step + 1) % self.probe_every == 0

    def holds_whole_batch(self, n_rows: int) -> bool:
        """reuse_forward on with micro-batches: every micro-batch's forward is held until the filter has run."""
        return self.reuse and self.rows_per_pass(n_rows) < n_rows


def estimator_of(cfg: TrainConfig):
    """cfg's advantage estimator with the options it reads from cfg (QAE's quantile_k)."""
    estimator = ADVANTAGES.get(cfg.advantage)
    if cfg.advantage == "qae":
        return functools.partial(estimator, quantile_k=cfg.quantile_k)
    return estimator


def zero_advantage_rows(estimator, rewards, group_ids, min_share: float = MIN_FROZEN_SHARE) -> Tensor | None:
    """(B,) rows whose advantage is exactly 0 (the step's own estimator on the same rewards), or None when fewer than
    min_share of the rows are, or every row is (then the backward runs as usual, so Adam steps on zero gradients
    exactly as before)."""
    zero = estimator(rewards, group_ids) == 0
    share = float(zero.float().mean())
    return zero if zero.dim() == 1 and min_share <= share < 1 and share > 0 else None


def shaped_rewards(cfg: TrainConfig, rewards: Tensor, mask: Tensor) -> Tensor:
    """(B,) rewards with DAPO's soft overlong punishment, when configured."""
    if cfg.overlong_buffer_frac <= 0:
        return rewards
    return rewards + overlong_penalty(mask.sum(-1), max_len=cfg.max_new_tokens,
                                      buffer=round(cfg.overlong_buffer_frac * cfg.max_new_tokens),
                                      factor=cfg.overlong_penalty_factor)


def compute_advantages(cfg: TrainConfig, estimator, rewards, group_ids, mask, old_logp,
                       old_values) -> tuple[Tensor, Tensor | None]:
    """(advantages (B,) or (B, R), returns (B, R) or None): the estimator over each group, after the reward shaping
    that reads old log p (rewarding the unlikely's rank penalty), then advantage reweighting; PPO's GAE over the
    value head's old values."""
    shaped = rewards
    if cfg.rank_penalty_beta > 0:  # rewarding the unlikely
        seq_logp = (old_logp * mask).sum(-1) / mask.sum(-1).clamp_min(1)
        shaped = rank_penalty(rewards, group_ids, seq_logp, beta=cfg.rank_penalty_beta)
    returns = None
    if isinstance(estimator, TokenLevel):  # PPO: GAE over the value head's values, (B, R)
        adv, returns = estimator(outcome_token_rewards(shaped, mask), old_values, mask, gamma=cfg.gamma, lam=cfg.lam)
    else:
        adv = estimator(shaped, group_ids)
    if cfg.ar_alpha > 0:  # advantage reweighting
        adv = advantage_reweight(adv, old_logp, alpha=cfg.ar_alpha)
    return adv, returns


def behaviour_statistics(model, rollout: Rollout, cfg: TrainConfig, value_head=None, *, reuse: bool,
                         frozen: Tensor | None = None) -> tuple[TokenStats, Tensor | None, HeldForward | None]:
    """(stats, old values, held) of the behaviour policy, (B, R) each, over the whole batch. Strict on-policy with
    reuse: the update's own forward, kept with its graph until the filter has run (`held`). Otherwise one no-grad
    pass built exactly as the update's forward (forward.py: one construction): the update's micro-batches, its
    module mode, its precision, so at these weights it gives the update's log p bit for bit."""
    rows = min(cfg.micro_batch_size or len(rollout.texts), len(rollout.texts))
    if reuse:
        held = HeldForward(model, rollout, cfg.temperature, rows, value_head, cfg.precision,
                           from_hidden=cfg.stats_from_hidden, frozen=frozen)
        return held.stats(), held.values(), held
    stats, values = batch_forward(model, rollout, cfg.temperature, rows, value_head, cfg.precision,
                                  from_hidden=cfg.stats_from_hidden)
    return stats, values, None


@dataclass
class Behaviour:
    """The statistics pass of a step, under the behaviour policy, (B, R) each."""

    rewards: Tensor  # (B,) shaped
    stats: TokenStats
    old_values: Tensor | None
    ref_logp: Tensor | None
    held: HeldForward | None  # strict on-policy: the update's own forward, with its graph
    frozen: Tensor | None  # (B,) rows whose forward runs without a graph


@dataclass
class Decision:
    """The step's choices over the whole batch, as plain tensors: everything the update applies."""

    adv: Tensor  # (B,) or (B, R)
    returns: Tensor | None  # (B, R) GAE's
    old_logp: Tensor  # (B, R) the behaviour policy's
    old_values: Tensor | None  # (B, R)
    ref_logp: Tensor | None  # (B, R)
    keep: Tensor  # (B, R) bool: the method's filter (or the control's)
    loss_mask: Tensor  # (B, R) bool: valid & keep
    selected: Tensor | None = None  # (B, R) Clip-Cov / KL-Cov's tokens
    knobs: Knobs = field(default_factory=Knobs)
    entropy: float = 0.0  # the batch's mean entropy over every valid response token
    filter_metrics: dict = field(default_factory=dict)
    old_entropy: Tensor | None = None  # (B, R) the behaviour policy's per-token entropy, for losses that read it (ERC)


class Step:
    """A run's step: its objective, control and rules, fixed at set-up; `statistics`, `decide` and `update` are the
    three phases (module docstring). The trainer, invariants.recipe_step and the tests call the same methods."""

    def __init__(self, cfg: TrainConfig, model, optimizer, *, value_head=None, ref_model=None,
                 control: EntropyControl | None = None, update_gen: torch.Generator | None = None):
        self.cfg, self.model, self.optimizer = cfg, model, optimizer
        self.value_head, self.ref_model = value_head, ref_model
        self.method, self.estimator = METHODS.get(cfg.method), estimator_of(cfg)
        if isinstance(self.estimator, TokenLevel) and value_head is None:
            raise ValueError(f"advantage {cfg.advantage!r} needs a value head: pass value_head=ValueHead(hidden_size)")
        self.loss = POLICY_LOSSES.get(cfg.policy_loss)
        self.control = control or make_control(cfg)
        self.objective = objective_of(cfg, self.control, kl=ref_model is not None, value=value_head is not None)
        self.rules = StepRules.of(cfg, objective=self.objective, control=self.control,
                                  dropout_active=has_active_dropout(model))
        self.update_gen = update_gen if update_gen is not None else torch.Generator().manual_seed(cfg.seed + 1)

    def statistics(self, batch: Scored, step: int) -> Behaviour:
        """The behaviour policy's statistics over the whole batch: with reuse, the update's own forward held with its
        graph; otherwise one no-grad pass built exactly as the update's forward (forward.py: one construction)."""
        cfg, rollout = self.cfg, batch.rollout
        rewards = shaped_rewards(cfg, batch.rewards, rollout.response_mask)
        frozen = (zero_advantage_rows(self.estimator, rewards, batch.group_ids)
                  if self.rules.may_freeze and not self.rules.probing(step) else None)
        stats, values, held = behaviour_statistics(self.model, rollout, cfg, self.value_head, reuse=self.rules.reuse,
                                                   frozen=frozen)
        rows = self.rules.rows_per_pass(len(rollout.texts))
        ref_logp = (batch_forward(self.ref_model, rollout, cfg.temperature, rows, precision=cfg.precision,
                                  from_hidden=cfg.stats_from_hidden)[0].logp if self.ref_model is not None else None)
        return Behaviour(rewards, stats, values, ref_logp, held, frozen)

    def decide(self, batch: Scored, behaviour: Behaviour) -> Decision:
        """Advantages, the keep mask, Clip-Cov / KL-Cov's selection and the control's knobs, over the whole batch."""
        cfg, mask, stats = self.cfg, batch.rollout.response_mask, behaviour.stats
        old_logp = stats.logp
        adv, returns = compute_advantages(cfg, self.estimator, behaviour.rewards, batch.group_ids, mask, old_logp,
                                          behaviour.old_values)
        entropy = masked_mean(stats.entropy, mask)
        keep, filter_metrics = self.control.choose_tokens(self.method, stats, adv, mask, entropy)
        loss_mask = mask & keep
        knobs = self.control.knobs(entropy, old_logp, loss_mask)
        selected = self.loss.select(adv, old_logp, loss_mask, cfg, self.update_gen) if self.loss.select else None
        return Decision(adv, returns, old_logp, behaviour.old_values, behaviour.ref_logp, keep, loss_mask, selected,
                        knobs, entropy, filter_metrics, stats.entropy if self.loss.entropy else None)

    def probe(self, rollout: Rollout, behaviour: Behaviour, step: int) -> EntropyProbe | None:
        """On probe steps, d(mean H)/d(theta) before the update (forward.EntropyProbe)."""
        if not self.rules.probing(step):
            return None
        return EntropyProbe(self.model, rollout, self.cfg.temperature, self.rules.rows_per_pass(len(rollout.texts)),
                            self.cfg.precision, held=behaviour.held, from_hidden=self.cfg.stats_from_hidden)

    def diagnose(self, step: int, batch: Scored, behaviour: Behaviour, decision: Decision, updated: dict,
                 probe: EntropyProbe | None) -> dict:
        """The step's metrics line (diagnostics.py) without timings; the control learns from it."""
        mask, cfg = batch.rollout.response_mask, self.cfg
        metrics = step_metrics(step, behaviour.rewards, batch.correct, decision.adv, behaviour.stats, mask,
                               decision.keep, batch.rollout, cfg, self.optimizer)
        metrics.update(updated)
        metrics.update(batch.info)
        # responses whose forward ran without a graph (advantage 0: their gradient is exactly 0)
        frozen = behaviour.frozen
        metrics["update/frac_rows_no_backward"] = float(frozen.float().mean()) if frozen is not None else 0.0
        metrics.update(self.control.metrics(decision.knobs, mask))
        metrics.update({f"filter/{k}": v for k, v in decision.filter_metrics.items()})
        metrics.update(after_update_metrics(self.model, batch.rollout, behaviour.stats, probe, cfg,
                                            self.rules.rows_per_pass(len(batch.rollout.texts))))
        self.control.observe(metrics)
        return metrics

    def update(self, rollout: Rollout, decision: Decision, *, held: HeldForward | None = None, observe=None,
               on_first_step: Callable[[], None] | None = None) -> dict:
        return apply_update(self.model, self.optimizer, self.objective, rollout, decision, self.cfg, self.update_gen,
                            value_head=self.value_head, held=held, observe=observe, on_first_step=on_first_step)


def apply_update(model, optimizer, objective: Objective, rollout: Rollout, decision: Decision, cfg: TrainConfig,
                 gen: torch.Generator, *, value_head=None, held: HeldForward | None = None, observe=None,
                 on_first_step: Callable[[], None] | None = None) -> dict:
    """ppo_epochs x mini_batches optimizer steps (per Lopti phase) on the objective; gradient accumulation over
    micro-batches with the mini-batch's counts. `held` (strict on-policy) supplies the micro-batches' forward
    already computed. `observe(rows, stats, old_logp)`, if given, sees each micro-batch's forward and the old log p its
    loss used (invariants.py checks the update against the statistics pass with it); `on_first_step()` runs just
    before the first optimizer step changes the weights (the trainer holds stop signals from there).

    Returns, averaged over the optimizer steps, loss/total (the objective), loss/<term> (each term's value without
    its coefficient: loss/policy, loss/kl, loss/value, loss/entropy_bonus, loss/entropic) and the terms' metrics
    (loss/clipfrac, loss/ppo_kl, ...: means over their tokens); the last grad norm; and Corollary 4.1's prediction
    (eq. 28) summed over the optimizer steps, each with its true ratios and the current policy's S_c."""
    device = next(model.parameters()).device
    adv, old_logp, loss_mask = decision.adv, decision.old_logp, decision.loss_mask
    n_rows = loss_mask.shape[0]
    model.train()
    sums: dict[str, float] = {}
    steps: list[dict[str, float]] = []  # per optimizer step: the objective, its terms and their metrics
    grad_norms = []
    ratio = torch.ones_like(old_logp)
    s_centered = torch.zeros_like(old_logp)  # S_c under the policy of the current optimizer step
    predicted_off = 0.0
    n_total = loss_mask.sum().clamp_min(1)
    spec = POLICY_LOSSES.get(cfg.policy_loss)
    if spec.entropy and decision.old_entropy is None:
        raise ValueError(f"policy loss {cfg.policy_loss!r} reads the behaviour policy's per-token entropies: give the "
                         "Decision its old_entropy (Step.decide does)")
    valid = rollout.response_mask
    first_step = True  # until the first optimizer.step(), the weights are the behaviour policy's
    phases = [loss_mask]
    if cfg.lopti_eta is not None:  # Lopti: low-probability tokens first, then the rest
        low = old_logp.exp() < cfg.lopti_eta
        phases = [loss_mask & low, loss_mask & ~low]
    high_all = decision.knobs.high
    for phase_mask, _epoch in ((pm, e) for pm in phases for e in range(cfg.ppo_epochs)):
        order = torch.randperm(n_rows, generator=gen) if cfg.mini_batches > 1 else torch.arange(n_rows)
        sets = {"loss": phase_mask, "valid": valid}
        if high_all is not None:  # EntroPIC's T_hi within the phase's loss tokens
            sets["high"] = high_all & phase_mask
        for rows in order.chunk(cfg.mini_batches):
            mb_mask = phase_mask[rows]
            counts = objective.counts({k: v[rows] for k, v in sets.items()}, valid[rows], device)
            optimizer.zero_grad(set_to_none=True)
            step_sums: dict[str, float] = {}  # this optimizer step's objective and terms
            step_means: dict[str, tuple[float, float]] = {}  # its metrics: (sum of mean x tokens, tokens)
            for part in rows.split(cfg.micro_batch_size or len(rows)):
                if held is not None:
                    stats, values = held.take(part)
                else:
                    stats, values = policy_forward(model, rollout.select(part), cfg.temperature, value_head,
                                                   cfg.precision, from_hidden=cfg.stats_from_hidden)
                # the first optimizer step runs at the weights that produced old_logp: its own forward is the
                # behaviour policy's, so its ratio is exactly 1 whatever the precision (departure 2)
                old = stats.logp.detach() if first_step else old_logp[part].to(device)
                on = lambda t: None if t is None else t[part].to(device)  # noqa: E731
                old_v = None if values is None else (values.detach() if first_step else on(decision.old_values))
                old_h = None
                if decision.old_entropy is not None:  # ERC: the behaviour policy's entropy, exactly on the first step
                    old_h = stats.entropy.detach() if first_step else on(decision.old_entropy)
                mb = Micro(stats, values, old, adv[part].to(device), {k: v[part].to(device) for k, v in sets.items()},
                           old_values=old_v, returns=on(decision.returns), ref_logp=on(decision.ref_logp),
                           selected=on(decision.selected), entropy_coef=decision.knobs.entropy_coef,
                           alpha=decision.knobs.alpha, old_entropy=old_h)
                loss, terms, pm = objective(mb, counts)
                if observe is not None:
                    observe(part, stats, old)
                if loss.requires_grad or held is None or held.frozen is None:  # a micro-batch of frozen rows only
                    loss.backward()                                            # (advantage 0) has no graph
                m = mb.masks["loss"]
                ratio[part] = spec.factor(stats.logp.detach(), old, m, cfg, advantages=mb.adv,
                                          entropy=stats.entropy.detach(), old_entropy=old_h).cpu()
                s_centered[part] = stats.s_centered.cpu()
                # terms: each micro-batch's value is its share of the mini-batch's (global counts), so they add up;
                # metrics: means over the micro-batch's tokens, weighted by their count
                step_sums["total"] = step_sums.get("total", 0.0) + float(loss.detach())
                for k, v in terms.items():
                    step_sums[k] = step_sums.get(k, 0.0) + float(v)
                for k, (v, n) in pm.items():
                    num, den = step_means.get(k, (0.0, 0.0))
                    step_means[k] = (num + float(v) * n, den + n)
            # Corollary 4.1, eq. 28: this optimizer step's share of the batch, at the policy it is taken from
            n_tokens, n_seqs = counts["loss"]
            share = float(mb_mask.sum()) / float(n_total)
            step = step_sizes(mb_mask, spec.aggregation(cfg), lr=cfg.lr, num_tokens=float(n_tokens), num_seqs=float(n_seqs),
                              norm=cfg.max_new_tokens)
            predicted_off += share * float(corollary4_entropy_change(adv[rows], s_centered[rows], mb_mask,
                                                                     lr=cfg.lr, ratio=ratio[rows], step=step))
            params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
            norm = torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip if cfg.grad_clip > 0 else math.inf)
            grad_norms.append(float(norm))
            check_finite(loss=step_sums["total"], gradient_norm=grad_norms[-1])  # else no optimizer step: NonFinite
            if first_step and on_first_step is not None:
                on_first_step()
            optimizer.step()
            first_step = False
            steps.append({**step_sums, **{k: num / den for k, (num, den) in step_means.items() if den > 0}})
    # loss/*: the mean over the update's optimizer steps of each step's value, which micro-batching does not change
    for k in dict.fromkeys(k for st in steps for k in st):
        sums[f"loss/{k}"] = sum(st.get(k, 0.0) for st in steps) / len(steps)
    sums["grad_norm"] = grad_norms[-1] if grad_norms else 0.0
    sums["entropy_change/predicted_offpolicy"] = predicted_off
    return sums


def update_policy(model, optimizer, rollout: Rollout, adv, old_logp, ref_logp, loss_mask, cfg: TrainConfig,
                  gen: torch.Generator, *, entropy_coef: float = 0.0, selected: Tensor | None = None,
                  critic: tuple | None = None, held: HeldForward | None = None, observe=None,
                  entropic: tuple[float, Tensor] | None = None) -> dict:
    """apply_update for a decision given piece by piece (the interface tests and benchmarks use): the objective
    has the terms the arguments imply (KL with ref_logp, value with a critic (value_head, old_values, returns), the
    bonus with entropy_coef, EntroPIC with entropic = (alpha, T_hi (B, R)))."""
    value_head, old_values, returns = critic or (None, None, None)
    objective = Objective.of(cfg, kl=ref_logp is not None, value=value_head is not None,
                             entropy_bonus=entropy_coef != 0, entropic=entropic is not None)
    knobs = Knobs(entropy_coef, *(entropic or (0.0, None)))
    decision = Decision(adv, returns, old_logp, old_values, ref_logp, loss_mask, loss_mask, selected, knobs)
    return apply_update(model, optimizer, objective, rollout, decision, cfg, gen, value_head=value_head, held=held,
                        observe=observe)
