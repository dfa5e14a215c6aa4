"""`entropy_rft.theory`: the tabular checks are exact to first order; the model checks run and agree in sign."""

import torch

from entropy_rft.theory import format_table, model_checks, tabular_checks


def by_name(rows):
    return {r["check"].split(":")[0]: r for r in rows}


def test_tabular_first_order_predictions_hold():
    """Every first-order prediction has the sign of the exact change and a relative error of order the step."""
    rows = by_name(tabular_checks(step=1e-3))
    for name in ("Theorem 1", "Theorem 2", "Corollary 3", "Corollary 4", "Corollary 4.1 (off-policy, ratios r)"):
        assert rows[name]["sign_agreement"] == 1.0, name
        assert rows[name]["median_rel_error"] < 5e-3, (name, rows[name])
    assert rows["Corollary 1"]["max_abs"] < 1e-12
    c2 = rows["Corollary 2"]
    assert abs(c2["mean_s_c"]) < 4 * c2["stderr_s_c"] and c2["mean_s_star"] > 10 * abs(c2["mean_s_c"])


def test_tabular_error_shrinks_with_the_step():
    """The relative error is first order in the step: 10x smaller step, about 10x smaller error."""
    big, small = by_name(tabular_checks(step=1e-2)), by_name(tabular_checks(step=1e-3))
    for name in ("Theorem 1", "Theorem 2", "Corollary 4"):
        ratio = big[name]["median_rel_error"] / small[name]["median_rel_error"]
        assert 5 < ratio < 20, (name, ratio)


def test_model_checks_agree_in_sign_more_often_than_chance():
    """On the shipped policy, single-token parameter steps move entropy in the predicted direction for most
    tokens, and the parameters are restored after the checks."""
    from entropy_rft.config import TrainConfig
    from entropy_rft.tasks import CountdownTask
    from entropy_rft.trainer import default_data, load_policy, load_problems

    model, tok = load_policy("countdown-tiny", torch.device("cpu"))
    before = [p.detach().clone() for p in model.parameters()]
    task = CountdownTask()
    rows = model_checks(model, tok, task, load_problems(default_data(TrainConfig(), "train"), task), n_tokens=32,
                        n_batches=2)
    assert rows[0]["n"] == 32 and rows[0]["sign_agreement"] > 0.6
    for p, q in zip(model.parameters(), before):
        assert torch.equal(p, q)
    assert "| model: GRPO step on a batch |" in format_table(rows)
