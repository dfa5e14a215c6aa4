"""`entropy-rft report` and `sweep` on runs this test suite makes."""

import json

import numpy as np
import pytest
from tiny import THREE_STEPS, tiny_config

from entropy_rft.commands.cli import main
from entropy_rft.commands.report import build_report, correlation, prediction_summary, sign_base_rate
from entropy_rft.config import load_config
from entropy_rft.logging import read_metrics
from entropy_rft.train.trainer import train


def small(tmp_path, name, **kw):
    return tiny_config(tmp_path, name, shape=THREE_STEPS, **kw)


def test_correlation_matches_numpy():
    """Pearson r equals numpy's; sign agreement counts pairs of equal sign (4 of 5 here)."""
    x, y = [1.0, 2.0, 3.5, -1.0, 0.5], [2.0, 1.0, 4.0, -3.0, -0.2]
    r, agree, n = correlation(x, y)
    assert r == pytest.approx(np.corrcoef(x, y)[0, 1]) and n == 5 and agree == pytest.approx(0.8)


def test_prediction_summary_against_numpy_and_base_rate():
    """prediction_summary: Pearson r as numpy's, sign agreement beside the constant-sign base rate (the share of
    the majority sign among the realised values of the same steps), median of realised / predicted, LS slope
    through the origin; steps with a missing value are dropped."""
    pred = [1.0, 2.0, -0.5, 0.8, float("nan"), 1.5, 0.2]
    real = [0.9, 1.7, -0.2, -0.1, 3.0, 1.2, 0.3]
    s = prediction_summary(pred, real)
    x, y = np.array([1.0, 2.0, -0.5, 0.8, 1.5, 0.2]), np.array([0.9, 1.7, -0.2, -0.1, 1.2, 0.3])
    assert s["n"] == 6 and s["corr"] == pytest.approx(np.corrcoef(x, y)[0, 1])
    assert s["sign_agreement"] == pytest.approx(5 / 6) and s["sign_base_rate"] == pytest.approx(4 / 6)
    assert s["median_ratio"] == pytest.approx(np.median(y / x)) and s["slope"] == pytest.approx(
        (x * y).sum() / (x * x).sum()
    )
    assert sign_base_rate([-1.0, -2.0, 3.0, 0.0]) == pytest.approx(2 / 3)


def test_report_shows_first_order_beside_realised(tmp_path):
    """A run whose realised change is 0.9 x the first-order one on every probed step: the report's summary
    line and report.json give r = 1, ratio 0.9 and the sign agreement beside its base rate; steps without a
    probe are left out."""
    run = tmp_path / "r"
    run.mkdir()
    fo = [1e-3, -2e-3, 5e-4, 3e-3, -1e-3, 2e-3]
    rows = []
    for i, f in enumerate(fo):
        row = {
            "step": i + 1,
            "entropy": 0.3,
            "clip_frac": 0.0,
            "s_star_mean": 0.1,
            "s_centered_mean": 0.0,
            "cov_a_sc": 0.01,
            "grad_norm": 1.0,
            "reward_mean": 0.5,
            "entropy_change/predicted": -f * 1e-3,
        }
        row.update({"entropy_change/first_order": f, "entropy_change/realised": 0.9 * f})
        rows.append(row)
    rows.append({"step": 7, "entropy": 0.3, "clip_frac": 0.0, "entropy_change/predicted": 1.0})  # not probed
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    page = build_report([run], tmp_path / "rep")
    text = page.read_text()
    assert (
        "r, first-order change against realised over 6 probed steps: r = 1.000, realised / predicted median 0.9 "
        "(slope 0.9), same sign on 100% of steps against 67% for a constant-sign guess"
    ) in text
    assert "Corollary 4 (logit space, SGD step sizes) against realised over 6 probed steps: r = -1.000" in text
    got = json.loads((tmp_path / "rep" / "report.json").read_text())["r"]
    assert got["first_order"]["median_ratio"] == pytest.approx(0.9) and got["logit_space"]["sign_agreement"] == 0.0
    assert not (tmp_path / "rep" / "entropy_by_region.png").exists()  # a run without the regions: no region figure


@pytest.mark.slow
def test_report_writes_every_figure(tmp_path):
    """Two Clip_B runs at different mu and a GRPO run give all figures, the mu figure included."""
    for name, kw in {
        "b1": {"method": "clip_b", "mu": 1.0},
        "b2": {"method": "clip_b", "mu": 2.0},
        "g": {"method": "grpo"},
    }.items():
        train(small(tmp_path, name, **kw))
    page = build_report([tmp_path / n for n in ("b1", "b2", "g")], tmp_path / "rep")
    text = page.read_text()
    for png in (
        "entropy.png",
        "s_means.png",
        "cov.png",
        "grad_norm.png",
        "clip_vs_mu.png",
        "pass_rates.png",
        "predicted_vs_realised.png",
        "entropy_by_region.png",
    ):
        assert (tmp_path / "rep" / png).read_bytes()[:4] == b"\x89PNG", png
        assert png in text
    assert text.count("| clip_b |") == 2
    assert set(json.loads((tmp_path / "rep" / "report.json").read_text())) == {"b1", "b2", "g"}
    # report.html: the same table, every figure inline, and a link to the token view of the three runs
    html = (tmp_path / "rep" / "report.html").read_text()
    assert html.count("data:image/png;base64,") == 8 and html.count("<td>clip_b</td>") == 2 and "![" not in html
    assert '<a href="inspect.html">' in html and "http" not in html.replace("http-equiv", "")
    assert "b1" in (tmp_path / "rep" / "inspect.html").read_text()


def test_report_rejects_a_directory_without_metrics(tmp_path):
    with pytest.raises(FileNotFoundError, match="no metrics.jsonl"):
        build_report([tmp_path], tmp_path / "rep")


@pytest.mark.slow
def test_sweep_resumes(tmp_path, capsys):
    """A rerun of the same sweep skips finished (method, mu) runs."""
    args = ["sweep", "--method", "clip_v", "--mu", "1,3", "--steps", "1", "--out", str(tmp_path), "--quiet"]
    main(args)
    main(args)
    out = capsys.readouterr().out
    assert out.count("done, skipped") == 2
    assert (tmp_path / "clip_vs_mu.png").exists()


@pytest.mark.slow
def test_trainer_with_entropy_targets(tmp_path):
    """The mu controller logs its mu and kappa each step; the adaptive bonus logs a moving coefficient."""
    cfg = small(tmp_path, "mu", method="clip_b", entropy_target=5.0, steps=3)
    train(cfg)
    rows = read_metrics(cfg.out)
    assert all("filter/kappa" in r for r in rows)
    cfg = small(tmp_path, "bonus", method="grpo", entropy_target=5.0, entropy_control="bonus", bonus_delta=0.01)
    train(cfg)
    assert [round(r["entropy_coef"], 6) for r in read_metrics(cfg.out)] == [0.01, 0.02, 0.03]


def test_target_config_errors():
    with pytest.raises(ValueError, match="use a method with their filter"):
        load_config(None, method="grpo", entropy_target=0.3)
    with pytest.raises(ValueError, match="entropy_control"):
        load_config(None, method="clip_b", entropy_target=0.3, entropy_control="pid")


@pytest.mark.slow
def test_theory_cli_tabular(capsys):
    main(["theory", "--no-model"])
    assert "Theorem 2: dz = alpha (e_k - p)" in capsys.readouterr().out


def test_a_short_run_gets_no_placeholder_rows(tmp_path):
    """Property (issue 43): a 2-step Clip_B run with no probed step and no eval shows its method's mu (marked as the
    default), no column or line of dashes for the probe it lacks, and says why instead."""
    run = tmp_path / "short"
    run.mkdir()
    (run / "config.yaml").write_text("method: clip_b\nmu: null\nprobe_every: 10\n")
    rows = [
        {
            "step": s,
            "entropy": 0.4,
            "clip_frac": 0.0,
            "s_star_mean": 0.1,
            "s_centered_mean": 0.0,
            "cov_a_sc": 0.0,
            "grad_norm": 1.0,
            "reward_mean": 0.5,
        }
        for s in (1, 2)
    ]
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    text = build_report([run], tmp_path / "rep").read_text().split("\n## ")[0]
    row = next(line for line in text.splitlines() if line.startswith("| short |"))
    assert "| 2.5 (default) |" in row and "| - |" not in row and "corr(first order" not in text
    assert "no probed step (probe_every 10, 2 steps logged" in text and " r = -" not in text
