"""Issue 46 item 4: a first look at GRPO's entropy against Clip_B's on a real pretrained LM (SmolLM2-135M-Instruct,
`model: smollm2-135m`), sized to a 2-core CPU.

    python benchmarks/real_lm_dynamics.py split      # writes benchmarks/real_lm_dynamics/data/{train,eval}.jsonl
    ENTROPY_RFT_CACHE=... OMP_NUM_THREADS=1 entropy-rft compare --config benchmarks/real_lm_dynamics.yaml \
        --methods grpo,clip_b --seeds 3 --out runs/real_lm_dynamics

The task is the math task (the paper's DAPO prompt and reward, tasks/math.py) on made-up arithmetic with integer
answers (data.synthetic_problems: a + b, a * c, a + b * c), because on countdown in words the model is never right
(0 of 112 training responses in a 7-step pilot), so its rewards only separate finished from cut-off responses and the
signal is gone once every response finishes (step 5 of that pilot). On arithmetic it is right about one time in ten
at 64 tokens (Avg@4 10.9%, Pass@4 37.5% on 16 evaluation problems at temperature 1.0), so the advantages carry
correctness as the paper's do.

The evaluation problems share none with the training problems by content: a problem is its operation with the
operands of + and * as a multiset (so 3 + 5 and 5 + 3 are one problem, and so are 2 + 3 * 4 and 2 + 4 * 3); an
evaluation candidate whose content is a training problem's is dropped.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from entropy_rft.tasks.data import synthetic_problems, write_jsonl

HERE = Path(__file__).resolve().parent / "real_lm_dynamics" / "data"
N_TRAIN, N_EVAL, SEED = 1600, 400, 1
_NUMBER = re.compile(r"\d+")


def content(question: str) -> tuple:
    """A problem's content: its shape and operands, commutative operands as a sorted tuple."""
    nums = list(map(int, _NUMBER.findall(question)))
    if "+" in question and "\\cdot" in question:  # a + b * c
        return ("a+b*c", nums[0], tuple(sorted(nums[1:])))
    return ("+" if "+" in question else "*", tuple(sorted(nums)))


def _draw(stream, n: int, seen: set) -> list:
    """The next n problems of the stream whose content is not in seen (which they join)."""
    out = []
    for p in stream:
        key = content(p.question)
        if key not in seen:
            seen.add(key)
            out.append(p)
            if len(out) == n:
                break
    return out


def split() -> tuple[list, list]:
    """N_TRAIN training and N_EVAL evaluation problems, no content shared, from one seeded stream."""
    stream = iter(synthetic_problems(3 * (N_TRAIN + N_EVAL), seed=SEED))
    seen: set = set()
    train = _draw(stream, N_TRAIN, seen)
    held = _draw(stream, N_EVAL, seen)  # after every training problem, never one of their contents
    if len(held) < N_EVAL:
        raise RuntimeError(f"only {len(held)} evaluation problems could be drawn; raise the stream")
    return train, held


if __name__ == "__main__":
    if sys.argv[1:] != ["split"]:
        raise SystemExit(__doc__)
    train, held = split()
    write_jsonl(train, HERE / "train.jsonl")
    write_jsonl(held, HERE / "eval.jsonl")
    shared = {content(p.question) for p in train} & {content(p.question) for p in held}
    print(f"wrote {len(train)} training and {len(held)} evaluation problems to {HERE}; contents shared: {len(shared)}")
