"""RSI-S (arXiv 2606.31575) as method "rsi": masks.rsi_band against the port's own compute_rsi_selection run on
fixed inputs (tests/fixtures/rsi_oracle.json; smellslikeml/open-instruct, the only public code) and against a
float64 loop; RSI > 1 exactly where S* < 0; the method by name in the trainer; its options range-checked."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import f32, load_fixture
from tiny import tiny_config

from entropy_rft.config import load_config
from entropy_rft.core import masks
from entropy_rft.core.dynamics import TokenStats, token_stats
from entropy_rft.core.methods import METHODS
from entropy_rft.logging import read_metrics
from entropy_rft.train.trainer import train

ORACLE = load_fixture("rsi_oracle.json")


def stats_of(logp: torch.Tensor, entropy: torch.Tensor) -> TokenStats:
    zeros = torch.zeros_like(logp)
    return TokenStats(logp, entropy, zeros, zeros)


@pytest.mark.parametrize("case", ORACLE["cases"], ids=lambda c: c["name"])
def test_keep_mask_equals_the_ports_code(case):
    """On each fixed input (a band, only an upper or a lower bound, zero entropies, another eps) the keep mask equals
    the port's weights exactly (the same float32 arithmetic) and the dropped fractions equal its metrics' means; the
    port's 0.0 (that side off) is None here, and its 0 / 0 (everything kept) is refused as no band."""
    p, inputs = case["params"], case["inputs"]
    mask = torch.tensor(inputs["response_mask"]).bool()
    stats = stats_of(f32(inputs["logprobs"]), f32(inputs["entropy"]))
    bounds = {
        "rsi_lower_bound": p["lower_bound"] or None,
        "rsi_upper_bound": p["upper_bound"] or None,
        **({"eps": p["eps"]} if "eps" in p else {}),
    }
    if bounds["rsi_lower_bound"] is None and bounds["rsi_upper_bound"] is None:
        assert torch.equal(f32(case["outputs"]["weights"]).bool(), mask)  # the port keeps every valid token
        with pytest.raises(ValueError, match="RSI-S needs a band"):
            masks.rsi_band(stats, torch.ones(mask.shape[0]), mask, **bounds)
        return
    keep, metrics = masks.rsi_band(stats, torch.ones(mask.shape[0]), mask, **bounds)
    assert torch.equal(keep, f32(case["outputs"]["weights"]).bool())
    theirs = case["outputs"]["metrics_mean_over_mask"]
    assert metrics["rsi_drop_low"] == pytest.approx(theirs["val/rsi_drop_low_frac"], abs=1e-6)
    assert metrics["rsi_drop_high"] == pytest.approx(theirs["val/rsi_drop_high_frac"], abs=1e-6)
    assert metrics["frac_clipped"] == pytest.approx(1 - theirs["val/rsi_keep_frac"], abs=1e-6)


@pytest.mark.parametrize("seed", range(5))
def test_keep_mask_equals_a_float64_loop(seed):
    """Random batches: a token is kept iff it is valid and lower <= -log p / (H + eps) <= upper, computed token by
    token in float64, except within float32 rounding (4 u32) of a bound, where either answer is right."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(6, 9, generator=g) < 0.75
    logp, entropy = -torch.rand(6, 9, generator=g) * 3, torch.rand(6, 9, generator=g) * 2
    lower, upper = [(0.2, 2.0), (None, 1.0), (0.5, None), (0.0, 0.7), (1.0, 4.0)][seed]
    keep, _ = masks.rsi_band(
        stats_of(logp, entropy), torch.randn(6), mask, rsi_lower_bound=lower, rsi_upper_bound=upper
    )
    for i in range(6):
        for j in range(9):
            rsi = -float(logp[i, j]) / (float(entropy[i, j]) + 1e-6)
            near = any(b is not None and abs(rsi - b) <= 4 * 2.0**-24 * max(abs(b), 1.0) for b in (lower, upper))
            if near:
                continue
            inside = (lower is None or rsi >= lower) and (upper is None or rsi <= upper)
            assert bool(keep[i, j]) == (bool(mask[i, j]) and inside), (i, j, rsi)


def test_rsi_above_one_exactly_where_s_star_is_negative():
    """RSI = -log p / H > 1 iff log p < -H iff S* = p (H + log p) < 0 (float64 statistics of random logits; tokens
    within 1e-9 of the boundary skipped)."""
    g = torch.Generator().manual_seed(0)
    z = torch.randn(400, 30, generator=g, dtype=torch.float64) * 2
    t = torch.multinomial(z.softmax(-1), 1, generator=g).squeeze(-1)
    st = token_stats(z, t)
    rsi = -st.logp / st.entropy
    clear = (st.entropy + st.logp).abs() > 1e-9
    assert torch.equal((rsi > 1)[clear], (st.s_star < 0)[clear]) and bool(clear.sum() > 390)


def test_options_are_checked(tmp_path):
    """A band is required (no published default) and well-formed; the options belong to method rsi only."""
    stats = stats_of(-torch.rand(2, 3), torch.rand(2, 3))
    mask = torch.ones(2, 3, dtype=torch.bool)
    for bad, match in (
        ({"rsi_lower_bound": -0.1}, "rsi_lower_bound"),
        ({"rsi_upper_bound": math.inf}, "rsi_upper_bound"),
        ({"rsi_lower_bound": 2.0, "rsi_upper_bound": 1.0}, "below"),
        ({"rsi_upper_bound": 1.0, "eps": 0.0}, "eps"),
    ):
        with pytest.raises(ValueError, match=match):
            masks.rsi_band(stats, torch.ones(2), mask, **bad)
    assert set(METHODS.get("rsi").option_names()) == {"rsi_lower_bound", "rsi_upper_bound", "eps"}
    with pytest.raises(ValueError, match="method 'rsi' needs a band"):
        load_config(None, method="rsi", out=str(tmp_path / "a"))
    with pytest.raises(ValueError, match="rsi_upper_bound is an option of method 'rsi'"):
        load_config(None, method="grpo", rsi_upper_bound=2.0, out=str(tmp_path / "b"))
    with pytest.raises(ValueError, match="below"):
        load_config(None, method="rsi", rsi_lower_bound=2.0, rsi_upper_bound=1.0, out=str(tmp_path / "c"))


@pytest.mark.slow
def test_rsi_trains_by_name(tmp_path):
    """`--method rsi --set rsi_lower_bound=0.05 rsi_upper_bound=1.5` on the shipped policy for 2 steps: each step's
    keep mask is masks.rsi_band over the whole batch with the behaviour policy's statistics (captured at the
    decision), it drops tokens, and the logged clip fraction and drop fractions are its."""
    from entropy_rft.train import step as step_module

    seen = []
    real_stats, real_decide = step_module.Step.statistics, step_module.Step.decide

    def decide(self, batch, behaviour):
        decision = real_decide(self, batch, behaviour)
        seen.append((behaviour.stats, batch.rollout.response_mask, decision))
        return decision

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        step_module.Step.decide = decide
        cfg = tiny_config(tmp_path, "rsi", method="rsi", rsi_lower_bound=0.05, rsi_upper_bound=1.5)
        train(cfg)
    finally:
        step_module.Step.decide = real_decide
        torch.set_num_threads(threads)
    assert real_stats is step_module.Step.statistics
    rows = read_metrics(cfg.out)
    for (stats, mask, decision), row in zip(seen, rows):
        want, metrics = masks.rsi_band(stats, decision.adv, mask, rsi_lower_bound=0.05, rsi_upper_bound=1.5)
        assert torch.equal(decision.keep & mask, want)
        assert row["filter/rsi_drop_high"] == pytest.approx(metrics["rsi_drop_high"], rel=1e-6)
        assert row["clip_frac"] == pytest.approx(float((mask & ~want).sum() / mask.sum()), rel=1e-6)
    assert any(row["clip_frac"] > 0 for row in rows)
