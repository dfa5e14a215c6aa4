"""Math word problems with a final answer: the paper's training and evaluation task (DAPO-Math-17k, AIME, DAPO500).

Prompt templates (registered as two tasks):
    math        DAPO's template: "Solve ... The last line of your response should be of the form Answer: $Answer
                ..." (the prompt of DAPO-Math-17k); the stated answer is the last "Answer:" line
    math_boxed  "... put your final answer within \\boxed{}" (the Qwen/DeepSeek convention); the stated answer is
                the last \\boxed{}

Reward, the paper's Appendix B:
    1.0   answer correct and format correct
    0.0   answer correct, format not
   -1.0   answer wrong and the response overlong (no EOS within the length limit)
   -0.1   answer wrong, within the length limit
Departures, numbered, where the paper leaves the checker unspecified:
1. "Format correct" means the response ended (EOS) and states its answer in the template's form (an Answer: line,
   or a \\boxed{}).
2. "Answer correct" means: the stated answer passes DAPO's string checker (`checkers.dapo_check`) or the boxed
   checker, or math-verify finds it equal to the ground truth (`checkers.equivalent`, which accepts 0.5 for
   \\frac{1}{2}). Without a stated answer, math-verify reads the whole response: a right answer in the wrong
   form earns 0, not -0.1.
3. Every response is scored in a worker process under a wall-clock timeout (default 10 s; verl uses 30 s for
   math-verify); a response whose check times out is scored as a wrong answer.
Evaluation (Avg@K, Pass@K) counts "answer correct" (point 2).
"""

from __future__ import annotations

import atexit
import hashlib
import multiprocessing
import threading
from dataclasses import dataclass, field
from typing import Callable, Sequence

from . import checkers
from .countdown import TASKS

DAPO_PREFIX = ("Solve the following math problem step by step. The last line of your response should be of the "
               "form Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n")
DAPO_SUFFIX = '\n\nRemember to put your answer on its own line after "Answer:".'
BOXED_SUFFIX = "\nPlease reason step by step, and put your final answer within \\boxed{}."

TEMPLATES: dict[str, Callable[[str], str]] = {
    "dapo": lambda q: f"{DAPO_PREFIX}{q}{DAPO_SUFFIX}",
    "boxed": lambda q: f"{q}{BOXED_SUFFIX}",
    "raw": lambda q: q,
}


def strip_template(prompt: str) -> str:
    """The bare problem of a prompt that carries DAPO's (or the boxed) template; other text is returned as is."""
    text = prompt
    if text.startswith(DAPO_PREFIX):
        text = text[len(DAPO_PREFIX):]
    for suffix in (DAPO_SUFFIX, BOXED_SUFFIX):
        if text.endswith(suffix):
            text = text[: -len(suffix)]
    return text.strip()


@dataclass(frozen=True)
class MathProblem:
    question: str  # the bare problem, no template
    answer: str  # ground truth as a string
    id: str = ""
    source: str = ""
    extra: dict = field(default_factory=dict, compare=False, hash=False)

    @property
    def key(self) -> str:
        """A stable identity of the problem: sha256 of its question text (ids differ between dataset copies)."""
        return hashlib.sha256(self.question.encode()).hexdigest()[:16]

    def to_json(self) -> dict:
        return {"question": self.question, "answer": self.answer, "id": self.id, "source": self.source, **self.extra}

    @classmethod
    def from_json(cls, row: dict) -> "MathProblem":
        missing = [k for k in ("question", "answer") if k not in row]
        if missing:
            raise ValueError(f"math row has no {' or '.join(missing)} (keys: {sorted(row)}); load dataset files with "
                             "entropy_rft.data.load_math (it reads the DAPO, AIME and AMC schemas)")
        extra = {k: v for k, v in row.items() if k not in ("question", "answer", "id", "source")}
        return cls(str(row["question"]), str(row["answer"]), str(row.get("id", "")), str(row.get("source", "")), extra)


@dataclass(frozen=True)
class Verdict:
    reward: float
    correct: bool  # answer correct (departure 2)
    well_formed: bool  # format correct (departure 1)
    stated: str | None  # the answer in the template's form, if any


def judge(completion: str, finished: bool, answer: str, template: str = "dapo", *,
          mv_timeout: int | None = None) -> Verdict:
    """The paper's reward for one response (module docstring); runs the checkers in this process."""
    if template == "dapo":
        stated = checkers.answer_line(completion[-checkers.DAPO_WINDOW:])
        strict = checkers.dapo_check(completion, answer).acc
    else:
        strict, stated = checkers.boxed_check(completion, answer)
    if stated is not None:
        correct = strict or checkers.equivalent(f"${stated.strip().strip('$')}$", answer, timeout=mv_timeout)
    else:
        correct = strict or checkers.equivalent(completion, answer, timeout=mv_timeout)
    well_formed = finished and stated is not None
    if correct:
        reward = 1.0 if well_formed else 0.0
    else:
        reward = -0.1 if finished else -1.0
    return Verdict(reward, correct, well_formed, stated)


# ---------------------------------------------------------------------------------------------------------------
# Timeouts: checks run in a pool of worker processes; a check past its time kills the pool, which is rebuilt.


def _start_worker(barrier, modules: tuple[str, ...]) -> None:
    import importlib
    import logging

    for name in modules:  # import before the first timed call (sympy alone takes seconds)
        try:
            importlib.import_module(name)
        except ImportError:  # the call itself will raise, with its own message
            pass
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    try:
        barrier.wait(timeout=TimeoutPool.STARTUP_SECONDS)  # tell the parent this worker is up
    except threading.BrokenBarrierError:  # a replacement worker, after the parent stopped waiting
        pass


class TimeoutPool:
    """Run fn(*args) for many argument tuples in worker processes, each under a wall-clock timeout.

    A call that runs past `timeout` seconds gets `on_timeout(args)` as its result; the pool is terminated (which
    stops the stuck worker) and the calls not yet collected run again in a fresh pool. workers=0 runs in this
    process without a timeout (for debugging). `preload` names modules each worker imports at start-up, before
    any call is timed (fn's own module is always imported)."""

    def __init__(self, workers: int = 2, timeout: float = 10.0, preload: tuple[str, ...] = ()):
        self.workers = workers
        self.timeout = timeout
        self.preload = preload
        self._pool = None
        self._lock = threading.Lock()
        self.timeouts = 0  # calls that timed out, over the pool's life

    STARTUP_SECONDS = 120.0  # a fresh worker imports Python and this package before its first call

    def _get(self, fn):
        if self._pool is None:
            ctx = multiprocessing.get_context("spawn")  # no fork: the parent holds torch threads
            barrier = ctx.Barrier(self.workers + 1)
            self._pool = ctx.Pool(self.workers, initializer=_start_worker,
                                  initargs=(barrier, (*self.preload, fn.__module__)))
            barrier.wait(timeout=self.STARTUP_SECONDS)  # the timeout is for checks, not for start-up
            atexit.register(self.close)  # stop the workers before the interpreter tears down
        return self._pool

    def close(self) -> None:
        if self._pool is not None:
            self._pool.terminate()
            self._pool.join()
            self._pool = None

    def map(self, fn, arg_list: Sequence[tuple], on_timeout: Callable[[tuple], object]) -> list:
        if self.workers == 0:
            return [fn(*args) for args in arg_list]
        results: dict[int, object] = {}
        pending = list(range(len(arg_list)))
        with self._lock:
            while pending:
                pool = self._get(fn)
                handles = [(i, pool.apply_async(fn, arg_list[i])) for i in pending]
                stuck = None
                for i, handle in handles:
                    try:
                        results[i] = handle.get(timeout=self.timeout)
                    except multiprocessing.TimeoutError:
                        stuck = i
                        break
                if stuck is None:
                    break
                self.timeouts += 1
                results[stuck] = on_timeout(arg_list[stuck])
                self.close()
                pending = [i for i in pending if i not in results]
        return [results[i] for i in range(len(arg_list))]


def _judge_in_worker(completion: str, finished: bool, answer: str, template: str) -> Verdict:
    return judge(completion, finished, answer, template)


@dataclass
class MathTask:
    """The task interface (prompt, score, parse_row) for math with a final answer."""

    name: str = "math"
    template: str = "dapo"
    timeout: float = 10.0
    workers: int = 2
    _pool: TimeoutPool | None = field(default=None, repr=False)

    def prompt(self, problem: MathProblem) -> str:
        return TEMPLATES[self.template](problem.question)

    def parse_row(self, row: dict) -> MathProblem:
        return MathProblem.from_json(row)

    def score(self, completion: str, finished: bool, problem: MathProblem) -> tuple[float, bool]:
        return self.score_batch([completion], [finished], [problem])[0]

    def verdicts(self, completions: Sequence[str], finished: Sequence[bool], problems: Sequence[MathProblem]) -> list[Verdict]:
        if self._pool is None:
            checkers._math_verify()  # a missing library fails here, with the install command
            self._pool = TimeoutPool(self.workers, self.timeout, preload=("math_verify",))
        args = [(c, bool(f), p.answer, self.template) for c, f, p in zip(completions, finished, problems)]
        return self._pool.map(_judge_in_worker, args,
                              on_timeout=lambda a: Verdict(-0.1 if a[1] else -1.0, False, False, None))

    def score_batch(self, completions: Sequence[str], finished: Sequence[bool],
                    problems: Sequence[MathProblem]) -> list[tuple[float, bool]]:
        return [(v.reward, v.correct) for v in self.verdicts(completions, finished, problems)]


TASKS.register("math", MathTask("math", "dapo"))
TASKS.register("math_boxed", MathTask("math_boxed", "boxed"))
