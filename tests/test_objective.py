"""objective.Objective: the update's loss as a sum of named terms, each a mean over its own token set.

Properties: the micro-batches' totals, terms and their gradients sum to the whole mini-batch's, for every
aggregation and with every term (the mini-batch's counts are global); each term equals a slow reference written
from its formula (a loop over tokens in float64); a term with coefficient 0 is skipped; the zero-advantage rule is
derived from the terms; denominator="all" counts every valid token in the loss set."""

import math

import pytest
import torch

from entropy_rft.config import load_config
from entropy_rft.core.dynamics import TokenStats
from entropy_rft.core.losses import AGG_MODES
from entropy_rft.core.objective import Micro, Objective

B, R = 6, 5


def batch(seed: int = 0) -> dict:
    """Statistics with gradients, old log p and values, advantages, token sets, returns and a reference's log p."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([5, 3, 1, 4, 2, 5])
    valid = torch.arange(R)[None] < lengths[:, None]
    loss = valid & (torch.rand(B, R, generator=g) < 0.8)
    loss[:, 0] = valid[:, 0]  # every row keeps a token
    logp = (-torch.rand(B, R, generator=g) * 2).requires_grad_()
    entropy = (torch.rand(B, R, generator=g) * 2).requires_grad_()
    values = torch.randn(B, R, generator=g).requires_grad_()
    return {
        "logp": logp,
        "entropy": entropy,
        "values": values,
        "valid": valid,
        "loss": loss,
        "old_logp": logp.detach() + 0.1 * torch.randn(B, R, generator=g),
        "ref_logp": logp.detach() + 0.2 * torch.randn(B, R, generator=g),
        "old_values": values.detach() + 0.3 * torch.randn(B, R, generator=g),
        "returns": torch.randn(B, R, generator=g),
        "adv": torch.randn(B, generator=g),
        "high": loss & (torch.rand(B, R, generator=g) < 0.5),
    }


def micro(d: dict, rows, *, entropy_coef: float = 0.0, alpha: float = 0.0) -> Micro:
    stats = TokenStats(d["logp"][rows], d["entropy"][rows], torch.zeros(len(rows), R), torch.zeros(len(rows), R))
    masks = {"loss": d["loss"][rows], "valid": d["valid"][rows], "high": d["high"][rows]}
    return Micro(
        stats,
        d["values"][rows],
        d["old_logp"][rows],
        d["adv"][rows],
        masks,
        old_values=d["old_values"][rows],
        returns=d["returns"][rows],
        ref_logp=d["ref_logp"][rows],
        entropy_coef=entropy_coef,
        alpha=alpha,
    )


def run(objective: Objective, d: dict, parts: list[torch.Tensor], **knobs) -> tuple[float, dict, list[torch.Tensor]]:
    """(total, terms, gradients) summed over the micro-batches `parts` with the whole batch's counts."""
    every = torch.arange(B)
    counts = objective.counts({k: d[k][every] for k in ("loss", "valid", "high")}, d["valid"], "cpu")
    leaves = [d["logp"], d["entropy"], d["values"]]
    for x in leaves:
        x.grad = None
    total, terms = 0.0, {}
    for rows in parts:
        loss, values, _ = objective(micro(d, rows, **knobs), counts)
        loss.backward()
        total += float(loss.detach())
        for k, v in values.items():
            terms[k] = terms.get(k, 0.0) + float(v)
    return total, terms, [torch.zeros_like(x) if x.grad is None else x.grad.clone() for x in leaves]


@pytest.mark.parametrize("agg", AGG_MODES)
def test_micro_batches_sum_to_the_mini_batch(agg):
    """Splitting the mini-batch into micro-batches changes neither the total, the terms, nor the gradient (the
    policy, KL, value, entropy-bonus and EntroPIC terms, each over its own token set)."""
    cfg = load_config(None, loss_agg=agg, kl_coef=0.05, vf_coef=0.5, max_new_tokens=R)
    objective = Objective.of(cfg, kl=True, value=True, entropy_bonus=True, entropic=True)
    d = batch()
    whole = run(objective, d, [torch.arange(B)], entropy_coef=0.01, alpha=0.3)
    split = run(objective, d, list(torch.arange(B).split(2)), entropy_coef=0.01, alpha=0.3)
    assert whole[0] == pytest.approx(split[0], rel=1e-5, abs=1e-6)
    assert whole[1].keys() == split[1].keys() == {"policy", "kl", "value", "entropy_bonus", "entropic"}
    for k in whole[1]:
        assert whole[1][k] == pytest.approx(split[1][k], rel=1e-5, abs=1e-6), k
    for a, b in zip(whole[2], split[2]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


def test_terms_equal_their_formulas_token_by_token():
    """token-mean: the KL term is k3 = exp(ref - logp) - (ref - logp) - 1 averaged over the loss tokens; the
    entropy bonus's value is the loss tokens' mean H and enters the total with -entropy_coef; EntroPIC's value is
    the mean over T_hi of -r |A| and enters with alpha; the total is the sum of coefficient x value (float64 loops)."""
    cfg = load_config(None, kl_coef=0.05, max_new_tokens=R)
    objective = Objective.of(cfg, kl=True, value=False, entropy_bonus=True, entropic=True)
    d = batch(1)
    total, terms, _ = run(objective, d, [torch.arange(B)], entropy_coef=0.02, alpha=0.4)
    kl = ent = hi = 0.0
    n_loss, n_high = int(d["loss"].sum()), int(d["high"].sum())
    for i in range(B):
        for t in range(R):
            if d["loss"][i, t]:
                delta = float(d["ref_logp"][i, t]) - float(d["logp"][i, t])
                kl += math.exp(delta) - delta - 1
                ent += float(d["entropy"][i, t])
            if d["high"][i, t]:
                r = math.exp(float(d["logp"][i, t]) - float(d["old_logp"][i, t]))
                hi += -r * abs(float(d["adv"][i]))
    assert terms["kl"] == pytest.approx(kl / n_loss, rel=1e-5)
    assert terms["entropy_bonus"] == pytest.approx(ent / n_loss, rel=1e-5)
    assert terms["entropic"] == pytest.approx(hi / n_high, rel=1e-5)
    want = terms["policy"] + 0.05 * terms["kl"] - 0.02 * terms["entropy_bonus"] + 0.4 * terms["entropic"]
    assert total == pytest.approx(want, rel=1e-5)


def test_a_zero_coefficient_skips_its_term():
    """The adaptive bonus at coefficient 0 (and EntroPIC at alpha 0) leave the step: no value, no loss share."""
    objective = Objective.of(
        load_config(None, max_new_tokens=R), kl=False, value=False, entropy_bonus=True, entropic=True
    )
    _, terms, _ = run(objective, batch(), [torch.arange(B)], entropy_coef=0.0, alpha=0.0)
    assert set(terms) == {"policy"}


def test_zero_advantage_rule_comes_from_the_terms():
    """Rows with advantage 0 may skip the backward only when every term's gradient vanishes there: the policy loss
    linear in A and EntroPIC's -r|A| do; the KL, value and entropy terms and KL-Cov's |log r| do not."""
    cfg = load_config(None)

    def vanishes(c=cfg, **kw) -> bool:
        terms = {"kl": False, "value": False, "entropy_bonus": False, "entropic": False, **kw}
        return Objective.of(c, **terms).vanishes_at_zero_advantage

    assert vanishes() and vanishes(entropic=True)
    assert not vanishes(kl=True) and not vanishes(value=True) and not vanishes(entropy_bonus=True)
    assert not vanishes(load_config(None, policy_loss="kl_cov"))


def test_denominator_all_counts_every_valid_token():
    """denominator="all": the loss set's token count is every valid token (filtered tokens stay in the mean's
    denominator); "kept": only the kept ones."""
    d = batch()
    masks = {k: d[k] for k in ("loss", "valid", "high")}
    kept = Objective.of(load_config(None), kl=False, value=False, entropy_bonus=False, entropic=False)
    every = Objective.of(
        load_config(None, denominator="all"), kl=False, value=False, entropy_bonus=False, entropic=False
    )
    assert int(kept.counts(masks, d["valid"], "cpu")["loss"][0]) == int(d["loss"].sum())
    assert int(every.counts(masks, d["valid"], "cpu")["loss"][0]) == int(d["valid"].sum()) > int(d["loss"].sum())
