"""The target gate of Clip_B and Clip_V (masks.entropy_gate, STARE's closed-loop gate: hp-luo/STARE's
STAREController.update sets gate_on = 1[H_bar < target_entropy] from the batch's token-mean entropy): the filter
acts exactly on the batches whose mean entropy is below the target, off by default, through the method registry,
the config and a real training step."""

from __future__ import annotations

import math

import pytest
import torch
from tiny import tiny_config

from entropy_rft.config import load_config
from entropy_rft.core import masks
from entropy_rft.core.dynamics import TokenStats
from entropy_rft.core.methods import METHODS
from entropy_rft.logging import read_metrics
from entropy_rft.train.trainer import train


def batch(seed: int = 0, b: int = 8, t: int = 10):
    """Statistics where Clip_B at mu 0.5 and Clip_V at mu 0.5 (no cap) clip tokens on negative rows."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(b, t, generator=g) < 0.8
    mask[:, 0] = True
    stats = TokenStats(
        -torch.rand(b, t, generator=g),
        torch.rand(b, t, generator=g),
        torch.randn(b, t, generator=g),
        0.1 * torch.randn(b, t, generator=g),
    )
    adv = torch.randn(b, generator=g)
    return stats, adv, mask


def mean_entropy64(stats: TokenStats, mask: torch.Tensor) -> float:
    """The batch's mean entropy over the valid tokens, a Python loop in float64."""
    values = [float(stats.entropy[i, j]) for i in range(mask.shape[0]) for j in range(mask.shape[1]) if mask[i, j]]
    return math.fsum(values) / len(values)


@pytest.mark.parametrize("name, options", [("clip_b", {"mu": 0.5}), ("clip_v", {"mu": 0.5, "max_frac": "none"})])
def test_gate_opens_exactly_below_the_target(name, options):
    """Below the target (H_bar < target, strictly, as STAREController) the gated keep mask is the filter's own; at or
    above it every valid token is kept and the fractions read 0; the gate's metrics give H_bar (float64 loop, to
    float32 rounding) and whether it opened; without entropy_gate the method is unchanged (off by default)."""
    stats, adv, mask = batch()
    method = METHODS.get(name)
    plain, plain_metrics = method.apply(stats, adv, mask, **options)
    assert (mask & ~plain).any()  # the filter does clip on this batch
    h = mean_entropy64(stats, mask)
    for target, opens in ((h + 1e-3, True), (h - 1e-3, False), (10.0, True), (1e-3, False)):
        keep, metrics = method.apply(stats, adv, mask, entropy_gate=target, **options)
        assert metrics["gate_open"] == float(opens)
        assert metrics["gate_entropy"] == pytest.approx(h, rel=1e-6)
        if opens:
            assert torch.equal(keep, plain) and metrics["frac_clipped"] == plain_metrics["frac_clipped"]
        else:
            assert torch.equal(keep, mask) and metrics["frac_clipped"] == 0.0
        assert not (keep & ~mask).any()
    again, again_metrics = method.apply(stats, adv, mask, entropy_gate=None, **options)
    assert torch.equal(again, plain) and "gate_open" not in again_metrics


def test_gate_is_strict_at_the_target():
    """H_bar equal to the target keeps the gate closed (STARE: current_ent < target_entropy)."""
    mask = torch.ones(2, 3, dtype=torch.bool)
    entropy = torch.full((2, 3), 0.25)
    keep = torch.zeros(2, 3, dtype=torch.bool)
    got, metrics = masks.entropy_gate(keep, torch.tensor([1.0, -1.0]), mask, entropy, target=0.25)
    assert metrics["gate_open"] == 0.0 and torch.equal(got, mask)
    got, metrics = masks.entropy_gate(keep, torch.tensor([1.0, -1.0]), mask, entropy, target=0.2500001)
    assert metrics["gate_open"] == 1.0 and not got.any()


@pytest.mark.parametrize("bad", [0.0, -0.3, math.inf, math.nan, True])
def test_gate_refuses_a_target_that_is_not_a_positive_entropy(bad):
    stats, adv, mask = batch()
    with pytest.raises(ValueError, match="entropy_gate must be a finite entropy > 0"):
        METHODS.get("clip_b").apply(stats, adv, mask, entropy_gate=bad)


def test_gate_options_and_config_checks(tmp_path):
    """The gated methods list entropy_gate among their options (the adapters check options against this list);
    the config refuses it for a method without a gated filter, and a value <= 0, each in one line naming it."""
    compositions = {"stare+clip_b", "grpo_dropout+clip_b", "entrocraft+clip_b", "tre_k+clip_b"}  # Clip_B's filter
    assert {n for n in METHODS if METHODS.get(n).gated} == {
        "clip_b",
        "clip_v",
        "ppo_clip_b",
        "ppo_clip_v",
    } | compositions
    assert "entropy_gate" in METHODS.get("clip_v").option_names()
    assert "entropy_gate" not in METHODS.get("forking").option_names()
    with pytest.raises(ValueError, match="entropy_gate gates a filter of clip_b, clip_v"):
        load_config(None, method="grpo", entropy_gate=0.3, out=str(tmp_path / "a"))
    with pytest.raises(ValueError, match="entropy_gate"):
        load_config(None, method="clip_b", entropy_gate=0.0, out=str(tmp_path / "b"))


@pytest.mark.slow
def test_gate_in_training_steps(tmp_path):
    """Clip_B (mu 0.5) on the shipped policy for 2 steps: with a gate far above the policy's entropy every step is
    exactly the ungated run's (same metrics, bit for bit, gate_open 1); with a gate far below it nothing is
    clipped on any step (clip_frac 0, gate_open 0), and filter/gate_entropy is the step's logged entropy."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        runs = {}
        for name, gate in (("plain", None), ("high", 100.0), ("low", 1e-6)):
            cfg = tiny_config(tmp_path, name, method="clip_b", mu=0.5, entropy_gate=gate)
            train(cfg)
            runs[name] = read_metrics(cfg.out)
    finally:
        torch.set_num_threads(threads)
    skip = ("seconds", "time/", "filter/gate_")
    for plain, high, low in zip(runs["plain"], runs["high"], runs["low"]):
        same = {k: v for k, v in plain.items() if not k.startswith(skip)}
        assert same == {k: v for k, v in high.items() if not k.startswith(skip)}
        assert high["filter/gate_open"] == 1.0 and low["filter/gate_open"] == 0.0
        assert low["clip_frac"] == 0.0 and low["filter/gate_entropy"] == pytest.approx(low["entropy"], rel=1e-6)
    assert any(row["clip_frac"] > 0 for row in runs["plain"])  # the filter clips when the gate is open
