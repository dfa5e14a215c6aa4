"""A task whose reward runs under a wall-clock timeout: wrap your own task in `TimedTask` before registering it, and
each response's reward runs in a worker process (math.TimeoutPool, the pool the math tasks check answers in). A
reward that runs past `timeout` seconds, crashes its worker or raises scores that response as a wrong answer (-0.1,
or -1.0 when it was overlong, the paper's Appendix B shape) and the run goes on; the pool counts them (`timeouts`,
`crashes`, `failures`).

    from entropy_rft.tasks import TASKS, TimedTask
    TASKS.register("my_task", TimedTask(MyTask(), timeout=5.0))

The wrapped task's `score(completion, finished, problem)` runs in the workers, so the task, its problems and its
reward must pickle (a task object of a module's class, its functions defined at module level, as a `spawn` worker
imports them); `prompt` and `parse_row` run in the trainer's process as the wrapped task's own.

Departures, numbered:
1. A reward in the trainer's own process cannot be stopped from within it when it is stuck in native code (a
   regular expression that backtracks, a solver), so the timeout needs a worker process: each response pays a
   round trip through a pipe (well under a millisecond) besides the reward itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from .math import TimeoutPool


def _score_in_worker(task, completion: str, finished: bool, problem) -> tuple[float, bool]:
    reward, correct = task.score(completion, finished, problem)
    return float(reward), bool(correct)


@dataclass
class TimedTask:
    """`task` with each response's reward run in `workers` worker processes under `timeout` seconds (module
    docstring); its name, prompt and row format are the task's."""

    task: object
    timeout: float = 10.0
    workers: int = 2
    pool: TimeoutPool | None = field(default=None, repr=False)

    @property
    def name(self) -> str:
        return getattr(self.task, "name", type(self.task).__name__)

    def prompt(self, problem) -> str:
        return self.task.prompt(problem)

    def parse_row(self, row: dict):
        return self.task.parse_row(row)

    def score(self, completion: str, finished: bool, problem) -> tuple[float, bool]:
        return self.score_batch([completion], [finished], [problem])[0]

    def score_batch(self, completions: Sequence[str], finished: Sequence[bool], problems: Sequence) -> list:
        if self.pool is None:
            self.pool = TimeoutPool(self.workers, self.timeout)
        args = [(self.task, c, bool(f), p) for c, f, p in zip(completions, finished, problems)]
        return self.pool.map(_score_in_worker, args, on_timeout=lambda a: (-0.1 if a[2] else -1.0, False))
