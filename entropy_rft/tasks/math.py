"""Math word problems with a final answer: the paper's training and evaluation task (DAPO-Math-17k, AIME, DAPO500).

Prompt templates and checkers (registered as four tasks):
    math        DAPO's template: "Solve ... The last line of your response should be of the form Answer: $Answer
                ..." (the prompt of DAPO-Math-17k); the stated answer is the last "Answer:" line
    math_boxed  "... put your final answer within \\boxed{}" (the Qwen/DeepSeek convention); the stated answer is
                the last \\boxed{}
    math_strict DAPO's template with DAPO's string checker alone (verl's `math_dapo.compute_score`, the reference
                code's reward), no math-verify: for generated arithmetic, where departure 2 below is a reward hack
    math_numeral  DAPO's template; a stated answer is read by DAPO's string checker, a response without one by its
                last number (GSM8K's "flexible extract"): computed integer answers get departure 2's partial credit
                for a right value in the wrong form, and an echoed expression earns none

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
   form earns 0, not -0.1. math-verify evaluates what it parses, so on a computation ("What is $61 \\cdot 94$?")
   an answer that restates the question ("Answer: $61 \\cdot 94$"), or a response that echoes it, counts as
   correct: `math_strict` (verifier "dapo") scores such tasks with the string checker alone.
3. Every response is scored in a worker process under a wall-clock timeout (default 10 s; verl uses 30 s for
   math-verify); a response whose check times out, crashes its worker or raises is scored as a wrong answer, and
   the pool of workers is rebuilt.
Evaluation (Avg@K, Pass@K) counts "answer correct" (point 2).
"""

from __future__ import annotations

import atexit
import hashlib
import multiprocessing
import multiprocessing.connection
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from . import checkers
from .countdown import TASKS

DAPO_PREFIX = (
    "Solve the following math problem step by step. The last line of your response should be of the "
    "form Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n"
)
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
        text = text[len(DAPO_PREFIX) :]
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
    def identity(self) -> str:
        """The problem's identity (issue 39): sha256 of its normalised question text, whitespace runs collapsed to
        one space and the ends stripped (ids differ between dataset copies, and so does spacing)."""
        return hashlib.sha256(" ".join(self.question.split()).encode()).hexdigest()[:16]

    @property
    def key(self) -> str:
        """The same as `identity` (kept for callers of the older name)."""
        return self.identity

    def to_json(self) -> dict:
        return {"question": self.question, "answer": self.answer, "id": self.id, "source": self.source, **self.extra}

    @classmethod
    def from_json(cls, row: dict) -> MathProblem:
        fix = (
            "a row is a JSON object with 'question' (non-empty text) and 'answer' (text or a number); load "
            "dataset files with entropy_rft.tasks.data.load_math (it reads the DAPO, AIME and AMC schemas)"
        )
        if not isinstance(row, dict):
            raise ValueError(f"math row {row!r} is not a JSON object; {fix}")
        missing = [k for k in ("question", "answer") if k not in row]
        if missing:
            raise ValueError(f"math row has no {' or '.join(missing)} (keys: {sorted(row)}); {fix}")
        if not isinstance(row["question"], str) or not row["question"].strip():
            raise ValueError(f"math row question {row['question']!r} is not non-empty text; {fix}")
        answer = row["answer"]
        if isinstance(answer, bool) or not isinstance(answer, (str, int, float)) or not str(answer).strip():
            raise ValueError(f"math row answer {answer!r} is neither text nor a number; {fix}")
        extra = {k: v for k, v in row.items() if k not in ("question", "answer", "id", "source")}
        return cls(str(row["question"]), str(row["answer"]), str(row.get("id", "")), str(row.get("source", "")), extra)


@dataclass(frozen=True)
class Verdict:
    reward: float
    correct: bool  # answer correct (departure 2)
    well_formed: bool  # format correct (departure 1)
    stated: str | None  # the answer in the template's form, if any


VERIFIERS = (
    "math_verify",
    "dapo",
    "numeral",
)  # departure 2; the string checker alone; the string checker or last number
LAST_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def last_number(text: str) -> str | None:
    """The last number written in text, thousands commas and a trailing period removed (GSM8K's flexible extract)."""
    found = LAST_NUMBER.findall(text)
    return found[-1].replace(",", "") if found else None


def judge(
    completion: str,
    finished: bool,
    answer: str,
    template: str = "dapo",
    *,
    mv_timeout: int | None = None,
    verifier: str = "math_verify",
) -> Verdict:
    """The paper's reward for one response (module docstring); runs the checkers in this process. verifier "dapo"
    counts an answer correct only when the template's string checker does (no math-verify); "numeral" reads a stated
    answer with the string checker and, without one, compares the response's last number with the ground truth."""
    if verifier not in VERIFIERS:
        raise ValueError(f"verifier {verifier!r} is not one of {', '.join(VERIFIERS)}")
    if template == "dapo":
        stated = checkers.answer_line(completion[-checkers.DAPO_WINDOW :])
        strict = checkers.dapo_check(completion, answer).acc
    else:
        strict, stated = checkers.boxed_check(completion, answer)
    if verifier == "dapo":
        correct = strict
    elif verifier == "numeral":
        correct = strict if stated is not None else last_number(completion) == answer.strip()
    elif stated is not None:
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
# Timeouts: each worker process has its own pipe and runs one call at a time. A call past its time gets its worker
# killed and replaced; a worker that dies under a call (a crash in native code, a kill) is seen at once by its pipe's
# end of file and replaced; either call is scored by on_timeout. (multiprocessing.Pool shares one task queue whose
# lock a killed worker can take with it, hanging the pool, even its terminate().)


def _serve(conn, modules: tuple[str, ...]) -> None:
    """A worker: import the modules, say ready, then run (fn, args) messages until None or the pipe closes."""
    import importlib
    import logging

    for name in modules:  # import before the first timed call (sympy alone takes seconds)
        try:
            importlib.import_module(name)
        except ImportError:  # the call itself will raise, with its own message
            pass
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    conn.send("ready")
    while True:
        try:
            message = conn.recv()
        except EOFError:
            return
        if message is None:
            return
        fn, args = message
        conn.send("started")  # a worker that dies before this never ran the call: the parent hands it on
        try:
            conn.send((True, fn(*args)))
        except Exception as err:  # reported to the parent, which scores the call as failed
            conn.send((False, f"{type(err).__name__}: {err}"))


@dataclass
class _Worker:
    process: multiprocessing.process.BaseProcess
    conn: object  # the parent's end of the pipe
    call: int | None = None  # the call it is running
    since: float = 0.0
    started: bool = False  # the worker has confirmed it began the call


class TimeoutPool:
    """Run fn(*args) for many argument tuples in worker processes, each under a wall-clock timeout.

    A call that runs past `timeout` seconds from its start, whose worker dies during it, or that raises gets
    `on_timeout(args)` as its result (counted in `timeouts`, `crashes` and `failures`); a stuck or dead worker is
    replaced and the other calls go on. workers=0 runs in this process without a timeout (for debugging).
    `preload` names modules each worker imports at start-up, before any call is timed (fn's own module is always
    imported)."""

    def __init__(self, workers: int = 2, timeout: float = 10.0, preload: tuple[str, ...] = ()):
        self.workers = workers
        self.timeout = timeout
        self.preload = preload
        self._workers: list[_Worker] = []
        self._lock = threading.Lock()
        self.timeouts = 0  # calls past their time, over the pool's life
        self.crashes = 0  # calls whose worker died under them
        self.failures = 0  # calls that raised

    STARTUP_SECONDS = 120.0  # a fresh worker imports Python and this package before its first call

    def _fill(self, fn) -> None:
        """Replace dead idle workers and start missing ones (in parallel), waiting until each says it is ready."""
        ctx = multiprocessing.get_context("spawn")  # no fork: the parent holds torch threads
        for w in [w for w in self._workers if w.call is None and not w.process.is_alive()]:
            self._drop(w)  # (a dead worker holding a call is seen by its pipe's end of file, in map)
        fresh = []
        while len(self._workers) + len(fresh) < self.workers:
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_serve, args=(child, (*self.preload, fn.__module__)), daemon=True)
            proc.start()
            child.close()
            fresh.append(_Worker(proc, parent))
        for w in fresh:  # the timeout is for checks, not for start-up
            if not w.conn.poll(self.STARTUP_SECONDS) or w.conn.recv() != "ready":
                self._drop(w)
                raise RuntimeError(f"an answer-checking worker did not start within {self.STARTUP_SECONDS:.0f} s")
            self._workers.append(w)
        if fresh and len(self._workers) == len(fresh):
            atexit.register(self.close)  # stop the workers before the interpreter tears down

    def _drop(self, w: _Worker) -> None:
        if w.process.is_alive():
            w.process.kill()
        w.process.join()
        w.conn.close()
        if w in self._workers:
            self._workers.remove(w)

    def close(self) -> None:
        for w in list(self._workers):
            self._drop(w)

    def map(self, fn, arg_list: Sequence[tuple], on_timeout: Callable[[tuple], object]) -> list:
        if self.workers == 0:
            return [fn(*args) for args in arg_list]
        results: dict[int, object] = {}
        queue = list(range(len(arg_list)))
        with self._lock:
            while queue or any(w.call is not None for w in self._workers):
                self._fill(fn)
                for w in list(self._workers):
                    if w.call is None and queue:
                        w.call, w.since, w.started = queue.pop(0), time.monotonic(), False
                        try:
                            w.conn.send((fn, arg_list[w.call]))
                        except OSError:  # the worker died while idle (a broken pipe): hand the call on
                            queue.insert(0, w.call)
                            self._drop(w)
                if not any(w.call is not None for w in self._workers):
                    continue  # every idle worker was dead: start replacements
                busy = [w for w in self._workers if w.call is not None]
                left = min(w.since + self.timeout for w in busy) - time.monotonic()
                ready = multiprocessing.connection.wait([w.conn for w in busy], timeout=max(left, 0.0))
                for w in busy:
                    i = w.call
                    if w.conn in ready:
                        try:
                            message = w.conn.recv()
                        except (EOFError, OSError):  # the worker died
                            if w.started:  # under the call: the call is to blame
                                self.crashes += 1
                                results[i] = on_timeout(arg_list[i])
                            else:  # before it began the call (killed while idle): another worker runs it
                                queue.insert(0, i)
                            self._drop(w)
                            continue
                        if message == "started":
                            w.started = True
                            continue
                        ok, value = message
                        if not ok:
                            self.failures += 1
                        results[i] = value if ok else on_timeout(arg_list[i])
                        w.call = None
                    elif time.monotonic() - w.since > self.timeout:
                        self.timeouts += 1
                        results[i] = on_timeout(arg_list[i])
                        self._drop(w)
        return [results[i] for i in range(len(arg_list))]


def _judge_in_worker(completion: str, finished: bool, answer: str, template: str, verifier: str) -> Verdict:
    return judge(completion, finished, answer, template, verifier=verifier)


@dataclass
class MathTask:
    """The task interface (prompt, score, parse_row) for math with a final answer."""

    name: str = "math"
    template: str = "dapo"
    verifier: str = "math_verify"  # VERIFIERS: "dapo" scores with the string checker alone (math_strict)
    timeout: float = 10.0
    workers: int = 2
    _pool: TimeoutPool | None = field(default=None, repr=False)

    def prompt(self, problem: MathProblem) -> str:
        return TEMPLATES[self.template](problem.question)

    def parse_row(self, row: dict) -> MathProblem:
        return MathProblem.from_json(row)

    def score(self, completion: str, finished: bool, problem: MathProblem) -> tuple[float, bool]:
        return self.score_batch([completion], [finished], [problem])[0]

    def verdicts(
        self, completions: Sequence[str], finished: Sequence[bool], problems: Sequence[MathProblem]
    ) -> list[Verdict]:
        if self._pool is None:
            if self.verifier == "math_verify":
                checkers._math_verify()  # a missing library fails here, with the install command
            self._pool = TimeoutPool(self.workers, self.timeout, preload=("math_verify",))
        args = [
            (c, bool(f), p.answer, self.template, self.verifier) for c, f, p in zip(completions, finished, problems)
        ]
        return self._pool.map(
            _judge_in_worker, args, on_timeout=lambda a: Verdict(-0.1 if a[1] else -1.0, False, False, None)
        )

    def score_batch(
        self, completions: Sequence[str], finished: Sequence[bool], problems: Sequence[MathProblem]
    ) -> list[tuple[float, bool]]:
        return [(v.reward, v.correct) for v in self.verdicts(completions, finished, problems)]


TASKS.register("math", MathTask("math", "dapo"))
TASKS.register("math_boxed", MathTask("math_boxed", "boxed"))
TASKS.register("math_strict", MathTask("math_strict", "dapo", verifier="dapo"))
TASKS.register("math_numeral", MathTask("math_numeral", "dapo", verifier="numeral"))
