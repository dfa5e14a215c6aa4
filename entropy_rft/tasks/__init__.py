"""Tasks: a task turns a problem into a prompt and scores completions. Chosen by name through TASKS.

The interface: `prompt(problem) -> str`, `score_batch(completions, finished, problems) -> [(reward, correct)]`,
`score(completion, finished, problem)` for one, and `parse_row(dict) -> problem` for JSONL rows. A task of your
own whose reward may hang: register `TimedTask(task, timeout=...)` (its reward then runs under a timeout).
"""

from .countdown import TASKS, CountdownTask, Problem
from .countdown_chat import CountdownChatTask
from .math import MathProblem, MathTask
from .timed import TimedTask

__all__ = ["TASKS", "CountdownTask", "CountdownChatTask", "Problem", "MathProblem", "MathTask", "TimedTask"]
