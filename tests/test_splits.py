"""One puzzle identity and clean splits (issue 39; entropy_rft/tasks/splits.py). Checked: the identity of a countdown
puzzle ignores the order of its numbers and nothing else, a math problem's ignores whitespace; split_overlaps against
a brute-force count; and, per shipped pool, the three properties of a clean split: no puzzle twice within a split, no
evaluation puzzle in training, no evaluation puzzle in the supervised warm-up that built the shipped policy (the
warm-up replayed from build.json's settings)."""

import itertools
import json
import random

import pytest

from entropy_rft.tasks.countdown import Problem, random_problem
from entropy_rft.tasks.data import to_problems
from entropy_rft.tasks.math import MathProblem
from entropy_rft.tasks.splits import check_clean, split_overlaps
from entropy_rft.toy import ToyConfig, warmup_batches
from entropy_rft.train.policy import BUILTIN_MODELS
from entropy_rft.train.problems import SHIPPED_DATA

BUILD = BUILTIN_MODELS["countdown-tiny"] / "build.json"


def rows(path) -> list[Problem]:
    return [Problem.from_json(json.loads(line)) for line in path.read_text().splitlines() if line.strip()]


def test_countdown_identity_is_the_multiset_of_numbers_and_the_target():
    """Every reordering of a puzzle's numbers has the puzzle's identity (and a different key, the prompt text); a
    different multiset (a number repeated differently) or target is another puzzle."""
    p = Problem((5, 1, 3, 1), 22)
    orders = {Problem(q, 22) for q in itertools.permutations(p.numbers)}
    assert {q.identity for q in orders} == {"1,1,3,5>22"} and len({q.key for q in orders}) == 12
    assert Problem((5, 1, 3, 3), 22).identity != p.identity and Problem((1, 1, 3, 5), 23).identity != p.identity
    assert Problem((1, 1, 3, 5), 22, solution="other").identity == p.identity


def test_math_identity_ignores_whitespace_and_loading_deduplicates_by_it():
    """Two copies of a question that differ only in spacing are one problem: same identity, and to_problems keeps the
    first; a question with other words is another."""
    a = MathProblem("What is  $2 + 2$?\n", "4")
    b = MathProblem(" What is $2 + 2$?", "4")
    assert a.identity == b.identity and a.key == a.identity
    assert MathProblem("What is $2 + 3$?", "5").identity != a.identity
    got = to_problems(
        [
            {"question": a.question, "answer": "4"},
            {"question": b.question, "answer": "4"},
            {"question": "What is $2 + 3$?", "answer": "5"},
        ],
        "t",
    )
    assert [p.question for p in got] == [a.question, "What is $2 + 3$?"]


def test_split_overlaps_matches_a_brute_force_count():
    """split_overlaps equals counts written as loops over pairs: repeats are rows whose identity appeared earlier in
    the same list; overlaps count distinct evaluation identities found in the other list; shuffled reorderings of
    puzzles count as the puzzles."""
    rng = random.Random(0)
    for _ in range(30):
        base = [random_problem(rng, max_number=3, max_target=9) for _ in range(12)]

        def draw(n, base=base):
            out = []
            for _ in range(n):
                p = rng.choice(base)
                out.append(Problem(tuple(rng.sample(p.numbers, len(p.numbers))), p.target))
            return out

        train, evals, warm = draw(rng.randint(0, 10)), draw(rng.randint(0, 10)), draw(rng.randint(0, 10))

        def repeats(xs):
            return sum(any(xs[j].identity == xs[i].identity for j in range(i)) for i in range(len(xs)))

        distinct_eval = {p.identity for p in evals}
        want = {
            "train_repeats": repeats(train),
            "eval_repeats": repeats(evals),
            "eval_in_train": sum(any(q.identity == e for q in train) for e in distinct_eval),
            "eval_in_warmup": sum(any(q.identity == e for q in warm) for e in distinct_eval),
        }
        assert split_overlaps(train, evals, warmup=warm) == want


def test_check_clean_names_what_is_not_clean():
    """check_clean passes a clean split and refuses one with a reordered evaluation puzzle in training, naming it."""
    check_clean([Problem((1, 2), 3)], [Problem((1, 3), 4)])
    with pytest.raises(ValueError, match="eval_in_train=1"):
        check_clean([Problem((2, 1), 3)], [Problem((1, 2), 3)], name="x")


@pytest.fixture(scope="module")
def warmup_identities() -> set[str]:
    """The identities of every problem of the shipped policy's supervised warm-up, replayed from build.json's settings
    (toy.warmup_batches leaves out the countdown evaluation puzzles, as the build did)."""
    build = json.loads(BUILD.read_text())
    cfg = ToyConfig(**build["config"])
    exclude = {p.identity for p in rows(SHIPPED_DATA["countdown"] / "eval.jsonl")}
    seen = {p.identity for batch in warmup_batches(cfg, exclude) for p in batch}
    assert len(seen) == build["warmup_puzzles"]  # the replay is the warm-up the build recorded
    return seen


@pytest.mark.parametrize("task", ["countdown", "countdown5", "countdown5_large"])
def test_shipped_pool_is_clean(task, warmup_identities):
    """The shipped pool of `task`: no puzzle twice in train.jsonl, none twice in eval.jsonl, no evaluation puzzle in
    training, and no evaluation puzzle in the warm-up that built the shipped policy; the build's record says the same
    (all of its overlap counts 0)."""
    train, evals = rows(SHIPPED_DATA[task] / "train.jsonl"), rows(SHIPPED_DATA[task] / "eval.jsonl")
    assert {p.identity for p in evals}.isdisjoint(warmup_identities)
    counts = split_overlaps(train, evals)
    assert counts == {"train_repeats": 0, "eval_repeats": 0, "eval_in_train": 0, "eval_in_warmup": 0}
    build = json.loads(BUILD.read_text())
    record = {"countdown": build, "countdown5": build["countdown5"]}.get(task)
    if record is None:
        record = json.loads((SHIPPED_DATA[task] / "build.json").read_text())
    assert all(v == 0 for v in record["overlaps"].values())
