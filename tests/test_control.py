"""Entropy targets: the mu controller's choice and the adaptive bonus."""

import math

import pytest
import torch

from entropy_rft.core.control import AdaptiveEntropyBonus, MuController, unit_entropy_change
from entropy_rft.core.dynamics import TokenStats
from entropy_rft.core.methods import METHODS


def batch():
    g = torch.Generator().manual_seed(0)
    s_star = torch.randn(16, 8, generator=g) * 0.1
    adv = torch.randn(16, generator=g)
    adv[adv < 0] *= 1.0
    s_c = s_star - 0.02
    # negative samples carry the low-S* outliers: clipping them raises the predicted entropy change
    for i in range(16):
        if adv[i] < 0:
            s_star[i, 0] = s_c[i, 0] = -1.0
    stats = TokenStats(torch.zeros(16, 8), torch.ones(16, 8), s_star, s_star - s_c)
    return stats, adv, torch.ones(16, 8, dtype=torch.bool)


def test_unit_change_rises_when_outliers_are_clipped():
    """Clip_B removing negative-sample low-S* tokens raises -Cov_B(A, S_c), as Corollary 4 reads."""
    stats, adv, mask = batch()
    keep, _ = METHODS.get("clip_b").apply(stats, adv, mask, mu=1.0)
    assert (~keep).any()
    assert unit_entropy_change(adv, stats.s_centered, mask & keep) > unit_entropy_change(adv, stats.s_centered, mask)


def test_controller_clips_when_entropy_is_below_target_and_not_above():
    stats, adv, mask = batch()
    method = METHODS.get("clip_b")
    ctl = MuController(target=1.0, kappa_prior=1.0)
    mu_low, keep_low, _ = ctl.choose(method, stats, adv, mask, entropy_now=0.5, overrides={})
    assert math.isfinite(mu_low) and (~keep_low).any()  # below target: clip to lift entropy
    mu_high, keep_high, _ = ctl.choose(method, stats, adv, mask, entropy_now=2.0, overrides={})
    assert math.isinf(mu_high) and keep_high.all()  # above target: leave the update alone


def test_controller_fits_kappa_by_least_squares():
    ctl = MuController(target=0.3, forget=1.0)
    for x, y in [(1.0, 2.0), (2.0, 4.1), (-1.0, -1.9)]:
        ctl.last_unit = x
        ctl.observe(y)
    assert ctl.kappa == pytest.approx((2.0 + 8.2 + 1.9) / 6.0)


def test_adaptive_bonus_moves_toward_target_and_clamps():
    b = AdaptiveEntropyBonus(target=0.5, delta=0.01, max_coef=0.02)
    assert [b.update(0.1) for _ in range(3)] == pytest.approx([0.01, 0.02, 0.02])
    assert b.update(0.9) == pytest.approx(0.01)
    assert [b.update(0.9) for _ in range(3)] == [0.0, 0.0, 0.0]


def test_unit_change_is_eq23_on_the_kept_set_and_predicts_the_logit_step():
    """On a tabular policy (each token owns its logits, float64), one SGD step of the token-mean loss over Clip_B's
    kept tokens K changes the mean entropy of all valid tokens by eta / |V| * unit_entropy_change (eq. 23 on K
    with the token mean's 1/|K|), to first order. Corollary 4's -Cov_K(A, S_c) misses it: on K, S_c does not
    average to 0 (Corollary 2 holds on the whole batch only) and A does not either."""
    g = torch.Generator().manual_seed(1)
    rows, width, vocab, eta = 32, 16, 24, 1e-2
    z = (torch.randn(rows, width, vocab, generator=g, dtype=torch.float64) * 2).requires_grad_()
    lp = z.detach().log_softmax(-1)
    k = torch.multinomial(lp.exp().view(-1, vocab), 1, generator=g).view(rows, width)
    p = lp.exp()
    h = -(p * lp).sum(-1)
    s = p * (h.unsqueeze(-1) + lp)
    s_star = s.gather(-1, k.unsqueeze(-1)).squeeze(-1)
    s_expect = (p * s).sum(-1)
    stats = TokenStats(lp.gather(-1, k.unsqueeze(-1)).squeeze(-1).float(), h.float(), s_star.float(), s_expect.float())
    rewards = (torch.rand(rows, generator=g) < 0.5).float()
    adv = (rewards - rewards.view(4, 8).mean(-1).repeat_interleave(8)) / 0.5
    mask = torch.ones(rows, width, dtype=torch.bool)
    keep, _ = METHODS.get("clip_b").apply(stats, adv, mask, mu=0.3)
    kept = mask & keep
    assert (~kept).sum() > 10
    loss = -(adv[:, None] * z.log_softmax(-1).gather(-1, k.unsqueeze(-1)).squeeze(-1) * kept).sum() / kept.sum()
    (grad,) = torch.autograd.grad(loss, z)
    with torch.no_grad():
        lp2 = (z - eta * grad).log_softmax(-1)
        realised = float((-(lp2.exp() * lp2).sum(-1) - h).mean())
    s_c = s_star - s_expect
    unit = unit_entropy_change(adv, s_c, kept)
    loop = -sum(float(adv[i] * s_c[i, j]) for i in range(rows) for j in range(width) if kept[i, j]) / int(kept.sum())
    assert unit == pytest.approx(loop, rel=1e-9)
    n_valid = int(mask.sum())
    assert eta / n_valid * unit == pytest.approx(realised, rel=1e-2)
    from entropy_rft.core.dynamics import batch_covariance

    cov_unit = -float(batch_covariance(adv[:, None].expand_as(s_c).double(), s_c, kept))
    assert abs(eta / n_valid * cov_unit - realised) > 0.1 * abs(realised)


def test_kappa_ignores_tiny_denominators_and_is_clamped():
    """The scale fit skips a step whose unit prediction is tiny against the running scale (its ratio would be
    noise), clamps a negative fit to 0 (then nothing is clipped) and respects kappa_max."""
    ctl = MuController(target=0.3, forget=1.0)
    for x, y in [(1.0, 2.0), (2.0, 4.0)]:
        ctl.last_unit = x
        assert ctl.observe(y)
    ctl.last_unit = 1e-9  # a near-zero prediction with a noisy measured change
    assert not ctl.observe(0.5)
    assert ctl.kappa == pytest.approx(2.0)
    ctl.last_unit = 0.0
    assert not ctl.observe(0.1)
    ctl = MuController(target=1.0, forget=1.0)
    ctl.last_unit = 1.0
    ctl.observe(-3.0)  # the measured change went against the prediction
    assert ctl.kappa == 0.0
    stats, adv, mask = batch()
    mu, keep, _ = ctl.choose(METHODS.get("clip_b"), stats, adv, mask, entropy_now=0.5, overrides={})
    assert math.isinf(mu) and keep.all()  # no usable scale: no clipping
    capped = MuController(target=1.0, forget=1.0, kappa_max=5.0)
    capped.last_unit = 1.0
    capped.observe(100.0)
    assert capped.kappa == 5.0


def test_controller_uses_the_denominator_all_scaling():
    """With denominator="all" the unit prediction of a candidate is -sum_K A S_c / |V| (the loss divides by every
    valid token), so it scales with the kept fraction against the "kept" form."""
    stats, adv, mask = batch()
    keep, _ = METHODS.get("clip_b").apply(stats, adv, mask, mu=1.0)
    kept = mask & keep
    full = unit_entropy_change(adv, stats.s_centered, kept, num_tokens=float(mask.sum()))
    assert full == pytest.approx(
        unit_entropy_change(adv, stats.s_centered, kept) * float(kept.sum()) / float(mask.sum())
    )


def test_mu_controller_state_round_trips_everything_it_learns():
    """A controller restored from state() continues exactly as the original: every learnt field is in the state
    (a checkpoint that missed one would resume with a different kappa)."""
    from dataclasses import fields

    from entropy_rft.core.control import MuController

    a = MuController(target=1.0)
    for i, realised in enumerate([0.3, -0.1, 0.2]):
        a.last_unit = 0.5 + i
        a.observe(realised)
    b = MuController(target=1.0)
    b.load_state(a.state())
    assert {f.name for f in fields(a) if not f.init} == set(a.state())
    assert all(getattr(a, f.name) == getattr(b, f.name) for f in fields(a)) and a.kappa == b.kappa


# ---------------------------------------------------------------------------------------------------------------
# EntroPIC (Yang et al. 2025): the PI law, the loss term, and tracking on a tabular policy


def test_entropic_pi_law_against_a_hand_computation():
    """alpha_t = clip(K_p e_t + K_i sum_{s<t} e_s, -1, 1) with e_t = H_t - H_tar; the integral takes e_t after alpha_t
    is computed (as the authors' actor). Target 0.5, K_p 2, K_i 0.5, entropies 0.7, 0.6, 0.1, 0.1, 1.9:
    e = 0.2, 0.1, -0.4, -0.4, 1.4; alpha = 0.4, 0.2 + 0.1, -0.8 + 0.15, -0.8 - 0.05, clip(2.8 - 0.25) = 1."""
    from entropy_rft.core.control import EntroPIC

    pi = EntroPIC(target=0.5, k_p=2.0, k_i=0.5)
    alphas = [pi.update(h) for h in (0.7, 0.6, 0.1, 0.1, 1.9)]
    assert alphas == pytest.approx([0.4, 0.3, -0.65, -0.85, 1.0])
    assert pi.integral == pytest.approx(0.2 + 0.1 - 0.4 - 0.4 + 1.4)
    low = EntroPIC(target=2.0, alpha_max=0.3)  # far below target: alpha stays at -alpha_max
    assert [low.update(0.0) for _ in range(3)] == pytest.approx([-0.3] * 3)
    restored = EntroPIC(target=0.5, k_p=2.0, k_i=0.5)
    restored.load_state(pi.state())
    assert restored.update(0.5) == pi.update(0.5)


def test_entropic_term_reweights_high_probability_tokens_by_one_plus_minus_alpha():
    """Policy loss + EntroPIC's term has the gradient of a token-mean loss whose high-probability tokens (p_old > tau)
    weigh (1 + alpha |T| / |T_hi|) in positive samples and (1 - alpha |T| / |T_hi|) in negative ones (the term is a
    token mean over T_hi): d/dlogp of  -sum_T A r / |T|  +  alpha * sum_{T_hi} -|A| r / |T_hi|. Checked token by token
    in float64 against that hand-built weighting (a loop), and the high-probability set against its definition."""
    from entropy_rft.core.control import high_probability_tokens
    from entropy_rft.core.losses import Aggregation, entropic_adjustment

    g = torch.Generator().manual_seed(3)
    old = -torch.rand(6, 5, generator=g, dtype=torch.float64) * 0.2  # p_old in (0.82, 1]: some above 0.95
    logp = (old + 0.01 * torch.randn(6, 5, generator=g, dtype=torch.float64)).requires_grad_()
    adv = torch.tensor([1.0, -1.0, 0.5, -2.0, 0.0, 1.5], dtype=torch.float64)
    mask = torch.ones(6, 5, dtype=torch.bool)
    mask[2, 3:] = False
    high = high_probability_tokens(old, mask, threshold=0.95)
    assert all(
        bool(high[i, j]) == (bool(mask[i, j]) and math.exp(float(old[i, j])) > 0.95) for i in range(6) for j in range(5)
    )
    assert 0 < int(high.sum()) < int(mask.sum())
    alpha = 0.3
    ratio = (logp - old).exp()
    policy = -(adv[:, None] * ratio * mask).sum() / mask.sum()
    term, _ = entropic_adjustment(logp, old, adv, high, alpha=alpha, agg=Aggregation(num_tokens=high.sum()))
    (grad,) = torch.autograd.grad(policy + term, logp)
    n, n_hi = int(mask.sum()), int(high.sum())
    for i in range(6):
        for j in range(5):
            r = math.exp(float(logp[i, j].detach() - old[i, j]))
            a = float(adv[i])
            want = 0.0
            if mask[i, j]:
                want -= a * r / n
            if high[i, j]:
                want -= alpha * abs(a) * r / n_hi  # = -(alpha sign(A) n / n_hi) A r / n: weight 1 +- alpha n / n_hi
            assert float(grad[i, j]) == pytest.approx(want, rel=1e-12, abs=1e-15)


def _tabular_grpo(
    target, control, steps=240, contexts=32, actions=8, group=8, lr=30.0, seed=0, k_p=10.0, k_i=0.5, tau=0.95
):
    """A tabular softmax policy (one logit row per context, float64) trained by on-policy GRPO with SGD: each step
    samples `group` actions per context, rewards each with its action's fixed success probability, and updates on
    the token-mean loss, plus EntroPIC's term when `control`. Returns the mean entropy before each step."""
    from entropy_rft.core.control import EntroPIC, high_probability_tokens
    from entropy_rft.core.losses import Aggregation, entropic_adjustment

    g = torch.Generator().manual_seed(seed)
    z = (torch.randn(contexts, actions, generator=g, dtype=torch.float64) * 5).requires_grad_()
    success = torch.rand(contexts, actions, generator=g, dtype=torch.float64) * 0.8 + 0.1
    pi = EntroPIC(target, k_p=k_p, k_i=k_i) if control else None
    opt = torch.optim.SGD([z], lr=lr)
    history = []
    for _ in range(steps):
        with torch.no_grad():
            lp = z.log_softmax(-1)
            history.append(float(-(lp.exp() * lp).sum(-1).mean()))
            act = torch.multinomial(lp.exp(), group, replacement=True, generator=g)  # (C, G)
            r = (torch.rand(contexts, group, generator=g, dtype=torch.float64) < success.gather(1, act)).double()
            adv = ((r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-6)).reshape(-1)  # (C G,)
            old = lp.gather(1, act).reshape(-1, 1)  # each response is one token
        logp = z.log_softmax(-1).gather(1, act).reshape(-1, 1)
        loss = -(adv[:, None] * (logp - old).exp()).mean()
        if pi is not None:
            high = high_probability_tokens(old, torch.ones_like(old, dtype=torch.bool), threshold=tau)
            term, _ = entropic_adjustment(
                logp, old, adv, high, alpha=pi.update(history[-1]), agg=Aggregation(num_tokens=high.sum().clamp_min(1))
            )
            loss = loss + term
        opt.zero_grad()
        loss.backward()
        opt.step()
    return history


@pytest.mark.slow
def test_entropic_tracks_a_target_on_a_tabular_policy():
    """On a tabular policy GRPO drives entropy from 0.5 towards 0 (below 0.1 on the last 100 of 240 steps);
    EntroPIC's loop aimed at 0.2 or at 0.35 holds the mean |H - target| over those steps under 0.04 (measured 0.006
    and 0.012), each at its own level, where GRPO misses both by more than 0.1. The loop's sign matters: with the
    term's sign flipped the same runs end near 0.73 (measured mean |H - target| 0.53 and 0.38).
    tau = 0.7 here, not the default 0.95: a context's entropy can only rise until its mode's probability falls
    below tau, and with 8 actions tau = 0.95 caps it near 0.3, where a wrong-signed loop would also settle. Gains
    10 / 0.5: the authors' 1 / 0.01 suit thousands of LLM steps; here, in 240 steps, they end 0.08 and 0.15 off.
    Float64; another summation order changes a sample now and then, not the tracking."""
    free = _tabular_grpo(0.2, control=False)
    assert free[0] > 0.4 and sum(free[-100:]) / 100 < 0.1
    for target in (0.2, 0.35):
        held = _tabular_grpo(target, control=True, tau=0.7)
        error = sum(abs(h - target) for h in held[-100:]) / 100
        assert error < 0.04, (target, error)
        assert sum(abs(h - target) for h in free[-100:]) / 100 > 0.1


@pytest.fixture(scope="module")
def shipped_policy():
    from entropy_rft.train.policy import load_policy

    return load_policy("countdown-tiny", torch.device("cpu"), trainable=True)[0]


@pytest.mark.slow
@pytest.mark.parametrize("micro", [0, 5])
def test_entropic_update_in_the_trainer_is_the_reweighted_gradient(micro, shipped_policy):
    """The step's update (step.Step.update) with EntroPIC's (alpha, T_hi) steps along the gradient of sum_t c_t r_t with
    c_t = -A_t / |T| on every loss token and -alpha |A_t| / |T_hi| more on the high-probability ones, computed here
    by autograd over the whole batch (SGD at lr 1, no gradient clipping, so the step is minus the gradient); with
    micro-batches of 5 rows (12 rows in all) the step is the same. float32: tolerances of a few ulps of the
    gradient's scale, summed over 12 rows."""
    import copy

    from entropy_rft.config import load_config
    from entropy_rft.core.control import Knobs, high_probability_tokens
    from entropy_rft.rollout import Rollout
    from entropy_rft.train.forward import batch_forward, policy_forward
    from entropy_rft.train.step import Decision, Step

    base = shipped_policy
    g = torch.Generator().manual_seed(5)
    prompt = torch.randint(3, 22, (12, 6), generator=g)
    pm = torch.ones(12, 6, dtype=torch.bool)
    resp = torch.randint(3, 22, (12, 8), generator=g)
    lengths = torch.randint(2, 9, (12,), generator=g)
    rm = torch.arange(8)[None] < lengths[:, None]
    resp[~rm] = 0
    ro = Rollout(prompt, pm, resp, rm, lengths == 8, [""] * 12)
    adv = torch.tensor([0.7, -1.2, 0.5, 0.0, 1.1, -0.4, 1.0, -0.3, -1.0, 0.2, 0.9, -0.8])
    cfg = load_config(
        None,
        prompts_per_step=4,
        group_size=3,
        probe_every=0,
        grad_clip=0.0,
        micro_batch_size=micro,
        entropy_target=0.5,
        entropy_control="pi",
    )  # the objective with EntroPIC's term
    base.eval()
    old = batch_forward(base, ro, 1.0, 12)[0].logp  # (B, T)
    valid = ro.response_mask
    threshold = float(old[valid].exp().median())  # about half the tokens count as high-probability
    high = high_probability_tokens(old, valid, threshold=threshold)
    alpha = 0.6
    ref = copy.deepcopy(base)
    logp = policy_forward(ref, ro, 1.0)[0].logp
    coef = (-adv[:, None] / valid.sum()) * valid - alpha * adv.abs()[:, None] / high.sum() * high
    (coef * (logp - old).exp()).sum().backward()
    model = copy.deepcopy(base)
    before = {k: v.detach().clone() for k, v in model.named_parameters()}
    step = Step(cfg, model, torch.optim.SGD(model.parameters(), lr=1.0), update_gen=torch.Generator().manual_seed(0))
    step.update(ro, Decision(adv, old, valid, valid, knobs=Knobs(alpha=alpha, high=high)))
    for name, p in model.named_parameters():
        want = ref.get_parameter(name).grad
        scale = float(want.abs().max()) + 1e-12
        torch.testing.assert_close(before[name] - p.detach(), want, atol=1e-5 * scale, rtol=1e-4)


@pytest.mark.slow
def test_trainer_runs_entropic_with_the_pi_law_on_the_logged_entropy(tmp_path):
    """entropy_control: pi logs each step's alpha, equal to the PI law on the entropies the trainer logs (the
    batch's token mean before the update), and its integral; the checkpoint holds the controller's state."""
    from entropy_rft.config import load_config
    from entropy_rft.logging import read_metrics
    from entropy_rft.train.trainer import train

    cfg = load_config(
        None,
        method="grpo",
        entropy_target=0.5,
        entropy_control="pi",
        steps=3,
        prompts_per_step=4,
        group_size=4,
        lr=1e-4,
        eval_problems=4,
        eval_k=2,
        progress=False,
        out=str(tmp_path / "pi"),
    )
    summary = train(cfg)
    rows = read_metrics(cfg.out)
    errors = [r["entropy"] - 0.5 for r in rows]
    want = [min(max(1.0 * e + 0.01 * sum(errors[:i]), -1.0), 1.0) for i, e in enumerate(errors)]
    assert [r["entropic/alpha"] for r in rows] == pytest.approx(want, rel=1e-9)
    assert rows[-1]["entropic/integral"] == pytest.approx(sum(errors), rel=1e-9)
    assert all(0 < r["entropic/high_prob_frac"] < 1 for r in rows)
    state = torch.load(f"{summary['checkpoint']}/trainer_state.pt", weights_only=False)
    assert state["control"]["integral"] == pytest.approx(sum(errors), rel=1e-9)  # checkpoint.py: the control's state
