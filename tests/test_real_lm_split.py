"""The arithmetic split of the real-LM dynamics run (benchmarks/real_lm_dynamics.py): evaluation problems share no
content with training problems (a reordered sum or product is the same problem), and the shipped files are the
ones the script writes."""

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SPEC = importlib.util.spec_from_file_location("real_lm_dynamics", ROOT / "benchmarks" / "real_lm_dynamics.py")
dyn = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(dyn)


def test_content_identifies_reordered_problems_and_nothing_else():
    assert dyn.content("What is $3 + 5$?") == dyn.content("What is $5 + 3$?")
    assert dyn.content("What is $7 \\cdot 4$?") == dyn.content("What is $4 \\cdot 7$?")
    assert dyn.content("What is $2 + 3 \\cdot 4$?") == dyn.content("What is $2 + 4 \\cdot 3$?")
    assert dyn.content("What is $2 + 3 \\cdot 4$?") != dyn.content("What is $3 + 2 \\cdot 4$?")  # 14 vs 11
    assert dyn.content("What is $3 + 5$?") != dyn.content("What is $3 \\cdot 5$?")


def test_the_shipped_split_is_the_scripts_and_disjoint_by_content():
    train, held = dyn.split()
    assert (len(train), len(held)) == (dyn.N_TRAIN, dyn.N_EVAL)
    assert not {dyn.content(p.question) for p in train} & {dyn.content(p.question) for p in held}
    for name, problems in (("train.jsonl", train), ("eval.jsonl", held)):
        rows = [json.loads(x) for x in (dyn.HERE / name).read_text().splitlines()]
        assert [(r["question"], r["answer"]) for r in rows] == [(p.question, p.answer) for p in problems]
        assert len({dyn.content(r["question"]) for r in rows}) == len(rows)  # no two alike within a file either
