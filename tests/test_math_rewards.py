"""Math answer checking and the paper's reward scheme (Appendix B), against verl 0.9.1's checkers."""

import time

import pytest
from conftest import load_fixture

from entropy_rft.tasks import TASKS
from entropy_rft.tasks.checkers import dapo_check, equivalent, last_boxed, normalize_final_answer
from entropy_rft.tasks.math import TEMPLATES, MathProblem, TimeoutPool, judge, strip_template

CASES = load_fixture("math_rewards.json")["cases"]


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_dapo_checker_matches_verl(case):
    """dapo_check returns verl's math_dapo score, acc and pred on every oracle case."""
    got = dapo_check(case["solution_str"], case["ground_truth"])
    want = case["math_dapo"]
    assert (got.score, got.acc, got.pred) == (want["score"], want["acc"], want["pred"])


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_math_verify_matches_verl(case):
    """equivalent() agrees with verl's math_verify.compute_score (1.0 / 0.0) on every oracle case."""
    pytest.importorskip("math_verify")
    assert float(equivalent(case["solution_str"], case["ground_truth"])) == case["math_verify"]


def test_normalisation_rules():
    """Minerva normalisation: right of '=', units, thousands commas, \\text and shorthand fractions."""
    assert normalize_final_answer("x = 5 \\text{ cm}") == "5"
    assert normalize_final_answer("$1,000$") == "1000"
    assert normalize_final_answer("\\frac34") == "\\frac{3}{4}"
    assert normalize_final_answer("(1, 2)") == "(1,2)"  # commas kept when not a pure number


def test_last_boxed_balances_braces():
    """last_boxed takes the last box, with nested braces, and None for an unclosed box."""
    assert last_boxed("\\boxed{1} then \\boxed{\\frac{1}{2}} end") == "\\frac{1}{2}"
    assert last_boxed("\\boxed{\\frac{1}{2}") is None
    assert last_boxed("no box") is None


def test_paper_reward_scheme():
    """The four rewards of Appendix B: 1 / 0 / -0.1 / -1."""
    pytest.importorskip("math_verify")
    assert judge("So 40+2.\nAnswer: 42", True, "42").reward == 1.0
    assert judge("So 0.5.\nAnswer: 0.5", True, "\\frac{1}{2}").reward == 1.0  # math-verify equivalence
    right_but_unformatted = judge("The value is $42$.", True, "42")
    assert (right_but_unformatted.reward, right_but_unformatted.correct) == (0.0, True)
    assert judge("Answer: 42", False, "42").reward == 0.0  # truncated: format not met
    assert judge("Answer: 41", True, "42").reward == -0.1
    assert judge("Answer: 41 and more and more", False, "42").reward == -1.0


def test_boxed_template_reward():
    """math_boxed reads the last \\boxed{} as the stated answer; an Answer: line is not its format."""
    pytest.importorskip("math_verify")
    assert judge("thus \\boxed{\\frac{1}{2}}", True, "0.5", template="boxed").reward == 1.0
    assert judge("Answer: 7", True, "7", template="boxed").reward == 0.0


def test_templates_round_trip():
    """strip_template recovers the bare problem from each template's prompt."""
    q = "What is $1+1$?"
    for name, render in TEMPLATES.items():
        assert strip_template(render(q)) == q, name


def _sleepy(seconds: float, value: int) -> int:
    time.sleep(seconds)
    return value


@pytest.mark.slow
def test_timeout_pool_scores_a_hung_check_and_keeps_the_rest():
    """A call past the timeout gets on_timeout's value; every other call still returns its own result."""
    pool = TimeoutPool(workers=2, timeout=1.0)
    try:
        t0 = time.time()
        out = pool.map(_sleepy, [(0.0, 1), (30.0, 2), (0.0, 3), (0.0, 4)], on_timeout=lambda a: -a[1])
        assert out == [1, -2, 3, 4]
        assert pool.timeouts == 1
        assert time.time() - t0 < 20
    finally:
        pool.close()


def test_math_task_scores_in_worker_processes():
    """MathTask.score_batch (worker pool) gives the same verdicts as judge() in this process."""
    pytest.importorskip("math_verify")
    task = TASKS.get("math")
    problems = [MathProblem("q1", "42"), MathProblem("q2", "\\frac{1}{2}"), MathProblem("q3", "7")]
    texts = ["Answer: 42", "Answer: 0.5", "no idea"]
    finished = [True, True, False]
    want = [(judge(t, f, p.answer).reward, judge(t, f, p.answer).correct) for t, f, p in zip(texts, finished, problems)]
    assert task.score_batch(texts, finished, problems) == want == [(1.0, True), (1.0, True), (-1.0, False)]
    assert task.prompt(problems[0]).startswith("Solve the following math problem step by step.")


def _crashy(value: int) -> int:
    """A checker that hangs on 2, kills its own worker process (a segfault in native code) on 3, raises on 4."""
    import os

    if value == 2:
        time.sleep(600)
    if value == 3:
        os._exit(1)
    if value == 4:
        raise RecursionError("a checker bug")
    return value


def _worker_pids() -> set[int]:
    import multiprocessing

    return {p.pid for p in multiprocessing.active_children()}


@pytest.mark.slow
def test_timeout_pool_scores_hung_crashed_and_raising_checks_wrong():
    """A hung check, a check that kills its worker and a check that raises each get on_timeout's value quickly
    (each within its timeout, not a wait on a dead process); the others keep their results; the pool then scores
    new calls normally."""
    pool = TimeoutPool(workers=2, timeout=2.0)
    try:
        t0 = time.time()
        out = pool.map(_crashy, [(1,), (2,), (3,), (5,), (4,), (6,)], on_timeout=lambda a: -a[0])
        assert out == [1, -2, -3, 5, -4, 6]
        assert (pool.timeouts, pool.crashes, pool.failures) == (1, 1, 1)
        assert time.time() - t0 < 60
        assert pool.map(_crashy, [(7,), (8,)], on_timeout=lambda a: -a[0]) == [7, 8]
    finally:
        pool.close()


@pytest.mark.slow
def test_timeout_pool_recovers_from_killed_workers():
    """Killing every worker process of the pool (os.kill, SIGKILL) between two batches does not cost a result:
    the next batch is scored correctly, by replacement workers, well within the time a timeout would take."""
    import os
    import signal

    before = _worker_pids()
    pool = TimeoutPool(workers=2, timeout=20.0)
    try:
        assert pool.map(_sleepy, [(0.0, 1), (0.0, 2)], on_timeout=lambda a: -a[1]) == [1, 2]
        for pid in _worker_pids() - before:
            os.kill(pid, signal.SIGKILL)
        t0 = time.time()
        assert pool.map(_sleepy, [(0.0, 3), (0.0, 4), (0.0, 5)], on_timeout=lambda a: -a[1]) == [3, 4, 5]
        assert pool.timeouts == pool.crashes == 0 and time.time() - t0 < 19
    finally:
        pool.close()


@pytest.mark.slow
def test_timeout_pool_scores_a_call_whose_worker_is_killed_wrong():
    """A worker killed in the middle of a call: that call is scored by on_timeout as soon as the death is seen
    (well before its timeout), the rest of the batch keeps its results."""
    import os
    import signal
    import threading

    before = _worker_pids()
    pool = TimeoutPool(workers=1, timeout=60.0)
    try:
        pool.map(_sleepy, [(0.0, 0)], on_timeout=lambda a: -a[1])  # start the worker
        (pid,) = _worker_pids() - before
        threading.Timer(1.0, os.kill, (pid, signal.SIGKILL)).start()
        t0 = time.time()
        assert pool.map(_sleepy, [(30.0, 1), (0.0, 2)], on_timeout=lambda a: -a[1]) == [-1, 2]
        assert (pool.timeouts, pool.crashes) == (0, 1) and time.time() - t0 < 30
    finally:
        pool.close()


@pytest.mark.slow
def test_pathological_answer_is_timed_out_and_scored_wrong():
    """A stated answer whose check does not finish (a power tower that sympy tries to evaluate: minutes in
    math-verify without its own timeout) is scored as a wrong answer after the task's timeout; the right answer
    beside it keeps its reward and the task scores again afterwards."""
    pytest.importorskip("math_verify")
    from entropy_rft.tasks.math import MathTask

    task = MathTask("math", "dapo", timeout=3.0, workers=2)
    try:
        problems = [MathProblem("q", "7"), MathProblem("q2", "7")]
        t0 = time.time()
        assert task.score_batch(["Answer: 9^{9^{9^{9}}}", "Answer: 7"], [True, True], problems) == [
            (-0.1, False),
            (1.0, True),
        ]
        assert time.time() - t0 < 60 and task._pool.timeouts == 1
        assert task.score_batch(["Answer: 7", "Answer: 8"], [True, False], problems) == [(1.0, True), (-1.0, False)]
    finally:
        if task._pool is not None:
            task._pool.close()


def test_math_verify_accepts_a_restated_computation_and_math_strict_does_not():
    """On a computation, math-verify evaluates what it parses: an answer that restates the question ("Answer:
    $61 \\cdot 94$" for 5734) or a response that only echoes it counts as correct under `math`. `math_strict`
    (verl's math_dapo string checker alone) scores both wrong and still takes the computed answer."""
    pytest.importorskip("math_verify")
    echo, restated = "What is $61 \\cdot 94$? Let us see.", "Multiply.\nAnswer: $61 \\cdot 94$"
    assert judge(echo, True, "5734").correct and judge(restated, True, "5734").reward == 1.0
    assert not judge(echo, True, "5734", verifier="dapo").correct
    assert judge(restated, True, "5734", verifier="dapo").reward == -0.1
    assert judge("61 * 94 = 5734\nAnswer: 5734", True, "5734", verifier="dapo").reward == 1.0
    assert judge("Answer: 61 \\cdot 94 = 5734", False, "5734", verifier="dapo").reward == 0.0  # right, cut off
    task = TASKS.get("math_strict")
    problem = MathProblem("What is $61 \\cdot 94$?", "5734")
    assert task.score_batch([restated, "Answer: 5734"], [True, True], [problem, problem]) == [
        (-0.1, False),
        (1.0, True),
    ]
    with pytest.raises(ValueError, match="verifier"):
        judge("Answer: 1", True, "1", verifier="sympy")


def test_math_numeral_reads_a_stated_answer_strictly_and_else_the_last_number():
    """`math_numeral`: an Answer: line is judged by DAPO's string checker alone (a restated expression is wrong,
    "= 5734" on its right is right); without one, the response's last number is the answer (partial credit 0 for a
    right value in the wrong form, as the paper's scheme gives), so an echo of the question earns nothing."""

    def verdict(text, finished=True):
        v = judge(text, finished, "5734", verifier="numeral")
        return v.reward, v.correct

    assert verdict("What is $61 \\cdot 94$?") == (-0.1, False)  # math-verify would evaluate the echo: correct
    assert verdict("Answer: $61 \\cdot 94$") == (-0.1, False)
    assert verdict("61 * 94 = 5734\nAnswer: 5734") == (1.0, True)
    assert verdict("So 61 times 94 is 5,734.") == (0.0, True)  # right value, no Answer: line
    assert verdict("5734 is close, but 5735") == (-0.1, False)
    assert verdict("The product is 5734 and", finished=False) == (0.0, True)
    assert verdict("no number at all") == (-0.1, False)
