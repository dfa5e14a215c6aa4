"""The per-token step-size rule (losses.token_weights, losses.step_sizes): hand-computed values for each loss
aggregation and for GSPO's sequence-level ratio, the gradient of the real losses (autograd) as the reference, and
the predictions that use it (dynamics.corollary4_entropy_change, batch_mean_entropy_change)."""

import math

import pytest
import torch

from entropy_rft.dynamics import batch_covariance, batch_mean_entropy_change, corollary4_entropy_change
from entropy_rft.losses import AGG_MODES, gspo_loss, ppo_clip_loss, sequence_ratio, step_sizes, token_weights

# two responses: three valid tokens, and one valid token then padding
MASK = torch.tensor([[True, True, True], [True, False, False]])


@pytest.mark.parametrize("mode, want", [
    ("token-mean", 1 / 4),  # |T_B| = 4 tokens: a float
    ("seq-mean-token-mean", [[1 / 6, 1 / 6, 1 / 6], [1 / 2, 0, 0]]),  # 1 / (2 sequences x |o_b|)
    ("seq-mean-token-sum", [[1 / 2, 1 / 2, 1 / 2], [1 / 2, 0, 0]]),  # 1 / 2 sequences
    ("seq-mean-token-sum-norm", [[1 / 16, 1 / 16, 1 / 16], [1 / 16, 0, 0]]),  # 1 / (2 sequences x norm 8)
])
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
        value, _ = ppo_clip_loss(logp, old, adv, mask, eps_low=0.9, eps_high=9.0, dual_clip_c=None, agg=mode, **counts)
        ratio = (logp.detach() - old).exp()
    else:
        value, _ = gspo_loss(logp, old, adv, mask, eps_low=0.9, eps_high=9.0, agg=mode, **counts)
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
    assert float(corollary4_entropy_change(adv, s_c, mask, lr=0.0, step=step)) == pytest.approx(float(cov_form),
                                                                                                rel=1e-5)
    eq23 = batch_mean_entropy_change(adv, s_c, mask, lr=2e-3)
    assert float(batch_mean_entropy_change(adv, s_c, mask, lr=0.0, step=step)) == pytest.approx(float(eq23), rel=1e-5)
