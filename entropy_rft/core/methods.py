"""Methods chosen by name (`--method`): each is a token filter from masks.py (or none), the TokenStats field it
reads, the filter's default options, and the TrainConfig defaults the method sets (loss, clip range,
sampling, reward shaping). Settings given explicitly in a recipe or on the command line win over the method's.
Also here: POLICY_LOSSES, the registry of policy losses with the config fields each one reads.

Departures of the baselines from their reference code, numbered:
1. DAPO's overlong buffer is a fraction of max_new_tokens (DAPO: L_cache 4096 of L_max 20480 = 0.2), and its
   dynamic sampling stops after max_sampling_rounds and trains on the groups it has (verl raises instead).
2. Rewarding the unlikely ranks a group's responses by mean token log-probability and scales positive rewards
   only (advantages.rank_penalty); the original rewards are binary.
3. Forking tokens: "forking" divides by the selected tokens (the authors' code), "forking_all" by all valid
   tokens (TRL); the selection is exact top-k (masks.py, departure 6).
4. The fixed entropy bonus uses 0.005, a value that moves the tiny countdown policy; LLM recipes use ~1e-3.
5. PPO's critic is a value head on the policy (shared trunk, its own learning rate) rather than a separate
   critic model, and GAE uses verl's defaults gamma = lam = 1.
6. RSI-S follows the only public code, a third-party port (smellslikeml/open-instruct@36813c9, rsi_token_selection.py),
   whose band defaults to 0 / 0 (every token kept); the paper's band is not published with code, so method rsi has
   no default and asks for rsi_lower_bound and/or rsi_upper_bound. The port's 0 for "that side off" is None here.

Registered here:
- grpo: no filter.
- clip_b: Algorithm 1, reads S* (defaults: mu 2.5, negative samples, lower tail; the authors' code).
- clip_v: Algorithm 2, reads S_c (defaults: mu 8.5, max_frac 1e-4; the authors' code).
  Both (and ppo_clip_b / ppo_clip_v) take entropy_gate: STARE's target gate (masks.entropy_gate), off by default.
- entrocraft: Entrocraft (arXiv 2604.26326; lblaoke/entrocraft), an advantage rule (advantages.entrocraft_rule):
  RAFT++ above an entropy band annealed from (0.6, 0.7) to (0.4, 0.5), NSR below it, GRPO inside (advantages.py,
  departure 4).
- rsi: RSI-S (arXiv 2606.31575), the band filter of smellslikeml/open-instruct's port (masks.rsi_band); the band
  has no published default, so rsi_lower_bound and/or rsi_upper_bound must be given.
- stare: STARE (arXiv 2606.19236; hp-luo/STARE), token weights rather than a filter (masks.stare_weights): W 1.1 on
  the top 10% surprisal tokens of A > 0 (variant O1; C2 also M 0.9 on those of A < 0) while the batch's mean
  entropy is below entropy_gate 0.3; the step multiplies each token's advantage by its weight.
- s_sign:{retain|mask}:{pos|neg}_s:{pos|neg}_samples, eight filters for Figure 1, e.g.
  "s_sign:retain:pos_s:pos_samples" keeps only tokens with S* > 0 in positive samples.
- baselines the paper compares against (Tables 3-4, Section 4.2), each with its published defaults:
  dapo, dr_grpo, gspo, clip_cov, kl_cov, unlikely (and unlikely_2ep), forking (and forking_all),
  entropy_bonus, ar, lopti. docs/paper_index.md maps each to its paper.
- the losses engines ship (verl 0.9.1's names, its ActorConfig defaults): cispo, sapo, dppo_tv, dppo_kl, geo_mean,
  erc (Kwai-Klear/ERC), each a method that sets policy_loss; and qae (advantage "qae"). A filter composes with any
  of them: `--method clip_b --set policy_loss=cispo`.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import cast

from torch import Tensor

from . import advantages as advantages_mod
from . import losses, masks, rollouts
from .losses import AggMode, Aggregation
from .registry import Registry


@dataclass(frozen=True)
class Method:
    name: str
    filter: Callable | None = None  # masks.* function: (score, advantages, mask, **options) -> (keep, metrics)
    score: str = "s_star"  # TokenStats field passed as the score ("stats": the TokenStats itself)
    options: dict = field(default_factory=dict)  # default keyword options of the filter
    summary: str = ""
    config: dict = field(default_factory=dict)  # TrainConfig defaults this method sets
    gated: bool = False  # takes `entropy_gate`: the filter acts only while the batch's mean entropy is below it
    # masks.* token weights: (logp, advantages, mask, entropy, **options) -> (weights (B, T), metrics); the step
    # multiplies each token's advantage by its weight (step.py, departure 3)
    weigh: Callable | None = None
    # advantages.* rule on the estimator's advantages: (scores, advantages, *, entropy, step, total_steps, **options)
    # -> (advantages, metrics), with the batch's mean entropy and the 1-based step of the run's total (Entrocraft)
    advantage_rule: Callable | None = None
    # rollouts.* rule on whole rollouts: (scores, advantages (B,), group_ids, logp, mask, *, estimator, generator,
    # **options) -> (advantages (B,), keep (B,) bool, metrics); deleted rollouts leave the loss and its denominator
    rollout_rule: Callable | None = None
    # the entropy bonus is TRE's (dynamics.top_entropy: the renormalised top-K / top-p entropy, scaled), with the
    # options tre_top_k / tre_top_p; entropy_coef is its coefficient
    top_entropy: bool = False

    def option_names(self) -> list[str]:
        """The options this method takes: the keyword options of its filter, weights and rules (a composed method has
        several), entropy_gate where the filter is gated, tre_top_k / tre_top_p with TRE's bonus."""
        given_by_the_step = {"entropy", "step", "total_steps", "estimator", "generator"}  # inputs, not options
        names: list[str] = []
        for rule in (self.filter, self.weigh, self.advantage_rule, self.rollout_rule):
            if rule is None:
                continue
            params = inspect.signature(rule).parameters.values()
            names += [p.name for p in params if p.kind is p.KEYWORD_ONLY and p.name not in given_by_the_step]
        names += ["entropy_gate"] if self.gated and "entropy_gate" not in names else []
        return list(dict.fromkeys(names)) + (["tre_top_k", "tre_top_p"] if self.top_entropy else [])

    def rollouts(
        self, scores, advantages, group_ids, logp, mask, *, estimator, generator=None, **overrides
    ) -> tuple[Tensor, Tensor | None, dict]:
        """(advantages, keep (B,) bool or None, metrics): the method's rollout rule (GRPODropout) on the estimator's
        advantages, its options overridden as in `apply`; a method without one returns them unchanged and None."""
        if self.rollout_rule is None:
            return advantages, None, {}
        options = self._options(self.rollout_rule, overrides)
        return self.rollout_rule(
            scores, advantages, group_ids, logp, mask, estimator=estimator, generator=generator, **options
        )

    def _options(self, rule: Callable, overrides: dict) -> dict:
        """The method's default options that `rule` takes, overridden by the given ones it takes (None: the default;
        NO_CAP: None itself). A composed method's options are shared out this way among its filter, weights and
        rules."""
        accepted = set(inspect.signature(rule).parameters)
        given = {k: None if _is_no_cap(v) else v for k, v in overrides.items() if v is not None}
        return {k: v for k, v in {**self.options, **given}.items() if k in accepted}

    def advantages(self, scores, advantages, *, entropy, step, total_steps, **overrides) -> tuple[Tensor, dict]:
        """The method's advantage rule on the estimator's advantages (unchanged, with no metrics, for a method
        without one), its options overridden as in `apply`."""
        if self.advantage_rule is None:
            return advantages, {}
        options = self._options(self.advantage_rule, overrides)
        return self.advantage_rule(scores, advantages, entropy=entropy, step=step, total_steps=total_steps, **options)

    def weights(self, stats, advantages, mask, **overrides) -> tuple[Tensor | None, dict]:
        """(weights (B, T) or None, metrics): the method's token weights for a batch (None: it has none), its options
        overridden as in `apply` (NO_CAP passes None itself: entropy_gate=NO_CAP runs STARE ungated)."""
        if self.weigh is None:
            return None, {}
        return self.weigh(stats.logp, advantages, mask, stats.entropy, **self._options(self.weigh, overrides))

    def apply(self, stats, advantages, mask, **overrides):
        """(keep, metrics) for a batch; overrides replace the default options.

        An override of None means "the method's default" (TrainConfig's unset fields) and is ignored; to pass
        None itself to the filter, give NO_CAP: `apply(..., max_frac=NO_CAP)` runs Clip_V with max_frac=None,
        clipping every violator. Overrides the filter does not take are ignored. A gated method given
        entropy_gate runs its filter through masks.entropy_gate (STARE's gate) on stats.entropy over `mask`."""
        if self.filter is None:
            return mask.clone(), {}
        score = stats if self.score == "stats" else getattr(stats, self.score)  # "stats": a filter reading several
        keep, metrics = self.filter(score, advantages, mask, **self._options(self.filter, overrides))
        target = overrides.get("entropy_gate", self.options.get("entropy_gate"))
        if not self.gated or target is None or _is_no_cap(target):
            return keep, metrics
        gated, gate_metrics = masks.entropy_gate(keep, advantages, mask, stats.entropy, target=target)
        return gated, {**metrics, **gate_metrics}


# An option value that reaches the filter as None, where a plain None means "the method's default". Written as
# the string "none" so that YAML and Hydra configs (verl, TRL scripts) can say it: `max_frac: none`.
NO_CAP = "none"


def _is_no_cap(value) -> bool:
    return isinstance(value, str) and value == NO_CAP


METHODS: Registry[Method] = Registry("method")
METHODS.register("grpo", Method("grpo", summary="plain clipped policy gradient, no token filter"))
METHODS.register(
    "clip_b",
    Method(
        "clip_b", masks.clip_b, "s_star", {"mu": 2.5}, "Clip_B: drop batch-outlier S* tokens (Algorithm 1)", gated=True
    ),
)
METHODS.register(
    "clip_v",
    Method(
        "clip_v",
        masks.clip_v,
        "s_centered",
        {"mu": 8.5, "max_frac": 1e-4},
        "Clip_V: drop outlier S_c tokens (Algorithm 2)",
        gated=True,
    ),
)
for _action in ("retain", "mask"):
    for _sign in ("pos", "neg"):
        for _samples in ("pos", "neg"):
            _name = f"s_sign:{_action}:{_sign}_s:{_samples}_samples"
            METHODS.register(
                _name,
                Method(
                    _name,
                    masks.s_sign,
                    "s_star",
                    {
                        "action": _action,
                        "sign": "positive" if _sign == "pos" else "negative",
                        "samples": "positive" if _samples == "pos" else "negative",
                    },
                    f"Figure 1: {_action} tokens with S* {'>' if _sign == 'pos' else '<'} 0 in "
                    f"{'positive' if _samples == 'pos' else 'negative'} samples",
                ),
            )

METHODS.register(
    "dapo",
    Method(
        "dapo",
        summary="DAPO: clip-higher, token-level loss, dynamic sampling, overlong shaping",
        config={
            "eps_low": 0.2,
            "eps_high": 0.28,
            "loss_agg": "token-mean",
            "dynamic_sampling": True,
            "overlong_buffer_frac": 0.2,
        },
    ),
)
METHODS.register(
    "dr_grpo",
    Method(
        "dr_grpo",
        summary="Dr. GRPO: no std normalisation, constant normaliser",
        config={"advantage": "dr_grpo", "loss_agg": "seq-mean-token-sum-norm"},
    ),
)
METHODS.register(
    "gspo",
    Method(
        "gspo",
        summary="GSPO: sequence-level ratio and clipping",
        config={"policy_loss": "gspo", "eps_low": 3e-4, "eps_high": 4e-4, "loss_agg": "seq-mean-token-mean"},
    ),
)
METHODS.register(
    "clip_cov",
    Method(
        "clip_cov",
        summary="Clip-Cov: detach a random subset of high-covariance tokens",
        config={"policy_loss": "clip_cov"},
    ),
)
METHODS.register(
    "kl_cov",
    Method("kl_cov", summary="KL-Cov: KL penalty on the top-covariance tokens", config={"policy_loss": "kl_cov"}),
)
METHODS.register(
    "unlikely",
    Method(
        "unlikely",
        summary="rewarding the unlikely: rank penalty on likely correct answers",
        config={"rank_penalty_beta": 0.25},
    ),
)
METHODS.register(
    "unlikely_2ep",
    Method(
        "unlikely_2ep",
        summary="rewarding the unlikely with a second update epoch",
        config={"rank_penalty_beta": 0.25, "ppo_epochs": 2},
    ),
)
METHODS.register(
    "forking",
    Method(
        "forking",
        masks.top_entropy,
        "entropy",
        {"frac": 0.2},
        "forking tokens: top 20% entropy, divided by the selected tokens (authors)",
        config={"denominator": "kept"},
    ),
)
METHODS.register(
    "forking_all",
    Method(
        "forking_all",
        masks.top_entropy,
        "entropy",
        {"frac": 0.2},
        "forking tokens: top 20% entropy, divided by all tokens (TRL)",
        config={"denominator": "all"},
    ),
)
METHODS.register(
    "entropy_bonus", Method("entropy_bonus", summary="fixed entropy bonus", config={"entropy_coef": 0.005})
)
METHODS.register(
    "ar", Method("ar", summary="advantage reweighting by pi_old (Yang et al. 2025)", config={"ar_alpha": 0.3})
)
METHODS.register(
    "ppo", Method("ppo", summary="PPO with GAE and a value head (paper Table 4)", config={"advantage": "gae"})
)
METHODS.register(
    "ppo_clip_b",
    Method(
        "ppo_clip_b",
        masks.clip_b,
        "s_star",
        {"mu": 2.5},
        "Clip_B on PPO, each token's GAE advantage as its direction (Table 4)",
        config={"advantage": "gae"},
        gated=True,
    ),
)
METHODS.register(
    "ppo_clip_v",
    Method(
        "ppo_clip_v",
        masks.clip_v,
        "s_centered",
        {"mu": 8.5, "max_frac": 1e-4},
        "Clip_V on PPO, each token's GAE advantage as its direction (Table 4)",
        config={"advantage": "gae"},
        gated=True,
    ),
)
for _loss, _summary in (
    ("cispo", "CISPO: clipped importance weight, stop-gradient, on every token's log p (verl)"),
    ("sapo", "SAPO: a smooth sigmoid gate in place of the hard clip (verl)"),
    ("dppo_tv", "DPPO-TV: no gradient where p moved past a bound in A's direction (verl)"),
    ("dppo_kl", "DPPO-KL: no gradient where the binary KL passed a bound in A's direction (verl)"),
    ("geo_mean", "GMPO: geometric mean of the clipped token ratios per sequence (verl geo_mean)"),
    ("erc", "ERC: no gradient where the entropy ratio H / H_old leaves (0.95, 1.05)"),
):
    METHODS.register(
        _loss,
        Method(
            _loss,
            summary=_summary,
            config={
                "policy_loss": _loss,
                **({"loss_agg": "seq-mean-token-mean"} if _loss in ("sapo", "geo_mean") else {}),
            },
        ),
    )
# the names these go by in their papers (suggested, never looked up: registry.py)
METHODS.alias("gmpo", "geo_mean")
METHODS.alias("dppo", "dppo_tv", "dppo_kl")
METHODS.register(
    "qae",
    Method(
        "qae",
        summary="QAE: the group's K-quantile (K 0.4) as the baseline instead of its mean",
        config={"advantage": "qae"},
    ),
)
METHODS.register(
    "entrocraft",
    Method(
        "entrocraft",
        score="entropy",
        options={"lower_range": (0.6, 0.4), "upper_range": (0.7, 0.5), "schedule": "linear"},
        summary="Entrocraft: RAFT++ above an annealed entropy band, NSR below it, GRPO inside (authors' code)",
        advantage_rule=advantages_mod.entrocraft_rule,
    ),
)
METHODS.register(
    "rsi",
    Method(
        "rsi",
        masks.rsi_band,
        "stats",
        {},
        "RSI-S: keep tokens whose -log p / H lies in [rsi_lower_bound, rsi_upper_bound] (no published default band)",
    ),
)
METHODS.register(
    "stare",
    Method(
        "stare",
        score="logp",
        options={"variant": "O1", "top_p_ratio": 0.1, "reweight_w": 1.1, "reweight_m": 0.9, "entropy_gate": 0.3},
        summary="STARE: weight W on each sign's top-10% surprisal tokens of A > 0 (C2: also M on A < 0), gated",
        weigh=masks.stare_weights,
    ),
)
METHODS.register(
    "grpo_dropout",
    Method(
        "grpo_dropout",
        options={"basis": "avg", "recenter": True},
        summary="GRPODropout: delete the rollouts whose push A (s - H) drives entropy down, recentre the rest",
        rollout_rule=rollouts.grpo_dropout,
    ),
)
METHODS.register(
    "tre_k",
    Method(
        "tre_k",
        summary="TRE-K: entropy bonus 0.001 on the renormalised top-2 logits, scaled by log V / log K (TRE-P: top_p)",
        config={"entropy_coef": 0.001},
        top_entropy=True,
    ),
)
# compositions (docs/concepts.md): Clip_B's filter with a rule that acts elsewhere in the step; Clip_B's mu, side and
# entropy_gate, and the mu controller (entropy_control mu), apply as with clip_b
METHODS.register(
    "stare+clip_b",
    Method(
        "stare+clip_b",
        options={"mu": 2.5, "variant": "O1", "top_p_ratio": 0.1, "reweight_w": 1.1, "reweight_m": 0.9},
        summary="Clip_B's mask, then STARE's weights ranked over the tokens it keeps (STARE's gate 0.3)",
        weigh=masks.stare_weights,
        filter=masks.clip_b,
        gated=True,
    ),
)
METHODS.register(
    "grpo_dropout+clip_b",
    Method(
        "grpo_dropout+clip_b",
        options={"mu": 2.5, "basis": "avg", "recenter": True},
        summary="GRPODropout's kept rollouts and advantages, then Clip_B over their tokens",
        rollout_rule=rollouts.grpo_dropout,
        filter=masks.clip_b,
        gated=True,
    ),
)
METHODS.register(
    "entrocraft+clip_b",
    Method(
        "entrocraft+clip_b",
        options={"mu": 2.5, "lower_range": (0.6, 0.4), "upper_range": (0.7, 0.5), "schedule": "linear"},
        summary="Entrocraft's advantages, then Clip_B on their negative-advantage tokens",
        advantage_rule=advantages_mod.entrocraft_rule,
        filter=masks.clip_b,
        gated=True,
    ),
)
METHODS.register(
    "tre_k+clip_b",
    Method(
        "tre_k+clip_b",
        options={"mu": 2.5},
        summary="Clip_B's mask and TRE's top-K entropy bonus over the tokens it keeps",
        config={"entropy_coef": 0.001},
        top_entropy=True,
        filter=masks.clip_b,
        gated=True,
    ),
)
METHODS.register(
    "lopti",
    Method(
        "lopti", summary="Lopti: low-probability tokens updated first (Yang et al. 2025)", config={"lopti_eta": 0.5}
    ),
)


@dataclass(frozen=True)
class PolicyLoss:
    fn: Callable
    kwargs: Callable  # TrainConfig -> keyword arguments of fn
    select: Callable | None = None  # (advantages, logp, mask, cfg, generator) -> selected tokens, whole batch
    # every token's loss is A times a function of its ratio, so a response with A = 0 has exactly zero gradient
    # (KL-Cov's |log ratio| penalty on selected tokens is not: its zero gradient on-policy is a subgradient choice)
    linear_in_advantage: bool = True
    # the factor the loss puts on d log p_t (losses.step_sizes): (logp, old_logp, mask, **keywords) with the keywords
    # it names among fn's options, advantages, entropy and old_entropy; 1 at ratio 1 for every loss here
    ratio: Callable = losses.token_ratio
    agg: AggMode | None = None  # the aggregation the loss always uses (verl's SAPO and GMPO); None: cfg.loss_agg
    # a loss that reads the update's and the behaviour policy's per-token entropies (ERC): (entropy, old_entropy,
    # cfg) -> the keyword arguments of fn and ratio computed from them (ERC's band); None: it reads none
    entropy: Callable | None = None

    def aggregation(self, cfg) -> AggMode:
        return self.agg or cast(AggMode, cfg.loss_agg)  # TrainConfig checks it is one of losses.AGG_MODES

    def loss(
        self,
        logp: Tensor,
        old_logp: Tensor,
        advantages: Tensor,
        mask: Tensor,
        cfg,
        *,
        agg: Aggregation,
        selected: Tensor | None = None,
        entropy: Tensor | None = None,
        old_entropy: Tensor | None = None,
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """`fn` with the options it takes from kwargs(cfg), in its own aggregation mode where it has one (agg's
        counts kept), with Clip-Cov / KL-Cov's selection and what it reads of the entropies (ERC's band)."""
        extra: dict = {"selected": selected} if selected is not None else {}
        if self.entropy is not None:
            extra.update(self.entropy(entropy, old_entropy, cfg))
        agg = dataclasses.replace(agg, mode=self.agg) if self.agg else agg
        return self.fn(logp, old_logp, advantages, mask, agg=agg, **self.kwargs(cfg), **extra)

    def factor(self, logp, old_logp, mask, cfg, *, advantages, entropy=None, old_entropy=None):
        """`ratio` with the options it takes from kwargs(cfg) and the step's tensors."""
        given = {**self.kwargs(cfg), "advantages": advantages}
        if self.entropy is not None:
            given.update(self.entropy(entropy, old_entropy, cfg))
        accepted = set(inspect.signature(self.ratio).parameters)
        return self.ratio(logp, old_logp, mask, **{k: v for k, v in given.items() if k in accepted})


def _clip_range(c) -> dict:
    return {"eps_low": c.eps_low, "eps_high": c.eps_high}


POLICY_LOSSES: Registry[PolicyLoss] = Registry("policy loss")
POLICY_LOSSES.register(
    "ppo",
    PolicyLoss(
        losses.ppo_clip_loss, lambda c: {"eps_low": c.eps_low, "eps_high": c.eps_high, "dual_clip_c": c.dual_clip_c}
    ),
)
POLICY_LOSSES.register("gspo", PolicyLoss(losses.gspo_loss, _clip_range, ratio=losses.sequence_ratio))
POLICY_LOSSES.register(
    "clip_cov",
    PolicyLoss(
        losses.clip_cov_loss,
        _clip_range,
        lambda adv, logp, mask, c, gen: losses.select_clip_cov(
            adv, logp, mask, ratio=c.clip_cov_ratio, lb=c.clip_cov_lb, ub=c.clip_cov_ub, generator=gen
        ),
    ),
)
POLICY_LOSSES.register(
    "kl_cov",
    PolicyLoss(
        losses.kl_cov_loss,
        lambda c: {"kl_coef": c.kl_cov_coef},
        lambda adv, logp, mask, c, gen: losses.select_kl_cov(adv, logp, mask, ratio=c.kl_cov_ratio),
        linear_in_advantage=False,
    ),
)
# verl 0.9.1's names; eps_low / eps_high are verl's clip_ratio_low / clip_ratio_high for each (DPPO: probability or
# binary-KL bounds; GMPO: log-ratio bounds), dual_clip_c its clip_ratio_c (DPPO: the importance-weight truncation)
POLICY_LOSSES.register(
    "cispo",
    PolicyLoss(
        losses.cispo_loss, lambda c: {**_clip_range(c), "upper_only": c.cispo_upper_only}, ratio=losses.cispo_ratio
    ),
)
POLICY_LOSSES.register(
    "sapo",
    PolicyLoss(
        losses.sapo_loss,
        lambda c: {"tau_pos": c.tau_pos, "tau_neg": c.tau_neg},
        ratio=losses.sapo_ratio,
        agg="seq-mean-token-mean",
    ),
)
POLICY_LOSSES.register(
    "dppo_tv",
    PolicyLoss(
        losses.dppo_tv_loss, lambda c: {**_clip_range(c), "clip_ratio_c": c.dual_clip_c}, ratio=losses.dppo_tv_ratio
    ),
)
POLICY_LOSSES.register(
    "dppo_kl",
    PolicyLoss(
        losses.dppo_kl_loss, lambda c: {**_clip_range(c), "clip_ratio_c": c.dual_clip_c}, ratio=losses.dppo_kl_ratio
    ),
)
POLICY_LOSSES.register(
    "geo_mean", PolicyLoss(losses.geo_mean_loss, _clip_range, ratio=losses.geo_mean_ratio, agg="seq-mean-token-mean")
)
POLICY_LOSSES.alias("gmpo", "geo_mean")
POLICY_LOSSES.alias("dppo", "dppo_tv", "dppo_kl")
POLICY_LOSSES.register(
    "erc",
    PolicyLoss(
        losses.erc_loss,
        lambda c: {**_clip_range(c), "dual_clip_c": c.dual_clip_c},
        ratio=losses.erc_ratio,
        entropy=lambda h, h_old, c: {"band": losses.erc_keep(h, h_old, erc_low=c.erc_low, erc_high=c.erc_high)},
    ),
)
