"""Properties of the token filters and of the update they feed: batch-level statistics, exact counts,
micro-batch invariance, masked positions."""

import pytest
import torch

from entropy_rft.core.losses import Aggregation, aggregate, ppo_clip_loss
from entropy_rft.core.masks import clip_b, clip_v, clipped_fractions, s_sign


def batch(seed=0, b=16, t=12):
    g = torch.Generator().manual_seed(seed)
    s = torch.randn(b, t, generator=g) * 0.1
    s[0, 0], s[3, 2], s[9, 5] = -2.0, -1.5, 1.8  # outliers
    adv = torch.randn(b, generator=g)
    lengths = torch.randint(3, t + 1, (b,), generator=g)
    mask = torch.arange(t).unsqueeze(0) < lengths.unsqueeze(1)
    return s, adv, mask


def loop_clip_b(s, adv, mask, mu, mu_plus=None, side="negative"):
    """Reference Clip_B: a Python loop over tokens with float64 batch statistics."""
    vals = [float(s[i, j]) for i in range(s.shape[0]) for j in range(s.shape[1]) if mask[i, j]]
    mean = sum(vals) / len(vals)
    std = (sum((v - mean) ** 2 for v in vals) / len(vals)) ** 0.5
    keep = torch.zeros_like(mask)
    for i in range(s.shape[0]):
        for j in range(s.shape[1]):
            if not mask[i, j]:
                continue
            a = float(adv[i])
            on_side = {"negative": a < 0, "positive": a > 0, "all": True}[side]
            d = float(s[i, j]) - mean
            out = d < -mu * std or (mu_plus is not None and d > mu_plus * std)
            keep[i, j] = not (on_side and out)
    return keep


@pytest.mark.parametrize("mu,mu_plus,side", [(2.5, None, "negative"), (1.0, 1.0, "all"), (0.5, 2.0, "positive")])
def test_clip_b_equals_loop_reference(mu, mu_plus, side):
    """clip_b (one- and two-sided, each side) equals a token loop with float64 batch statistics."""
    s, adv, mask = batch()
    keep, _ = clip_b(s, adv, mask, mu=mu, mu_plus=mu_plus, side=side)
    assert torch.equal(keep, loop_clip_b(s, adv, mask, mu, mu_plus, side))


def test_padded_positions_never_change_the_mask():
    """Values at padded positions (mask False) change neither keep nor metrics."""
    s, adv, mask = batch()
    s2 = s.clone()
    s2[~mask] = 1e3
    for fn, kw in ((clip_b, {}), (clip_v, {"mu": 1.0, "max_frac": 0.05})):
        k1, m1 = fn(s, adv, mask, **kw)
        k2, m2 = fn(s2, adv, mask, **kw)
        assert torch.equal(k1, k2) and m1 == m2
        assert not (k1 & ~mask).any()


def test_clip_v_cap_counts_are_exact():
    """With many violators the cap clips exactly max(int(max_frac n), 1) non-zero-advantage tokens, the ones
    with the largest |S_c|."""
    s, adv, mask = batch()
    s = -s.abs()  # every token is on the low side
    n = int(mask.sum())
    keep, _ = clip_v(s, adv.abs() * -1, mask, mu=0.1, max_frac=0.05)
    clipped = mask & ~keep
    k = max(int(0.05 * n), 1)
    assert int(clipped.sum()) == k
    assert float(s[clipped].abs().min()) >= float(s[mask & keep].abs().max())


def test_clip_v_zero_advantage_option():
    """Zero-advantage tokens are clipped by default (authors' code) and kept with clip_zero_advantage=False."""
    s, _, mask = batch()
    adv = torch.zeros(s.shape[0])
    keep, _ = clip_v(s, adv, mask, mu=1.0, max_frac=None)
    assert not keep[0, 0]
    keep, _ = clip_v(s, adv, mask, mu=1.0, max_frac=None, clip_zero_advantage=False)
    assert torch.equal(keep, mask)


def test_bad_mu_raises():
    """Negative and NaN thresholds are rejected by name; mu = 0 is accepted (test_oracles checks what it does)."""
    s, adv, mask = batch()
    with pytest.raises(ValueError, match="mu must be >= 0"):
        clip_b(s, adv, mask, mu=-0.5)
    with pytest.raises(ValueError, match="mu must be >= 0"):
        clip_v(s, adv, mask, mu=float("nan"))
    with pytest.raises(ValueError, match="mu_plus must be >= 0"):
        clip_v(s, adv, mask, mu_plus=-1.0)
    with pytest.raises(ValueError, match="max_frac"):
        clip_v(s, adv, mask, max_frac=0.0)
    for fn in (clip_b, clip_v):
        keep, _ = fn(s, adv, mask, mu=0.0)
        assert (mask & ~keep).any()  # mu = 0 clips the negative-sample tokens below the mean


@pytest.mark.parametrize("fn", [clip_b, clip_v])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_score_at_a_valid_token_raises_naming_it(fn, bad):
    """One NaN (or inf) score at a valid token raises an error naming its (row, position); before, the NaN made
    the batch mean and std NaN, every comparison false, and the filter kept every token without a word."""
    s, adv, mask = batch()
    s[2, 1] = bad
    with pytest.raises(ValueError, match=r"not finite at 1 valid token.*\(2, 1\)"):
        fn(s, adv, mask)


@pytest.mark.parametrize("fn", [clip_b, clip_v])
def test_non_finite_score_at_a_padded_position_changes_nothing(fn):
    """A NaN at a padded position neither raises nor reaches the batch statistics."""
    s, adv, mask = batch()
    s2 = s.clone()
    s2[~mask] = float("nan")
    kw = {"mu": 1.0, "max_frac": 0.05} if fn is clip_v else {}
    k1, m1 = fn(s, adv, mask, **kw)
    k2, m2 = fn(s2, adv, mask, **kw)
    assert torch.equal(k1, k2) and m1 == m2 and (mask & ~k1).any()


def test_clip_v_positive_side_never_clips_zero_advantage():
    """clip_v(side="positive") filters A > 0 only: zero-advantage tokens count as negative (docstring), so they
    are kept on the positive side whatever clip_zero_advantage says; A > 0 violators are still clipped."""
    s, _, mask = batch()
    adv = torch.zeros(s.shape[0])
    adv[4:] = 1.0
    s = s.clone()
    s[1, 0] = -3.0  # a violator in a zero-advantage row
    s[5, 0] = -3.0  # and one in a positive row
    keep, _ = clip_v(s, adv, mask, mu=1.0, max_frac=None, side="positive")
    assert keep[1, 0] and not keep[5, 0]
    zero_rows = adv == 0
    assert torch.equal(keep[zero_rows], mask[zero_rows])


@pytest.mark.parametrize("action", ["retain", "mask"])
@pytest.mark.parametrize("sign", ["positive", "negative"])
@pytest.mark.parametrize("samples", ["positive", "negative"])
def test_s_sign_selection(action, sign, samples):
    """Figure 1 filters select exactly the tokens with the given S* sign in the given samples."""
    s, adv, mask = batch()
    keep, metrics = s_sign(s, adv, mask, action=action, sign=sign, samples=samples)
    a = adv.unsqueeze(-1).expand_as(s)
    sel = mask & ((a > 0) if samples == "positive" else (a < 0)) & ((s > 0) if sign == "positive" else (s < 0))
    assert torch.equal(keep, sel if action == "retain" else mask & ~sel)
    assert 0.0 <= metrics["frac_clipped"] <= 1.0


def test_clipped_fractions_empty_side():
    """clipped_fractions reports 0 for a side without tokens (the authors' metric would read 1.0)."""
    mask = torch.ones(2, 3, dtype=torch.bool)
    keep = mask.clone()
    keep[0, 0] = False
    f = clipped_fractions(mask, keep, torch.tensor([1.0, 2.0]))
    assert f == {
        "frac_clipped": pytest.approx(1 / 6),
        "frac_clipped_pos": pytest.approx(1 / 6),
        "frac_clipped_neg": 0.0,
    }


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"])
@pytest.mark.parametrize("method", ["clip_b", "clip_v"])
def test_micro_batches_change_no_mask_and_no_gradient(agg, method):
    """Masks computed on the whole batch, then the loss summed over micro-batches with global denominators,
    give the same gradient as one full-batch loss; the mask never depends on the micro-batch split."""
    s, adv, mask = batch(b=12)
    fn = clip_b if method == "clip_b" else clip_v
    kw = {"mu": 1.0} if method == "clip_b" else {"mu": 1.0, "max_frac": 0.05}
    keep, _ = fn(s, adv, mask, **kw)
    g = torch.Generator().manual_seed(3)
    old = torch.randn(12, 12, generator=g) * 0.3 - 1
    new = (old + torch.randn(12, 12, generator=g) * 0.2).requires_grad_()
    loss_mask = mask & keep
    n_tok, n_seq = loss_mask.sum(), (loss_mask.sum(-1) > 0).sum()
    full, _ = ppo_clip_loss(new, old, adv, loss_mask, agg=Aggregation(agg, n_tok, n_seq, norm=16))
    (g_full,) = torch.autograd.grad(full, new)
    total = 0.0
    for rows in (slice(0, 5), slice(5, 7), slice(7, 12)):
        k_micro, _ = fn(s, adv, mask, **kw)  # recomputed per micro-batch from the whole batch: identical
        assert torch.equal(k_micro, keep)
        part, _ = ppo_clip_loss(
            new[rows], old[rows], adv[rows], loss_mask[rows], agg=Aggregation(agg, n_tok, n_seq, norm=16)
        )
        total = total + part
    (g_micro,) = torch.autograd.grad(total, new)
    torch.testing.assert_close(g_micro, g_full, atol=1e-7, rtol=1e-5)
    torch.testing.assert_close(total, full)


def test_aggregate_loop_reference():
    """Each aggregation mode equals its definition written as a loop over sequences."""
    x = torch.randn(4, 6)
    m = torch.tensor([[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1], [0] * 6, [1, 0, 0, 0, 0, 0]], dtype=torch.bool)
    rows = [[float(x[i, j]) for j in range(6) if m[i, j]] for i in range(4)]
    rows = [r for r in rows if r]
    assert float(aggregate(x, m, "token-mean")) == pytest.approx(sum(map(sum, rows)) / sum(map(len, rows)), rel=1e-5)
    assert float(aggregate(x, m, "seq-mean-token-mean")) == pytest.approx(
        sum(sum(r) / len(r) for r in rows) / 3, rel=1e-5
    )
    assert float(aggregate(x, m, "seq-mean-token-sum")) == pytest.approx(sum(map(sum, rows)) / 3, rel=1e-5)
    assert float(aggregate(x, m, "token-sum")) == pytest.approx(sum(map(sum, rows)), rel=1e-5)
    norm = 16  # the generation budget (max_new_tokens), a constant, not the padded width 6
    assert float(aggregate(x, m, "seq-mean-token-sum-norm", norm=norm)) == pytest.approx(
        sum(map(sum, rows)) / 3 / norm, rel=1e-5
    )
    with pytest.raises(ValueError, match="unknown loss aggregation"):
        aggregate(x, m, "token-product")


def test_dr_grpo_norm_is_a_constant_not_the_padded_width():
    """Dr. GRPO's seq-mean-token-sum-norm divides by a constant: without one it raises (it used to divide by the
    padded width), and the same tokens padded to width 5 and to width 16 give the same loss."""
    x = torch.randn(3, 5)
    m = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]], dtype=torch.bool)
    with pytest.raises(ValueError, match="norm= the generation budget"):
        aggregate(x, m, "seq-mean-token-sum-norm")
    wide_x = torch.cat([x, torch.randn(3, 11)], dim=1)
    wide_m = torch.cat([m, torch.zeros(3, 11, dtype=torch.bool)], dim=1)
    narrow = aggregate(x, m, "seq-mean-token-sum-norm", norm=16)
    torch.testing.assert_close(aggregate(wide_x, wide_m, "seq-mean-token-sum-norm", norm=16), narrow)


def test_k3_kl_penalty_definition():
    """k3 = exp(ref - logp) - (ref - logp) - 1 >= 0, zero when the policies agree; k1 = logp - ref."""
    from entropy_rft.core.losses import kl_penalty

    logp, ref = torch.randn(3, 5) - 2, torch.randn(3, 5) - 2
    d = (ref - logp).double()
    torch.testing.assert_close(kl_penalty(logp, ref).double(), d.exp() - d - 1, atol=1e-6, rtol=1e-5)
    assert (kl_penalty(logp, ref) >= 0).all() and kl_penalty(logp, logp).abs().max() == 0
    torch.testing.assert_close(kl_penalty(logp, ref, kind="k1"), logp - ref)


def test_on_policy_loss_gradient_is_minus_advantage_over_tokens():
    """Strict on-policy (logp == old_logp): ratio 1, no clipping, d loss / d logp = -A / n_tokens on kept tokens
    and 0 on masked ones (masked tokens leave numerator and denominator)."""
    logp = torch.randn(3, 4).requires_grad_()
    adv = torch.tensor([1.0, -2.0, 0.5])
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]], dtype=torch.bool)
    loss, m = ppo_clip_loss(logp, logp.detach(), adv, mask)
    loss.backward()
    want = -adv.unsqueeze(-1).expand(3, 4) * mask / mask.sum()
    torch.testing.assert_close(logp.grad, want)
    assert float(m["clipfrac"]) == 0.0 and float(m["ratio_mean"]) == pytest.approx(1.0)


def test_method_apply_no_cap_reaches_clip_v_as_none():
    """Through METHODS, max_frac=NO_CAP clips every Clip_V violator (clip_v with max_frac=None), while a plain
    None still means the method's default cap (1e-4, here k = 1 token): the case has many violators, so the
    two differ."""
    from entropy_rft.core.dynamics import TokenStats
    from entropy_rft.core.methods import METHODS, NO_CAP

    s, adv, mask = batch()
    s = -s.abs()  # every token is on the low side: many violators at mu = 0.1
    zeros = torch.zeros_like(s)
    stats = TokenStats(zeros, zeros, s, zeros)  # s_centered = s
    neg = -adv.abs()
    method = METHODS.get("clip_v")
    uncapped, _ = clip_v(s, neg, mask, mu=0.1, max_frac=None)
    capped, _ = clip_v(s, neg, mask, mu=0.1, max_frac=1e-4)
    assert int((mask & ~uncapped).sum()) > int((mask & ~capped).sum()) == 1
    assert torch.equal(method.apply(stats, neg, mask, mu=0.1, max_frac=NO_CAP)[0], uncapped)
    assert torch.equal(method.apply(stats, neg, mask, mu=0.1, max_frac=None)[0], capped)
    assert torch.equal(method.apply(stats, neg, mask, mu=0.1)[0], capped)
