"""TimedTask: a task of the user's own with its reward run in worker processes under a timeout (issue 63)."""

import time

from entropy_rft.tasks import CountdownTask, Problem, TimedTask
from entropy_rft.tasks.countdown import reward


def slow_reward(completion: str, finished: bool, problem: Problem) -> tuple[float, bool]:
    """countdown's reward, except that "hang" never returns and "raise" raises (module level: workers import it)."""
    if completion == "hang":
        time.sleep(3600)
    if completion == "raise":
        raise RuntimeError("a bug in the reward")
    return reward(completion, finished, problem)


def test_a_hung_or_failing_reward_scores_its_response_as_wrong_and_the_rest_go_on():
    """Of four responses, the one whose reward hangs is scored as a wrong answer after the timeout (-0.1: it ended)
    and the one whose reward raises as a wrong overlong one (-1.0: it did not end); the others get the task's own
    rewards, within seconds rather than the hour the hung one would take; the pool counts one timeout and one
    failure. Prompt and row format are the wrapped task's."""
    inner = CountdownTask(name="slow", reward_of=slow_reward)
    task = TimedTask(inner, timeout=2.0, workers=2)
    problem = Problem((3, 5, 7), 22)
    start = time.monotonic()
    try:
        scored = task.score_batch(["3*5+7=22", "hang", "raise", "3+5=8"], [True, True, False, True], [problem] * 4)
        assert task.pool.timeouts == 1 and task.pool.failures == 1
    finally:
        if task.pool is not None:
            task.pool.close()
    assert scored == [(1.0, True), (-0.1, False), (-1.0, False), (-0.1, False)]
    assert time.monotonic() - start < 600  # worker start-up (imports) included; the hung reward alone is 3600 s
    assert task.name == "slow" and task.prompt(problem) == inner.prompt(problem) == "3,5,7>22:"
    assert task.parse_row({"numbers": [3, 5, 7], "target": 22}) == problem
