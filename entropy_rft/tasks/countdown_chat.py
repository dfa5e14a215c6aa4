"""Countdown in words, for a pretrained instruct model: the problems (and JSONL rows) of tasks/countdown.py, a prompt
a chat model reads, and the stated answer on a final "Answer:" line, as the paper's DAPO-Math prompt asks for its
answers (tasks/math.py, DAPO_PREFIX). Used with chat_template: true (each prompt one user turn).

    prompt      "Using the numbers 3, 5, 7, write an arithmetic expression that equals 22. ... The last line of your
                response should be of the form Answer: $Expression ..."
    completion  free text whose last line is "Answer: 3*5+7" (the expression may be followed by "= 22")

Reward, the paper's Appendix B shape (as tasks/math.py):
    1.0   answer correct and format correct
    0.0   answer correct, format not
   -1.0   answer wrong and the response overlong (no EOS within max_new_tokens)
   -0.1   answer wrong, within the length limit
Departures, numbered:
1. "Answer" is the expression of the last line that starts with "Answer:", read after dropping "$", a trailing
   ".", and anything from "=" on; x, × and \\times read as *. A response without such a line has no answer (wrong).
2. "Format correct" means the response ended (EOS) and its last non-empty line is the Answer: line.
3. "Answer correct" is countdown's rule: the expression parses, uses only given numbers (each at most as often as
   given) and evaluates to the target (tasks/countdown.is_correct).
"""

from __future__ import annotations

import re
from functools import partial

from .countdown import TASKS, CountdownTask, Problem, is_correct

ANSWER_LINE = re.compile(r"^\s*\**\s*answer\s*\**\s*:\s*\**\s*(.*)$", re.IGNORECASE)  # also **Answer:** and **Answer**:
TIMES = re.compile(r"\\times|\\cdot|[x×·]")


def prompt(problem: Problem) -> str:
    numbers = ", ".join(map(str, problem.numbers))
    return (
        f"Using the numbers {numbers}, write an arithmetic expression that equals {problem.target}. You may use "
        "+, -, * and parentheses, and each number at most once.\n\nThe last line of your response should be of "
        "the form Answer: $Expression (without quotes) where $Expression is the expression."
    )


def stated_answer(completion: str) -> tuple[str | None, bool]:
    """(the expression of the last Answer: line or None, whether that line is the last non-empty one)."""
    lines = [line for line in completion.splitlines() if line.strip()]
    for i in range(len(lines) - 1, -1, -1):
        m = ANSWER_LINE.match(lines[i])
        if m:
            expr = m.group(1).replace("$", "").strip().rstrip(".").split("=", 1)[0]
            return TIMES.sub("*", expr).strip(), i == len(lines) - 1
    return None, False


def reward(completion: str, finished: bool, problem: Problem) -> tuple[float, bool]:
    """(reward, correct) for one completion (module docstring)."""
    expr, last = stated_answer(completion)
    correct = expr is not None and is_correct(expr, problem)
    if correct:
        return (1.0 if finished and last else 0.0), True
    return (-0.1 if finished else -1.0), False


# the task interface is countdown's, with this module's prompt and reward
CountdownChatTask = partial(CountdownTask, name="countdown_chat", prompt_of=prompt, reward_of=reward)

TASKS.register("countdown_chat", CountdownChatTask())
