"""Countdown: reach a target by combining given numbers with + - * and parentheses, each number at most once.

The embedded default task; small enough for a character-level policy of about 1M parameters to learn on a
laptop CPU, hard enough that its pass rates spread out (the paper's setting needs problems that are neither
always nor never solved).

Text formats (character level):
    prompt      "3,5,7>22:"             the numbers, '>', the target, ':'
    completion  "3*5+7=22" + EOS        an expression, '=', the target it reaches, end of sequence
The format has no whitespace on purpose: some tokenizer classes that transformers picks for a model type strip
spaces, and a format without them reads the same under any of them.

Reward, in the shape of the paper's Appendix B:
    1.0   correct answer and well formed
    0.0   correct answer, badly formed
   -0.1   wrong answer, within the length limit
   -1.0   wrong answer and overlong (no EOS within max_new_tokens)
"Answer" is the expression before the first '=' (the whole completion when there is none); it is correct when
it parses, uses only given numbers (each at most as often as given) and evaluates to the target. "Well formed"
means the completion ended with EOS and reads exactly "<expression>=<target>" with nothing else.

A puzzle's identity (issue 39) is its numbers as a multiset and its target, `Problem.identity` ("1,3,5>22" for
"5,1,3>22"): the order of the numbers changes the prompt's text (`Problem.key`) but not the puzzle, since any
solution of one ordering solves every other. Every builder, filter and split tells problems apart by identity
(tasks/splits.py); before issue 39 they used the ordered key, and reorderings of evaluation puzzles were in training.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import dataclass

from ..core.registry import Registry

TASKS: Registry = Registry("task")

_ALLOWED = set("0123456789+-*() ")
_TOKEN = re.compile(r"\s*(\d+|[+\-*()])")


@dataclass(frozen=True)
class Problem:
    numbers: tuple[int, ...]
    target: int
    solution: str = ""  # one known solution (used for supervised warm-up only)

    @property
    def key(self) -> str:
        """The prompt's text of the puzzle, numbers in their given order: "5,1,3>22"."""
        return f"{','.join(map(str, self.numbers))}>{self.target}"

    @property
    def identity(self) -> str:
        """The puzzle, whatever the order of its numbers: sorted numbers and target, "1,3,5>22" (module docstring)."""
        return f"{','.join(map(str, sorted(self.numbers)))}>{self.target}"

    def to_json(self) -> dict:
        return {"numbers": list(self.numbers), "target": self.target, "solution": self.solution}

    @classmethod
    def from_json(cls, row: dict) -> Problem:
        """A problem from a JSON row; a row of the wrong shape raises ValueError saying what a row holds (no
        coercion: 2.5 or "7" in numbers is an error, not 2 or 7)."""
        fix = (
            "each row needs 'numbers' (a non-empty list of non-negative ints) and 'target' (an int), optionally "
            "'solution' (a string), as one JSON object a line"
        )
        if not isinstance(row, dict):
            raise ValueError(f"countdown row {row!r} is not a JSON object; {fix}")
        missing = [k for k in ("numbers", "target") if k not in row]
        if missing:
            raise ValueError(f"countdown row {row!r} has no {' or '.join(missing)}; {fix}")
        numbers, target, solution = row["numbers"], row["target"], row.get("solution", "")
        is_int = lambda x: isinstance(x, int) and not isinstance(x, bool)  # noqa: E731
        if not isinstance(numbers, list) or not numbers or not all(is_int(n) and n >= 0 for n in numbers):
            raise ValueError(f"countdown row {row!r}: numbers must be a non-empty list of non-negative ints; {fix}")
        if not is_int(target):
            raise ValueError(f"countdown row {row!r}: target must be an int; {fix}")
        if not isinstance(solution, str):
            raise ValueError(f"countdown row {row!r}: solution must be a string; {fix}")
        return cls(tuple(numbers), target, solution)


class _Parser:
    """Recursive descent over + - * ( ) and non-negative integers; no eval()."""

    def __init__(self, text: str):
        self.tokens: list[str] = []
        pos = 0
        text = text.rstrip()
        while pos < len(text):
            m = _TOKEN.match(text, pos)
            if not m:
                raise ValueError(f"bad character at {pos}")
            self.tokens.append(m.group(1))
            pos = m.end()
        self.i = 0
        self.numbers: list[int] = []

    def parse(self) -> int:
        value = self.sum()
        if self.i != len(self.tokens):
            raise ValueError("trailing tokens")
        return value

    def peek(self) -> str | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def take(self) -> str:
        tok = self.peek()
        if tok is None:
            raise ValueError("unexpected end")
        self.i += 1
        return tok

    def sum(self) -> int:
        value = self.product()
        while self.peek() in ("+", "-"):
            op = self.take()
            rhs = self.product()
            value = value + rhs if op == "+" else value - rhs
        return value

    def product(self) -> int:
        value = self.atom()
        while self.peek() == "*":
            self.take()
            value *= self.atom()
            if abs(value) > 10**9:
                raise ValueError("overflow")
        return value

    def atom(self) -> int:
        tok = self.take()
        if tok == "(":
            value = self.sum()
            if self.take() != ")":
                raise ValueError("unbalanced")
            return value
        if tok.isdigit():
            self.numbers.append(int(tok))
            return int(tok)
        raise ValueError(f"unexpected {tok!r}")


def evaluate_expression(expr: str) -> tuple[int, list[int]] | None:
    """Value of an arithmetic expression and the numbers it uses, or None if it does not parse."""
    if not expr.strip() or not set(expr) <= _ALLOWED:
        return None
    try:
        parser = _Parser(expr)
        return parser.parse(), parser.numbers
    except (ValueError, IndexError):
        return None


def uses_allowed_numbers(used: list[int], given: tuple[int, ...]) -> bool:
    pool = list(given)
    for n in used:
        if n not in pool:
            return False
        pool.remove(n)
    return True


def is_correct(completion: str, problem: Problem) -> bool:
    expr = completion.split("=", 1)[0]
    result = evaluate_expression(expr)
    return result is not None and result[0] == problem.target and uses_allowed_numbers(result[1], problem.numbers)


def reward(completion: str, finished: bool, problem: Problem) -> tuple[float, bool]:
    """(reward, correct) for one completion in the paper's reward shape (module docstring)."""
    correct = is_correct(completion, problem)
    expr = completion.split("=", 1)[0]
    well_formed = finished and completion == f"{expr}={problem.target}" and expr == expr.strip()
    if correct:
        return (1.0 if well_formed else 0.0), True
    return (-0.1 if finished else -1.0), False


def prompt(problem: Problem) -> str:
    return f"{problem.key}:"


# ---------------------------------------------------------------------------------------------------------------
# Synthetic problems with known solutions.


def _render(tree) -> tuple[str, int, int]:
    """(text, value, precedence) of an expression tree with minimal parentheses; precedence 2 for atoms."""
    if isinstance(tree, int):
        return str(tree), tree, 2
    op, left, right = tree
    lt, lv, lp = _render(left)
    rt, rv, rp = _render(right)
    prec = 1 if op == "*" else 0
    if lp < prec:
        lt = f"({lt})"
    if rp < prec or (op == "-" and rp == 0):
        rt = f"({rt})"
    value = lv + rv if op == "+" else lv - rv if op == "-" else lv * rv
    return f"{lt}{op}{rt}", value, prec


def random_problem(rng: random.Random, *, n_numbers: int = 3, max_number: int = 9, max_target: int = 99) -> Problem:
    """Numbers drawn from 1..max_number; the target is the value of a random expression over 2 or all of them."""
    while True:
        numbers = tuple(rng.randint(1, max_number) for _ in range(n_numbers))
        used = rng.sample(list(numbers), rng.choice(range(2, n_numbers + 1)))
        tree = used[0]
        for n in used[1:]:
            op = rng.choice("+-*")
            tree = (op, tree, n) if rng.random() < 0.5 else (op, n, tree)
        text, value, _ = _render(tree)
        if 0 < value <= max_target:
            return Problem(numbers, value, f"{text}={value}")


def make_problems(n: int, *, seed: int, exclude: set[str] | None = None, **kwargs) -> list[Problem]:
    """n distinct puzzles (by identity: the numbers as a multiset and the target), none of whose identities is in
    exclude."""
    rng = random.Random(seed)
    seen = set(exclude or ())
    out: list[Problem] = []
    for _ in range(1000 * n):
        if len(out) == n:
            break
        p = random_problem(rng, **kwargs)
        if p.identity not in seen:
            seen.add(p.identity)
            out.append(p)
    if len(out) < n:
        raise ValueError(
            f"could only make {len(out)} distinct countdown problems of the {n} asked; raise max_number or max_target"
        )
    return out


@dataclass(frozen=True)
class CountdownTask:
    """The task interface the trainer uses: prompt text and reward of each completion. The prompt and reward
    functions are this module's (the character-level policy's format) unless given (tasks/countdown_chat.py: the
    same puzzles in words for a chat model)."""

    name: str = "countdown"
    prompt_of: Callable[[Problem], str] = prompt
    reward_of: Callable[[str, bool, Problem], tuple[float, bool]] = reward

    def prompt(self, problem: Problem) -> str:
        return self.prompt_of(problem)

    def score(self, completion: str, finished: bool, problem: Problem) -> tuple[float, bool]:
        return self.reward_of(completion, finished, problem)

    def score_batch(self, completions, finished, problems) -> list[tuple[float, bool]]:
        return [self.reward_of(c, bool(f), p) for c, f, p in zip(completions, finished, problems)]

    def parse_row(self, row: dict) -> Problem:
        return Problem.from_json(row)


TASKS.register("countdown", CountdownTask())
# The harder setting: the same prompts and reward over problems of five numbers (entropy_rft/toy.py, build_split);
# its default data is the shipped countdown5 split.
TASKS.register("countdown5", CountdownTask(name="countdown5"))
# The same over a large pool (issue 31: 8,000 filtered training problems, 1,000 evaluation problems with an initial-
# difficulty stratum; toy.build_pool); its default data is the shipped countdown5_large split.
TASKS.register("countdown5_large", CountdownTask(name="countdown5_large"))
