"""GRPODropout (hexuandeng/GRPODropout) as method "grpo_dropout": core.rollouts.grpo_dropout against the authors'
selector, recompute and recentring run on fixed inputs (tests/fixtures/grpo_dropout_oracle.json); the selection
rule's invariants against a brute-force reading of it; the method by name in the trainer, composed with Clip_B and the
mu controller."""

from __future__ import annotations

import pytest
import torch
from conftest import f32, group_ids, load_fixture

from entropy_rft.config import load_config
from entropy_rft.core.advantages import ADVANTAGES
from entropy_rft.core.methods import METHODS
from entropy_rft.core.rollouts import GRPO_DROPOUT_EPS, grpo_dropout, rollout_pushes

ORACLE = load_fixture("grpo_dropout_oracle.json")
GRPO = ADVANTAGES.get("grpo")


def _ours(case, generator=None):
    inputs, p = case["inputs"], case["params"]
    scores, gids = f32(inputs["rewards"]), group_ids(inputs["uid"])
    logp, mask = f32(inputs["old_log_probs"]), torch.tensor(inputs["response_mask"]).bool()
    adv = GRPO(scores, gids)
    out = grpo_dropout(
        scores,
        adv,
        gids,
        logp,
        mask,
        estimator=GRPO,
        basis=p["basis"],
        recenter=p["adv_p_center_mode"] != "none",
        generator=generator,
    )
    return adv, out, gids, logp, mask


@pytest.mark.parametrize("case", ORACLE["cases"], ids=lambda c: c["name"])
def test_equals_the_authors_code(case):
    """On each fixed input (binary and graded rewards, groups of 4, 8 and 16, the sum basis, no recentring, groups
    whose pushes are all 0, groups of one push sign) the pushes equal the authors' to float32 rounding, the kept
    rollouts are theirs exactly (in a group whose pushes are all 0, which ones is a random draw: the count), and the
    final advantages of the kept rollouts equal theirs to float32 rounding."""
    out = case["outputs"]
    adv, (ours, keep, _), gids, logp, mask = _ours(case)
    torch.testing.assert_close(adv, f32(out["advantages_before"]), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(
        rollout_pushes(adv, logp, mask, gids, basis=case["params"]["basis"]),
        torch.tensor(out["push"], dtype=torch.float64),
        rtol=1e-5,
        atol=1e-6,
    )
    uids = case["inputs"]["uid"]
    theirs = torch.zeros_like(keep)
    theirs[out["selected"]] = True
    fallback = torch.tensor([u in out["random_fallback_groups"] for u in uids])
    assert torch.equal(keep[~fallback], theirs[~fallback])
    for g in set(out["random_fallback_groups"]):
        rows = torch.tensor([u == g for u in uids])
        assert int(keep[rows].sum()) == int(theirs[rows].sum())
    if fallback.any():  # the kept rows of a random draw differ, so their group's advantages are compared by rule
        assert not fallback[out["selected"]].all()
    sel = torch.tensor(out["selected"])
    compare = ~fallback[sel]
    torch.testing.assert_close(ours[sel][compare], f32(out["advantages"])[compare], rtol=1e-5, atol=1e-6)
    assert torch.equal(ours[~keep], torch.zeros_like(ours[~keep]))


def _brute(push: list[float]) -> set[int]:
    """The selection as a specification: every h > 0; then the h < 0 closest to 0 first while the kept sum stays
    > eps; then zeros (by index) up to max(1, G // 4); with one sign only, then the negatives closest to 0."""
    eps, g = GRPO_DROPOUT_EPS, len(push)
    least = max(1, g // 4)
    pos = [i for i, h in enumerate(push) if h > eps]
    neg = sorted((i for i, h in enumerate(push) if h < -eps), key=lambda i: -push[i])
    zero = [i for i, h in enumerate(push) if abs(h) <= eps]
    keep = list(pos)
    if pos and neg:
        total = sum(push[i] for i in pos)
        for i in neg:
            if total + push[i] <= eps:
                break
            keep.append(i)
            total += push[i]
    keep += zero[: max(0, least - len(keep))]
    if not (pos and neg):
        keep += neg[: max(0, least - len(keep))]
    return set(keep)


@pytest.mark.parametrize("seed", range(40))
def test_selection_matches_its_specification(seed):
    """Random groups of 2 to 16 rollouts with pushes of both signs, one sign, and zeros: the kept set is the
    specification's, the kept pushes sum to > 0 whenever any push is positive, and at least max(1, G // 4) are kept."""
    gen = torch.Generator().manual_seed(seed)
    g = int(torch.randint(2, 17, (1,), generator=gen))
    kind = seed % 4
    h = torch.randn(g, generator=gen, dtype=torch.float64)
    if kind == 1:
        h = h.abs()
    elif kind == 2:
        h = -h.abs()
    elif kind == 3:
        h[torch.rand(g, generator=gen) < 0.3] = 0.0
    from entropy_rft.core.rollouts import _select_group

    keep = _select_group(h, gen, GRPO_DROPOUT_EPS)
    assert set(keep.nonzero().squeeze(-1).tolist()) == _brute(h.tolist())
    assert int(keep.sum()) >= max(1, g // 4)
    if bool((h > 0).any()):
        assert float(h[keep].sum()) > 0


def test_recentred_weighted_mean_is_zero_and_deleted_rows_leave_the_loss():
    """After the rule, each group's kept advantages have e^{-s}-weighted mean 0 (s the mean token surprisal), and the
    deleted rollouts carry advantage 0 and keep False."""
    case = ORACLE["cases"][0]
    _, (ours, keep, metrics), gids, logp, mask = _ours(case)
    s = -(logp * mask).sum(-1) / mask.sum(-1)
    for g in gids.unique():
        rows = (gids == g) & keep
        w = torch.exp(-s[rows].double())
        assert abs(float((w * ours[rows].double()).sum() / w.sum())) < 1e-6
    assert 0 < metrics["rollouts_kept_frac"] < 1


def test_options_are_checked(tmp_path):
    """A bad basis is refused; the options belong to methods with the rule."""
    with pytest.raises(ValueError, match="basis"):
        rollout_pushes(torch.zeros(2), torch.zeros(2, 3), torch.ones(2, 3, dtype=torch.bool), torch.zeros(2), basis="x")
    assert set(METHODS.get("grpo_dropout").option_names()) == {"basis", "recenter"}
    with pytest.raises(ValueError, match="grpo_dropout_basis is an option of method 'grpo_dropout'"):
        load_config(None, method="grpo", grpo_dropout_basis="sum", out=str(tmp_path / "a"))
    with pytest.raises(ValueError, match="grpo_dropout_basis"):
        load_config(None, method="grpo_dropout", grpo_dropout_basis="mean", out=str(tmp_path / "b"))
