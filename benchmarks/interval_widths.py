"""How much wider evidence.py's two-way (pigeonhole) intervals are than intervals over seeds alone, on the committed
issue-24 study (benchmarks/study/cells.jsonl): for every paired difference of its tables (each method - GRPO, Avg@K,
Pass@8, Pass@32, on countdown and countdown5), the width of the two-way interval (seeds and problems resampled) and
of the seed-only one (each seed's mean over the same problems, seeds resampled), with the same replicates and level.

    python benchmarks/interval_widths.py [--cells benchmarks/study/cells.jsonl]

Prints one row per comparison and the median, lowest and highest of 1 - seed-only width / two-way width (how much
narrower the seed-only interval is). The figure is quoted in evidence.py's departure 1 and the README.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # this checkout's entropy_rft, before an installed one

from entropy_rft.commands.evidence import avg_scores, paired_difference, pass_at_k_scores, seed_estimate


def narrower(cells: list[dict], *, seed: int = 0) -> list[dict]:
    """One row per (task, method, metric): the two widths and 1 - seed-only / two-way."""
    gen = np.random.default_rng(seed)
    rows = []
    for task in sorted({c["task"] for c in cells}):
        by = {(c["method"], c["seed"]): c for c in cells if c["task"] == task}
        methods = sorted({m for m, _ in by})
        seeds = sorted(s for s in {s for _, s in by} if all((m, s) in by for m in methods))
        n = by[("grpo", seeds[0])]["eval_n"]
        metrics = {
            "avg": lambda c, n=n: avg_scores(c, n),
            "pass@8": lambda c, n=n: pass_at_k_scores(c, n, 8),
            "pass@32": lambda c, n=n: pass_at_k_scores(c, n, 32),
        }
        for method in methods:
            if method == "grpo":
                continue
            for name, score in metrics.items():
                x, base = (score(np.array([by[(m, s)]["final_correct"] for s in seeds])) for m in (method, "grpo"))
                two_way = paired_difference(x, base, gen)
                seed_only = seed_estimate((x - base).mean(axis=1), gen)
                w2, w1 = two_way.high - two_way.low, seed_only.high - seed_only.low
                rows.append(
                    {
                        "task": task,
                        "method": method,
                        "metric": name,
                        "two_way_width": w2,
                        "seed_only_width": w1,
                        "narrower": 1 - w1 / w2,
                    }
                )
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--cells", default=str(REPO / "benchmarks" / "study" / "cells.jsonl"))
    args = p.parse_args()
    cells = [json.loads(line) for line in Path(args.cells).read_text().splitlines() if line.strip()]
    rows = narrower(cells)
    for r in rows:
        print(
            f"{r['task']:<11} {r['method']:<13} {r['metric']:<8} two-way {100 * r['two_way_width']:6.2f}  "
            f"seed-only {100 * r['seed_only_width']:6.2f}  narrower {100 * r['narrower']:5.1f}%"
        )
    for task in sorted({r["task"] for r in rows}) + ["all"]:
        f = np.array([r["narrower"] for r in rows if task in ("all", r["task"])])
        print(
            f"{task}: seed-only intervals narrower by median {100 * np.median(f):.0f}% "
            f"(range {100 * f.min():.0f}% to {100 * f.max():.0f}%, {len(f)} comparisons)"
        )


if __name__ == "__main__":
    main()
