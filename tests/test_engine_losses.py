"""The policy losses engines ship (CISPO, SAPO, DPPO-TV/KL, GMPO, ERC) and QAE against values produced by running the
reference code (tests/fixtures/engine_policy_losses.json and qae_advantages.json; tests/fixtures/make_engine_losses.py
made them): loss, d loss / d log p and the metrics, in float64, over padded and empty rows, advantages of both signs
and zero, log-ratios past the clamp, every aggregation verl accepts and non-default options."""

import pytest
import torch
from conftest import group_ids, load_fixture

from entropy_rft.core import losses
from entropy_rft.core.advantages import qae
from entropy_rft.core.losses import Aggregation

LOSSES = load_fixture("engine_policy_losses.json")
QAE = load_fixture("qae_advantages.json")["cases"]
F64 = dict(rtol=1e-12, atol=1e-15)  # float64 rounding of the same sums in another order
FRAC = 1e-7  # the clip fractions are float32 means of 0/1 flags here (metrics), float64 in the reference


def _t(x) -> torch.Tensor:
    return torch.tensor(x, dtype=torch.float64)


def _batch(case):
    b = LOSSES["batches"][case["batch"]]
    return (
        _t(b["log_prob"]).requires_grad_(),
        _t(b["old_log_prob"]),
        _t(b["advantages"]),
        _t(b["response_mask"]),
        _t(b["entropy"]),
        _t(b["old_entropy"]),
    )


def _verl_counts(case, mask) -> dict:
    """verl's global_batch_info as this project's counts (per data-parallel rank), or verl's local defaults."""
    p, agg = case["params"], case["params"]["loss_agg_mode"]
    gbi = p["global_batch_info"]
    if gbi:
        return dict(
            num_tokens=gbi["batch_num_tokens"] / gbi["dp_size"],
            num_seqs=gbi["global_batch_size"] / gbi["dp_size"],
            norm=gbi["loss_scale_factor"],
        )
    return dict(norm=mask.shape[-1]) if agg == "seq-mean-token-sum-norm" else {}  # verl: the padded width


def _check(loss, logp, out, rtol=1e-12):
    loss.backward()
    assert float(loss.detach()) == pytest.approx(out["loss"], rel=rtol, abs=1e-15)
    torch.testing.assert_close(logp.grad, _t(out["grad_log_prob"]), rtol=rtol, atol=1e-15)


def _cases(source, loss=None):
    return [c for c in LOSSES["cases"] if c["source"] == source and (loss is None or c["params"]["loss_mode"] == loss)]


def _ids(c):
    return c["name"]


@pytest.mark.parametrize("case", _cases("verl", "cispo"), ids=_ids)
def test_cispo_matches_verl(case):
    """CISPO: loss, gradient, clip fraction and ppo_kl equal verl 0.9.1's compute_policy_loss_cispo."""
    logp, old, adv, mask, _, _ = _batch(case)
    p, out = case["params"], case["outputs"]
    loss, m = losses.cispo_loss(
        logp,
        old,
        adv,
        mask,
        eps_low=p["clip_ratio_low"],
        eps_high=p["clip_ratio_high"],
        agg=Aggregation(p["loss_agg_mode"], **_verl_counts(case, mask)),
    )
    _check(loss, logp, out)
    assert float(m["clipfrac"]) == pytest.approx(out["metrics"]["actor/pg_clipfrac"], abs=FRAC)
    assert float(m["ppo_kl"]) == pytest.approx(out["metrics"]["actor/ppo_kl"], abs=1e-12)


@pytest.mark.parametrize("case", _cases("verl", "sapo"), ids=_ids)
def test_sapo_matches_verl(case):
    """SAPO: verl aggregates seq-mean-token-mean whatever loss_agg_mode says, with the global sequence count; the
    loss's default aggregation and that count give verl's loss and gradient for every mode passed."""
    logp, old, adv, mask, _, _ = _batch(case)
    p, out = case["params"], case["outputs"]
    counts = _verl_counts(case, mask)
    loss, m = losses.sapo_loss(
        logp,
        old,
        adv,
        mask,
        tau_pos=p["tau_pos"],
        tau_neg=p["tau_neg"],
        agg=Aggregation("seq-mean-token-mean", num_seqs=counts.get("num_seqs")),
    )
    _check(loss, logp, out)
    assert float(m["ppo_kl"]) == pytest.approx(out["metrics"]["actor/ppo_kl"], abs=1e-12)


@pytest.mark.parametrize("case", _cases("verl", "dppo_tv") + _cases("verl", "dppo_kl"), ids=_ids)
def test_dppo_matches_verl(case):
    """DPPO-TV and DPPO-KL: the trust-region masks, the truncated weight, loss, gradient and both fractions equal
    verl's (clip_ratio_c 3.0 as verl's ActorConfig sets it, and 1.5 with the non-default bounds)."""
    logp, old, adv, mask, _, _ = _batch(case)
    p, out = case["params"], case["outputs"]
    fn = losses.dppo_tv_loss if p["loss_mode"] == "dppo_tv" else losses.dppo_kl_loss
    loss, m = fn(
        logp,
        old,
        adv,
        mask,
        eps_low=p["clip_ratio_low"],
        eps_high=p["clip_ratio_high"],
        clip_ratio_c=p["clip_ratio_c"],
        agg=Aggregation(p["loss_agg_mode"], **_verl_counts(case, mask)),
    )
    _check(loss, logp, out)
    assert float(m["clipfrac"]) == pytest.approx(out["metrics"]["actor/pg_clipfrac"], abs=FRAC)
    assert float(m["clipfrac_trunc"]) == pytest.approx(out["metrics"]["actor/pg_clipfrac_lower"], abs=FRAC)
    assert float(m["ppo_kl"]) == pytest.approx(out["metrics"]["actor/ppo_kl"], abs=1e-12)


@pytest.mark.parametrize("case", _cases("verl", "geo_mean"), ids=_ids)
def test_geo_mean_matches_verl(case):
    """GMPO: verl takes the mean over every row of the micro-batch (num_seqs = B, the empty row included) and ignores
    loss_agg_mode and global_batch_info; with that count, loss, gradient and clip fractions equal verl's."""
    logp, old, adv, mask, _, _ = _batch(case)
    p, out = case["params"], case["outputs"]
    loss, m = losses.geo_mean_loss(
        logp,
        old,
        adv,
        mask,
        eps_low=p["clip_ratio_low"],
        eps_high=p["clip_ratio_high"],
        agg=Aggregation("seq-mean-token-mean", num_seqs=mask.shape[0]),
    )
    _check(loss, logp, out)
    assert float(m["clipfrac"]) == pytest.approx(out["metrics"]["actor/pg_clipfrac"], abs=FRAC)
    assert float(m["clipfrac_low"]) == pytest.approx(out["metrics"]["actor/pg_clipfrac_lower"], abs=FRAC)


def test_geo_mean_takes_no_other_aggregation():
    """GMPO's weights are seq-mean-token-mean's; asking for another aggregation is an error, not a silent default."""
    z = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="seq-mean-token-mean"):
        losses.geo_mean_loss(z, z, torch.ones(2), z.bool(), agg="token-mean")


# The ERC fork's older agg_loss, expressed with aggregate's counts: token-mean divides by count + 1e-8;
# seq-mean-token-sum(-norm) by every row (no empty rows in those cases), -norm without the mean over rows
def _erc_counts(agg, mask) -> dict:
    rows = mask.shape[0]
    return {
        "token-mean": dict(num_tokens=float(mask.sum()) + 1e-8),
        "seq-mean-token-mean": dict(num_seqs=rows),
        "seq-mean-token-sum": dict(num_seqs=rows),
        "seq-mean-token-sum-norm": dict(num_seqs=1.0, norm=mask.shape[-1]),
    }[agg]


@pytest.mark.parametrize("case", _cases("erc"), ids=_ids)
def test_erc_matches_the_authors_code(case):
    """ERC: loss, gradient (no gradient outside the entropy-ratio band), clip fraction, ppo_kl and the in-band fraction
    equal Kwai-Klear/ERC's compute_policy_loss_grpo_erc. Their seq-mean-token-mean divides each row by its count
    without verl's + 1e-8, so that mode agrees to 1e-8 relative (the epsilon over rows of 1 to 8 tokens)."""
    logp, old, adv, mask, h, h_old = _batch(case)
    p, out = case["params"], case["outputs"]
    agg = p["loss_agg_mode"]
    loss, m = losses.erc_loss(
        logp,
        old,
        adv,
        mask,
        band=losses.erc_keep(h, h_old, erc_low=p["entropy_mask_low"], erc_high=p["entropy_mask_high"]),
        eps_low=p["clip_ratio_low"],
        eps_high=p["clip_ratio_high"],
        dual_clip_c=p["clip_ratio_c"],
        agg=Aggregation(agg, **_erc_counts(agg, mask)),
    )
    _check(loss, logp, out, rtol=2e-8 if agg == "seq-mean-token-mean" else 1e-12)
    assert float(m["clipfrac"]) == pytest.approx(out["metrics"]["pg_clipfrac"], abs=FRAC)
    assert float(m["ppo_kl"]) == pytest.approx(out["metrics"]["ppo_kl"], abs=1e-12)
    assert float(m["erc_kept_frac"]) == pytest.approx(out["metrics"]["entropy_frac"], abs=FRAC)


def test_erc_fixture_exercises_the_band():
    """The fixture's entropies put tokens on both sides of the band, and its gradient is zero exactly there (so the
    parity above tests the band, not only the PPO part)."""
    case = next(c for c in _cases("erc") if c["name"] == "erc-mixed-token-mean")
    _, _, adv, mask, h, h_old = _batch(case)
    band = losses.erc_keep(h, h_old)
    valid = mask.bool() & (adv != 0)
    assert (valid & band).any() and (valid & ~band).any()
    assert (_t(case["outputs"]["grad_log_prob"])[valid & ~band] == 0).all()


@pytest.mark.parametrize("case", QAE, ids=_ids)
def test_qae_matches_the_authors_baseline(case):
    """QAE: the group's K-quantile baseline (torch.quantile) over GRPO's std, singleton and equal-reward groups
    included, K 0.2 / 0.4 / 0.8, without std normalisation, and K outside (0, 1) falling back to the mean."""
    i, p = case["inputs"], case["params"]
    adv = qae(
        _t(i["scores"]),
        group_ids(i["uid"]),
        quantile_k=p["quantile_k"],
        norm_by_std=p["norm_adv_by_std_in_grpo"],
        epsilon=p["epsilon"],
    )
    torch.testing.assert_close(adv[:, None] * _t(i["response_mask"]), _t(case["outputs"]["advantages"]), **F64)


def test_qae_zeroes_most_binary_advantages():
    """With binary rewards, K 0.4: a group with 1 success in 8 gets baseline 0 (its failures 0, its success > 0); a
    group with 7 in 8 baseline 1 (its successes 0, its failure < 0), as the authors' two-regime gate says."""
    scores = torch.tensor([1.0] + [0.0] * 7 + [1.0] * 7 + [0.0])
    adv = qae(scores, torch.arange(2).repeat_interleave(8))
    assert adv[0] > 0 and (adv[1:8] == 0).all() and (adv[8:15] == 0).all() and adv[15] < 0


@pytest.mark.parametrize("name", ["cispo", "dppo_tv", "dppo_kl", "erc", "sapo", "geo_mean"])
@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "token-sum"])
def test_on_policy_each_engine_loss_has_grpos_gradient(name, agg):
    """At the behaviour policy (every ratio exactly 1, the entropies unchanged: the strict on-policy step) no clip,
    mask, gate or band of these losses acts, so d loss / d log p is PPO-clip's (GRPO's), -A w_t with w_t the
    aggregation's token weight, within float64 rounding; SAPO and GMPO under their own aggregation (verl's
    seq-mean-token-mean) against PPO-clip under the same. This is why their demo runs equal GRPO's bit for bit
    (docs/evidence, the losses engines ship)."""
    from entropy_rft.config import load_config
    from entropy_rft.core.methods import POLICY_LOSSES

    g = torch.Generator().manual_seed(3)
    mask = (torch.rand(6, 9, generator=g) < 0.8).double()
    mask[2] = 0.0  # an empty row
    adv = torch.randn(6, generator=g, dtype=torch.float64).unsqueeze(-1).expand(6, 9)
    adv = torch.where(torch.arange(6).unsqueeze(-1) == 4, 0.0, adv)  # a row with A = 0
    old = -torch.rand(6, 9, generator=g, dtype=torch.float64) * 3
    ent = torch.rand(6, 9, generator=g, dtype=torch.float64)
    cfg = load_config(None, method=name)

    def grad(loss_name):
        spec = POLICY_LOSSES.get(loss_name)
        logp = old.clone().requires_grad_()
        mode = POLICY_LOSSES.get(name).agg or agg
        counts = {"num_tokens": mask.sum(), "num_seqs": 6.0, "norm": 9.0}
        loss, _ = spec.loss(logp, old, adv, mask, cfg, agg=Aggregation(mode, **counts), entropy=ent, old_entropy=ent)
        loss.backward()
        return logp.grad

    reference = grad("ppo")
    assert reference.abs().sum() > 0 and (reference[mask == 0] == 0).all()
    # GMPO, as verl, divides by a row's token count + 1e-8 (in its ratio's exponent and its advantage's mean), which
    # moves its gradient by up to 1e-8 relative to one token's; the others compute the same float64 expression
    rtol = 2e-8 if name == "geo_mean" else 1e-12
    torch.testing.assert_close(grad(name), reference, rtol=rtol, atol=1e-15)
