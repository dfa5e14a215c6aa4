"""The step's predicted entropy change by region (diagnostics.region_metrics) on real training steps of every
registered method: the four regions sum to the logged entropy_change/predicted, and the clipped share of each region
counts the tokens the method removed. The split itself is checked against a token loop in tests/test_dynamics.py."""

from __future__ import annotations

import pytest
import torch
from tiny import tiny_config

from entropy_rft.core.advantages import broadcast_advantages
from entropy_rft.core.dynamics import REGIONS
from entropy_rft.core.methods import METHODS
from entropy_rft.train import step as step_module
from entropy_rft.train.trainer import train

U32, U64 = 2.0**-24, 2.0**-53
NEEDS = {"rsi": {"rsi_lower_bound": 0.05, "rsi_upper_bound": 1.5}}  # a method with no default for a setting


def _captured_steps(tmp_path, monkeypatch, method: str) -> list[tuple[dict, dict]]:
    """Two steps of `method` on the shipped policy (4 prompts x 4 responses), each as (the tensors step_metrics was
    given, the metrics it returned)."""
    seen: list[tuple[dict, dict]] = []
    real = step_module.step_metrics

    def spy(step, rewards, correct, adv, stats, mask, keep, rollout, cfg, optimizer):
        out = real(step, rewards, correct, adv, stats, mask, keep, rollout, cfg, optimizer)
        seen.append(({"adv": adv, "stats": stats, "mask": mask, "keep": keep, "cfg": cfg}, out))
        return out

    monkeypatch.setattr(step_module, "step_metrics", spy)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the 0.8M-parameter policy: one thread is as fast and spares a shared machine
    try:
        cfg = tiny_config(tmp_path, method=method, **NEEDS.get(method, {}))
        train(cfg)
    finally:
        torch.set_num_threads(threads)
    return seen


def _tolerance(inputs: dict, predicted_step) -> float:
    """The rounding bound of Corollary 4 as step_metrics computes it: float32 through batch_covariance for a constant
    step (8 n u32 step E_T[(|A| + |E A|)(|S_c| + |E S_c|)]), float64 for a per-token step (4 n u64 E_T[step |A|
    |S_c - E S_c|]); the regions themselves are float64."""
    mask = inputs["mask"] & inputs["keep"]
    a = broadcast_advantages(inputs["adv"], inputs["stats"].s_centered)[mask].double()
    s = inputs["stats"].s_centered[mask].double()
    n = a.numel()
    if n == 0:  # no loss token: both are exactly 0
        return 0.0
    if not isinstance(predicted_step, torch.Tensor):
        return 8 * n * U32 * predicted_step * float(((a.abs() + a.mean().abs()) * (s.abs() + s.mean().abs())).mean())
    size = predicted_step[mask].double()
    return 4 * n * U64 * float((size * a.abs() * (s - s.mean()).abs()).mean())


@pytest.mark.slow
@pytest.mark.parametrize("method", sorted(METHODS))
def test_regions_sum_to_the_prediction_on_every_step(tmp_path, monkeypatch, method):
    """On every step of every method, entropy_change/by_region/{pos,neg}_{likely,unlikely} sum to the logged
    entropy_change/predicted within the rounding bound of its arithmetic (_tolerance), are exactly 0 when no loss
    token has A != 0, and clip_frac_by_region/<r> is the fraction of region r's valid tokens (A sign x S* > 0)
    that the method's keep mask removed."""
    from entropy_rft.train.diagnostics import loss_step_sizes

    for inputs, out in _captured_steps(tmp_path, monkeypatch, method):
        mask, keep, stats = inputs["mask"], inputs["keep"], inputs["stats"]
        moving = (mask & keep & (broadcast_advantages(inputs["adv"], stats.s_star) != 0)).any()
        if not moving:  # no loss token with A != 0: every region is exactly 0
            assert all(out[f"entropy_change/by_region/{r}"] == 0 for r in REGIONS)
        total = sum(out[f"entropy_change/by_region/{r}"] for r in REGIONS)
        tol = _tolerance(inputs, loss_step_sizes(mask, mask & keep, inputs["cfg"]))
        assert abs(total - out["entropy_change/predicted"]) <= tol, (total, out["entropy_change/predicted"], tol)
        adv = broadcast_advantages(inputs["adv"], stats.s_star)
        for r in REGIONS:
            sign = adv > 0 if r.startswith("pos") else adv < 0
            likely = stats.s_star > 0 if r.endswith("_likely") else stats.s_star <= 0
            where = mask & sign & likely
            dropped = where & ~keep
            want = float(dropped.sum()) / max(int(where.sum()), 1)
            assert out[f"clip_frac_by_region/{r}"] == pytest.approx(want, abs=1e-12)
