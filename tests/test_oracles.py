"""Parity with the published implementations (tests/fixtures, see its README for sources and versions)."""

import pytest
import torch
from conftest import f32, group_ids, load_fixture

from entropy_rft.core import advantages as adv_lib
from entropy_rft.core import losses
from entropy_rft.core.advantages import broadcast_advantages
from entropy_rft.core.losses import Aggregation
from entropy_rft.core.masks import clip_b, clip_v

CLIP_B = load_fixture("clip_b.json")["cases"]
CLIP_V = load_fixture("clip_v.json")["cases"]
ADV = load_fixture("verl_advantages.json")["cases"]
LOSS = load_fixture("verl_policy_losses.json")


def _grpo_of(case):
    i = case["inputs"]
    return adv_lib.grpo(f32(i["token_level_rewards"]).sum(-1), group_ids(i["uid"]), epsilon=case["params"]["epsilon"])


@pytest.mark.parametrize("case", CLIP_B, ids=lambda c: c["name"])
def test_clip_b_reproduces_authors_code(case):
    """Default clip_b gives the authors' (Trinity-RFT 0.6.0) mask exactly and their metrics to 1e-6."""
    i, out = case["inputs"], case["outputs"]
    lp, h = f32(i["rollout_log_probs"]), f32(i["entropys"])
    a = _grpo_of(case)
    mask = f32(i["response_mask"]).bool()
    torch.testing.assert_close(a.unsqueeze(-1) * mask, f32(out["advantages"]), atol=1e-6, rtol=0)
    params = {k: v for k, v in case["params"].items() if k != "epsilon"}
    keep, metrics = clip_b(lp.exp() * (h + lp), a, mask, **params)
    assert torch.equal(keep, f32(out["response_mask"]).bool())
    for key, value in out["metrics"].items():
        assert metrics[key] == pytest.approx(value, abs=1e-6), key


@pytest.mark.parametrize("case", CLIP_V, ids=lambda c: c["name"])
def test_clip_v_reproduces_authors_code(case):
    """Default clip_v (S_c = S* - necs) gives the authors' mask exactly, cap branches included."""
    i, out = case["inputs"], case["outputs"]
    lp, h = f32(i["old_log_probs"]), f32(i["entropys"])
    s_c = lp.exp() * (h + lp) - f32(i["necs"])
    params = {k: v for k, v in case["params"].items() if k != "epsilon"}
    keep, metrics = clip_v(s_c, _grpo_of(case), f32(i["response_mask"]).bool(), **params)
    assert torch.equal(keep, f32(out["response_mask"]).bool())
    assert int((~keep & f32(i["response_mask"]).bool()).sum()) == case["diagnostics"]["n_clipped"]
    for key, value in out["metrics"].items():
        assert metrics[key] == pytest.approx(value, abs=1e-6), key


def test_clip_v_from_token_stats_matches_oracle_necs():
    """Our own S_c from the fixture's logits selects the same tokens as the authors' code (their necs)."""
    for case in CLIP_V:
        i = case["inputs"]
        from entropy_rft.core.dynamics import token_stats

        st = token_stats(f32(i["logits"]), torch.tensor(i["token_ids"]), temperature=i["temperature"])
        mask = f32(i["response_mask"]).bool()
        torch.testing.assert_close(
            st.s_expect[mask], f32(i["necs"])[mask], atol=1e-5, rtol=0
        )  # oracle necs uses fp32 log_softmax (~1e-6 error)
        params = {k: v for k, v in case["params"].items() if k != "epsilon"}
        keep, _ = clip_v(st.s_centered, _grpo_of(case), mask, **params)
        assert torch.equal(keep, f32(case["outputs"]["response_mask"]).bool()), case["name"]


@pytest.mark.parametrize("case", ADV, ids=lambda c: c["name"])
def test_advantages_match_verl(case):
    """GRPO (both std settings), RLOO, REINFORCE++-baseline and GAE equal verl 0.9.1's outputs."""
    i, p, out = case["inputs"], case["params"], case["outputs"]
    rewards, mask = f32(i["token_level_rewards"]), f32(i["response_mask"])
    fn = case["function"]
    if fn == "compute_gae_advantage_return":
        a, ret = adv_lib.gae(rewards, f32(i["values"]), mask, gamma=p["gamma"], lam=p["lam"])
    elif fn == "compute_grpo_outcome_advantage":
        a = adv_lib.grpo(
            rewards.sum(-1), group_ids(i["uid"]), norm_by_std=p["norm_adv_by_std_in_grpo"], epsilon=p["epsilon"]
        )
        a = ret = a.unsqueeze(-1) * mask
    elif fn == "compute_rloo_outcome_advantage":
        a = ret = adv_lib.rloo(rewards.sum(-1), group_ids(i["uid"])).unsqueeze(-1) * mask
    else:
        a = ret = adv_lib.reinforce_pp_baseline(rewards.sum(-1), group_ids(i["uid"]), mask)
    torch.testing.assert_close(a, f32(out["advantages"]), atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(ret, f32(out["returns"]), atol=1e-6, rtol=1e-6)


VANILLA = [c for c in LOSS["cases"] if c["function"] == "compute_policy_loss_vanilla"]


@pytest.mark.parametrize("case", VANILLA, ids=lambda c: c["name"])
def test_ppo_clip_loss_matches_verl(case):
    """Dual-clip PPO loss, its gradient w.r.t. log p and the clip metrics equal verl's for every aggregation mode,
    with local and explicit global batch sizes."""
    b, p, out = LOSS["batches"][case["batch"]], case["params"], case["outputs"]
    logp = f32(b["log_prob"]).requires_grad_()
    gbi = p["global_batch_info"]
    kw = {}
    if gbi:
        kw = dict(
            num_tokens=gbi["batch_num_tokens"] / gbi["dp_size"],
            num_seqs=gbi["global_batch_size"] / gbi["dp_size"],
            norm=gbi["loss_scale_factor"],
        )
    elif p["loss_agg_mode"] == "seq-mean-token-sum-norm":  # verl's default loss_scale_factor is the response
        kw = dict(norm=len(b["log_prob"][0]))  # width, which verl pads to max_response_length: the budget
    loss, m = losses.ppo_clip_loss(
        logp,
        f32(b["old_log_prob"]),
        f32(b["advantages"]),
        f32(b["response_mask"]),
        eps_low=p["clip_ratio_low"],
        eps_high=p["clip_ratio_high"],
        dual_clip_c=p["clip_ratio_c"],
        agg=Aggregation(p["loss_agg_mode"], **kw),
    )
    loss.backward()
    assert float(loss.detach()) == pytest.approx(out["loss"], abs=1e-6)
    torch.testing.assert_close(logp.grad, f32(out["grad_log_prob"]), atol=1e-7, rtol=1e-5)
    assert float(m["clipfrac"]) == pytest.approx(out["metrics"]["actor/pg_clipfrac"], abs=1e-6)
    assert float(m["ppo_kl"]) == pytest.approx(out["metrics"]["actor/ppo_kl"], abs=1e-6)
    assert float(m["clipfrac_dual"]) == pytest.approx(out["metrics"]["actor/pg_clipfrac_lower"], abs=1e-6)


def _loss_batch(case):
    b = LOSS["batches"][case["batch"]]
    return (f32(b["log_prob"]).requires_grad_(), f32(b["old_log_prob"]), f32(b["advantages"]), f32(b["response_mask"]))


def _positions(selected):
    return sorted(map(list, selected.nonzero().tolist()))


def _assert_loss_matches(loss, logp, out):
    """Loss value and d loss / d log p equal the reference's."""
    loss.backward()
    assert float(loss.detach()) == pytest.approx(out["loss"], abs=1e-6)
    torch.testing.assert_close(logp.grad, f32(out["grad_log_prob"]), atol=1e-7, rtol=1e-5)


@pytest.mark.parametrize(
    "case", [c for c in LOSS["cases"] if c["function"] == "compute_policy_loss_kl_cov"], ids=lambda c: c["name"]
)
def test_kl_cov_matches_verl(case):
    """KL-Cov: the per-token covariance, the top-k selection, the loss and its gradient equal verl's."""
    logp, old, adv, mask = _loss_batch(case)
    p, out = case["params"], case["outputs"]
    torch.testing.assert_close(losses.token_covariance(adv, logp, mask), f32(out["cov"]), atol=1e-6, rtol=1e-5)
    sel = losses.select_kl_cov(adv, logp, mask, ratio=p["kl_cov_ratio"])
    assert _positions(sel) == sorted(out["selected_positions"]) and int(sel.sum()) == out["n_selected"]
    loss, m = losses.kl_cov_loss(logp, old, adv, mask, selected=sel, kl_coef=p["ppo_kl_coef"], agg=p["loss_agg_mode"])
    _assert_loss_matches(loss, logp, out)
    assert float(m["ppo_kl"]) == pytest.approx(out["metrics"]["actor/ppo_kl"], abs=1e-6)


@pytest.mark.parametrize(
    "case", [c for c in LOSS["cases"] if c["function"] == "compute_policy_loss_clip_cov"], ids=lambda c: c["name"]
)
def test_clip_cov_matches_verl(case):
    """Clip-Cov: verl's candidate set and count exactly; the loss equals verl's for verl's own selection, and our
    seeded selection is a subset of the candidates of the right size that is reproducible."""
    logp, old, adv, mask = _loss_batch(case)
    p, out = case["params"], case["outputs"]
    # verl's candidates exclude the tokens where the PPO clip is active (the clipped term above the unclipped one)
    ratio, a = (logp.detach() - old).clamp(-20.0, 20.0).exp(), broadcast_advantages(adv, logp)
    clipped = (-a * ratio.clamp(1.0 - p["clip_ratio_low"], 1.0 + p["clip_ratio_high"])) > (-a * ratio)
    kw = dict(ratio=p["clip_cov_ratio"], lb=p["clip_cov_lb"], ub=p["clip_cov_ub"], exclude=clipped & mask.bool())
    everything = losses.select_clip_cov(adv, logp, mask, **{**kw, "ratio": 1.0})
    assert _positions(everything) == sorted(out["candidate_positions"])
    assert int(everything.sum()) == out["n_candidates"]
    mine = losses.select_clip_cov(adv, logp, mask, **kw, generator=torch.Generator().manual_seed(5))
    again = losses.select_clip_cov(adv, logp, mask, **kw, generator=torch.Generator().manual_seed(5))
    assert torch.equal(mine, again) and int(mine.sum()) == out["n_selected"] and not (mine & ~everything).any()
    verl_sel = torch.zeros_like(mask, dtype=torch.bool)
    for b, t in out["selected_positions"]:
        verl_sel[b, t] = True
    loss, m = losses.clip_cov_loss(
        logp,
        old,
        adv,
        mask,
        selected=verl_sel,
        eps_low=p["clip_ratio_low"],
        eps_high=p["clip_ratio_high"],
        agg=p["loss_agg_mode"],
    )
    _assert_loss_matches(loss, logp, out)
    assert float(m["clipfrac"]) == pytest.approx(out["metrics"]["actor/pg_clipfrac"], abs=1e-6)


@pytest.mark.parametrize(
    "case", [c for c in LOSS["cases"] if c["function"] == "compute_policy_loss_gspo"], ids=lambda c: c["name"]
)
def test_gspo_matches_verl(case):
    """GSPO: loss, gradient and clip fraction equal verl's."""
    logp, old, adv, mask = _loss_batch(case)
    p, out = case["params"], case["outputs"]
    loss, m = losses.gspo_loss(
        logp, old, adv, mask, eps_low=p["clip_ratio_low"], eps_high=p["clip_ratio_high"], agg=p["loss_agg_mode"]
    )
    _assert_loss_matches(loss, logp, out)
    assert float(m["clipfrac"]) == pytest.approx(out["metrics"]["actor/pg_clipfrac"], abs=1e-6)


def _authors_clip_b_loop(s, adv, mask, mu):
    """The authors' Clip_B rule as the fixture notes state it, token by token in float64: population mean and
    std of S over the valid tokens; with std < 1e-12 keep all; else clip iff A < 0 and S - ES < -mu std."""
    vals = [float(s[i, j]) for i in range(s.shape[0]) for j in range(s.shape[1]) if mask[i, j]]
    mean = sum(vals) / len(vals)
    std = (sum((v - mean) ** 2 for v in vals) / len(vals)) ** 0.5
    keep = mask.clone()
    for i, j in mask.nonzero().tolist():
        if std >= 1e-12 and float(adv[i]) < 0 and float(s[i, j]) - mean < -mu * std:
            keep[i, j] = False
    return keep


def _authors_clip_v_loop(s_c, adv, mask, mu, max_frac):
    """The authors' Clip_V rule (fixture notes) as loops in float64: D = -S_c, violators D > mu std_D with
    A <= 0; over the cap, only the k = max(int(max_frac n), 1) negative-advantage violators with the largest D
    plus every zero-advantage violator."""
    cells = mask.nonzero().tolist()
    d = {(i, j): -float(s_c[i, j]) for i, j in cells}
    n = len(cells)
    mean = sum(d.values()) / n
    std = (sum((v - mean) ** 2 for v in d.values()) / n) ** 0.5
    if std < 1e-12:
        return mask.clone()
    violators = [c for c in cells if float(adv[c[0]]) <= 0 and d[tuple(c)] > mu * std]
    clipped = violators
    k = max(int(max_frac * n), 1)
    negative = [c for c in violators if float(adv[c[0]]) < 0]
    if len(violators) / n > max_frac and len(negative) > k:
        top = sorted(negative, key=lambda c: -d[tuple(c)])[:k]
        clipped = top + [c for c in violators if float(adv[c[0]]) == 0]
    keep = mask.clone()
    for i, j in clipped:
        keep[i, j] = False
    return keep


@pytest.mark.parametrize("case", CLIP_B, ids=lambda c: c["name"])
def test_clip_b_mu_zero_is_the_authors_rule(case):
    """mu = 0 (accepted, as in the authors' code) clips every negative-sample token with S below the batch mean,
    and keeps all when the std is 0: on each fixture's inputs it equals the authors' rule as a float64 loop."""
    i = case["inputs"]
    lp, h = f32(i["rollout_log_probs"]), f32(i["entropys"])
    s, a, mask = lp.exp() * (h + lp), _grpo_of(case), f32(i["response_mask"]).bool()
    keep, _ = clip_b(s, a, mask, mu=0.0)
    assert torch.equal(keep, _authors_clip_b_loop(s, a, mask, 0.0))


@pytest.mark.parametrize("case", CLIP_V, ids=lambda c: c["name"])
def test_clip_v_mu_zero_is_the_authors_rule(case):
    """mu = 0 in Clip_V: every non-positive-sample token with S_c < 0 violates, the cap then applies as in the
    authors' code; equal to the float64 loop of their rule on each fixture's inputs."""
    i = case["inputs"]
    lp, h = f32(i["old_log_probs"]), f32(i["entropys"])
    s_c = lp.exp() * (h + lp) - f32(i["necs"])
    a, mask = _grpo_of(case), f32(i["response_mask"]).bool()
    max_frac = case["params"]["max_frac"]
    keep, _ = clip_v(s_c, a, mask, mu=0.0, max_frac=max_frac)
    assert torch.equal(keep, _authors_clip_v_loop(s_c, a, mask, 0.0, max_frac))
