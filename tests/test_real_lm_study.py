"""The real-model study of issue 52 (benchmarks/real_lm_study.py, docs/prereg_real_lm.md): the generated family's
content and sub-solutions, the committed split against them (counted here by loops), and the registered analysis on
synthetic records whose answers are computed here."""

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
SPEC = importlib.util.spec_from_file_location("real_lm_study", ROOT / "benchmarks" / "real_lm_study.py")
study = importlib.util.module_from_spec(SPEC)
sys.modules["real_lm_study"] = study  # its dataclasses look their module up while the module runs
SPEC.loader.exec_module(study)
Node = study.Node


def test_content_ignores_the_order_of_commuting_operands_and_sub_solutions_are_the_inner_nodes():
    """3 * 5 and 5 * 3 are one problem; (3 * 5) + 4 and (5 * 3) + 4 too, and their sub-solution is the product;
    a lone product has none."""
    assert study.content(Node("*", 3, 5)) == study.content(Node("*", 5, 3))
    a, b = Node("+", Node("*", 3, 5), 4), Node("+", 4, Node("*", 5, 3))
    assert study.content(a) == study.content(b)
    assert study.sub_solutions(a) == {study.content(Node("*", 3, 5))}
    assert study.sub_solutions(Node("*", 47, 6)) == set()
    assert Node("+", Node("*", 12, 3), 5).value() == 41 and Node("*", 47, 6).tex() == "47 \\cdot 6"


def test_committed_split_shares_no_problem_or_sub_solution():
    """benchmarks/real_lm_study/data: the registered sizes; no problem twice; no held-out problem whose operands (as
    a multiset, with its operation) or any inner result is a training problem's, read back from the question text
    and counted by loops; every answer is the question's value."""
    import re

    def parse(question):
        nums = list(map(int, re.findall(r"\d+", question)))
        ops = re.findall(r"\\cdot|\+", question)
        return nums, ops

    rows = {name: study.read(study.DATA / f"{name}.jsonl") for name in ("train", "eval")}
    assert (len(rows["train"]), len(rows["eval"])) == (study.N_TRAIN, study.N_EVAL)
    keys = {}
    for name, rs in rows.items():
        keys[name] = []
        for r in rs:
            nums, ops = parse(r["question"])
            value = nums[0]
            for op, x in zip(ops, nums[1:]):
                value = value * x if op == "\\cdot" else value + x
            assert str(value) == r["answer"]
            keys[name].append((tuple(ops), tuple(sorted(nums))))
        assert len(set(keys[name])) == len(keys[name])
    assert not set(keys["train"]) & set(keys["eval"])
    assert study.split_counts(rows["train"], rows["eval"])["held_out_content_in_train"] == 0


def test_trailing_mean_and_matched_entropy_by_loops():
    """trailing_mean is the mean of the last SMOOTH values; matched_entropy averages the entropy of the steps whose
    smoothed accuracy falls in each bin."""
    rng = np.random.default_rng(0)
    acc, ent = rng.uniform(0, 0.7, 40), rng.uniform(0, 2, 40)
    tm = study.trailing_mean(acc)
    for i in range(40):
        window = acc[max(0, i + 1 - study.SMOOTH) : i + 1]
        assert tm[i] == pytest.approx(sum(window) / len(window))
    got = study.matched_entropy({"curves": {"accuracy": list(acc), "entropy": list(ent)}})
    for lo, hi in zip(study.ACC_BINS[:-1], study.ACC_BINS[1:]):
        picked = [e for a, e in zip(tm, ent) if lo <= a < hi]
        key = f"{lo:.1f}-{hi:.1f}"
        assert (key in got) == bool(picked)
        if picked:
            assert got[key] == pytest.approx(sum(picked) / len(picked))


def _records(rng, problems=7, steps=None):
    steps = steps or study.COMMON["steps"]
    out = []
    for seed in range(3):
        base = rng.integers(1, 6, problems)
        for method, shift in (("grpo", 0), ("clip_b", 1), ("clip_v", -1)):
            curves = {k: list(rng.uniform(0, 1, steps)) for k in study.CURVES}
            out.append(
                {
                    "method": method,
                    "seed": seed,
                    "eval_k": study.EVAL_K,
                    "steps": steps,
                    "final_correct": [int(v) for v in np.clip(base + shift, 0, study.EVAL_K)],
                    "curves": curves,
                }
            )
    return out


def test_analysis_primary_is_the_paired_mean_difference_and_refuses_other_settings():
    """The primary difference is the mean over seeds and problems of the per-problem Avg@8 difference (a loop here);
    the entropy over the last tenth of steps is each cell's mean of its last 10% of steps; a record with other
    registered settings is refused."""
    recs = _records(np.random.default_rng(1))
    r = study.analyse(recs)
    by = {(x["method"], x["seed"]): x for x in recs}
    for m in ("clip_b", "clip_v"):
        diffs = [
            (a - b) / study.EVAL_K
            for s in range(3)
            for a, b in zip(by[(m, s)]["final_correct"], by[("grpo", s)]["final_correct"])
        ]
        assert r["primary"][m]["value"] == pytest.approx(sum(diffs) / len(diffs))
        assert r["primary"][m]["low"] <= r["primary"][m]["value"] <= r["primary"][m]["high"]
    tenth = study.COMMON["steps"] // 10
    want = np.mean([np.mean(by[("grpo", s)]["curves"]["entropy"][-tenth:]) for s in range(3)])
    assert r["entropy_last_tenth"]["grpo"]["value"]["value"] == pytest.approx(want)
    assert "| clip_b |" in study.markdown(r)
    with_initial = study.analyse(recs, {"0": {"correct": [2] * 7}})
    assert with_initial["absolute"]["initial policy"]["avg@8"]["value"] == pytest.approx(2 / study.EVAL_K)
    bad = [dict(x, eval_k=4) if x["method"] == "clip_v" else x for x in recs]
    with pytest.raises(ValueError, match="eval_k 4"):
        study.analyse(bad)
    json.dumps(r)  # the record it writes is plain JSON


def test_the_cells_run_the_registered_methods_with_the_pilots_mu():
    """The study's methods are the registration's (GRPO, Clip_B, Clip_V), and each mu is what the pilot's rule gives
    on the committed pilot samples (benchmarks/real_lm_pilot.py mu): the smallest mu of the grid clipping at most 5%
    of the negative-advantage tokens. (The first start of the runner had Clip_B at a draft's 0.9 and no Clip_V.)"""
    spec = importlib.util.spec_from_file_location("real_lm_pilot", ROOT / "benchmarks" / "real_lm_pilot.py")
    pilot = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pilot)
    rule = pilot.main(ROOT / "benchmarks" / "real_lm_study" / "pilot" / "runs" / "n_mul2x1")
    assert rule["negative_tokens"] == 1052
    assert set(study.METHODS) == {"grpo", "clip_b", "clip_v"}
    assert (
        study.METHODS["clip_b"]
        == {"method": "clip_b", "mu": rule["chosen_mu"]["clip_b"]}
        == {"method": "clip_b", "mu": 1.0}
    )
    assert study.METHODS["clip_v"] == {
        "method": "clip_v",
        "mu": rule["chosen_mu"]["clip_v"],
        "max_frac": pilot.MAX_FRAC,
    }
    cfg = study.cell_config("clip_v", 3)
    assert (cfg.method, cfg.mu, cfg.max_frac, cfg.seed, cfg.steps, cfg.task) == (
        "clip_v",
        2.0,
        0.05,
        3,
        100,
        "math_numeral",
    )


REGISTERED_CODE = "1c0ab63"  # the cells' code: docs/prereg_real_lm.md, "How the cells ran"


def test_committed_cells_are_whole_records_of_the_registered_settings():
    """Each committed cell (benchmarks/real_lm_study/cells/) is whole: run by the registered commit on one thread,
    with its method's registered settings (its directory's key is their settings_key), its 100 steps in
    metrics.jsonl once each in order, the record's curves exactly those rows, and the registered final evaluation
    (8 samples on each of the 400 held-out problems). Nothing is compared here: the comparison is the registered
    analysis's (test_committed_analysis_is_the_registered_script_on_the_committed_cells)."""
    from study_records import assert_registered_settings, assert_steps_once

    cells = sorted((study.HERE / "cells").glob("*/*/cell.json"))
    assert len(cells) == len(study.METHODS) * len(study.SEEDS), "all 15 cells are committed"
    for path in cells:
        rec = json.loads(path.read_text())
        method, seed = rec["method"], rec["seed"]
        assert path.parent.parent.name == method and path.parent.name == f"seed{seed}-{rec['key']}", path
        assert method in study.METHODS and seed in study.SEEDS
        assert (rec["code"], rec["torch_threads"], rec["steps"], rec["eval_k"]) == (REGISTERED_CODE, 1, 100, 8), path
        assert_registered_settings(rec["settings"], study.cell_config(method, seed).to_dict(), rec["key"], path)
        assert_steps_once(rec, study.read(path.parent / "metrics.jsonl"), study.CURVES, path)
        correct = rec["final_correct"]
        assert len(correct) == study.N_EVAL and all(isinstance(c, int) and 0 <= c <= rec["eval_k"] for c in correct)


def test_committed_initial_evaluation_is_the_registered_one():
    """benchmarks/real_lm_study/initial.json (`initial`, once): the initial policy's 8 samples on each of the 400
    held-out problems, as correct counts, under seed 0's sampling seed (one entry, "0")."""
    done = json.loads((study.HERE / "initial.json").read_text())
    assert list(done) == ["0"]
    correct = done["0"]["correct"]
    assert len(correct) == study.N_EVAL and all(isinstance(c, int) and 0 <= c <= study.EVAL_K for c in correct)


@pytest.mark.slow
def test_committed_analysis_is_the_registered_script_on_the_committed_cells(tmp_path, capsys):
    """benchmarks/real_lm_study/{cells.jsonl,study.json,study.md} are what the registered `analyse` writes today from
    the 15 committed cell records and initial.json: the same cells, every figure to float rounding, every verdict."""
    import argparse

    from study_records import assert_close_json

    assert len(list((study.HERE / "cells").glob("*/*/cell.json"))) == len(study.METHODS) * len(study.SEEDS)
    study.cmd_analyse(argparse.Namespace(cells=str(study.HERE), dest=str(tmp_path)))
    capsys.readouterr()
    assert study.read(tmp_path / "cells.jsonl") == study.read(study.HERE / "cells.jsonl")
    assert_close_json(
        json.loads((study.HERE / "study.json").read_text()), json.loads((tmp_path / "study.json").read_text())
    )
    assert (tmp_path / "study.md").read_text() == (study.HERE / "study.md").read_text()
    assert (study.HERE / "curves.png").stat().st_size > 0
