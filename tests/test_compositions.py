"""Compositions of Clip_B with the field's rules (stare+clip_b, grpo_dropout+clip_b, entrocraft+clip_b, tre_k+clip_b):
each is Clip_B's keep mask composed with the other rule as the step orders them, checked against the pieces on a
fixed batch; each trains by name, and the mu controller steers Clip_B's mu inside them."""

from __future__ import annotations

import pytest
import torch
from tiny import tiny_config

from entropy_rft.core import masks
from entropy_rft.core.dynamics import TokenStats
from entropy_rft.core.methods import METHODS
from entropy_rft.logging import read_metrics
from entropy_rft.train.trainer import train


def _batch(seed: int = 0, b: int = 8, t: int = 10):
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(b, t, generator=g) < 0.8
    mask[:, 0] = True
    logp = -torch.rand(b, t, generator=g) * 3
    stats = TokenStats(logp, torch.rand(b, t, generator=g), torch.randn(b, t, generator=g), torch.zeros(b, t))
    adv = torch.randn(b, generator=g)
    return stats, adv, mask


def test_composed_methods_are_their_pieces():
    """stare+clip_b: Clip_B's keep at mu 0.5 and STARE's weights ranked over it (its gate open); the composed
    method's options go to the piece that takes them (mu to Clip_B, top_p_ratio to STARE), never both."""
    stats, adv, mask = _batch()
    spec = METHODS.get("stare+clip_b")
    keep, _ = spec.apply(stats, adv, mask, mu=0.5, top_p_ratio=0.3, entropy_gate=None)
    want, _ = masks.clip_b(stats.s_star, adv, mask, mu=0.5)
    assert torch.equal(keep, want) and (mask & ~keep).any()
    w, _ = spec.weights(stats, adv, mask & keep, mu=0.5, top_p_ratio=0.3, entropy_gate=100.0)
    ref, _ = masks.stare_weights(stats.logp, adv, mask & keep, stats.entropy, top_p_ratio=0.3, entropy_gate=100.0)
    assert torch.equal(w, ref) and bool((w != 1).any())
    assert set(METHODS.get("grpo_dropout+clip_b").option_names()) >= {"mu", "side", "basis", "recenter", "entropy_gate"}


@pytest.mark.slow
@pytest.mark.parametrize(
    ("method", "extra"),
    [
        ("stare+clip_b", {"mu": 1.0, "entropy_gate": 100.0}),
        ("grpo_dropout+clip_b", {"mu": 1.0}),
        ("entrocraft+clip_b", {"mu": 1.0}),
        ("grpo_dropout+clip_b", {"entropy_target": 0.3, "entropy_control": "mu"}),
        ("stare+clip_b", {"entropy_target": 0.3, "entropy_control": "mu", "entropy_gate": 100.0}),
    ],
)
def test_compositions_train_by_name(tmp_path, method, extra):
    """Two steps of each composition on the shipped policy: Clip_B's metrics and the other rule's are both logged
    (the mu controller's mu and kappa where it steers)."""
    cfg = tiny_config(tmp_path, method=method, group_size=8, **extra)
    train(cfg)
    rows = read_metrics(cfg.out)
    assert len(rows) == 2
    # the controller starts at mu = inf (no clipping, no Clip_B metrics) until it has seen a step
    assert "filter/frac_clipped" in rows[-1] or "entropy_target" in extra
    other = {"stare+clip_b": "filter/mean_weight", "grpo_dropout+clip_b": "filter/rollouts_kept_frac"}
    other["entrocraft+clip_b"] = "filter/regime"
    assert other[method] in rows[-1]
    if "entropy_target" in extra:
        assert "filter/mu" in rows[-1] and "filter/kappa" in rows[-1]
