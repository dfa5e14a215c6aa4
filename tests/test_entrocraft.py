"""Entrocraft (arXiv 2604.26326) as method "entrocraft": advantages.entrocraft_rule against the authors' own
compute_grpo_range_linear / _cos_outcome_advantage run on fixed inputs (tests/fixtures/entrocraft_oracle.json); the
annealed band against its formula in float64; the method by name in the trainer; its options range-checked."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import f32, group_ids, load_fixture
from tiny import tiny_config

from entropy_rft.config import load_config
from entropy_rft.core.advantages import ADVANTAGES, entrocraft_band, entrocraft_rule
from entropy_rft.core.methods import METHODS
from entropy_rft.logging import read_metrics
from entropy_rft.train.trainer import train

ORACLE = load_fixture("entrocraft_oracle.json")


@pytest.mark.parametrize("case", ORACLE["cases"], ids=lambda c: c["name"])
def test_advantages_equal_the_authors_code(case):
    """On each fixed input (inside, above and below the band, late in the run, an entropy equal to the upper bound,
    the cosine schedule, groups of equal rewards, 0/1 rewards) our advantages, broadcast over the response mask,
    equal the authors' (GRPO's float32 arithmetic inside the band: to float32 rounding; RAFT++ and NSR exactly)."""
    p, inputs = case["params"], case["inputs"]
    tlr, mask = f32(inputs["token_level_rewards"]), f32(inputs["response_mask"])
    scores = tlr.sum(-1)
    grpo = ADVANTAGES.get("grpo")(scores, group_ids(inputs["uid"]))
    ours, metrics = entrocraft_rule(
        scores,
        grpo,
        entropy=p["current_entropy"],
        step=p["step"],
        total_steps=p["total_steps"],
        lower_range=tuple(p["entropy_lower_bound_range"]),
        upper_range=tuple(p["entropy_upper_bound_range"]),
        schedule=p["schedule"],
    )
    torch.testing.assert_close(ours[:, None] * mask, f32(case["outputs"]["advantages"]), rtol=1e-6, atol=1e-6)
    if metrics["regime"] != 0:
        assert torch.equal(ours[:, None] * mask, f32(case["outputs"]["advantages"]))


@pytest.mark.parametrize("schedule", ["linear", "cos"])
def test_band_follows_its_schedule(schedule):
    """h(step) = start + (end - start) progress, progress = step / total (linear) or (1 - cos(pi step / total)) / 2,
    for each bound, in float64; the ends are the ranges' ends."""
    for step in (0, 1, 17, 50, 99, 100):
        t = step / 100
        progress = t if schedule == "linear" else 0.5 * (1 - math.cos(math.pi * t))
        low, high = entrocraft_band(step, 100, lower_range=(0.6, 0.4), upper_range=(0.7, 0.5), schedule=schedule)
        assert low == pytest.approx(0.6 - 0.2 * progress, abs=1e-15)
        assert high == pytest.approx(0.7 - 0.2 * progress, abs=1e-15)
    assert entrocraft_band(100, 100, schedule=schedule) == pytest.approx((0.4, 0.5))


def test_options_are_checked(tmp_path):
    """Bad schedules, ranges and steps are refused by name, at the config too; the options belong to entrocraft."""
    for kw, match in (
        ({"schedule": "step"}, "schedule"),
        ({"lower_range": (0.6, -0.1)}, "lower_range"),
        ({"upper_range": (0.7,)}, "upper_range"),
    ):
        with pytest.raises(ValueError, match=match):
            entrocraft_band(1, 10, **kw)
    with pytest.raises(ValueError, match="step"):
        entrocraft_band(11, 10)
    assert set(METHODS.get("entrocraft").option_names()) == {"lower_range", "upper_range", "schedule"}
    with pytest.raises(ValueError, match="entrocraft_schedule is an option of method 'entrocraft'"):
        load_config(None, method="grpo", entrocraft_schedule="cos", out=str(tmp_path / "a"))
    with pytest.raises(ValueError, match="lower_range"):
        load_config(None, method="entrocraft", entrocraft_lower_range=[0.6, -1.0], out=str(tmp_path / "b"))


@pytest.mark.slow
def test_entrocraft_trains_by_name(tmp_path):
    """`--method entrocraft` on the shipped policy, 2 steps each: with a band far above the policy's entropy every
    step is NSR (the update's advantages are min(R, 0)); far below it, RAFT++ (max(R, 0)); the regime and band are
    logged; with the authors' band the advantages are one of the three rules' for the step's band."""
    from entropy_rft.train import step as step_module

    seen = []
    real = step_module.Step.decide

    def spy(self, batch, behaviour):
        decision = real(self, batch, behaviour)
        seen.append((behaviour, decision))
        return decision

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        step_module.Step.decide = spy
        runs = {}
        for name, band in (("nsr", ([5.0, 5.0], [6.0, 6.0])), ("raft", ([0.0, 0.0], [1e-3, 1e-3]))):
            cfg = tiny_config(
                tmp_path,
                name,
                method="entrocraft",
                entrocraft_lower_range=band[0],
                entrocraft_upper_range=band[1],
            )
            train(cfg)
            runs[name] = read_metrics(cfg.out)
    finally:
        step_module.Step.decide = real
        torch.set_num_threads(threads)
    for (behaviour, decision), row in zip(seen, runs["nsr"] + runs["raft"]):
        regime = row["filter/regime"]
        want = behaviour.rewards.clamp(max=0.0) if regime == -1 else behaviour.rewards.clamp(min=0.0)
        assert regime in (-1.0, 1.0) and torch.equal(decision.adv, want.to(decision.adv.dtype))
    assert [r["filter/regime"] for r in runs["nsr"]] == [-1.0, -1.0]
    assert [r["filter/regime"] for r in runs["raft"]] == [1.0, 1.0]
    assert runs["nsr"][0]["filter/band_low"] == 5.0 and runs["raft"][1]["filter/band_high"] == 1e-3
