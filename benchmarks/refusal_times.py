"""How long a refusal of a size that cannot be allocated takes (issue 54): the memory check's own arithmetic
(plan.check_fits for train, plan.check_eval_fits for eval) on the sizes the probe tried, and, with --cli, the
whole command as a user meets it (a fresh `python -m entropy_rft.commands.cli` process: interpreter start and imports,
then the refusal).

Before issue 54 the check built one integer per rollout row (rules.passes via StepRules.rows_per_pass, 8 times per
check): train refused prompts_per_step=10^8 in 33 s, group_size=10^8 in 25 s and ran out of memory at 10^9; eval had
no check (614 GB asked after 48 s). The check is now arithmetic on sizes, so its time does not grow with them.

    python benchmarks/refusal_times.py [--repeats 5] [--cli]

Prints, per case, the median of --repeats in-process checks (milliseconds) and, with --cli, the command's wall
time and exit code. tests/test_bad_input.py asserts only a generous bound (10 s) on a shared machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRAIN = [
    {"prompts_per_step": 10**8, "group_size": 4},
    {"group_size": 10**8},
    {"prompts_per_step": 10**9},
    {"max_new_tokens": 10**9},
    {"prompts_per_step": 10**12, "group_size": 10**6},
]
EVAL = [
    {"problems": 1, "n": 10**8, "max_new_tokens": 16},
    {"problems": 200, "n": 10**8, "max_new_tokens": 16},
    {"problems": 1, "n": 32, "max_new_tokens": 10**9},
]
CLI = [
    ["train", "--steps", "2", "--set", "prompts_per_step=100000000", "group_size=4", "--out", "d"],
    ["train", "--steps", "2", "--set", "group_size=100000000", "--out", "d"],
    ["train", "--steps", "2", "--set", "prompts_per_step=1000000000", "--out", "d"],
    ["eval", "--eval-k", "100000000", "--eval-problems", "1", "--out", "d"],
]


def median_seconds(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def refuses(fn) -> None:
    from entropy_rft.config import ConfigError

    try:
        fn()
    except ConfigError:
        return
    raise AssertionError("not refused")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--cli", action="store_true", help="also time each command in a fresh process")
    args = parser.parse_args()

    import torch

    from entropy_rft.config import load_config
    from entropy_rft.train.plan import check_eval_fits, check_fits

    cpu = torch.device("cpu")
    print(f"in-process checks, median of {args.repeats} (countdown-tiny, this machine's memory as the device):")
    for sizes in TRAIN:
        check = partial(check_fits, load_config(None, **sizes), cpu)
        ms = 1e3 * median_seconds(partial(refuses, check), args.repeats)
        print(f"  train {' '.join(f'{k}={v}' for k, v in sizes.items()):<45} {ms:8.2f} ms")
    for sizes in EVAL:
        check = partial(
            check_eval_fits, "countdown-tiny", cpu, batch_size=512, engine="hf", options={"n": "--eval-k"}, **sizes
        )
        ms = 1e3 * median_seconds(partial(refuses, check), args.repeats)
        print(f"  eval  {' '.join(f'{k}={v}' for k, v in sizes.items()):<45} {ms:8.2f} ms")
    if not args.cli:
        return
    print("whole commands (a fresh process each: interpreter start, imports, the refusal):")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    with tempfile.TemporaryDirectory() as work:
        for argv in CLI:
            start = time.perf_counter()
            proc = subprocess.run(
                [sys.executable, "-m", "entropy_rft.commands.cli", *argv],
                cwd=work,
                env=env,
                capture_output=True,
                text=True,
            )
            seconds = time.perf_counter() - start
            print(f"  {' '.join(argv):<85} {seconds:6.2f} s  exit {proc.returncode}")
            assert not os.listdir(work), os.listdir(work)


if __name__ == "__main__":
    main()
