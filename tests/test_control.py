"""Entropy targets: the mu controller's choice and the adaptive bonus."""

import math

import pytest
import torch

from entropy_rft.control import AdaptiveEntropyBonus, MuController, unit_entropy_change
from entropy_rft.dynamics import TokenStats
from entropy_rft.methods import METHODS


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
