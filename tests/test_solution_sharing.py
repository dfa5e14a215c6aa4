"""The solution-sharing control of issue 52 (benchmarks/solution_sharing.py, docs/prereg_solution_sharing.md): what
"a shared reference solution" means, the committed new evaluation set against it, and the registered analysis on
synthetic records whose answers are computed here by plain loops."""

import importlib.util
import json
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
SPEC = importlib.util.spec_from_file_location("solution_sharing", ROOT / "benchmarks" / "solution_sharing.py")
sharing = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(sharing)


def test_a_solution_is_shared_when_a_training_puzzle_holds_its_numbers_and_target():
    """Shared: some training puzzle has the target and holds every number the solution writes (as a multiset);
    reordered or embedded in other numbers still counts, a number used twice needs two, another target does not."""
    train = [{"numbers": [9, 7, 5, 5, 2], "target": 18, "solution": "9+7+2=18"}]
    index = sharing.TrainingSolutions(train)
    assert index.shares_solution({"numbers": [1, 2, 7, 9, 4], "target": 18, "solution": "2+7+9=18"})
    assert index.shares_solution({"numbers": [5, 5, 1, 1, 1], "target": 18, "solution": "5+5+8=18"}) is False
    assert index.shares_solution({"numbers": [5, 5, 3, 3, 3], "target": 25, "solution": "5*5=25"}) is False
    assert index.shares_solution({"numbers": [5, 5, 3, 3, 3], "target": 10, "solution": "5+5=10"}) is False
    assert index.shares_solution({"numbers": [5, 5, 3, 3, 3], "target": 18, "solution": "(5-5)+18=18"}) is False
    assert sharing.solution_numbers("9+7-(5-(5+2))=18") == Counter({9: 1, 7: 1, 5: 2, 2: 1})


def test_committed_new_set_shares_no_solution_or_puzzle_and_matches_the_old_strata():
    """benchmarks/solution_sharing/data/eval_unshared.jsonl: 1,000 puzzles, none a training or old evaluation puzzle
    (by identity), none with a reference solution shared with training, the old set's stratum counts; and the old
    set's sharing is the audit's (669 inside a training puzzle, 381 verbatim)."""
    from entropy_rft.tasks.countdown import Problem

    train = sharing.read_jsonl(sharing.POOL / "train.jsonl")
    old = sharing.read_jsonl(sharing.POOL / "eval.jsonl")
    new = sharing.read_jsonl(sharing.NEW_EVAL)
    assert len(new) == 1000 and len({Problem.from_json(r).identity for r in new}) == 1000
    assert not {Problem.from_json(r).identity for r in new} & {Problem.from_json(r).identity for r in train + old}
    assert sharing.sharing_counts(train, new) == {
        "problems": 1000,
        "solution_inside_a_training_puzzle": 0,
        "solution_verbatim_in_training": 0,
    }
    assert sharing.sharing_counts(train, old)["solution_inside_a_training_puzzle"] == 669
    assert sharing.sharing_counts(train, old)["solution_verbatim_in_training"] == 381
    assert Counter(r["stratum"] for r in new) == Counter(r["stratum"] for r in old)
    for r in new:  # each puzzle's solution is an expression over its own numbers reaching its target
        assert not sharing.solution_numbers(r["solution"]) - Counter(r["numbers"])
        assert eval(r["solution"].split("=")[0]) == r["target"] == int(r["solution"].split("=")[1])


N, P_OLD, P_NEW, SEEDS = 32, 6, 4, 3


def records(rng) -> list[dict]:
    out = []
    for seed in range(SEEDS):
        base_old, base_new = rng.integers(4, 28, P_OLD), rng.integers(4, 28, P_NEW)
        for method, shift_old, shift_new in (("grpo", 0, 0), ("clip_v", -3, 1)):
            final = [int(v) for v in base_old + shift_old + (seed % 2)]
            out.append(
                {
                    "method": method,
                    "seed": seed,
                    "key": "0" * 12,
                    "final_correct": final,
                    "new_final_correct": [int(v) for v in base_new + shift_new],
                    "new_initial_correct": [1] * P_NEW,
                }
            )
    return out


def test_analysis_gives_the_differences_computed_by_loops(monkeypatch):
    """Primary (new set), old set and old-minus-new: each the mean over seeds and problems of the per-problem Avg@32
    difference, computed here by loops; intervals contain the value; the verdict follows the primary p."""
    monkeypatch.setattr(sharing, "reproduction", lambda r: {"identical": True})
    recs = records(np.random.default_rng(0))
    strata = {"new": ["unsolved", "hard", "easier", "hard"], "old": ["unsolved"] * 2 + ["hard"] * 2 + ["easier"] * 2}
    r = sharing.analyse(recs, strata)
    by = {(x["method"], x["seed"]): x for x in recs}

    def mean_diff(field):
        diffs = [(a - b) / N for s in range(SEEDS) for a, b in zip(by[("clip_v", s)][field], by[("grpo", s)][field])]
        return sum(diffs) / len(diffs)

    assert r["primary"]["value"] == pytest.approx(mean_diff("new_final_correct"), abs=1e-12)
    assert r["old_avg@32"]["value"] == pytest.approx(mean_diff("final_correct"), abs=1e-12)
    assert r["old_minus_new"]["value"] == pytest.approx(mean_diff("final_correct") - mean_diff("new_final_correct"))
    for e in (r["primary"], r["old_avg@32"], r["old_minus_new"]):
        assert e["low"] <= e["value"] <= e["high"]
    assert r["verdict"] == ("no difference shown on the new set" if r["primary"]["p"] >= 0.05 else r["verdict"])
    assert r["by_stratum"]["new"]["hard"]["problems"] == 2
    assert "Reproduction: 6 of 6" in sharing.markdown(r)


def test_reproduction_names_the_first_step_that_differs(tmp_path, monkeypatch):
    """A re-run equal to its committed cell is identical; one entropy value changed is named with its step."""
    committed = tmp_path / "countdown5_large" / "grpo" / "seed0-abc"
    committed.mkdir(parents=True)
    rec = {"method": "grpo", "seed": 0, "key": "abc", "entropy": [0.5, 0.4, 0.3], "clip_frac": [0, 0, 0]}
    rec |= {"control": [0, 0, 0], "eval_correct": {"0": [1]}, "initial_correct": [1], "final_correct": [2]}
    (committed / "cell.json").write_text(json.dumps(rec))
    monkeypatch.setattr(sharing, "COMMITTED", tmp_path)
    monkeypatch.setattr(sharing, "REPO", tmp_path)
    assert sharing.reproduction(rec)["identical"]
    changed = {**rec, "entropy": [0.5, 0.41, 0.3]}
    rep = sharing.reproduction(changed)
    assert not rep["identical"] and rep["differs"] == ["entropy"] and rep["first"] == {"entropy": 2}
