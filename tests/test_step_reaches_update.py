"""The method reaches the update: what the real step (step.Step: statistics -> decide -> update) differentiates is
what the method, the advantage estimator, the entropy control and the objective's terms say, token by token.

Each test runs the real step on a float64 model (so every comparison is exact up to the float32 rounding of the loss)
and hooks each micro-batch's forward through the update's `observe` callback: the gradient of the objective with respect
to every token's log p (and entropy, and value) is the per-token coefficient the update applies. It is compared with a
reference built here from the pieces alone: the method's filter (METHODS), the estimator (ADVANTAGES), the policy
loss (POLICY_LOSSES) on the expected mask with counts taken by hand, and the KL, value, bonus and EntroPIC terms
written out by hand. A step whose keep mask, denominators, ratio, advantages, KL or value term stop reaching the
loss fails here directly (the closing note of the issue lists the mutations each test caught)."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from invariants import scaled_model, synthetic_batch

from entropy_rft.config import load_config
from entropy_rft.core.advantages import ADVANTAGES, TokenLevel
from entropy_rft.core.losses import Aggregation
from entropy_rft.core.methods import METHODS, POLICY_LOSSES
from entropy_rft.train.policy import ValueHead
from entropy_rft.train.problems import Scored
from entropy_rft.train.step import Step, compute_advantages, shaped_rewards

PROMPTS, GROUP, RESPONSE = 3, 4, 6
# options under which each filter drops some tokens of these small batches (the defaults may drop none)
DROPPING = {
    "clip_b": {"mu": 0.5},
    "ppo_clip_b": {"mu": 0.5},
    "clip_v": {"mu": 0.5, "max_frac": 0.3},
    "ppo_clip_v": {"mu": 0.5, "max_frac": 0.3},
    "rsi": {"rsi_lower_bound": 0.05, "rsi_upper_bound": 1.5},
}
# settings under which a method's rule acts on the batch (STARE's gate held open, both of its weights)
ACTING = {
    "stare": {"entropy_gate": 100.0, "stare_variant": "C2"},
    # groups of 4 keep max(1, 4 // 4) = 1 rollout or more; recentring a lone survivor zeroes it, so keep the raw
    # recomputed advantages for a nonzero gradient
    "grpo_dropout": {"grpo_dropout_recenter": False},
    "grpo_dropout+clip_b": {"grpo_dropout_recenter": False},
}
# The statistics (log p, H) are float32 whatever the model's dtype (dynamics' tiles), so the loss and its backward run
# in float32: a token's coefficient -A r w (times a clip branch, a KL or bonus derivative) is a product of at most
# four float32 roundings (r, A r, the weight, the mean's division), each 2^-24 relative; 16 u of the largest
# coefficient covers a sum of two such terms twice over. A dropped token, a wrong denominator or advantage moves a
# coefficient by O(1) of itself.
RTOL = 16 * 2.0**-24


class CountingSGD(torch.optim.SGD):
    """Plain SGD that counts its steps, so a hook knows which optimizer step a gradient belongs to."""

    def __init__(self, params, lr):
        super().__init__(params, lr=lr)
        self.taken = 0

    def step(self, closure=None):
        self.taken += 1
        return super().step(closure)


class Capture:
    """Step.update's `observe`: per micro-batch forward, its rows, log p, old log p and entropy (detached) and, once
    the backward has run, the objective's gradient with respect to that log p and entropy."""

    def __init__(self, optimizer: CountingSGD):
        self.optimizer, self.parts = optimizer, []

    def __call__(self, rows, stats, old):
        rec = {
            "step": self.optimizer.taken,
            "rows": rows,
            "logp": stats.logp.detach().clone(),
            "old": old.clone(),
            "entropy": stats.entropy.detach().clone(),
            "g_logp": None,
            "g_entropy": None,
        }
        for key, t in (("g_logp", stats.logp), ("g_entropy", stats.entropy)):
            if t.requires_grad:
                t.register_hook(lambda g, key=key: rec.__setitem__(key, g.detach().clone()))
        self.parts.append(rec)

    def gathered(self, key: str, step: int, shape) -> torch.Tensor:
        """The (B, R) tensor `key` of one optimizer step's micro-batches (0 where no gradient reached it)."""
        out = torch.zeros(shape, dtype=torch.float64)
        for rec in self.parts:
            if rec["step"] == step and rec[key] is not None:
                out[rec["rows"], : rec[key].shape[1]] = rec[key].double().cpu()
        return out

    def rows(self, step: int) -> torch.Tensor:
        return torch.cat([rec["rows"] for rec in self.parts if rec["step"] == step])


def f64_policy(cfg, seed: int = 0):
    return scaled_model(
        "Qwen/Qwen2.5-7B-Instruct",
        cfg,
        seed=seed,
        hidden_size=32,
        intermediate_size=64,
        num_attention_heads=2,
        head_dim=16,
        vocab_size=300,
    ).double()


@dataclasses.dataclass
class Ran:
    cfg: object
    runner: Step
    batch: Scored
    behaviour: object
    decision: object
    capture: Capture
    values: list  # per value-head call: (output, gradient holder)

    @property
    def mask(self):
        return self.batch.rollout.response_mask


def run_step(seed: int = 0, *, lr: float = 0.0, ref: bool = False, **settings) -> Ran:
    """One real step (statistics, decide, update) of a float64 policy on a synthetic batch, every forward hooked."""
    cfg = load_config(
        None,
        **{
            "prompts_per_step": PROMPTS,
            "group_size": GROUP,
            "max_new_tokens": RESPONSE,
            "grad_clip": 0.0,
            "dynamic_sampling": False,
            **settings,
        },
    )
    model = f64_policy(cfg)
    head = None
    values: list = []
    if isinstance(ADVANTAGES.get(cfg.advantage), TokenLevel):
        head = ValueHead(32)  # float32, as the trainer builds it (the hidden states are cast to it)

        def keep_values(module, inputs, output):  # the head's output with its gradient, per call
            rec = [output.detach().clone(), None]
            if output.requires_grad:
                output.register_hook(lambda g: rec.__setitem__(1, g.detach().clone()))
            values.append(rec)

        head.register_forward_hook(keep_values)
    params = [p for p in model.parameters() if p.requires_grad] + (list(head.parameters()) if head else [])
    optimizer = CountingSGD(params, lr=lr)
    ref_model = f64_policy(cfg, seed=1).eval() if ref else None
    runner = Step(
        cfg, model, optimizer, value_head=head, ref_model=ref_model, update_gen=torch.Generator().manual_seed(seed)
    )
    batch = synthetic_batch(PROMPTS, GROUP, vocab=300, max_response=RESPONSE, seed=seed, model=model)
    behaviour = runner.statistics(batch, 0)
    decision = runner.decide(batch, behaviour)
    capture = Capture(optimizer)
    runner.update(batch.rollout, decision, held=behaviour.held, observe=capture)
    return Ran(cfg, runner, batch, behaviour, decision, capture, values)


def expected_advantages(ran: Ran) -> torch.Tensor:
    """The estimator's output on the shaped rewards; with a rank penalty, reweighting or GAE the step's own
    compute_advantages (the estimator alone does not define them); then the method's advantage rule (Entrocraft, at
    the batch's mean entropy and the step) and its token weights on each token's advantage (STARE), each as the
    registry defines it (their values are checked against the authors' code in their own tests)."""
    cfg, b = ran.cfg, ran.behaviour
    estimator = ADVANTAGES.get(cfg.advantage)
    if cfg.rank_penalty_beta > 0 or cfg.ar_alpha > 0 or isinstance(estimator, TokenLevel):
        adv = compute_advantages(cfg, estimator, b.rewards, ran.batch.group_ids, ran.mask, b.stats.logp, b.old_values)[
            0
        ]
    else:
        adv = estimator(shaped_rewards(cfg, ran.batch.rewards, ran.mask), ran.batch.group_ids)
    method, options = METHODS.get(cfg.method), cfg.method_overrides()
    m = ran.mask.float()
    entropy = float((b.stats.entropy * m).sum() / m.sum())
    adv, _, _ = expected_rollouts(ran, adv)
    adv, _ = method.advantages(b.rewards, adv, entropy=entropy, step=b.step + 1, total_steps=cfg.steps, **options)
    weights, _ = method.weights(b.stats, adv, valid_rows(ran), **options)
    if weights is not None:
        adv = (adv[:, None] if adv.dim() == 1 else adv) * weights.to(adv.dtype)
    return adv


def expected_rollouts(ran: Ran, adv: torch.Tensor):
    """The method's rollout rule (GRPODropout) on the estimator's advantages, its draws from run_step's update
    generator (seeded with run_step's seed, 0 here; the rule is its first user in a step)."""
    b = ran.behaviour
    return METHODS.get(ran.cfg.method).rollouts(
        b.rewards,
        adv,
        ran.batch.group_ids,
        b.stats.logp,
        ran.mask,
        estimator=ADVANTAGES.get(ran.cfg.advantage),
        generator=torch.Generator().manual_seed(0),
        **ran.cfg.method_overrides(),
    )


def valid_rows(ran: Ran) -> torch.Tensor:
    """(B, R) the valid tokens of the rollouts the method's rollout rule keeps (GRPODropout; every rollout else)."""
    b, cfg = ran.behaviour, ran.cfg
    if METHODS.get(cfg.method).rollout_rule is None:
        return ran.mask
    _, rows, _ = expected_rollouts(ran, ADVANTAGES.get(cfg.advantage)(b.rewards, ran.batch.group_ids))
    return ran.mask if rows is None else ran.mask & rows[:, None]


def expected_keep(ran: Ran, adv: torch.Tensor, **overrides) -> torch.Tensor:
    method = METHODS.get(ran.cfg.method)
    options = {**ran.cfg.method_overrides(), **overrides}
    return method.apply(ran.behaviour.stats, adv, valid_rows(ran), **options)[0]


def policy_grad(cfg, logp, old, adv, loss_mask, count_mask, selected=None, entropy=None, old_entropy=None):
    """d(policy loss)/d(log p), (B, R): the registered loss on the expected mask, its counts taken from count_mask,
    in its own aggregation where it has one (verl's SAPO and GMPO); a loss that reads entropies (ERC) gets them."""
    spec = POLICY_LOSSES.get(cfg.policy_loss)
    x = logp.clone().double().requires_grad_(True)
    n_tokens = count_mask.sum().clamp_min(1).double()
    n_seqs = (count_mask.sum(-1) > 0).sum().clamp_min(1).double()
    loss, _ = spec.loss(
        x,
        old.double(),
        adv.double(),
        loss_mask,
        cfg,
        agg=Aggregation(spec.agg or cfg.loss_agg, n_tokens, n_seqs, norm=cfg.max_new_tokens),
        selected=selected,
        entropy=None if entropy is None else entropy.double(),
        old_entropy=None if old_entropy is None else old_entropy.double(),
    )
    loss.backward()
    return x.grad


def assert_close(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    scale = float(want.abs().max()) + 1e-300
    err = float((got - want).abs().max())
    assert err <= RTOL * scale, f"{what}: max |got - want| {err:.3e} against {RTOL * scale:.3e}"


METHOD_NAMES = METHODS.names()


@pytest.mark.parametrize("name", METHOD_NAMES)
def test_every_method_reaches_the_loss(name):
    """For every registered method, at the update's first optimizer step: the tokens its filter drops (the filter
    applied here to the behaviour statistics and the estimator's advantages) get exactly zero gradient, and every
    token gets the registered policy loss's gradient on the expected loss mask, with its counts (the kept tokens, or
    every valid token with denominator 'all') and the advantages the estimator gives."""
    ran = run_step(method=name, **DROPPING.get(name, {}), **ACTING.get(name, {}))
    cfg, mask, d = ran.cfg, ran.mask, ran.decision
    adv = expected_advantages(ran)
    assert torch.equal(d.adv.double(), adv.double()), "the decision's advantages are not the estimator's"
    keep = expected_keep(ran, adv)
    loss_mask = mask & keep
    if cfg.lopti_eta is not None:  # Lopti's first phase: the low-probability tokens only
        loss_mask = loss_mask & (ran.behaviour.stats.logp.exp() < cfg.lopti_eta)
    g = ran.capture.gathered("g_logp", 0, mask.shape)
    dropped = mask & ~loss_mask
    if METHODS.get(name).filter is not None and name in DROPPING:
        assert bool(dropped.any()), "the amplified filter drops nothing: the zero-gradient check would be empty"
    assert torch.equal(g[dropped], torch.zeros_like(g[dropped])), "a dropped token received gradient"
    assert float(g[loss_mask].abs().sum()) > 0
    count_mask = mask if cfg.denominator == "all" else loss_mask
    logp, entropy = ran.capture.gathered("logp", 0, mask.shape), ran.capture.gathered("entropy", 0, mask.shape)
    # the first step's old entropies are its own forward's (ERC), as its old log p are
    want = policy_grad(cfg, logp, logp, adv, loss_mask, count_mask, d.selected, entropy, entropy)
    assert_close(g, want, f"{name}: d loss / d log p")


@pytest.mark.parametrize("estimator", ["grpo", "dr_grpo", "rloo"])
def test_the_estimators_advantages_are_what_the_loss_sees(estimator):
    """With no filter, each token's gradient is -A_row w_t (ratio 1 at the first step, token-mean weights 1/N):
    A is the registered estimator's output on the batch's rewards, row by row."""
    ran = run_step(advantage=estimator, loss_agg="token-mean")
    mask = ran.mask
    adv = ADVANTAGES.get(estimator)(ran.batch.rewards, ran.batch.group_ids)
    assert bool((adv != 0).any())
    g = ran.capture.gathered("g_logp", 0, mask.shape)
    want = -adv.double()[:, None].expand_as(g) * mask / float(mask.sum())
    assert_close(g, want, estimator)


def test_later_optimizer_steps_use_the_behaviour_policys_old_log_p():
    """Two mini-batches with SGD moving the weights in between: the second optimizer step's loss takes its ratio
    against the behaviour policy's log p from the statistics pass (not its own forward), with its mini-batch's
    counts, so its gradient is the clipped surrogate's at ratio != 1."""
    ran = run_step(method="clip_b", mu=0.5, mini_batches=3, prompts_per_step=3, lr=0.5)
    mask, d, cap = ran.mask, ran.decision, ran.capture
    rows = cap.rows(1)
    logp = cap.gathered("logp", 1, mask.shape)[rows]
    old = d.old_logp[rows].double()
    assert float((logp - old).abs()[mask[rows]].max()) > 1e-3  # the weights moved: the ratio is not 1
    loss_mask = d.loss_mask[rows]
    want = policy_grad(ran.cfg, logp, old, d.adv[rows], loss_mask, loss_mask)
    assert_close(cap.gathered("g_logp", 1, mask.shape)[rows], want, "second optimizer step")


def test_the_kl_term_reaches_the_loss():
    """With a reference policy and kl_coef: each loss token's gradient is the policy loss's plus kl_coef times the
    k3 estimator's derivative 1 - exp(ref - log p) (0 where k3 = e^d - d - 1, d = ref - log p, passes verl's clamp
    at 10), over the loss tokens' count."""
    ran = run_step(kl_coef=0.5, ref=True)
    mask, d = ran.mask, ran.decision
    logp = ran.capture.gathered("logp", 0, mask.shape)
    diff = d.ref_logp.double() - logp
    inside = (diff.exp() - diff - 1) < 10
    assert bool((mask & inside).any()) and bool((mask & ~inside).any())  # both sides of the clamp are at stake
    kl = ran.cfg.kl_coef * (1 - diff.exp()) * (mask & inside) / float(mask.sum())
    want = policy_grad(ran.cfg, logp, logp, d.adv, mask, mask) + kl
    assert float(kl.abs().max()) > 1e-6
    assert_close(ran.capture.gathered("g_logp", 0, mask.shape), want, "policy + KL")


def test_the_value_term_reaches_the_loss():
    """PPO with a value head: at the first optimizer step (values equal their old values, so the clipped and the
    unclipped value losses agree) each valid token's value gets vf_coef (v - R) / N_valid, R the decision's GAE
    returns."""
    ran = run_step(method="ppo")
    mask, d = ran.mask, ran.decision
    ((v, g),) = [rec for rec in ran.values if rec[1] is not None]  # the one call the update differentiated
    v, g = v.double()[:, : mask.shape[1]], g.double()[:, : mask.shape[1]]
    want = ran.cfg.vf_coef * (v - d.returns.double()) * mask / float(mask.sum())
    assert float(want.abs().max()) > 0
    assert_close(g * mask, want, "value term")


def test_the_entropy_bonus_coefficient_reaches_the_loss():
    """A fixed bonus (method entropy_bonus) and the adaptive one (entropy_control bonus): each loss token's entropy
    gets -c / N, c the decision's coefficient, and no other token any."""
    for settings in (
        {"method": "entropy_bonus"},
        {"entropy_target": 5.0, "entropy_control": "bonus", "entropy_coef": 0.01},
    ):
        ran = run_step(**settings)
        mask, c = ran.mask, ran.decision.knobs.entropy_coef
        assert c > 0
        want = -c * mask.double() / float(mask.sum())
        assert_close(ran.capture.gathered("g_entropy", 0, mask.shape), want, f"bonus {settings}")


def test_the_mu_controls_choice_reaches_the_loss():
    """The mu controller's chosen mu decides the keep mask the loss sees: dropped tokens (Clip_B at that mu) get
    exactly zero gradient, the others the policy loss's."""
    ran = run_step(method="clip_b", entropy_target=0.05, entropy_control="mu")
    mask, d = ran.mask, ran.decision
    mu = d.filter_metrics["mu"]
    keep = mask.clone() if mu is None else expected_keep(ran, d.adv, mu=mu)
    assert torch.equal(d.keep, keep)
    g = ran.capture.gathered("g_logp", 0, mask.shape)
    assert torch.equal(g[mask & ~keep], torch.zeros_like(g[mask & ~keep]))
    logp = ran.capture.gathered("logp", 0, mask.shape)
    assert_close(g, policy_grad(ran.cfg, logp, logp, d.adv, mask & keep, mask & keep), "mu control")


def test_entropics_alpha_and_tokens_reach_the_loss():
    """EntroPIC (entropy_control pi): each high-probability loss token gets alpha (-|A|) / N_hi on top of the policy
    loss's gradient, alpha and T_hi the decision's knobs."""
    ran = run_step(entropy_target=5.0, entropy_control="pi", pi_threshold=0.05)
    mask, d = ran.mask, ran.decision
    alpha, high = d.knobs.alpha, d.knobs.high
    assert alpha != 0 and bool(high.any())
    logp = ran.capture.gathered("logp", 0, mask.shape)
    adv = d.adv.double()[:, None].expand_as(logp)
    extra = alpha * -adv.abs() * high / float(high.sum())
    want = policy_grad(ran.cfg, logp, logp, d.adv, mask, mask) + extra
    assert_close(ran.capture.gathered("g_logp", 0, mask.shape), want, "EntroPIC")
    assert math.isfinite(alpha)
