"""STARE (arXiv 2606.19236; hp-luo/STARE) as method "stare": masks.stare_weights against the authors' own
compute_stare_token_weights run on fixed inputs (tests/fixtures/stare_oracle.json) and against a float64 loop; the
weight on the advantage equal to the authors' weight on the clipped surrogate (step.py, departure 3); the method
by name in the trainer; its options range-checked."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import f32, load_fixture
from tiny import tiny_config

from entropy_rft.config import load_config
from entropy_rft.core import masks
from entropy_rft.core.dynamics import TokenStats
from entropy_rft.core.losses import ppo_clip_loss
from entropy_rft.core.methods import METHODS
from entropy_rft.logging import read_metrics
from entropy_rft.train.trainer import train

ORACLE = load_fixture("stare_oracle.json")


def ours_on(case: dict) -> tuple[torch.Tensor, dict]:
    """Our weights on an oracle case: the authors' controller state as our gate (gate_on False: a batch entropy at
    its current_ent above its target; no controller: no gate)."""
    stare, ctrl = case["params"]["stare"], case["params"]["stare_ctrl_dict"]
    logp, adv = f32(case["inputs"]["log_prob"]), f32(case["inputs"]["advantages"])
    mask = torch.tensor(case["inputs"]["response_mask"]).bool()
    options = {"variant": stare["variant"], "top_p_ratio": stare["top_p_ratio"]}
    options.update(reweight_w=stare["reweight_w"], reweight_m=stare["reweight_m"], entropy_gate=None)
    entropy = torch.zeros_like(logp)
    if ctrl is not None:
        options.update(
            reweight_w=ctrl["reweight_w"], reweight_m=ctrl["reweight_m"], entropy_gate=ctrl["target_entropy"]
        )
        entropy = torch.full_like(logp, ctrl["current_ent"])
        assert (ctrl["current_ent"] < ctrl["target_entropy"]) == ctrl["gate_on"]
    return masks.stare_weights(logp, adv, mask, entropy, **options)


@pytest.mark.parametrize("case", ORACLE["cases"], ids=lambda c: c["name"])
def test_weights_equal_the_authors_code(case):
    """On each fixed input (O1 and C2, other P, W and M, the gate closed and open through the controller, 30 x 0.1
    positive tokens where the authors' ceiling differs from math.ceil, P = 0 and P = 1) the weights equal those of
    hp-luo/STARE's compute_stare_token_weights exactly (the same float32 constants, the same torch.topk), and the
    selected and mean-weight fractions equal its stats to float32 rounding."""
    weights, metrics = ours_on(case)
    assert torch.equal(weights, f32(case["outputs"]["weights"]))
    theirs = case["outputs"]["stats"]
    assert metrics["frac_reweighted_pos"] == pytest.approx(theirs["stare/positive_reweight_ratio"], abs=1e-6)
    assert metrics["frac_reweighted_neg"] == pytest.approx(theirs["stare/negative_reweight_ratio"], abs=1e-6)
    assert metrics["mean_weight"] == pytest.approx(theirs["stare/mean_weight"], abs=1e-6)


def by_loop(logp, adv, mask, *, variant, top_p_ratio, w, m):
    """STARE's selection written out: per sign, sort the valid tokens by -log p (float64, descending), take the
    first max(1, int(n P + 0.999999)) of them (none when n = 0 or P = 0)."""
    out = [[1.0] * mask.shape[1] for _ in range(mask.shape[0])]
    for sign, weight in ((1, w), (-1, m if variant == "C2" else None)):
        if weight is None:
            continue
        toks = [
            (-float(logp[i, j]), i, j)
            for i in range(mask.shape[0])
            for j in range(mask.shape[1])
            if mask[i, j] and (float(adv[i]) > 0 if sign > 0 else float(adv[i]) < 0)
        ]
        if not toks or top_p_ratio <= 0:
            continue
        k = min(max(1, int(len(toks) * top_p_ratio + 0.999999)), len(toks))
        for _, i, j in sorted(toks, reverse=True)[:k]:
            out[i][j] = weight
    return torch.tensor(out)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("variant", ["O1", "C2"])
def test_weights_equal_a_sorted_loop(seed, variant):
    """Random batches (per-row advantages, some 0; distinct surprisals): the weights equal the sorted loop's."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(7, 9, generator=g) < 0.7
    logp = -torch.rand(7, 9, generator=g, dtype=torch.float64) * 3
    adv = torch.randn(7, generator=g).round()
    ratio = [0.05, 0.1, 0.25, 0.5, 0.9, 1.0][seed]
    got, _ = masks.stare_weights(
        logp,
        adv,
        mask,
        torch.zeros(7, 9),
        variant=variant,
        top_p_ratio=ratio,
        reweight_w=1.3,
        reweight_m=0.6,
        entropy_gate=None,
    )
    want = by_loop(logp, adv, mask, variant=variant, top_p_ratio=ratio, w=1.3, m=0.6)
    assert torch.allclose(got.double(), want.double(), atol=1e-7)


def test_weight_on_the_advantage_is_the_weight_on_the_surrogate():
    """Departure 3 of step.py: the clipped surrogate with dual clip at w A equals w times it at A, per token and in
    its gradient (float64, ratios on both sides of the clip range, both advantage signs, w 1.1 / 0.9 / 1)."""
    g = torch.Generator().manual_seed(0)
    old = -torch.rand(6, 8, generator=g, dtype=torch.float64)
    logp = (old + 0.6 * torch.randn(6, 8, generator=g, dtype=torch.float64)).requires_grad_()
    adv = torch.randn(6, generator=g, dtype=torch.float64)[:, None].expand(6, 8)
    w = torch.tensor([1.1, 0.9, 1.0], dtype=torch.float64)[torch.randint(0, 3, (6, 8), generator=g)]
    mask = torch.ones(6, 8, dtype=torch.bool)
    ours, _ = ppo_clip_loss(logp, old, adv * w, mask, eps_low=0.2, eps_high=0.28, dual_clip_c=3.0, agg="token-sum")
    (grad_ours,) = torch.autograd.grad(ours, logp)
    ratio = (logp - old).exp()
    per_token = torch.maximum(-adv * ratio, -adv * ratio.clamp(0.8, 1.28))
    per_token = torch.where(adv < 0, torch.minimum(per_token, -adv * 3.0), per_token)
    theirs = (per_token * w).sum()
    (grad_theirs,) = torch.autograd.grad(theirs, logp)
    assert float(ours.detach()) == pytest.approx(float(theirs.detach()), rel=1e-12)
    assert torch.allclose(grad_ours, grad_theirs, rtol=1e-12, atol=1e-15)


def test_gate_closed_gives_weight_one_and_options_are_checked():
    """At or above the gate every weight is 1 (STARE degrades to GRPO); bad options are refused, each by name."""
    logp, adv, mask = -torch.rand(4, 5), torch.tensor([1.0, -1.0, 2.0, -0.5]), torch.ones(4, 5, dtype=torch.bool)
    w, metrics = masks.stare_weights(logp, adv, mask, torch.full((4, 5), 0.25), variant="C2", entropy_gate=0.25)
    assert torch.equal(w, torch.ones(4, 5)) and metrics["gate_open"] == 0.0 and metrics["mean_weight"] == 1.0
    w, metrics = masks.stare_weights(logp, adv, mask, torch.full((4, 5), 0.24), variant="C2", entropy_gate=0.25)
    assert metrics["gate_open"] == 1.0 and (w == 1.1).sum() == 1 and (w == 0.9).sum() == 1
    for bad, match in (
        ({"variant": "O2"}, "variant"),
        ({"top_p_ratio": 1.5}, "top_p_ratio"),
        ({"reweight_w": 0.0}, "reweight_w"),
        ({"reweight_m": math.inf}, "reweight_m"),
        ({"entropy_gate": -1.0}, "entropy_gate"),
    ):
        with pytest.raises(ValueError, match=match):
            masks.stare_weights(logp, adv, mask, torch.zeros(4, 5), **bad)


def test_method_by_name_and_its_config(tmp_path):
    """`stare` is in the registry with the authors' defaults (O1, P 0.1, W 1.1, M 0.9, gate 0.3) as options; its
    config fields reach them; they are refused for another method, out of range, or with a policy loss other than
    the clipped surrogate."""
    method = METHODS.get("stare")
    assert method.options == {
        "variant": "O1",
        "top_p_ratio": 0.1,
        "reweight_w": 1.1,
        "reweight_m": 0.9,
        "entropy_gate": 0.3,
    }
    assert set(method.option_names()) == {"variant", "top_p_ratio", "reweight_w", "reweight_m", "entropy_gate"}
    stats = TokenStats(-torch.rand(4, 5), torch.full((4, 5), 0.1), torch.zeros(4, 5), torch.zeros(4, 5))
    cfg = load_config(None, method="stare", stare_variant="C2", stare_reweight_m=0.5, out=str(tmp_path / "a"))
    w, _ = method.weights(
        stats, torch.tensor([1.0, -1.0, 1.0, -1.0]), torch.ones(4, 5, dtype=torch.bool), **cfg.method_overrides()
    )
    assert (w == 0.5).sum() == 1 and (w == 1.1).sum() == 1
    with pytest.raises(ValueError, match="stare_variant is an option of method 'stare'"):
        load_config(None, method="clip_b", stare_variant="C2", out=str(tmp_path / "b"))
    with pytest.raises(ValueError, match="stare_top_p_ratio"):
        load_config(None, method="stare", stare_top_p_ratio=1.5, out=str(tmp_path / "c"))
    with pytest.raises(ValueError, match="policy_loss"):
        load_config(None, method="stare", policy_loss="gspo", out=str(tmp_path / "d"))


@pytest.mark.slow
def test_stare_trains_by_name(tmp_path):
    """`--method stare` with the gate open (entropy_gate 100) and variant C2 on the shipped policy for 2 steps: the
    update's advantages are the estimator's times the weights (captured at the update), L+ and L- are each
    ceil-ish 10% of their sign's tokens, the step logs the weights' metrics and the reweighted share by region; with
    the gate closed (entropy_gate 1e-6) it logs GRPO's metrics, bit for bit."""
    from entropy_rft.train import step as step_module

    seen = []
    real = step_module.Step.decide

    def spy(self, batch, behaviour):
        decision = real(self, batch, behaviour)
        seen.append(decision)
        return decision

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        step_module.Step.decide = spy
        runs = {}
        for name, kw in (
            ("open", {"method": "stare", "entropy_gate": 100.0, "stare_variant": "C2"}),
            ("closed", {"method": "stare", "entropy_gate": 1e-6}),
            ("grpo", {"method": "grpo"}),
        ):
            cfg = tiny_config(tmp_path, name, **kw)
            train(cfg)
            runs[name] = read_metrics(cfg.out)
    finally:
        step_module.Step.decide = real
        torch.set_num_threads(threads)
    for decision, row in zip(seen[:2], runs["open"]):
        w = decision.weights
        assert w is not None and decision.adv.dim() == 2
        valid = decision.loss_mask
        for sign, weight in ((1, 1.1), (-1, 0.9)):
            side = valid & ((decision.adv > 0) if sign > 0 else (decision.adv < 0))
            n = int(side.sum())
            want = 0 if n == 0 else min(max(1, int(n * 0.1 + 0.999999)), n)
            assert int((side & (w == weight)).sum()) == want
        assert row["filter/gate_open"] == 1.0 and row["filter/mean_weight"] == pytest.approx(
            float(w[valid].mean()), rel=1e-6
        )
        assert {f"reweight_frac_by_region/{r}" for r in ("pos_likely", "neg_unlikely")} <= set(row)
    skip = ("seconds", "time/", "filter/", "reweight_frac_by_region/", "frac_zero_advantage")
    for closed, grpo in zip(runs["closed"], runs["grpo"]):
        assert {k: v for k, v in closed.items() if not k.startswith(skip)} == {
            k: v for k, v in grpo.items() if not k.startswith(skip)
        }
        assert closed["filter/gate_open"] == 0.0 and closed["filter/mean_weight"] == 1.0


def test_reweighted_share_by_region_counts_the_tokens():
    """diagnostics.reweight_metrics: per region (A's sign x S* > 0), the count of valid tokens with weight != 1 over
    the region's count, against a loop; 0 for an empty region; A = 0 tokens are in none."""
    from entropy_rft.train.diagnostics import reweight_metrics

    g = torch.Generator().manual_seed(5)
    s_star, mask = torch.randn(6, 7, generator=g), torch.rand(6, 7, generator=g) < 0.8
    adv = torch.tensor([1.0, -2.0, 0.0, 0.5, -0.1, 3.0])
    weights = torch.where(torch.rand(6, 7, generator=g) < 0.3, 1.1, 1.0)
    got = reweight_metrics(s_star, adv, mask, weights)
    for sign in ("pos", "neg"):
        for kind in ("likely", "unlikely"):
            toks = [
                (i, j)
                for i in range(6)
                for j in range(7)
                if mask[i, j]
                and (adv[i] > 0 if sign == "pos" else adv[i] < 0)
                and (s_star[i, j] > 0 if kind == "likely" else s_star[i, j] <= 0)
            ]
            want = sum(float(weights[t]) != 1 for t in toks) / max(len(toks), 1)
            assert got[f"reweight_frac_by_region/{sign}_{kind}"] == pytest.approx(want, abs=1e-12)
