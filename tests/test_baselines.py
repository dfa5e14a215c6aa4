"""The baselines the paper compares against: exact selections, hand-computed cases, and each method running
through the trainer."""

import math

import numpy as np
import pytest
import torch

from entropy_rft.config import load_config
from entropy_rft.core.advantages import advantage_reweight, overlong_penalty, rank_penalty
from entropy_rft.core.losses import Aggregation, ppo_clip_loss, select_kl_cov
from entropy_rft.core.masks import top_entropy
from entropy_rft.core.methods import METHODS
from entropy_rft.logging import read_metrics
from entropy_rft.train.trainer import train


def test_top_entropy_count_is_exact():
    """Forking tokens keep exactly round(0.2 n) valid tokens, the highest-entropy ones, never a padded one."""
    g = torch.Generator().manual_seed(0)
    ent = torch.rand(7, 9, generator=g)
    mask = torch.rand(7, 9, generator=g) > 0.3
    ent[~mask] = 10.0  # padded positions must never be chosen
    keep, _ = top_entropy(ent, torch.ones(7), mask, frac=0.2)
    n = int(mask.sum())
    assert int(keep.sum()) == round(0.2 * n) and not (keep & ~mask).any()
    assert float(ent[keep].min()) >= float(ent[mask & ~keep].max())


def test_rank_penalty_hand_case():
    """Group of G = 4 with rewards [1, 1, -0.1, 1] and mean log p [-1, -3, -2, -0.5]:
    ascending likelihood ranks are [2, 0, 1, 3]; R' = R (1 - 0.25 rank / 4) for R > 0:
    [1 - 0.125, 1 - 0, -0.1 (unchanged), 1 - 0.1875] = [0.875, 1.0, -0.1, 0.8125]."""
    r = torch.tensor([1.0, 1.0, -0.1, 1.0])
    out = rank_penalty(r, torch.zeros(4, dtype=torch.long), torch.tensor([-1.0, -3.0, -2.0, -0.5]), beta=0.25)
    torch.testing.assert_close(out, torch.tensor([0.875, 1.0, -0.1, 0.8125]))


def test_advantage_reweight_and_overlong_hand_cases():
    """AR: alpha 0.3, pi_old 0.5, A 2 -> (0.15 + 0.7) * 2 = 1.7. Overlong: L_max 16, L_cache 4:
    lengths 12 -> 0, 14 -> -(14 - 12) / 4 = -0.5, 16 -> -1."""
    a = advantage_reweight(torch.tensor([2.0]), torch.log(torch.tensor([[0.5, 1.0]])), alpha=0.3)
    torch.testing.assert_close(a, torch.tensor([[1.7, 2.0]]))
    torch.testing.assert_close(
        overlong_penalty(torch.tensor([12, 14, 16]), max_len=16, buffer=4), torch.tensor([0.0, -0.5, -1.0])
    )


def test_kl_cov_selection_is_batch_level():
    """KL-Cov picks the top-k covariance tokens of the whole batch: k = max(1, int(ratio n))."""
    g = torch.Generator().manual_seed(1)
    adv, logp = torch.randn(8, generator=g), torch.randn(8, 6, generator=g)
    mask = torch.ones(8, 6, dtype=torch.bool)
    assert int(select_kl_cov(adv, logp, mask, ratio=0.1).sum()) == 4
    assert int(select_kl_cov(adv, logp, mask, ratio=1e-4).sum()) == 1


def test_denominator_all_scales_by_kept_fraction():
    """With the TRL normalisation (divide by all valid tokens) the loss is the authors' (divide by selected)
    times n_selected / n_valid."""
    logp = torch.randn(3, 5).requires_grad_()
    adv = torch.tensor([1.0, -1.0, 0.5])
    valid = torch.ones(3, 5, dtype=torch.bool)
    kept = valid.clone()
    kept[:, :3] = False
    a, _ = ppo_clip_loss(logp, logp.detach(), adv, kept, agg=Aggregation(num_tokens=kept.sum()))
    b, _ = ppo_clip_loss(logp, logp.detach(), adv, kept, agg=Aggregation(num_tokens=valid.sum()))
    torch.testing.assert_close(b, a * kept.sum() / valid.sum())


def test_method_defaults_sit_beneath_explicit_settings():
    assert load_config(None, method="dapo").eps_high == 0.28
    assert load_config(None, method="dapo", eps_high=0.25).eps_high == 0.25
    assert load_config(None, method="gspo").policy_loss == "gspo"
    assert load_config(None, method="sapo").loss_agg == "seq-mean-token-mean"
    assert load_config(None, method="clip_b", policy_loss="cispo").policy_loss == "cispo"
    assert load_config(None, method="qae").advantage == "qae"


ENGINE_LOSSES = ["cispo", "sapo", "dppo_tv", "dppo_kl", "geo_mean", "erc"]
BASELINES = [
    "dapo",
    "dr_grpo",
    "gspo",
    "clip_cov",
    "kl_cov",
    "unlikely",
    "unlikely_2ep",
    "forking",
    "forking_all",
    "entropy_bonus",
    "ar",
    "lopti",
    *ENGINE_LOSSES,
    "qae",
]


@pytest.mark.slow
@pytest.mark.parametrize("method", BASELINES)
def test_every_baseline_trains(tmp_path, method):
    """Each baseline runs two steps end to end and logs finite metrics."""
    assert method in METHODS
    cfg = load_config(
        None,
        method=method,
        steps=2,
        prompts_per_step=4,
        group_size=4,
        lr=1e-4,
        eval_problems=4,
        eval_k=2,
        progress=False,
        out=str(tmp_path),
    )
    train(cfg)
    rows = read_metrics(tmp_path)
    assert len(rows) == 2 and all(r["entropy"] > 0 and r["grad_norm"] >= 0 for r in rows)


@pytest.mark.slow
@pytest.mark.parametrize("method, loss", [("clip_b", loss) for loss in ENGINE_LOSSES] + [("clip_v", "erc")])
def test_clip_b_and_clip_v_compose_with_the_engines_losses(tmp_path, method, loss):
    """Clip_B / Clip_V on top of each engine loss (--method clip_b --set policy_loss=cispo): two optimizer
    steps per batch (mini_batches 2), so the loss's ratios, masks and ERC's entropy band act; the filter drops tokens
    (mu 0.5), the loss's metrics are logged and the off-policy entropy prediction with the loss's own step sizes is
    finite."""
    cfg = load_config(
        None,
        method=method,
        policy_loss=loss,
        mu=0.5,
        steps=1,
        prompts_per_step=4,
        group_size=4,
        mini_batches=2,
        lr=1e-3,
        eval_problems=4,
        eval_k=2,
        progress=False,
        out=str(tmp_path),
    )
    assert cfg.policy_loss == loss and cfg.method == method
    train(cfg)
    rows = read_metrics(tmp_path)
    assert len(rows) == 1 and all(r["entropy"] > 0 and math.isfinite(r["loss/policy"]) for r in rows)
    assert any(r["clip_frac"] > 0 for r in rows)
    assert all(math.isfinite(r["entropy_change/predicted_offpolicy"]) for r in rows)
    assert "loss/ppo_kl" in rows[0] and ("loss/erc_kept_frac" in rows[0]) == (loss == "erc")


def test_dynamic_sampling_keeps_only_mixed_groups(tmp_path):
    """DAPO's dynamic sampling: every kept group has 0 < correct < G."""
    from entropy_rft.rollout import HFEngine
    from entropy_rft.tasks import CountdownTask
    from entropy_rft.train.policy import load_policy
    from entropy_rft.train.problems import ProblemSampler, default_data, load_problems, sample_batch

    cfg = load_config(None, method="dapo", prompts_per_step=6, group_size=4, max_sampling_rounds=5)
    model, tok = load_policy("countdown-tiny", torch.device("cpu"))
    task = CountdownTask()
    sampler = ProblemSampler(load_problems(default_data(cfg, "train"), task), seed=0)
    scored = sample_batch(HFEngine(model, tok), task, sampler, cfg, step=0)
    problems, rollout, correct, info = scored.problems, scored.rollout, scored.correct, scored.info
    assert len(rollout.texts) == 4 * len(problems) == 4 * info["sampling/groups"]
    per_group = correct.view(-1, 4).sum(-1)
    assert ((per_group > 0) & (per_group < 4)).all()


@pytest.mark.slow
def test_compare_resumes_and_summarises(tmp_path, capsys):
    """compare writes results.md/json with mean and std over seeds; a rerun skips every finished cell."""
    import json

    from entropy_rft.commands.cli import main

    cfg = tmp_path / "small.yaml"
    cfg.write_text(
        "common: {prompts_per_step: 4, group_size: 4, lr: 1.0e-4, eval_problems: 8, eval_k: 2}\n"
        "methods: {clip_b: {mu: 1.5}}\n"
    )
    args = [
        "compare",
        "--methods",
        "grpo,clip_b",
        "--seeds",
        "2",
        "--steps",
        "1",
        "--config",
        str(cfg),
        "--out",
        str(tmp_path / "cmp"),
        "--quiet",
    ]
    main(args)
    main(args)
    assert capsys.readouterr().out.count("done, skipped") == 4
    tmp_path = tmp_path / "cmp"
    res = json.loads((tmp_path / "results.json").read_text())
    assert set(res["methods"]) == {"grpo", "clip_b"} and res["seeds"] == 2
    mean, std = res["methods"]["grpo"]["avg_at_k"]
    assert 0 <= mean <= 1 and std >= 0
    assert "| clip_b |" in (tmp_path / "results.md").read_text() and (tmp_path / "entropy.png").exists()
    # intervals over seeds and problems, the paired comparison against GRPO, and what they rest on
    ev = res["evidence"]
    assert set(ev) == {"initial policy", "grpo", "clip_b"} and "vs_grpo" in ev["clip_b"] and "vs_grpo" not in ev["grpo"]
    est = ev["grpo"]["avg"]
    assert (est["seeds"], est["problems"], est["samples"]) == (2, 8, 2) and est["low"] <= est["value"] <= est["high"]
    assert est["value"] == pytest.approx(mean)
    assert "2 training seeds x 8 evaluation problems x 2 samples" in (tmp_path / "results.md").read_text()
    # the final entropy of each method with its t interval over the 2 seeds (t_{0.975, 1} = 12.706), and clip_b's
    # difference from GRPO paired by seed, recomputed here from each cell's own metrics
    table = (tmp_path / "results.md").read_text()
    assert "# Comparison on countdown (2 seeds" in table and "95% Student-t intervals over seeds" in table
    final = {
        m: [read_metrics(tmp_path / "runs" / c)[-1]["entropy"] for c in res["settings"]["cells"][m]]
        for m in ("grpo", "clip_b")
    }
    ent = res["entropy_evidence"]
    for m, values in final.items():
        half = 12.706205 * np.std(values, ddof=1) / np.sqrt(2)
        assert ent[m]["final"]["value"] == pytest.approx(np.mean(values), rel=1e-6)
        assert ent[m]["final"]["high"] - ent[m]["final"]["value"] == pytest.approx(half, rel=1e-5, abs=1e-9)
    diff = np.subtract(final["clip_b"], final["grpo"])
    assert ent["clip_b"]["vs_grpo"]["value"] == pytest.approx(diff.mean(), abs=1e-7) and "vs_grpo" not in ent["grpo"]
    # one step: the shaded band of step 1 is the range of the seeds' entropies
    assert res["methods"]["grpo"]["entropy_band"] == [[min(final["grpo"]), max(final["grpo"])]]
    # the reward and region figures: each method's curves are the mean over its seeds of the cells' own metrics, the
    # unprobed realised change is null (strict JSON: no NaN), and both figures are written
    cells = res["settings"]["cells"]
    rows = {m: [read_metrics(tmp_path / "runs" / c)[-1] for c in cells[m]] for m in ("grpo", "clip_b")}
    json.loads((tmp_path / "results.json").read_text(), parse_constant=lambda c: pytest.fail(f"{c} in results.json"))
    for m, last in rows.items():
        assert res["methods"][m]["reward_curve"] == [pytest.approx(np.mean([r["reward_mean"] for r in last]))]
        regions = res["methods"][m]["regions"]
        for key, values in regions.items():
            if key == "entropy_change/realised":  # --steps 1 with the settings' probe_every: never probed
                assert all(r.get(key) is None for r in last) and values == [None]
            else:
                assert values == [pytest.approx(np.mean([r[key] for r in last]), rel=1e-12, abs=0)], key
    assert (tmp_path / "reward.png").exists() and (tmp_path / "regions.png").exists()


@pytest.mark.slow
@pytest.mark.parametrize("method", ["ppo", "ppo_clip_b", "ppo_clip_v"])
def test_ppo_with_gae_trains_its_value_head(tmp_path, method):
    """PPO: GAE advantages per token from a value head that learns (its loss is logged and its weights move
    away from the zero initialisation and are checkpointed)."""
    cfg = load_config(
        None,
        method=method,
        steps=3,
        prompts_per_step=4,
        group_size=2,
        lr=1e-4,
        eval_problems=4,
        eval_k=2,
        progress=False,
        out=str(tmp_path),
    )
    assert cfg.advantage == "gae"
    summary = train(cfg)
    rows = read_metrics(tmp_path)
    assert all(r["loss/value"] > 0 for r in rows)
    state = torch.load(f"{summary['checkpoint']}/value_head.pt")
    assert state["proj.weight"].abs().sum() > 0


def test_outcome_token_rewards_and_gae_hand_case():
    """Reward on the last valid token; with gamma = lam = 1 and V = 0, the raw GAE advantage of every valid token
    is the final reward: rows [r=1, len 2], [r=-1, len 3] -> raw A [[1, 1, 0], [-1, -1, -1]]."""
    from entropy_rft.core.advantages import gae, outcome_token_rewards

    mask = torch.tensor([[1, 1, 0], [1, 1, 1]], dtype=torch.bool)
    tr = outcome_token_rewards(torch.tensor([1.0, -1.0]), mask)
    torch.testing.assert_close(tr, torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, -1.0]]))
    raw, ret = gae(tr, torch.zeros(2, 3), mask, gamma=1.0, lam=1.0, whiten=False)
    torch.testing.assert_close(raw, torch.tensor([[1.0, 1.0, 0.0], [-1.0, -1.0, -1.0]]))


@pytest.mark.slow
def test_dr_grpo_update_does_not_depend_on_the_padded_width():
    """The trainer's Dr. GRPO loss (seq-mean-token-sum-norm) on the same responses padded to width 9 and 16
    is the same (it divides by max_new_tokens); before, it divided by the batch's padded width."""
    import copy

    from entropy_rft.rollout import Rollout
    from entropy_rft.train.forward import batch_forward
    from entropy_rft.train.policy import load_policy
    from entropy_rft.train.step import Decision, Step

    model, tok = load_policy("countdown-tiny", torch.device("cpu"), trainable=True)
    cfg = load_config(None, method="dr_grpo", max_new_tokens=16, lr=1e-4, progress=False)
    assert cfg.loss_agg == "seq-mean-token-sum-norm"
    g = torch.Generator().manual_seed(0)
    n = 4
    prompt = torch.randint(3, 20, (n, 5), generator=g)
    response = torch.randint(3, 20, (n, 9), generator=g)
    mask = torch.arange(9)[None] < torch.tensor([9, 3, 6, 2])[:, None]
    response[~mask] = 0
    narrow = Rollout(prompt, torch.ones(n, 5, dtype=torch.bool), response, mask, mask.sum(-1) == 9, [""] * n)
    pad = torch.zeros(n, 7, dtype=torch.long)
    wide = Rollout(
        prompt,
        torch.ones(n, 5, dtype=torch.bool),
        torch.cat([response, pad], 1),
        torch.cat([mask, pad.bool()], 1),
        narrow.finished,
        [""] * n,
    )
    adv = torch.tensor([1.0, -0.5, 0.25, -1.0])
    losses = []
    for ro in (narrow, wide):
        m = copy.deepcopy(model)
        old = batch_forward(m, ro, cfg.temperature, n)[0].logp
        opt = torch.optim.Adam(m.parameters(), lr=cfg.lr)
        step = Step(cfg, m, opt, update_gen=torch.Generator().manual_seed(1))
        out = step.update(ro, Decision(adv, old, ro.response_mask, ro.response_mask))
        losses.append(out["loss/policy"])
    assert losses[0] != 0 and losses[0] == pytest.approx(losses[1], rel=1e-5)


def test_kl_cov_recipe_is_cui_et_al_7b_and_off_policy():
    """KL-Cov's penalty |log r| is 0 with zero gradient on-policy (r = 1), so a strict on-policy KL-Cov step is
    GRPO's exactly; the Table 3 recipe therefore uses Cui et al.'s 7B settings (ratio 2e-3, coef 1) with
    off-policy mini-batches, and at that ratio selects tokens of a recipe-sized batch."""
    from pathlib import Path

    from entropy_rft.core.losses import kl_cov_loss

    g = torch.Generator().manual_seed(0)
    logp = (torch.randn(4, 6, generator=g) - 1).requires_grad_()
    adv, mask = torch.randn(4, generator=g), torch.ones(4, 6, dtype=torch.bool)
    selected = torch.ones(4, 6, dtype=torch.bool)
    (g_kl,) = torch.autograd.grad(kl_cov_loss(logp, logp.detach(), adv, mask, selected=selected)[0], logp)
    (g_pg,) = torch.autograd.grad(ppo_clip_loss(logp, logp.detach(), adv, mask)[0], logp)
    torch.testing.assert_close(g_kl, g_pg)  # on-policy: the KL term does nothing
    recipe = Path(__file__).parent.parent / "entropy_rft" / "configs" / "paper" / "qwen2.5-7b-instruct_kl_cov.yaml"
    cfg = load_config(str(recipe))
    assert cfg.method == "kl_cov" and cfg.kl_cov_ratio == 2e-3 and cfg.kl_cov_coef == 1.0
    assert cfg.mini_batches * cfg.ppo_epochs > 1 and cfg.prompts_per_step % cfg.mini_batches == 0
    n = cfg.prompts_per_step * cfg.group_size * 50  # a batch of short responses
    assert int(
        select_kl_cov(
            torch.randn(n), torch.randn(n, 1), torch.ones(n, 1, dtype=torch.bool), ratio=cfg.kl_cov_ratio
        ).sum()
    ) == int(cfg.kl_cov_ratio * n)
