"""One training step over a scored batch: statistics, a decision over the whole batch, then the update.

    statistics  the behaviour policy's log p, H, S*, E_p[S] (and the critic's values) of every response token, (B, R)
    decide      over the whole batch, into plain tensors (`Decision`): shaped rewards -> advantages, the method's
                keep mask (or the entropy control's), Clip-Cov / KL-Cov's token selection, the control's knobs
    update      the optimizer steps of rules.StepRules.schedule on the objective (objective.py), gradient
                accumulation over micro-batches with the mini-batch's own counts, so splitting changes nothing

The update sees only the Decision's tensors, never the filter, so no filter can run per micro-batch. The rules that
shape a step (strict on-policy, the reuse of the update's forward, rows per pass, the optimizer steps, the probe's
cadence, which rows may run without a graph) are rules.StepRules, which the step, forward.py, plan.py and
invariants.py read.

Departures, numbered:
1. Old log-probs are recomputed by the trainer's forward pass (as verl does), not taken from generation.
2. Exactly on-policy where the weights are the behaviour policy's (as TRL does with num_iterations 1): the first
   optimizer step of each update takes old log p (and the critic's old values) from its own forward, detached, so
   its ratio is exactly 1 in any precision; later steps use the statistics pass's old log p, which the same
   construction computes (forward.py: one construction), so they differ only through the weights' change.
3. A method's token weights (STARE's omega, methods.Method.weigh) multiply each token's advantage, where the authors
   multiply each token's clipped surrogate: the same loss and gradient for the clipped surrogate (with dual clip) and
   a weight > 0, since max(-wA r, -wA clip(r)) = w max(-A r, -A clip(r)) and min(., -wA c) = w min(., -A c); the
   advantages become per token (B, R), so frac_zero_advantage counts tokens, and the step's predicted entropy
   change steps each token by its weighted advantage, as the loss does.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from ..config import TrainConfig
from ..core.advantages import (
    ADVANTAGES,
    TokenLevel,
    advantage_reweight,
    broadcast_advantages,
    outcome_token_rewards,
    overlong_penalty,
    rank_penalty,
)
from ..core.control import EntropyControl, Knobs, make_control
from ..core.dynamics import TokenStats, corollary4_entropy_change
from ..core.losses import step_sizes
from ..core.methods import METHODS, POLICY_LOSSES, PolicyLoss
from ..core.objective import Micro
from ..rollout import Rollout
from ..run.stops import check_finite
from .diagnostics import after_update_metrics, float_mean, reweight_metrics, step_metrics
from .dropout import has_active_dropout
from .forward import EntropyProbe, HeldForward, batch_forward, policy_forward
from .rules import StepRules, objective_of

if TYPE_CHECKING:
    from .problems import Scored

MIN_FROZEN_SHARE = 0.2  # below it the frozen rows' own passes cost more than their backward saves (demo policy:
#                        12% of rows frozen 1.01x the time of none, 25% 0.95x)


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
    return rewards + overlong_penalty(
        mask.sum(-1),
        max_len=cfg.max_new_tokens,
        buffer=round(cfg.overlong_buffer_frac * cfg.max_new_tokens),
        factor=cfg.overlong_penalty_factor,
    )


def compute_advantages(
    cfg: TrainConfig, estimator, rewards, group_ids, mask, old_logp, old_values
) -> tuple[Tensor, Tensor | None]:
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


def behaviour_statistics(
    model,
    rollout: Rollout,
    cfg: TrainConfig,
    value_head=None,
    *,
    reuse: bool,
    frozen: Tensor | None = None,
    rules: StepRules | None = None,
) -> tuple[TokenStats, Tensor | None, HeldForward | None]:
    """(stats, old values, held) of the behaviour policy, (B, R) each, over the whole batch. Strict on-policy with
    reuse: the update's own forward, kept with its graph until the filter has run (`held`). Otherwise one no-grad
    pass built exactly as the update's forward (forward.py: one construction): the update's micro-batches, its
    module mode, its precision, so at these weights it gives the update's log p bit for bit."""
    rows = (rules or StepRules.of(cfg)).rows_per_pass(len(rollout.texts))
    if reuse:
        held = HeldForward(
            model,
            rollout,
            cfg.temperature,
            rows,
            value_head,
            cfg.precision,
            from_hidden=cfg.stats_from_hidden,
            frozen=frozen,
            top=cfg.top_entropy(),
        )
        return held.stats(), held.values(), held
    stats, values = batch_forward(
        model, rollout, cfg.temperature, rows, value_head, cfg.precision, from_hidden=cfg.stats_from_hidden
    )
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
    step: int = 0  # the run's step, 0-based (a method's advantage rule reads it: Entrocraft's annealed band)


@dataclass
class Decision:
    """The step's choices over the whole batch, as plain tensors: everything the update applies."""

    adv: Tensor  # (B,) or (B, R)
    old_logp: Tensor  # (B, R) the behaviour policy's
    keep: Tensor  # (B, R) bool: the method's filter (or the control's)
    loss_mask: Tensor  # (B, R) bool: valid & keep
    returns: Tensor | None = None  # (B, R) GAE's
    old_values: Tensor | None = None  # (B, R)
    ref_logp: Tensor | None = None  # (B, R)
    selected: Tensor | None = None  # (B, R) Clip-Cov / KL-Cov's tokens
    knobs: Knobs = field(default_factory=Knobs)
    entropy: float = 0.0  # the batch's mean entropy over every valid response token
    filter_metrics: dict = field(default_factory=dict)
    old_entropy: Tensor | None = None  # (B, R) the behaviour policy's per-token entropy, for losses that read it (ERC)
    weights: Tensor | None = None  # (B, R) the method's token weights (STARE), already in adv; None: none


class Step:
    """A run's step: its objective, control and rules, fixed at set-up; `statistics`, `decide` and `update` are the
    three phases (module docstring). The trainer, invariants.recipe_step and the tests call the same methods. `rules`:
    the run's StepRules, which the trainer builds once per run for this model and control; None builds them here from
    cfg, the objective, the control and the model's dropout."""

    def __init__(
        self,
        cfg: TrainConfig,
        model,
        optimizer,
        *,
        value_head=None,
        ref_model=None,
        control: EntropyControl | None = None,
        rules: StepRules | None = None,
        update_gen: torch.Generator | None = None,
    ):
        self.cfg, self.model, self.optimizer = cfg, model, optimizer
        self.value_head, self.ref_model = value_head, ref_model
        self.method, self.estimator = METHODS.get(cfg.method), estimator_of(cfg)
        self.control = control or make_control(cfg)
        self.objective = objective_of(cfg, self.control, kl=ref_model is not None, value=value_head is not None)
        if rules is None:
            rules = StepRules.of(
                cfg, objective=self.objective, control=self.control, dropout_active=has_active_dropout(model)
            )
        self.rules = rules
        if self.rules.critic and value_head is None:
            raise ValueError(f"advantage {cfg.advantage!r} needs a value head: pass value_head=ValueHead(hidden_size)")
        self.loss = POLICY_LOSSES.get(cfg.policy_loss)
        self.update_gen = update_gen if update_gen is not None else torch.Generator().manual_seed(cfg.seed + 1)

    def statistics(self, batch: Scored, step: int) -> Behaviour:
        """The behaviour policy's statistics over the whole batch: with reuse, the update's own forward held with its
        graph; otherwise one no-grad pass built exactly as the update's forward (forward.py: one construction)."""
        cfg, rollout = self.cfg, batch.rollout
        rewards = shaped_rewards(cfg, batch.rewards, rollout.response_mask)
        frozen = (
            zero_advantage_rows(self.estimator, rewards, batch.group_ids)
            if self.rules.may_freeze and not self.rules.probing(step) and not self._rewrites_advantages()
            else None
        )
        stats, values, held = behaviour_statistics(
            self.model, rollout, cfg, self.value_head, reuse=self.rules.reuse, frozen=frozen, rules=self.rules
        )
        rows = self.rules.rows_per_pass(len(rollout.texts))
        ref_logp = (
            batch_forward(
                self.ref_model,
                rollout,
                cfg.temperature,
                rows,
                precision=cfg.precision,
                from_hidden=cfg.stats_from_hidden,
            )[0].logp
            if self.ref_model is not None
            else None
        )
        return Behaviour(rewards, stats, values, ref_logp, held, frozen, step)

    def decide(self, batch: Scored, behaviour: Behaviour) -> Decision:
        """Advantages, the keep mask, Clip-Cov / KL-Cov's selection and the control's knobs, over the whole batch."""
        cfg, mask, stats = self.cfg, batch.rollout.response_mask, behaviour.stats
        old_logp = stats.logp
        adv, returns = compute_advantages(
            cfg, self.estimator, behaviour.rewards, batch.group_ids, mask, old_logp, behaviour.old_values
        )
        entropy = float_mean(stats.entropy, mask)
        adv, rows, rollout_metrics = self.method.rollouts(  # GRPODropout: whole rollouts deleted, the rest recentred
            behaviour.rewards,
            adv,
            batch.group_ids,
            old_logp,
            mask,
            estimator=self.estimator,
            generator=self.update_gen,
            **cfg.method_overrides(),
        )
        valid = mask if rows is None else mask & rows[:, None]
        adv, rule_metrics = self.method.advantages(  # Entrocraft's rule (the estimator's rows frozen: none)
            behaviour.rewards,
            adv,
            entropy=entropy,
            step=behaviour.step + 1,
            total_steps=cfg.steps,
            **cfg.method_overrides(),
        )
        keep, filter_metrics = self.control.choose_tokens(self.method, stats, adv, valid, entropy)
        filter_metrics = {**filter_metrics, **rule_metrics, **rollout_metrics}
        # STARE's weights ranked over the tokens a composed filter keeps (stare+clip_b: Clip_B's mask, then weights)
        weights, weight_metrics = self.method.weights(stats, adv, valid & keep, **cfg.method_overrides())
        if weights is not None:  # departure 3: the weight on each token's advantage
            adv = broadcast_advantages(adv, mask) * weights.to(adv.dtype)
            filter_metrics = {**filter_metrics, **weight_metrics}
        loss_mask = mask & keep
        knobs = self.control.knobs(entropy, old_logp, loss_mask)
        selected = self.loss.select(adv, old_logp, loss_mask, cfg, self.update_gen) if self.loss.select else None
        return Decision(
            adv,
            old_logp,
            keep,
            loss_mask,
            returns,
            behaviour.old_values,
            behaviour.ref_logp,
            selected,
            knobs,
            entropy,
            filter_metrics,
            stats.entropy if self.loss.entropy else None,
            weights,
        )

    def _rewrites_advantages(self) -> bool:
        """Whether the method's rules change advantages after the estimator (Entrocraft, GRPODropout): then no row
        may run without a graph on the estimator's zeros."""
        return self.method.advantage_rule is not None or self.method.rollout_rule is not None

    def probe(self, rollout: Rollout, behaviour: Behaviour, step: int) -> EntropyProbe | None:
        """On probe steps, d(mean H)/d(theta) before the update (forward.EntropyProbe)."""
        if not self.rules.probing(step):
            return None
        return EntropyProbe(
            self.model,
            rollout,
            self.cfg.temperature,
            self.rules.rows_per_pass(len(rollout.texts)),
            self.cfg.precision,
            held=behaviour.held,
            from_hidden=self.cfg.stats_from_hidden,
        )

    def diagnose(
        self,
        step: int,
        batch: Scored,
        behaviour: Behaviour,
        decision: Decision,
        updated: dict,
        probe: EntropyProbe | None,
    ) -> dict:
        """The step's metrics line (diagnostics.py) without timings; the control learns from it."""
        mask, cfg = batch.rollout.response_mask, self.cfg
        metrics = step_metrics(
            step,
            behaviour.rewards,
            batch.correct,
            decision.adv,
            behaviour.stats,
            mask,
            decision.keep,
            batch.rollout,
            cfg,
            self.optimizer,
        )
        if decision.weights is not None:  # STARE: the share of each region it reweighted
            metrics.update(reweight_metrics(behaviour.stats.s_star, decision.adv, mask, decision.weights))
        metrics.update(updated)
        metrics.update(batch.info)
        # responses whose forward ran without a graph (advantage 0: their gradient is exactly 0)
        frozen = behaviour.frozen
        metrics["update/frac_rows_no_backward"] = float(frozen.float().mean()) if frozen is not None else 0.0
        metrics.update(self.control.metrics(decision.knobs, mask))
        metrics.update({f"filter/{k}": v for k, v in decision.filter_metrics.items()})
        metrics.update(
            after_update_metrics(
                self.model,
                batch.rollout,
                behaviour.stats,
                probe,
                cfg,
                self.rules.rows_per_pass(len(batch.rollout.texts)),
            )
        )
        self.control.observe(metrics)
        return metrics

    def update(
        self,
        rollout: Rollout,
        decision: Decision,
        *,
        held: HeldForward | None = None,
        observe: Callable[[Tensor, TokenStats, Tensor], None] | None = None,
        on_first_step: Callable[[], None] | None = None,
    ) -> dict:
        """The optimizer steps of rules.schedule on the objective; gradient accumulation over each mini-batch's
        micro-batches (StepRules.passes) with the mini-batch's counts. `held` (strict on-policy) supplies the forward
        already computed. `observe(rows, stats, old_logp)` sees each micro-batch's forward and the old log p its loss
        used (invariants.py); `on_first_step()` runs just before the first optimizer step changes the weights (the
        trainer holds stop signals from there). Returns UpdateLog.metrics()."""
        rules, valid = self.rules, rollout.response_mask
        device = next(self.model.parameters()).device
        phases = self._phase_sets(decision, valid)
        log = UpdateLog(decision, self.cfg, self.loss)
        self.model.train()
        for phase, rows in rules.schedule(len(valid), self.update_gen):
            sets = phases[phase]
            counts = self.objective.counts({k: v[rows] for k, v in sets.items()}, valid[rows], device)
            self.optimizer.zero_grad(set_to_none=True)
            for part in rules.passes(rows):
                stats, values = self._forward(rollout, part, held)
                mb = micro_batch(decision, part, sets, stats, values, first=log.first_step, device=device)
                loss, terms, means = self.objective(mb, counts)
                if observe is not None:
                    observe(part, stats, mb.old_logp)
                if loss.requires_grad or held is None or held.frozen is None:  # a micro-batch of frozen rows only
                    loss.backward()  # (advantage 0) has no graph
                log.micro_batch(part, mb, loss, terms, means)
            self._optimizer_step(log, rows, sets["loss"][rows], counts, on_first_step)
        return log.metrics()

    def _phase_sets(self, decision: Decision, valid: Tensor) -> list[dict[str, Tensor]]:
        """The token sets (token_sets) of each phase of rules.phase_masks; a Decision without the behaviour policy's
        per-token entropies is refused when the policy loss reads them."""
        phases = [
            token_sets(m, valid, decision.knobs.high)
            for m in self.rules.phase_masks(decision.loss_mask, decision.old_logp)
        ]
        if self.loss.entropy and decision.old_entropy is None:
            raise ValueError(
                f"policy loss {self.cfg.policy_loss!r} reads the behaviour policy's per-token entropies: give "
                "the Decision its old_entropy (Step.decide does)"
            )
        return phases

    def _forward(self, rollout: Rollout, part: Tensor, held: HeldForward | None) -> tuple[TokenStats, Tensor | None]:
        """Rows `part`'s statistics and values with their graph: the held forward's (strict on-policy), else one
        forward built as the statistics pass's (forward.py: one construction)."""
        if held is not None:
            return held.take(part)
        cfg = self.cfg
        return policy_forward(
            self.model,
            rollout.select(part),
            cfg.temperature,
            self.value_head,
            cfg.precision,
            from_hidden=cfg.stats_from_hidden,
            top=cfg.top_entropy(),
        )

    def _optimizer_step(
        self, log: UpdateLog, rows: Tensor, loss_mask: Tensor, counts: dict, on_first_step: Callable[[], None] | None
    ) -> None:
        """One optimizer step on the accumulated gradient, clipped: none when the loss or the gradient's norm is not
        finite (stops.NonFinite); `on_first_step()` just before the first one changes the weights."""
        norm = clip_gradients(self.optimizer, self.cfg.grad_clip)
        check_finite(loss=log.sums["total"], gradient_norm=float(norm))  # else no optimizer step: NonFinite
        if log.first_step and on_first_step is not None:
            on_first_step()
        self.optimizer.step()
        log.optimizer_step(rows, loss_mask, counts, norm)


def token_sets(loss: Tensor, valid: Tensor, high: Tensor | None) -> dict[str, Tensor]:
    """(B, R) bool masks of the objective's token sets (objective.TOKEN_SETS) in one phase: its loss tokens, every
    valid token, and EntroPIC's T_hi within the phase's loss tokens."""
    sets = {"loss": loss, "valid": valid}
    if high is not None:
        sets["high"] = high & loss
    return sets


def micro_batch(
    decision: Decision,
    part: Tensor,
    sets: dict[str, Tensor],
    stats: TokenStats,
    values: Tensor | None,
    *,
    first: bool,
    device: torch.device,
) -> Micro:
    """The objective's inputs for rows `part` on the device. The first optimizer step runs at the weights that
    produced old log p: its own forward is the behaviour policy's, so it takes old log p (and old values) from it,
    detached, and its ratio is exactly 1 whatever the precision (departure 2); so does the behaviour policy's
    per-token entropy, for a loss that reads it (ERC)."""

    def on(t: Tensor | None) -> Tensor | None:
        return None if t is None else t[part].to(device)

    old = stats.logp.detach() if first else decision.old_logp[part].to(device)
    old_v = None if values is None else (values.detach() if first else on(decision.old_values))
    old_h = None
    if decision.old_entropy is not None:
        old_h = stats.entropy.detach() if first else on(decision.old_entropy)
    return Micro(
        stats,
        values,
        old,
        decision.adv[part].to(device),
        {k: v[part].to(device) for k, v in sets.items()},
        old_values=old_v,
        returns=on(decision.returns),
        ref_logp=on(decision.ref_logp),
        selected=on(decision.selected),
        entropy_coef=decision.knobs.entropy_coef,
        alpha=decision.knobs.alpha,
        old_entropy=old_h,
    )


def clip_gradients(optimizer, max_norm: float) -> Tensor:
    """The gradient's norm over the optimizer's parameters, clipped to max_norm (0: not clipped)."""
    params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
    return torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm > 0 else math.inf)


class UpdateLog:
    """An update's bookkeeping. `metrics()`: averaged over the optimizer steps, loss/total (the objective),
    loss/<term> (each term's value without its coefficient: loss/policy, loss/kl, loss/value, loss/entropy_bonus,
    loss/entropic) and the terms' metrics (loss/clipfrac, loss/ppo_kl, ...: means over their tokens); the last grad
    norm; and Corollary 4.1's prediction (eq. 28) summed over the optimizer steps, each with its true ratios and the
    current policy's S_c."""

    def __init__(self, decision: Decision, cfg: TrainConfig, loss: PolicyLoss):
        self.cfg, self.loss, self.adv = cfg, loss, decision.adv  # loss: the run's policy loss (methods.POLICY_LOSSES)
        self.agg = loss.aggregation(cfg)  # the loss's own (SAPO, GMPO), else cfg.loss_agg
        self.ratio = torch.ones_like(decision.old_logp)
        self.s_centered = torch.zeros_like(decision.old_logp)  # S_c under the policy of the current optimizer step
        self.n_total = decision.loss_mask.sum().clamp_min(1)
        self.first_step = True  # until the first optimizer.step(), the weights are the behaviour policy's
        self.steps: list[dict[str, float]] = []  # per optimizer step: the objective, its terms and their metrics
        self.sums: dict[str, float] = {}  # the current optimizer step's objective and terms
        self.means: dict[str, tuple[float, float]] = {}  # its metrics: (sum of mean x tokens, tokens)
        self.grad_norm, self.predicted_off = 0.0, 0.0

    def micro_batch(self, part: Tensor, mb: Micro, loss: Tensor, terms: dict, means: dict) -> None:
        """Terms: each micro-batch's value is its share of the mini-batch's (global counts), so they add up;
        metrics: means over the micro-batch's tokens, weighted by their count."""
        self.ratio[part] = self.loss.factor(
            mb.stats.logp.detach(),
            mb.old_logp,
            mb.masks["loss"],
            self.cfg,
            advantages=mb.adv,
            entropy=mb.stats.entropy.detach(),
            old_entropy=mb.old_entropy,
        ).cpu()
        self.s_centered[part] = mb.stats.s_centered.cpu()
        self.sums["total"] = self.sums.get("total", 0.0) + float(loss.detach())
        for k, v in terms.items():
            self.sums[k] = self.sums.get(k, 0.0) + float(v)
        for k, (v, n) in means.items():
            num, den = self.means.get(k, (0.0, 0.0))
            self.means[k] = (num + float(v) * n, den + n)

    def optimizer_step(self, rows: Tensor, mb_mask: Tensor, counts: dict, norm: Tensor) -> None:
        """Corollary 4.1, eq. 28: this optimizer step's share of the batch, at the policy it is taken from."""
        cfg, (n_tokens, n_seqs) = self.cfg, counts["loss"]
        share = float(mb_mask.sum()) / float(self.n_total)
        step = step_sizes(
            mb_mask, self.agg, lr=cfg.lr, num_tokens=float(n_tokens), num_seqs=float(n_seqs), norm=cfg.max_new_tokens
        )
        self.predicted_off += share * float(
            corollary4_entropy_change(
                self.adv[rows], self.s_centered[rows], mb_mask, lr=cfg.lr, ratio=self.ratio[rows], step=step
            )
        )
        self.grad_norm, self.first_step = float(norm), False
        self.steps.append({**self.sums, **{k: num / den for k, (num, den) in self.means.items() if den > 0}})
        self.sums, self.means = {}, {}

    def metrics(self) -> dict:
        """loss/*: the mean over the update's optimizer steps of each step's value, which micro-batching does not
        change; grad_norm: the last step's; entropy_change/predicted_offpolicy: eq. 28 summed."""
        out = {
            f"loss/{k}": sum(st.get(k, 0.0) for st in self.steps) / len(self.steps)
            for k in dict.fromkeys(k for st in self.steps for k in st)
        }
        return {**out, "grad_norm": self.grad_norm, "entropy_change/predicted_offpolicy": self.predicted_off}
