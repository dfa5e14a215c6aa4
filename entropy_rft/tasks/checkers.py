"""Answer checkers for math: DAPO's "Answer:" checker, boxed-answer extraction, and math-verify equivalence.

`dapo_check` reproduces verl 0.9.1 `math_dapo.compute_score` (checked against tests/fixtures/math_rewards.json):
1. only the last 300 characters of the completion are read;
2. the answer is the last match of `(?i)Answer\\s*:\\s*([^\\n]+)`, normalised with the Minerva rules
   (Lewkowycz et al. 2022, App. D; `normalize_final_answer`) and compared with the normalised ground truth as strings;
3. with no Answer line, the last `\\boxed{...}` within the last 100 characters is compared with the ground truth
   by exact string equality (no normalisation).

`equivalent` reproduces verl 0.9.1 `math_verify.compute_score`: the ground truth is wrapped as `\\boxed{gt}` and
parsed as LaTeX, the completion is parsed as expressions and LaTeX, and any match counts. It needs the
math-verify library (`pip install "entropy-rft[math]"`).

Every check a run makes goes through `TimeoutPool` (entropy_rft/tasks/math.py), so a pathological answer
costs at most the timeout.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

ANSWER_PATTERN = re.compile(r"(?i)Answer\s*:\s*([^\n]+)")
INVALID = "[INVALID]"
DAPO_WINDOW = 300  # characters of the completion the DAPO checker reads
BOX_WINDOW = 100  # characters the boxed fallback reads

# Minerva normalisation (Lewkowycz et al. 2022, Appendix D, as used by lm-eval's hendrycks_math and DAPO):
# literal replacements, then words and TeX fragments deleted, then regex unwrapping.
_REPLACE = (
    ("an ", ""),
    ("a ", ""),
    (".$", "$"),
    ("\\$", ""),
    ("\\ ", ""),
    (" ", ""),
    ("mbox", "text"),
    (",\\text{and}", ","),
    ("\\text{and}", ","),
    ("\\text{m}", "\\text{}"),
)
_DELETE = (
    "square",
    "ways",
    "integers",
    "dollars",
    "mph",
    "inches",
    "hours",
    "km",
    "units",
    "\\ldots",
    "sue",
    "points",
    "feet",
    "minutes",
    "digits",
    "cents",
    "degrees",
    "cm",
    "gm",
    "pounds",
    "meters",
    "meals",
    "edges",
    "students",
    "childrentickets",
    "multiples",
    "\\text{s}",
    "\\text{.}",
    "\\text{\ns}",
    "\\text{}^2",
    "\\text{}^3",
    "\\text{\n}",
    "\\text{}",
    "\\mathrm{th}",
    "^\\circ",
    "^{\\circ}",
    "\\;",
    ",\\!",
    "{,}",
    '"',
    "\\dots",
)
_UNWRAP = (
    (re.compile(r"(.*?)(\$)(.*?)(\$)(.*)"), "$\\3$"),  # keep the first inline math span
    (re.compile(r"(\\text\{)(.*?)(\})"), "\\2"),
    (re.compile(r"(\\textbf\{)(.*?)(\})"), "\\2"),
    (re.compile(r"(\\overline\{)(.*?)(\})"), "\\2"),
    (re.compile(r"(\\boxed\{)(.*)(\})"), "\\2"),
    (re.compile(r"(frac)([^{])(.)"), "frac{\\2}{\\3}"),  # \frac12 -> \frac{1}{2}
    (re.compile(r"(sqrt)([^{])"), "sqrt{\\2}"),
)  # \sqrt2 -> \sqrt{2}


def normalize_final_answer(answer: str) -> str:
    """Minerva normalisation of a final answer: right of the last '=', units and TeX decoration removed."""
    answer = answer.split("=")[-1]
    for before, after in _REPLACE:
        answer = answer.replace(before, after)
    for fragment in _DELETE:
        answer = answer.replace(fragment, "")
    for pattern, repl in _UNWRAP:
        answer = pattern.sub(repl, answer)
    answer = answer.replace("$", "")
    if answer.replace(",", "").isdigit():
        answer = answer.replace(",", "")
    return answer.strip()


def last_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` in text (braces balanced), or None when there is none or it is open."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth = 0
    for i in range(start + len("\\boxed"), len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[start + len("\\boxed{") : i]
    return None


def answer_line(text: str) -> str | None:
    """The last `Answer: ...` line's content (case-insensitive), or None."""
    found = ANSWER_PATTERN.findall(text)
    return found[-1] if found else None


@dataclass(frozen=True)
class DapoResult:
    score: float  # +1 correct, -1 otherwise (verl's math_dapo score)
    acc: bool
    pred: str  # the normalised prediction, the boxed content, or "[INVALID]"


def dapo_check(completion: str, ground_truth: str) -> DapoResult:
    """verl 0.9.1 `math_dapo.compute_score` with its defaults (module docstring, points 1-3)."""
    tail = completion[-DAPO_WINDOW:]
    line = answer_line(tail)
    pred = normalize_final_answer(line if line is not None else INVALID)
    acc = pred == normalize_final_answer(ground_truth)
    if pred == INVALID:
        boxed = last_boxed(tail[-BOX_WINDOW:])
        if boxed is not None:
            pred, acc = boxed, boxed == ground_truth
    return DapoResult(1.0 if acc else -1.0, acc, pred)


def boxed_check(completion: str, ground_truth: str) -> tuple[bool, str | None]:
    """(correct, boxed answer): the last `\\boxed{}` anywhere, Minerva-normalised, against the normalised truth."""
    boxed = last_boxed(completion)
    if boxed is None:
        return False, None
    return normalize_final_answer(boxed) == normalize_final_answer(ground_truth), boxed


def _math_verify():
    try:
        import math_verify
    except ImportError as err:
        raise ImportError(
            "math answer checking needs the math-verify library: pip install 'entropy-rft[math]' "
            "(or pip install math-verify)"
        ) from err
    return math_verify


def equivalent(completion: str, ground_truth: str, *, timeout: int | None = None) -> bool:
    """verl 0.9.1 `math_verify.compute_score` as a bool: does any answer parsed from the completion equal the
    ground truth mathematically (1/2 = 0.5 = \\frac{1}{2})? `timeout` is math-verify's own per-call limit
    (signal based, main thread only); None leaves the limit to the caller's process pool."""
    mv = _math_verify()
    try:
        gold = mv.parse(
            f"\\boxed{{{ground_truth}}}", extraction_config=[mv.LatexExtractionConfig()], parsing_timeout=timeout
        )
        pred = mv.parse(
            completion,
            extraction_config=[mv.ExprExtractionConfig(), mv.LatexExtractionConfig()],
            parsing_timeout=timeout,
        )
        if not gold or not pred:
            return False
        return bool(mv.verify(gold, pred, timeout_seconds=timeout))
    except Exception:  # math-verify raises many kinds on unparsable input; verl scores them 0
        return False
