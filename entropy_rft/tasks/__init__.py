"""Tasks: a task turns a problem into a prompt and scores completions. Chosen by name through TASKS.

The interface: `prompt(problem) -> str`, `score_batch(completions, finished, problems) -> [(reward, correct)]`,
`score(completion, finished, problem)` for one, and `parse_row(dict) -> problem` for JSONL rows.
"""

from .countdown import TASKS, CountdownTask, Problem
from .countdown_chat import CountdownChatTask
from .math import MathProblem, MathTask

__all__ = ["TASKS", "CountdownTask", "CountdownChatTask", "Problem", "MathProblem", "MathTask"]
