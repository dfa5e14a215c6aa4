"""The countdown task: parser, reward shape, problem generation, and the shipped tokenizer."""

import random

import pytest
from transformers import AutoTokenizer

from entropy_rft.tasks.countdown import Problem, evaluate_expression, make_problems, random_problem, reward
from entropy_rft.train.policy import BUILTIN_MODELS

P = Problem((3, 5, 7), 22)


@pytest.mark.parametrize(
    "expr,value", [("3*5+7", 22), ("(3+5)*7", 56), ("7-5-3", -1), ("7-(5-3)", 5), ("2*(3*(4+1))", 30)]
)
def test_parser_values(expr, value):
    """The recursive-descent parser gives Python's integer arithmetic for + - * and parentheses."""
    assert evaluate_expression(expr)[0] == value == eval(expr)  # literal test inputs only


@pytest.mark.parametrize("expr", ["", "3+", "(3+5", "3//5", "import os", "3**5", "3 5"])
def test_parser_rejects(expr):
    assert evaluate_expression(expr) is None


@pytest.mark.parametrize(
    "completion,finished,expected",
    [
        ("3*5+7=22", True, (1.0, True)),  # correct and well formed
        ("5*3+7=22", True, (1.0, True)),  # any order
        ("3*5+7", True, (0.0, True)),  # correct answer, '=target' missing
        ("3*5+7=21", True, (0.0, True)),  # correct expression, wrong stated value
        ("3*5+7=22", False, (0.0, True)),  # correct but truncated (no EOS)
        ("3*5+7=22=", True, (0.0, True)),  # trailing junk
        ("3*5+7+7=29", True, (-0.1, False)),  # 7 used twice
        ("3*5*7=105", True, (-0.1, False)),  # wrong target, finished
        ("3*5*7=105", False, (-1.0, False)),  # wrong and overlong
        ("9+13=22", True, (-0.1, False)),  # numbers not given
    ],
)
def test_reward_shape(completion, finished, expected):
    """Paper's Appendix B shape: 1 correct+formed, 0 correct badly formed, -0.1 wrong, -1 wrong and overlong."""
    assert reward(completion, finished, P) == expected


def test_generated_solutions_are_correct():
    """Every synthetic problem's solution is well formed, uses given numbers and reaches the target."""
    rng = random.Random(0)
    for _ in range(500):
        p = random_problem(rng)
        assert reward(p.solution, True, p) == (1.0, True), p


def test_make_problems_distinct_and_exclusive():
    """make_problems gives distinct puzzles by identity (sorted numbers and target, not the ordered prompt text) and
    none whose identity is excluded."""
    a = make_problems(200, seed=1)
    b = make_problems(200, seed=2, exclude={p.identity for p in a})
    assert len({p.identity for p in a}) == 200
    assert not {p.identity for p in a} & {p.identity for p in b}


def test_row_without_answer_names_the_fix():
    with pytest.raises(ValueError, match="needs 'numbers'.*'target'"):
        Problem.from_json({"numbers": [1, 2]})


def test_shipped_tokenizer_round_trips_through_autotokenizer():
    """The shipped tokenizer, reloaded through AutoTokenizer (which picks a class from the model type), encodes
    one token per character and decodes prompts and solutions exactly."""
    tok = AutoTokenizer.from_pretrained(BUILTIN_MODELS["countdown-tiny"])
    for p in make_problems(50, seed=5):
        for text in (f"{p.key}:", p.solution):
            ids = tok.encode(text, add_special_tokens=False)
            assert len(ids) == len(text)
            assert tok.decode(ids) == text


def test_countdown5_ships_a_filtered_split_of_five_number_problems():
    """task countdown5: the same prompts and reward as countdown over problems of five numbers; its default data is
    the shipped split (toy.build_split): 200 held-out eval problems, and training problems whose pass rate under
    the shipped policy lies strictly between 1/16 and 15/16 (the paper's filter), disjoint from eval, each with a
    known solution the reward scores correct; build.json records the same counts."""
    import json

    from entropy_rft.config import load_config
    from entropy_rft.tasks import TASKS
    from entropy_rft.train.problems import default_data, load_problems

    task = TASKS.get("countdown5")
    cfg = load_config(None, task="countdown5")
    train_rows = [json.loads(x) for x in default_data(cfg, "train").read_text().splitlines()]
    eval_set = load_problems(default_data(cfg, "eval"), task)
    train_set = [Problem.from_json(r) for r in train_rows]
    assert len(eval_set) == 200 and len({p.identity for p in eval_set}) == 200
    assert all(len(p.numbers) == 5 for p in eval_set + train_set)
    assert all(1 / 16 < r["pass_rate"] < 15 / 16 for r in train_rows)
    assert not {p.identity for p in train_set} & {p.identity for p in eval_set}
    for p in train_set + eval_set:
        assert task.score(p.solution.split("=")[0] + f"={p.target}", True, p) == (1.0, True)
    build = json.loads((BUILTIN_MODELS["countdown-tiny"] / "build.json").read_text())["countdown5"]
    assert (build["train_after_filter"], build["eval"], build["numbers"]) == (len(train_set), 200, 5)


@pytest.mark.slow
def test_eval_cli_reads_the_shipped_countdown5_split(tmp_path, capsys):
    """`entropy-rft eval --data countdown5` scores the shipped countdown5 eval split with the countdown reward and
    the countdown budget of 16 new tokens (not the math task's 7168)."""
    import json

    from entropy_rft.commands.cli import main

    main(["eval", "--data", "countdown5", "--k", "2", "--limit", "6", "--out", str(tmp_path / "ev")])
    result = json.loads((tmp_path / "ev" / "eval.json").read_text())
    assert result["meta"]["task"] == "countdown5" and result["results"]["countdown5"]["n_problems"] == 6
    rows = [json.loads(x) for x in (tmp_path / "ev" / "samples" / "countdown5.jsonl").read_text().splitlines()]
    assert len(rows[0]["numbers"]) == 5 and max(len(r) for row in rows for r in row["responses"]) <= 16
