"""How many distinct five-number countdown puzzles pass the training filter under the shipped policy (issue 39,
docs/prereg_avgk.md Amendment 2): the capacity of the countdown5_large pool.

Draws the candidate stream toy.build_pool draws (random.Random(seed * 1000 + 33), five numbers), counts its distinct
puzzles (by identity: sorted numbers and target) as the draws grow, and orders them by when the stream first gives
them. For each bin of 10,000 in that order, a random sample of puzzles is scored as build_pool scores a candidate
(16 samples at temperature 1.0, 16 new tokens, one thread) and the fraction inside the filter (1/16 < pass rate <
15/16) is scaled to the bin: the sum estimates how many distinct puzzles of the stream can ever pass the filter, with
a 95% interval from the bins' binomial errors.

    python benchmarks/pool_capacity.py [--draws 6000000] [--per-bin 400] [--out benchmarks/results/pool_capacity.json]
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # this checkout's entropy_rft, before an installed one

import torch

from entropy_rft.evaluate import filter_by_pass_rate, sample_correctness
from entropy_rft.rollout import HFEngine
from entropy_rft.tasks.countdown import CountdownTask, random_problem
from entropy_rft.toy import PoolConfig
from entropy_rft.train.policy import load_policy

BIN = 10_000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--draws", type=int, default=6_000_000)
    ap.add_argument("--per-bin", type=int, default=400)
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "pool_capacity.json"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    cfg = PoolConfig()
    rng, first = random.Random(cfg.seed * 1000 + 33), {}
    growth = {}
    for i in range(1, args.draws + 1):
        p = random_problem(rng, n_numbers=cfg.numbers)
        first.setdefault(p.identity, p)
        if i in (100_000, 250_000, 500_000, 1_000_000, 2_000_000, 4_000_000) or i == args.draws:
            growth[i] = len(first)
            print(f"{i:>9,} draws: {len(first):,} distinct puzzles", flush=True)
    order = list(first.values())
    model, tok = load_policy("countdown-tiny", torch.device("cpu"))
    engine, task = HFEngine(model, tok), CountdownTask(name="countdown5_large")
    bins, total, var = [], 0.0, 0.0
    for lo in range(0, len(order), BIN):
        part = order[lo : lo + BIN]
        sample = random.Random(lo).sample(part, min(args.per_bin, len(part)))
        t0 = time.time()
        got, _ = sample_correctness(
            engine, task, sample, n=cfg.filter_samples, temperature=cfg.filter_temperature,
            max_new_tokens=cfg.max_new_tokens, seed=7 + lo,
        )  # fmt: skip
        frac = len(filter_by_pass_rate(sample, [sum(c) / cfg.filter_samples for c in got])) / len(sample)
        total += frac * len(part)
        var += len(part) ** 2 * frac * (1 - frac) / len(sample)
        bins.append({"first_found": [lo, lo + len(part)], "sampled": len(sample), "pass_filter_fraction": frac})
        print(f"found {lo:>6,}-{lo + len(part):>6,}: in the filter {frac:.3f} of {len(sample)} "
              f"(cumulative estimate {total:,.0f}; {time.time() - t0:.0f} s)", flush=True)  # fmt: skip
    half = 1.96 * math.sqrt(var)
    print(f"distinct puzzles: {len(order):,} after {args.draws:,} draws; passing the filter: about {total:,.0f} "
          f"[{total - half:,.0f}, {total + half:,.0f}]")  # fmt: skip
    result = {
        "stream_seed": cfg.seed * 1000 + 33,
        "draws": args.draws,
        "distinct_by_draws": growth,
        "bins": bins,
        "passing_estimate": total,
        "passing_interval_95": [total - half, total + half],
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
    }
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
