"""The objective an update minimises: a sum of named terms, each aggregated over its own tokens.

    L = L_policy (eq. 1, or the method's policy loss)  +  kl_coef KL(pi || pi_ref)  +  vf_coef L_value
        -  c H (entropy bonus)  +  alpha mean_{T_hi}(-r |A|) (EntroPIC)

Which terms a run has is fixed at set-up (`Objective.of`): the KL term with a reference model (kl_coef > 0), the
value term with a critic (GAE), the bonus with a fixed coefficient or the adaptive bonus, EntroPIC's term with its
controller. The aggregation (cfg.loss_agg, with Dr. GRPO's constant norm) is bound once here; each term is a mean
over one token set of the whole mini-batch (`TOKEN_SETS`), so the micro-batch losses sum to the mini-batch's.

Each term says whether its gradient on a response with advantage exactly 0 vanishes
(`vanishes_at_zero_advantage`): the policy terms linear in A and EntroPIC's -r|A| do, the KL, value and entropy
terms do not. `Objective.vanishes_at_zero_advantage` is the rule that lets such rows run without a graph
(forward.HeldForward's frozen rows): it is derived from the terms, so a term added here carries its own answer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from torch import Tensor

from .dynamics import TokenStats
from .losses import AggMode, Aggregation, entropic_adjustment, kl_penalty, value_loss
from .methods import POLICY_LOSSES, PolicyLoss

# the token sets a term is a mean over: the step's loss tokens (the filter's, in the current Lopti phase), every
# valid response token, EntroPIC's high-probability tokens among the loss tokens
TOKEN_SETS = ("loss", "valid", "high")


@dataclass
class Micro:
    """One micro-batch's inputs to the objective, on the model's device: the forward's statistics (and values), the
    old log p (and values) its ratios are against, and the step's decisions for these rows."""

    stats: TokenStats  # (b, R) each, log p and H with gradients
    values: Tensor | None  # (b, R) the critic's, with gradients
    old_logp: Tensor  # (b, R)
    adv: Tensor  # (b,) or (b, R)
    masks: dict[str, Tensor]  # token set -> (b, R) bool
    old_values: Tensor | None = None
    returns: Tensor | None = None
    ref_logp: Tensor | None = None
    selected: Tensor | None = None  # (b, R) Clip-Cov / KL-Cov's tokens
    entropy_coef: float = 0.0
    alpha: float = 0.0  # EntroPIC's
    old_entropy: Tensor | None = None  # (b, R) the behaviour policy's, for losses that read it (ERC)


@dataclass(frozen=True)
class Term:
    name: str
    tokens: str  # the token set of its mean (TOKEN_SETS)
    vanishes_at_zero_advantage: bool
    # (micro, the Aggregation with the mini-batch's counts of its token set, that set's (b, R) mask) -> (its value,
    # metrics that are means over its tokens)
    fn: Callable
    coef: Callable | None = None  # micro -> its coefficient in the objective (None: 1); a coefficient 0 skips it


class Objective:
    """The run's terms with the aggregation bound once. Called on a micro-batch it returns the total loss (each
    term times its coefficient, summed in order), each term's value (without its coefficient: the policy loss, the
    KL estimate, the value loss, the bonus's aggregated entropy, EntroPIC's mean of -r|A|), and each term's metrics
    with the count of tokens they are means over (so that micro-batches combine into the mini-batch's means)."""

    def __init__(self, terms: list[Term], *, agg: AggMode, norm: float, denominator: str = "kept"):
        self.terms, self.agg, self.norm, self.denominator = terms, agg, norm, denominator

    @classmethod
    def of(
        cls, cfg, *, kl: bool, value: bool, entropy_bonus: bool, entropic: bool, extra: Sequence[Term] = ()
    ) -> Objective:
        terms = [policy_term(POLICY_LOSSES.get(cfg.policy_loss), cfg)]
        if kl:
            terms.append(Term("kl", "loss", False, _kl, lambda mb: cfg.kl_coef))
        if value:
            terms.append(
                Term(
                    "value",
                    "valid",
                    False,
                    lambda mb, agg, mask: _value(mb, agg, mask, cfg.value_clip),
                    lambda mb: cfg.vf_coef,
                )
            )
        if entropy_bonus:  # minus: the bonus raises entropy
            terms.append(Term("entropy_bonus", "loss", False, _entropy_bonus, lambda mb: -mb.entropy_coef))
        if entropic:
            terms.append(Term("entropic", "high", True, _entropic, lambda mb: mb.alpha))
        return cls(terms + list(extra), agg=cfg.loss_agg, norm=cfg.max_new_tokens, denominator=cfg.denominator)

    @property
    def names(self) -> list[str]:
        return [t.name for t in self.terms]

    @property
    def vanishes_at_zero_advantage(self) -> bool:
        """Whether every term's gradient is exactly 0 on a response whose advantage is 0."""
        return all(t.vanishes_at_zero_advantage for t in self.terms)

    def token_sets(self) -> set[str]:
        return {t.tokens for t in self.terms}

    def counts(self, masks: dict[str, Tensor], valid: Tensor, device) -> dict[str, tuple[Tensor, Tensor]]:
        """(num_tokens, num_seqs) of each token set over the whole mini-batch: masks (n, R) of its rows. The loss
        set's denominator is every valid token with denominator="all"."""
        out = {}
        for name in self.token_sets():
            m = valid if name == "loss" and self.denominator == "all" else masks[name]
            out[name] = (m.sum().clamp_min(1).to(device), (m.sum(-1) > 0).sum().clamp_min(1).to(device))
        return out

    def __call__(self, mb: Micro, counts: dict[str, tuple[Tensor, Tensor]]) -> tuple[Tensor, dict, dict]:
        """(total, {term: value}, {metric: (mean over the term's tokens here, their count)})."""
        total: Tensor | None = None
        values: dict[str, Tensor] = {}
        metrics: dict[str, tuple[Tensor, float]] = {}
        for term in self.terms:
            coef = term.coef(mb) if term.coef is not None else None
            if coef == 0:  # a term switched off this step (the adaptive bonus at 0)
                continue
            num_tokens, num_seqs = counts[term.tokens]
            agg = Aggregation(self.agg, num_tokens=num_tokens, num_seqs=num_seqs, norm=self.norm)
            value, m = term.fn(mb, agg, mb.masks[term.tokens])
            weighted = value if coef is None else coef * value
            total = weighted if total is None else total + weighted
            values[term.name] = value.detach()
            n = float(mb.masks[term.tokens].sum())
            metrics.update({k: (v, n) for k, v in m.items()})
        assert total is not None, "the policy term has no coefficient, so it is never skipped"
        return total, values, metrics


def policy_term(spec: PolicyLoss, cfg) -> Term:
    """The method's policy loss (eq. 1's clipped surrogate, GSPO, Clip-Cov, KL-Cov, CISPO, ...) over the loss tokens,
    aggregated as cfg.loss_agg says unless the loss has its own (spec.agg: verl's SAPO and GMPO)."""

    def fn(mb: Micro, agg: Aggregation, mask: Tensor) -> tuple[Tensor, dict]:
        return spec.loss(
            mb.stats.logp,
            mb.old_logp,
            mb.adv,
            mask,
            cfg,
            agg=agg,
            selected=mb.selected,
            entropy=mb.stats.entropy,
            old_entropy=mb.old_entropy,
        )

    return Term("policy", "loss", spec.linear_in_advantage, fn)


def _kl(mb: Micro, agg: Aggregation, mask: Tensor) -> tuple[Tensor, dict]:
    assert mb.ref_logp is not None, "the KL term is built with a reference policy"
    return agg(kl_penalty(mb.stats.logp, mb.ref_logp), mask), {}


def _value(mb: Micro, agg: Aggregation, mask: Tensor, clip: float | None) -> tuple[Tensor, dict]:
    """PPO's clipped value loss on every valid token (the critic learns where the filter drops tokens too)."""
    assert mb.values is not None and mb.old_values is not None and mb.returns is not None, "built with a critic"
    return value_loss(mb.values, mb.old_values, mb.returns, mask, clip_range=clip, agg=agg)


def _entropy_bonus(mb: Micro, agg: Aggregation, mask: Tensor) -> tuple[Tensor, dict]:
    """The bonus's entropy: H, or TRE's top-K / top-p entropy where the forward computed it (core/tre.py)."""
    entropy = mb.stats.entropy if mb.stats.entropy_top is None else mb.stats.entropy_top
    return agg(entropy, mask), {}


def _entropic(mb: Micro, agg: Aggregation, mask: Tensor) -> tuple[Tensor, dict]:
    """EntroPIC's mean over T_hi of -r|A| (losses.entropic_adjustment at alpha 1; alpha is the coefficient)."""
    term, _ = entropic_adjustment(mb.stats.logp, mb.old_logp, mb.adv, mask, alpha=1.0, agg=agg)
    return term, {}
