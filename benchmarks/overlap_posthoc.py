"""Post hoc (issue 39): how much the evaluation problems of the two committed studies overlapped training, and what
their records say on the problems that did not overlap. Not pre-registered; the registered results stay as they
were reported, and these figures are disclosed beside them.

    python benchmarks/overlap_posthoc.py --dest benchmarks/study_avgk

Before issue 39 the pool builders told puzzles apart by their ordered numbers, so a reordering of an evaluation
puzzle could be a training problem. Here a puzzle is its identity (sorted numbers and target, Problem.identity).
The pools the studies ran on are read from git at POOL_COMMIT (the last commit with the old pools). For each
evaluation problem, the number of training rows with its identity ("orderings seen"); then, from the committed
records (per-problem correct counts out of 32):
- the Avg@K study (benchmarks/study_avgk/cells.jsonl, countdown5_large): each method's final Avg@32 on the
  overlapping and on the clean problems, and the primary comparison (Clip_B - GRPO, Clip_V - GRPO, paired by seed and
  problem, evidence.paired_test with the analysis's 20,000 replicates and generator seed 31) and Pass@32 on the
  clean subset;
- the issue-24 study (benchmarks/study/cells.jsonl, countdown and countdown5): each method's Avg@32 and Pass@32
  difference from GRPO on the clean subset (4,000 replicates).
Writes overlap_posthoc.json and overlap_posthoc.md to --dest.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # this checkout's entropy_rft, before an installed one

from entropy_rft.commands.evidence import avg_scores, paired_test, pass_at_k_scores
from entropy_rft.tasks.countdown import Problem

POOL_COMMIT = "3fe4bc1"  # the last commit whose shipped pools were told apart by ordered numbers
DATA = "entropy_rft/assets/countdown-tiny/data"
POOLS = {"countdown": DATA, "countdown5": f"{DATA}/countdown5", "countdown5_large": f"{DATA}/countdown5_large"}
N = 32


def git_rows(path: str, commit: str = POOL_COMMIT) -> list[dict]:
    text = subprocess.run(
        ["git", "show", f"{commit}:{path}"], cwd=REPO, check=True, capture_output=True, text=True
    ).stdout
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def orderings_seen(task: str, commit: str = POOL_COMMIT) -> list[int]:
    """For each evaluation problem of the task's old pool, in file order: training rows with its identity."""
    train = Counter(Problem.from_json(r).identity for r in git_rows(f"{POOLS[task]}/train.jsonl", commit))
    return [train[Problem.from_json(r).identity] for r in git_rows(f"{POOLS[task]}/eval.jsonl", commit)]


def pool_summary(task: str, commit: str = POOL_COMMIT) -> dict:
    train = [Problem.from_json(r) for r in git_rows(f"{POOLS[task]}/train.jsonl", commit)]
    evals = [Problem.from_json(r) for r in git_rows(f"{POOLS[task]}/eval.jsonl", commit)]
    seen = orderings_seen(task, commit)
    return {
        "train_rows": len(train),
        "train_distinct": len({p.identity for p in train}),
        "eval_rows": len(evals),
        "eval_distinct": len({p.identity for p in evals}),
        "eval_distinct_in_train": len({p.identity for p, s in zip(evals, seen) if s}),
        "eval_rows_in_train": sum(s > 0 for s in seen),
    }


def grids(cells: list[dict], task: str) -> tuple[dict, list[int]]:
    by = {(c["method"], c["seed"]): np.array(c["final_correct"]) for c in cells if c["task"] == task}
    by.update(
        {
            ("initial policy", s): np.array(c["initial_correct"])
            for c in cells
            if c["task"] == task and c["method"] == "grpo"
            for s in [c["seed"]]
        }
    )
    seeds = sorted(s for m, s in by if m == "grpo")
    methods = sorted({m for m, _ in by})
    return {m: np.array([by[(m, s)] for s in seeds]) for m in methods if all((m, s) in by for s in seeds)}, seeds


def test(x, base, gen, replicates) -> dict:
    est, p = paired_test(x, base, gen, samples=N, replicates=replicates)
    return {**est.to_json(), "p": p}


def avgk_study(cells: list[dict], seen: list[int]) -> dict:
    g, seeds = grids(cells, "countdown5_large")
    clean = np.array([s == 0 for s in seen])
    gen = np.random.default_rng(31)
    avg = {m: avg_scores(v, N) for m, v in g.items()}
    p32 = {m: pass_at_k_scores(v, N, 32) for m, v in g.items()}
    out = {
        "seeds": seeds,
        "problems": len(seen),
        "clean": int(clean.sum()),
        "overlapping": int((~clean).sum()),
        "avg@32": {
            m: {"overlapping": float(a[:, ~clean].mean()), "clean": float(a[:, clean].mean())} for m, a in avg.items()
        },
        "grpo_avg@32_by_orderings_seen": {},
    }
    seen_arr = np.array(seen)
    for k in sorted(set(seen)):
        cols = seen_arr == k
        out["grpo_avg@32_by_orderings_seen"][str(k)] = {
            "problems": int(cols.sum()),
            "avg@32": float(avg["grpo"][:, cols].mean()),
        }
    out["clean_primary"] = {m: test(avg[m][:, clean], avg["grpo"][:, clean], gen, 20_000) for m in ("clip_b", "clip_v")}
    out["clean_pass@32"] = {m: test(p32[m][:, clean], p32["grpo"][:, clean], gen, 4_000) for m in ("clip_b", "clip_v")}
    out["clean_pass@32_absolute"] = {m: float(p32[m][:, clean].mean()) for m in p32}
    return out


def issue24_study(cells: list[dict], seen: dict[str, list[int]]) -> dict:
    out = {}
    gen = np.random.default_rng(31)
    for task in ("countdown", "countdown5"):
        g, seeds = grids(cells, task)
        clean = np.array([s == 0 for s in seen[task]])
        res = {"seeds": seeds, "problems": len(clean), "clean": int(clean.sum()), "methods": {}}
        for m in g:
            if m == "grpo":
                continue
            res["methods"][m] = {
                "avg@32": test(avg_scores(g[m], N)[:, clean], avg_scores(g["grpo"], N)[:, clean], gen, 4_000),
                "pass@32": test(
                    pass_at_k_scores(g[m], N, 32)[:, clean], pass_at_k_scores(g["grpo"], N, 32)[:, clean], gen, 4_000
                ),
            }
        out[task] = res
    return out


def _ci(e: dict) -> str:
    return f"{100 * e['value']:+.1f} [{100 * e['low']:+.1f}, {100 * e['high']:+.1f}]"


def markdown(r: dict) -> str:
    lines = [
        "# Post hoc: evaluation problems that overlapped training (issue 39)",
        "",
        (
            f"Not pre-registered. Pools as shipped at commit {r['pool_commit']}; a puzzle is its sorted numbers and "
            "target. Made by `python benchmarks/overlap_posthoc.py`."
        ),
        "",
        (
            "| pool | training rows / distinct puzzles | evaluation rows / distinct | distinct evaluation puzzles also "
            "in training | evaluation rows also in training |"
        ),
        "|---|---|---|---|---|",
    ]
    for task, s in r["pools"].items():
        lines.append(
            f"| {task} | {s['train_rows']:,} / {s['train_distinct']:,} | {s['eval_rows']:,} / "
            f"{s['eval_distinct']:,} | {s['eval_distinct_in_train']} | {s['eval_rows_in_train']} |"
        )
    a = r["avgk"]
    lines += [
        "",
        (
            f"## The Avg@K study (countdown5_large; {a['overlapping']} of {a['problems']} evaluation problems "
            f"overlap training, {a['clean']} do not)"
        ),
        "",
        "| method | final Avg@32, overlapping | final Avg@32, clean | Pass@32, clean |",
        "|---|---|---|---|",
    ]
    for m, v in a["avg@32"].items():
        lines.append(
            f"| {m} | {100 * v['overlapping']:.1f} | {100 * v['clean']:.1f} | "
            f"{100 * a['clean_pass@32_absolute'][m]:.1f} |"
        )
    lines += [
        "",
        "GRPO's final Avg@32 by the number of orderings of the problem in training: "
        + ", ".join(
            f"{k}: {100 * v['avg@32']:.1f} ({v['problems']} problems)"
            for k, v in a["grpo_avg@32_by_orderings_seen"].items()
        ),
        "",
        "| on the clean problems, minus GRPO | Avg@32, points [95% CI] | p | Pass@32, points [95% CI] | p |",
        "|---|---|---|---|---|",
    ]
    for m in ("clip_b", "clip_v"):
        e, q = a["clean_primary"][m], a["clean_pass@32"][m]
        lines.append(f"| {m} | {_ci(e)} | {e['p']:.3f} | {_ci(q)} | {q['p']:.3f} |")
    for task, res in r["issue24"].items():
        lines += [
            "",
            f"## The issue-24 study, {task}: {res['clean']} of {res['problems']} evaluation problems clean",
            "",
            "| method minus GRPO, clean problems | Avg@32, points [95% CI] | Pass@32, points [95% CI] |",
            "|---|---|---|",
        ]
        for m, v in res["methods"].items():
            lines.append(f"| {m} | {_ci(v['avg@32'])} | {_ci(v['pass@32'])} |")
    lines += [
        "",
        (
            "Intervals: 95%, two-way bootstrap over seeds and problems (entropy_rft/commands/evidence.py). The "
            "three-number countdown policy's supervised warm-up also saw every three-number evaluation puzzle "
            "in some ordering (toy.py, departure 2); the five-number pools' evaluation puzzles were never in "
            "the warm-up."
        ),
        "",
    ]
    return "\n".join(lines)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--commit", default=POOL_COMMIT)
    p.add_argument("--dest", default=str(REPO / "benchmarks" / "study_avgk"))
    args = p.parse_args(argv)
    seen = {task: orderings_seen(task, args.commit) for task in POOLS}
    avgk_cells = [json.loads(x) for x in (REPO / "benchmarks/study_avgk/cells.jsonl").read_text().splitlines() if x]
    study_cells = [json.loads(x) for x in (REPO / "benchmarks/study/cells.jsonl").read_text().splitlines() if x]
    result = {
        "pool_commit": args.commit,
        "pools": {t: pool_summary(t, args.commit) for t in POOLS},
        "orderings_seen": seen,
        "avgk": avgk_study(avgk_cells, seen["countdown5_large"]),
        "issue24": issue24_study(study_cells, seen),
    }
    dest = Path(args.dest)
    (dest / "overlap_posthoc.json").write_text(json.dumps(result, indent=1) + "\n")
    md = markdown(result)
    (dest / "overlap_posthoc.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
