"""The pre-registered analysis of the Avg@K study (benchmarks/avgk_analysis.py, docs/prereg_avgk.md), run on synthetic
records whose answers are known: a method that adds correct samples to every problem, one identical to GRPO, strata
whose differences are computed here by loops, and records that the pre-registration refuses."""

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

SPEC = importlib.util.spec_from_file_location(
    "avgk_analysis", Path(__file__).resolve().parents[1] / "benchmarks" / "avgk_analysis.py"
)
avgk = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(avgk)

N, STEPS, SEEDS, PROBLEMS = 32, 1500, 3, 12
STRATA = ["unsolved"] * 4 + ["hard"] * 4 + ["easier"] * 4


def record(method: str, seed: int, final: list[int], *, steps: int = STEPS, rng=None) -> dict:
    rng = rng or np.random.default_rng(seed)
    initial = [0] * 4 + [3] * 4 + [20] * 4
    entropy = list(np.round(np.linspace(0.5, 0.2 if method == "grpo" else 0.3, steps), 5))
    return {
        "task": "countdown5_large",
        "method": method,
        "seed": seed,
        "key": "0" * 12,
        "steps": steps,
        "eval_n": N,
        "initial_correct": initial,
        "final_correct": final,
        "eval_correct": {"0": initial, "300": [int(v) for v in rng.integers(0, N + 1, PROBLEMS)], str(steps): final},
        "entropy": entropy,
    }


def synthetic(extra: int = 6) -> list[dict]:
    """GRPO with random final counts; Clip_B with `extra` more correct samples on every problem (capped at n);
    Clip_V equal to GRPO."""
    cells = []
    for s in range(SEEDS):
        base = [int(v) for v in np.random.default_rng(100 + s).integers(0, N - extra + 1, PROBLEMS)]
        cells += [
            record("grpo", s, base),
            record("clip_b", s, [c + extra for c in base]),
            record("clip_v", s, list(base)),
        ]
    return cells


def run(cells, **kw):
    return avgk.analyse(cells, STRATA, replicates_primary=1999, replicates=499, **kw)


def test_primary_endpoint_values_p_and_holm():
    """Clip_B's difference is exactly extra / n on every cell, so every replicate is > 0: p = 2 / (B + 1), Holm
    doubles it (the smaller of two), and the verdict is 'raises'; Clip_V's difference is 0 in every cell: p = 1,
    adjusted 1, no verdict."""
    r = run(synthetic(extra=6))
    b, v = r["primary"]["clip_b"], r["primary"]["clip_v"]
    assert b["value"] == pytest.approx(6 / N) and b["low"] == pytest.approx(6 / N)
    assert b["p"] == pytest.approx(2 / 2000) and b["p_holm"] == pytest.approx(4 / 2000)
    assert b["raises"] and not b["lowers"]
    assert v["value"] == 0 and v["p"] == 1 and v["p_holm"] == 1 and not v["raises"] and not v["lowers"]
    assert r["seeds"] == [0, 1, 2] and r["problems"] == PROBLEMS


def test_by_stratum_differences_equal_loops_over_their_problems():
    """Each stratum's paired difference is the mean over its problems and the seeds of the per-problem difference
    (Avg@32: c / n; Pass@32 from 32 samples: 1 if c > 0), computed here by loops."""
    cells = synthetic()
    # make Clip_V differ from GRPO unevenly across strata
    for c in cells:
        if c["method"] == "clip_v":
            c["final_correct"] = [min(N, x + (i % 3)) for i, x in enumerate(c["final_correct"])]
            c["eval_correct"][str(STEPS)] = c["final_correct"]
    r = run(cells)
    from entropy_rft import toy

    assert avgk.STRATA == toy.STRATA and list(r["by_stratum"]) == list(toy.STRATA)  # rows in the builder's order
    by = {(c["method"], c["seed"]): c["final_correct"] for c in cells}
    for name in ("unsolved", "hard", "easier"):
        cols = [i for i, s in enumerate(STRATA) if s == name]
        avg = [(by[("clip_v", s)][i] - by[("grpo", s)][i]) / N for s in range(SEEDS) for i in cols]
        hit = [float(by[("clip_v", s)][i] > 0) - float(by[("grpo", s)][i] > 0) for s in range(SEEDS) for i in cols]
        assert r["by_stratum"][name]["problems"] == len(cols)
        assert r["by_stratum"][name]["clip_v avg@32"]["value"] == pytest.approx(sum(avg) / len(avg))
        assert r["by_stratum"][name]["clip_v pass@32"]["value"] == pytest.approx(sum(hit) / len(hit))


def test_secondary_entropy_and_curves():
    """Secondary family: four comparisons, each adjusted p >= its raw p; the per-run entropy is the mean of the last
    10% of steps; the curves hold every evaluation step all seeds share, with the final one equal to the absolute
    final figures."""
    r = run(synthetic())
    assert set(r["secondary"]) == {"clip_b pass@8", "clip_b pass@32", "clip_v pass@8", "clip_v pass@32"}
    assert all(e["p_holm"] >= e["p"] for e in r["secondary"].values())
    ent = list(np.round(np.linspace(0.5, 0.3, STEPS), 5))
    assert avgk.final_entropy({"entropy": ent}) == pytest.approx(np.mean(ent[-150:]))
    assert r["entropy"]["clip_b"]["vs_grpo"]["difference"]["value"] > 0
    assert list(r["curves"]["grpo"]["evals"]) == [0, 300, STEPS]
    assert r["curves"]["clip_b"]["evals"][STEPS]["avg@32"]["value"] == pytest.approx(
        r["absolute"]["clip_b"]["avg@32"]["value"]
    )


def test_incomplete_seeds_are_dropped_and_other_settings_refused():
    """A seed without every method is left out; a record with other steps than the pre-registered 1,500, or a
    duplicate, is refused naming the cell; fewer than 2 complete seeds is refused."""
    cells = synthetic() + [record("clip_b", 7, [1] * PROBLEMS)]
    assert run(cells)["seeds"] == [0, 1, 2]
    with pytest.raises(ValueError, match=r"cell grpo seed 0 .* steps 1000"):
        run([record("grpo", 0, [1] * PROBLEMS, steps=1000)] + synthetic()[1:])
    with pytest.raises(ValueError, match="appears twice"):
        run(synthetic() + [synthetic()[0]])
    with pytest.raises(ValueError, match="at least 2 seeds"):
        run([c for c in synthetic() if c["seed"] == 0])


def test_main_writes_the_tables_from_records_and_strata(tmp_path):
    """The command reads a cells.jsonl and an eval.jsonl with strata and writes avgk.json, avgk.md (with the verdicts
    and the stratum rows) and the records it used; an eval file without strata is refused, naming the fix."""
    cells = tmp_path / "cells.jsonl"
    cells.write_text("".join(json.dumps(c) + "\n" for c in synthetic()))
    ev = tmp_path / "eval.jsonl"
    ev.write_text("".join(json.dumps({"numbers": [1, 2, 3, 4, 5], "target": 3, "stratum": s}) + "\n" for s in STRATA))
    avgk.main(["--cells", str(cells), "--eval", str(ev), "--dest", str(tmp_path / "out")])
    md = (tmp_path / "out" / "avgk.md").read_text()
    assert "| clip_b | +18.8 [+18.8, +18.8] |" in md and "raises Avg@32" in md and "no difference shown" in md
    assert "| hard | 4 |" in md
    assert len((tmp_path / "out" / "cells.jsonl").read_text().splitlines()) == 9
    assert json.loads((tmp_path / "out" / "avgk.json").read_text())["primary"]["clip_b"]["raises"] is True
    ev.write_text(json.dumps({"numbers": [1, 2], "target": 3}) + "\n")
    with pytest.raises(ValueError, match="pretrain-toy --split countdown5_large"):
        avgk.main(["--cells", str(cells), "--eval", str(ev), "--dest", str(tmp_path / "out")])


def test_study_configuration_is_the_preregistered_one():
    """benchmarks/study.py --study avgk: GRPO, Clip_B (mu 1.5), Clip_V (mu 3.0, max_frac 0.05) on countdown5_large,
    1,500 steps of 32 prompts x 8 rollouts, evaluated every 300 steps at 32 samples on all 1,000 problems; its steps
    and sample count are the ones the analysis requires."""
    spec = importlib.util.spec_from_file_location("study", Path(avgk.__file__).parent / "study.py")
    study = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(study)
    assert study.STUDIES["avgk"] == {"tasks": ["countdown5_large"], "methods": ["grpo", "clip_b", "clip_v"]}
    for method, want in (("grpo", {}), ("clip_b", {"mu": 1.5}), ("clip_v", {"mu": 3.0, "max_frac": 0.05})):
        cfg = study.cell_config("countdown5_large", method, 2)
        assert (cfg.task, cfg.method, cfg.steps, cfg.eval_every, cfg.eval_k, cfg.eval_problems, cfg.seed) == (
            "countdown5_large",
            method,
            avgk.STEPS,
            300,
            avgk.EVAL_N,
            0,
            2,
        )
        assert (cfg.prompts_per_step, cfg.group_size, cfg.lr, cfg.eval_temperature) == (32, 8, 5e-5, 0.7)
        assert all(getattr(cfg, k) == v for k, v in want.items())


def test_figures_plot_the_analysis_numbers(tmp_path):
    """avgk_figures.draw plots each method's curve at every evaluation step with its interval, the entropy per step
    with its range over seeds, and the by-stratum differences, exactly the numbers of the analysis (in points)."""
    spec = importlib.util.spec_from_file_location("avgk_figures", Path(avgk.__file__).parent / "avgk_figures.py")
    figures = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(figures)
    r = json.loads(json.dumps(run(synthetic())))  # as read back from avgk.json: evaluation steps become strings
    plotted = figures.draw(r, tmp_path)
    assert (tmp_path / "learning_curves.png").stat().st_size > 10_000 and (tmp_path / "by_stratum.png").exists()
    steps, y, low, high = plotted["avg@32"]["clip_b"]
    assert steps == [0, 300, STEPS]
    assert y[-1] == pytest.approx(100 * r["absolute"]["clip_b"]["avg@32"]["value"])
    assert all(lo <= v <= hi for v, lo, hi in zip(y, low, high))
    assert plotted["entropy"]["grpo"][1] == r["curves"]["grpo"]["entropy_mean"]
    strata, diff, _, _ = plotted["stratum avg@32"]["clip_b"]
    first = r["by_stratum"][strata[0]]["clip_b avg@32"]["value"]
    assert strata == list(r["by_stratum"]) and diff[0] == pytest.approx(100 * first)


REPO = Path(__file__).resolve().parents[1]
# The committed studies: their directory, the evaluation file their records were scored on, their seeds.
COMMITTED = {
    "first run (issue 31)": (REPO / "benchmarks/study_avgk", REPO / "benchmarks/study_avgk/first_pool/eval.jsonl", 5),
    "clean re-run (issue 39)": (
        REPO / "benchmarks/study_avgk_clean",
        REPO / "entropy_rft/assets/countdown-tiny/data/countdown5_large/eval.jsonl",
        15,
    ),
}


@pytest.mark.parametrize("name", list(COMMITTED))
def test_committed_reports_agree_with_their_records(name):
    """A committed study cannot contradict itself: its cells.jsonl holds exactly the committed cell records, every
    point estimate in avgk.json is the mean its records give (recomputed here with plain numpy, not the analysis's
    code path), the Holm adjustments and verdicts follow from its p-values, and avgk.md is avgk.json's tables (the
    Evidence page's quotes of them: tests/test_evidence_figures.py). Intervals and p-values are the bootstrap's and are
    reproduced by rerunning the analysis, not here. Exact to 1e-12: each value is one mean of at most 15 x 1,000
    multiples of 1/32 or of float entropies, and the two sums differ only in order."""
    dest, eval_file, n_seeds = COMMITTED[name]
    if not (dest / "avgk.json").exists():
        pytest.skip(f"{dest.name}: no report yet (the study's stopping rule: nothing is analysed before every cell)")
    result = json.loads((dest / "avgk.json").read_text())
    records = avgk.load_records(dest / "cells.jsonl")
    committed = avgk.load_records(dest)
    assert sorted(json.dumps(c, sort_keys=True) for c in records) == sorted(
        json.dumps(c, sort_keys=True) for c in committed
    )
    assert len(records) == 3 * n_seeds and result["seeds"] == list(range(n_seeds))
    strata = avgk.load_strata(eval_file)
    assert result["problems"] == len(strata)
    by = {(c["method"], c["seed"]): c for c in records}
    seeds = result["seeds"]

    def grid(method, field="final_correct"):
        return np.array([by[(method, s)][field] for s in seeds], dtype=np.float64)

    def pass_k(counts, k):  # 1 - C(n - c, k) / C(n, k), as a product
        out = np.ones_like(counts)
        for i in range(k):
            out *= np.clip((N - counts - i) / (N - i), 0, None)
        return 1 - out

    metric = {"avg@32": lambda c: c / N, "pass@8": lambda c: pass_k(c, 8), "pass@32": lambda c: pass_k(c, 32)}
    base = grid("grpo")
    for m in avgk.METHODS:
        assert result["primary"][m]["value"] == pytest.approx((grid(m) / N - base / N).mean(), abs=1e-12)
        for k in ("pass@8", "pass@32"):
            want = (metric[k](grid(m)) - metric[k](base)).mean()
            assert result["secondary"][f"{m} {k}"]["value"] == pytest.approx(want, abs=1e-12)
        for stratum, row in result["by_stratum"].items():
            cols = np.array([s == stratum for s in strata])
            assert row["problems"] == cols.sum()
            want = (grid(m)[:, cols] - base[:, cols]).mean() / N
            assert row[f"{m} avg@32"]["value"] == pytest.approx(want, abs=1e-12)
    for m in ("grpo", *avgk.METHODS):
        for k, f in metric.items():
            assert result["absolute"][m][k]["value"] == pytest.approx(f(grid(m)).mean(), abs=1e-12)
        last = [np.mean(by[(m, s)]["entropy"][-max(1, len(by[(m, s)]["entropy"]) // 10) :]) for s in seeds]
        assert result["entropy"][m]["value"]["value"] == pytest.approx(np.mean(last), abs=1e-12)
    initial = metric["avg@32"](grid("grpo", "initial_correct")).mean()
    assert result["absolute"]["initial policy"]["avg@32"]["value"] == pytest.approx(initial, abs=1e-12)
    for family in ("primary", "secondary"):
        rows = result[family]
        adjusted = avgk.holm({k: r["p"] for k, r in rows.items()})
        assert {k: r["p_holm"] for k, r in rows.items()} == pytest.approx(adjusted)
    for r in result["primary"].values():
        assert r["raises"] == (r["p_holm"] < avgk.ALPHA and r["value"] > 0)
        assert r["lowers"] == (r["p_holm"] < avgk.ALPHA and r["value"] < 0)
    assert (dest / "avgk.md").read_text() == avgk.markdown(result)
