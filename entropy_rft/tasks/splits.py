"""Clean splits (issue 39): no puzzle twice within a split, no evaluation puzzle in training, none in the supervised
warm-up that built the policy. A puzzle is told apart by its task's `identity` (countdown: sorted numbers and target;
math: normalised question text), never by the text of its prompt.

Every builder of shipped data checks its splits with `check_clean` before writing them, and a test per shipped pool
checks the files (tests/test_splits.py).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable


def split_overlaps(train: Iterable, evaluation: Iterable, *, warmup: Iterable = ()) -> dict[str, int]:
    """Counts of what a clean split has none of: `train_repeats` and `eval_repeats` (rows whose identity already
    appeared earlier in the same split), `eval_in_train` and `eval_in_warmup` (distinct evaluation identities that
    also appear in training or in the warm-up)."""
    train_ids = Counter(p.identity for p in train)
    eval_ids = Counter(p.identity for p in evaluation)
    warm_ids = {p.identity for p in warmup}
    return {
        "train_repeats": sum(train_ids.values()) - len(train_ids),
        "eval_repeats": sum(eval_ids.values()) - len(eval_ids),
        "eval_in_train": len(eval_ids.keys() & train_ids.keys()),
        "eval_in_warmup": len(eval_ids.keys() & warm_ids),
    }


def check_clean(train: Iterable, evaluation: Iterable, *, warmup: Iterable = (), name: str = "split") -> None:
    """Raise ValueError naming every nonzero count of `split_overlaps`."""
    counts = split_overlaps(train, evaluation, warmup=warmup)
    bad = {k: v for k, v in counts.items() if v}
    if bad:
        raise ValueError(
            f"{name} is not clean (puzzles told apart by identity): " + ", ".join(f"{k}={v}" for k, v in bad.items())
        )
