"""The per-token step-size rule (losses.token_weights, losses.step_sizes): hand-computed values for each loss
aggregation and for GSPO's sequence-level ratio, the gradient of the real losses (autograd) as the reference, and
the predictions that use it (dynamics.corollary4_entropy_change, batch_mean_entropy_change)."""

import math

import pytest
import torch

from entropy_rft.core import losses as losses_mod
from entropy_rft.core.dynamics import batch_covariance, batch_mean_entropy_change, corollary4_entropy_change
from entropy_rft.core.losses import (
    AGG_MODES,
    Aggregation,
    gspo_loss,
    ppo_clip_loss,
    sequence_ratio,
    step_sizes,
    token_weights,
)

# two responses: three valid tokens, and one valid token then padding
MASK = torch.tensor([[True, True, True], [True, False, False]])


@pytest.mark.parametrize(
    "mode, want",
    [
        ("token-mean", 1 / 4),  # |T_B| = 4 tokens: a float
        ("seq-mean-token-mean", [[1 / 6, 1 / 6, 1 / 6], [1 / 2, 0, 0]]),  # 1 / (2 sequences x |o_b|)
        ("seq-mean-token-sum", [[1 / 2, 1 / 2, 1 / 2], [1 / 2, 0, 0]]),  # 1 / 2 sequences
        ("seq-mean-token-sum-norm", [[1 / 16, 1 / 16, 1 / 16], [1 / 16, 0, 0]]),  # 1 / (2 sequences x norm 8)
        ("token-sum", [[1, 1, 1], [1, 0, 0]]),  # no denominator (verl's token-sum at one rank)
    ],
)
def test_token_weights_by_hand(mode, want):
    """Each mode's weight of a token, computed by hand for a 3-token and a 1-token response (norm 8)."""
    w = token_weights(MASK, mode, norm=8)
    if mode == "token-mean":
        assert isinstance(w, float) and w == want
    else:
        assert torch.allclose(w, torch.tensor(want, dtype=torch.float64), rtol=1e-7, atol=0)


def test_gspo_step_carries_the_sequence_ratio_by_hand():
    """GSPO: lr w_t s_b with s_b = exp(mean log r over the response): exp(0.1) for the first row's log-ratios
    (0.3, -0.1, 0.1), exp(0.2) for the second's single 0.2; seq-mean-token-mean weights 1/6 and 1/2."""
    old = torch.zeros(2, 3)
    logp = torch.tensor([[0.3, -0.1, 0.1], [0.2, 5.0, 5.0]])  # padding values must not count
    s = sequence_ratio(logp, old, MASK)
    assert torch.allclose(s, torch.tensor([[math.exp(0.1)] * 3, [math.exp(0.2)] * 3]), rtol=1e-6)
    got = step_sizes(MASK, "seq-mean-token-mean", lr=0.5, ratio=s)
    want = torch.tensor([[0.5 / 6 * math.exp(0.1)] * 3, [0.5 / 2 * math.exp(0.2), 0, 0]], dtype=torch.float64)
    assert torch.allclose(got, want, rtol=1e-6, atol=0)


@pytest.mark.parametrize("mode", AGG_MODES)
@pytest.mark.parametrize("loss", ["ppo", "gspo"])
def test_step_sizes_are_the_losses_gradients(mode, loss):
    """For every aggregation, d loss / d log p_t = -A_t step_t / lr, with the real loss functions under autograd
    (wide clip ranges, so no token is clipped; old log p off the current one, so the ratios are not 1)."""
    gen = torch.Generator().manual_seed(0)
    mask = torch.rand(5, 7, generator=gen) < 0.7
    mask[:, 0] = True
    logp = (-torch.rand(5, 7, generator=gen)).requires_grad_()
    old = logp.detach() + 0.05 * torch.randn(5, 7, generator=gen)
    adv = torch.randn(5, generator=gen)
    counts = dict(num_tokens=float(mask.sum()) + 3, num_seqs=6.0, norm=9.0)  # global counts of a larger batch
    if loss == "ppo":
        value, _ = ppo_clip_loss(
            logp, old, adv, mask, eps_low=0.9, eps_high=9.0, dual_clip_c=None, agg=Aggregation(mode, **counts)
        )
        ratio = (logp.detach() - old).exp()
    else:
        value, _ = gspo_loss(logp, old, adv, mask, eps_low=0.9, eps_high=9.0, agg=Aggregation(mode, **counts))
        ratio = sequence_ratio(logp.detach(), old, mask)
    (grad,) = torch.autograd.grad(value, logp)
    step = step_sizes(mask, mode, lr=0.1, ratio=ratio, **counts)
    want = -adv[:, None].double() * step / 0.1
    assert torch.allclose(grad.double(), want, rtol=1e-5, atol=1e-9)


def test_predictions_with_a_constant_step_are_the_covariance_forms():
    """With the same step for every token, the per-token forms equal Corollary 4's -step Cov_T(A, S_c) and eq. 23's
    -step E_T[A S_c] (float64 against float32: within float32 rounding of sums of 40 terms)."""
    gen = torch.Generator().manual_seed(1)
    adv, s_c = torch.randn(5), torch.randn(5, 8, generator=gen)
    mask = torch.rand(5, 8, generator=gen) < 0.8
    step = torch.full((5, 8), 2e-3, dtype=torch.float64) * mask
    cov_form = -2e-3 * batch_covariance(adv[:, None].expand(5, 8), s_c, mask)
    assert float(corollary4_entropy_change(adv, s_c, mask, lr=0.0, step=step)) == pytest.approx(
        float(cov_form), rel=1e-5
    )
    eq23 = batch_mean_entropy_change(adv, s_c, mask, lr=2e-3)
    assert float(batch_mean_entropy_change(adv, s_c, mask, lr=0.0, step=step)) == pytest.approx(float(eq23), rel=1e-5)


# ---------------------------------------------------------------------------------------------------------------
# The engines' losses (losses.cispo_loss, ...): the factor each puts on d log p_t (PolicyLoss.ratio), by hand, then
# against autograd of the real loss for every aggregation it takes.

ONE = torch.tensor([[True, True, True]])


def _factor(name, logp, old, adv, **extra):
    from entropy_rft.config import TrainConfig
    from entropy_rft.core.methods import POLICY_LOSSES

    return POLICY_LOSSES.get(name).factor(logp, old, ONE, TrainConfig(), advantages=adv, **extra)


@pytest.mark.parametrize("adv", [1.0, -1.0])
def test_cispo_factor_is_the_clipped_ratio_by_hand(adv):
    """CISPO (eps 0.2 each): r = 1.5, 0.5, 1.1 weigh d log p by 1.2, 0.8, 1.1 whatever A's sign; TRL's form
    (upper_only, eps_high 5) by min(r, 5): 1.5, 0.5, 1.1."""
    old = torch.zeros(1, 3)
    logp = torch.tensor([[math.log(1.5), math.log(0.5), math.log(1.1)]])
    got = _factor("cispo", logp, old, torch.tensor([adv]))
    assert torch.allclose(got, torch.tensor([[1.2, 0.8, 1.1]]), rtol=1e-6)
    trl = losses_mod.cispo_ratio(logp, old, ONE, eps_high=5.0, upper_only=True)
    assert torch.allclose(trl, torch.tensor([[1.5, 0.5, 1.1]]), rtol=1e-6)


def test_sapo_factor_by_hand():
    """SAPO: d g / d log p = 4 s (1 - s) r with s = sigmoid(tau (r - 1)): 1 at r = 1; at r = 2 with A > 0 (tau_pos 1)
    4 sigmoid(1) (1 - sigmoid(1)) 2 = 1.5729; at r = 2 with A < 0 (tau_neg 1.05) with sigmoid(1.05)."""
    s1, s105 = 1 / (1 + math.exp(-1.0)), 1 / (1 + math.exp(-1.05))
    logp = torch.tensor([[0.0, math.log(2.0), math.log(2.0)]])
    pos = _factor("sapo", logp, torch.zeros(1, 3), torch.tensor([1.0]))
    neg = _factor("sapo", logp, torch.zeros(1, 3), torch.tensor([-1.0]))
    assert torch.allclose(pos, torch.tensor([[1.0, 8 * s1 * (1 - s1), 8 * s1 * (1 - s1)]]), rtol=1e-6)
    assert torch.allclose(neg[0, 1:], torch.tensor([8 * s105 * (1 - s105)] * 2), rtol=1e-6)


def test_dppo_tv_factor_by_hand():
    """DPPO-TV (bounds 0.2, clip_ratio_c 3): p_old 0.5 -> 0.6 with A > 0 keeps r = 1.2; 0.5 -> 0.8 (+0.3) gets 0;
    0.1 -> 0.4 (r = 4, +0.3 > 0.2) gets 0; with A < 0, 0.5 -> 0.8 keeps r = 1.6 (only falls are bounded) and 0.05 ->
    0.2 keeps min(4, 3) = 3."""
    old = torch.tensor([[0.5, 0.5, 0.1]]).log()
    pos = _factor("dppo_tv", torch.tensor([[0.6, 0.8, 0.4]]).log(), old, torch.tensor([1.0]))
    assert torch.allclose(pos, torch.tensor([[1.2, 0.0, 0.0]]), rtol=1e-6)
    neg = _factor(
        "dppo_tv", torch.tensor([[0.8, 0.2, 0.4]]).log(), torch.tensor([[0.5, 0.05, 0.5]]).log(), torch.tensor([-1.0])
    )
    assert torch.allclose(neg, torch.tensor([[1.6, 3.0, 0.8]]), rtol=1e-6)


def test_geo_mean_factor_by_hand():
    """GMPO (eps 0.2): log-ratios (0.1, -0.1, 0.5) with A > 0: the third is clipped to 0.2, so R = exp(0.2 / 3) weighs
    the first two and the third gets 0; with A < 0 the same log-ratios are unclipped (only falls below -0.2 are), so
    R = exp(0.5 / 3) weighs all three."""
    logp = torch.tensor([[0.1, -0.1, 0.5]])
    pos = _factor("geo_mean", logp, torch.zeros(1, 3), torch.tensor([1.0]))
    neg = _factor("geo_mean", logp, torch.zeros(1, 3), torch.tensor([-1.0]))
    assert torch.allclose(pos, torch.tensor([[math.exp(0.2 / 3)] * 2 + [0.0]]), rtol=1e-6)
    assert torch.allclose(neg, torch.tensor([[math.exp(0.5 / 3)] * 3]), rtol=1e-6)


def test_erc_factor_by_hand():
    """ERC (band 0.95 < H / H_old < 1.05, eps 0.2): r = 1.1 inside the band weighs by 1.1; the same token with
    H / H_old = 1.1 gets 0; r = 1.5 with A > 0 is PPO-clipped and gets 0."""
    old = torch.zeros(1, 3)
    logp = torch.tensor([[math.log(1.1), math.log(1.1), math.log(1.5)]])
    h_old = torch.ones(1, 3)
    h = torch.tensor([[1.0, 1.1, 1.0]])
    got = _factor("erc", logp, old, torch.tensor([1.0]), entropy=h, old_entropy=h_old)
    assert torch.allclose(got, torch.tensor([[1.1, 0.0, 0.0]]), rtol=1e-6)


@pytest.mark.parametrize("name", ["cispo", "sapo", "dppo_tv", "dppo_kl", "geo_mean", "erc"])
def test_engine_losses_step_sizes_are_their_gradients(name):
    """For each loss and every aggregation it takes (SAPO and GMPO their own), d loss / d log p_t = -A_t step_t / lr
    with step = step_sizes(mask, agg, ratio=the loss's factor), the real loss under autograd in float64: log-ratios
    spread enough that clips, trust regions, truncation and ERC's band all act, advantages of both signs and zero."""
    from entropy_rft.config import TrainConfig
    from entropy_rft.core.methods import POLICY_LOSSES

    spec, cfg = POLICY_LOSSES.get(name), TrainConfig()
    gen = torch.Generator().manual_seed(0)
    mask = torch.rand(6, 7, generator=gen) < 0.7
    mask[:, 0] = True
    logp = (-torch.rand(6, 7, generator=gen, dtype=torch.float64) * 2).requires_grad_()
    old = logp.detach() + 0.4 * torch.randn(6, 7, generator=gen, dtype=torch.float64)
    adv = torch.randn(6, generator=gen, dtype=torch.float64)
    adv[2] = 0.0
    h = torch.rand(6, 7, generator=gen, dtype=torch.float64) + 0.5
    extra = {"entropy": h, "old_entropy": h * (1 + 0.1 * torch.randn(6, 7, generator=gen, dtype=torch.float64))}
    for mode in [spec.agg] if spec.agg else AGG_MODES:
        counts = dict(num_tokens=float(mask.sum()) + 3, num_seqs=7.0, norm=9.0)
        value, _ = spec.loss(logp, old, adv, mask, cfg, agg=Aggregation(mode, **counts), **extra)
        (grad,) = torch.autograd.grad(value, logp)
        factor = spec.factor(logp.detach(), old, mask, cfg, advantages=adv, **extra)
        kept = factor[mask]
        assert (kept != 0).any() and (kept != 1).any()  # not the on-policy step
        if name in ("dppo_tv", "dppo_kl", "geo_mean", "erc"):
            assert (kept == 0).any()  # the trust region, the clip or the band removes some token's gradient
        step = step_sizes(mask, mode, lr=0.1, ratio=factor, **counts)
        # GMPO's sequence advantage is mean(A) over the row with + 1e-8 in the count: 1e-8 relative
        torch.testing.assert_close(
            grad, -adv[:, None] * step / 0.1, rtol=1e-7 if name == "geo_mean" else 1e-12, atol=1e-15
        )
