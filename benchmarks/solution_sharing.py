"""Issue 52 item 2: the Avg@K study's answer tested against solution sharing (docs/prereg_solution_sharing.md).

The audit of the clean re-run (benchmarks/study_avgk_clean) found that for 669 of its 1,000 evaluation puzzles the
numbers the reference solution uses, with the same target, sit inside a training puzzle (381 match a training
solution verbatim), and that the whole Avg@32 deficit of Clip_B and Clip_V is on those 669. This script builds a
second evaluation set whose reference solutions appear in no training puzzle, re-runs GRPO and Clip_V for seeds 0-9
(deterministic: each re-run must reproduce its committed cell's training record), evaluates each final policy on the
old and the new set, and analyses as registered.

    python benchmarks/solution_sharing.py build-eval     # benchmarks/solution_sharing/data/eval_unshared.jsonl
    python benchmarks/solution_sharing.py run --jobs 2   # runs/solution_sharing: the 20 cells, resumable
    python benchmarks/solution_sharing.py analyse        # benchmarks/solution_sharing/{cells.jsonl,sharing.json,.md}

A puzzle's reference solution is the expression its generator drew (`solution`, e.g. "9+7-(5-(5+2))=18"); the
numbers it uses are the numbers written on its left-hand side, as a multiset. It is shared with training when some
training puzzle has the same target and holds those numbers (as a sub-multiset of its five): a policy that learned
to reach that target from those numbers on the training puzzle can reuse the expression verbatim. `shares_solution`.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # this checkout's entropy_rft, before an installed one
sys.path.insert(0, str(REPO / "benchmarks"))

POOL = REPO / "entropy_rft" / "assets" / "countdown-tiny" / "data" / "countdown5_large"
HERE = REPO / "benchmarks" / "solution_sharing"
NEW_EVAL = HERE / "data" / "eval_unshared.jsonl"
COMMITTED = REPO / "benchmarks" / "study_avgk_clean" / "cells"
TASK = "countdown5_large"
METHODS = ("grpo", "clip_v")
SEEDS = range(10)
N_EVAL = 1000
STREAM_SEED = 34  # the new set's candidate stream: random.Random(seed * 1000 + 34); the old set used + 31
STRATA_SEED = 35  # the strata's sampling seed (seed * 1000 + 35; the old set's + 32)
EVAL_N = 32  # samples per problem, as the study


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def solution_numbers(solution: str) -> Counter:
    """The numbers a reference solution writes on its left-hand side, as a multiset."""
    return Counter(int(x) for x in re.findall(r"\d+", solution.split("=")[0]))


class TrainingSolutions:
    """The training puzzles' numbers by target, to ask whether a reference solution could be reused."""

    def __init__(self, train: list[dict]):
        self.by_target: dict[int, list[Counter]] = defaultdict(list)
        for row in train:
            self.by_target[row["target"]].append(Counter(row["numbers"]))
        self.verbatim = {row["solution"] for row in train}

    def shares_solution(self, row: dict) -> bool:
        """Some training puzzle has this target and holds every number the reference solution uses."""
        used = solution_numbers(row["solution"])
        return any(all(c[k] >= v for k, v in used.items()) for c in self.by_target[row["target"]])


def sharing_counts(train: list[dict], evaluation: list[dict]) -> dict[str, int]:
    index = TrainingSolutions(train)
    return {
        "problems": len(evaluation),
        "solution_inside_a_training_puzzle": sum(index.shares_solution(r) for r in evaluation),
        "solution_verbatim_in_training": sum(r["solution"] in index.verbatim for r in evaluation),
    }


def build_eval(seed: int = 0, chunk: int = 500) -> dict:
    """N_EVAL puzzles from the generator of the old evaluation set (random_problem, five numbers), drawn from a new
    stream, none whose identity is a training or an old evaluation puzzle's and none whose reference solution is
    shared with training, stratified to the old set's initial difficulty: candidates are scored chunk by chunk as the
    old set's strata were (the shipped policy, 64 samples at 0.7, each chunk with its own seed) and each stratum takes
    its first candidates in stream order up to the old set's count (438 unsolved, 425 hard, 137 easier). Unsolved
    candidates are far more common among unshared solutions (73% of the first 1,000 against 44% of the old set): an
    unstratified set would compare the methods on harder problems, not only on unshared ones."""
    import torch

    from entropy_rft.evaluate import sample_correctness
    from entropy_rft.rollout import HFEngine
    from entropy_rft.tasks.countdown import CountdownTask, Problem, random_problem
    from entropy_rft.toy import STRATA, PoolConfig, stratum
    from entropy_rft.train.policy import load_policy

    cfg = PoolConfig(seed=seed)
    t0 = time.time()
    train, old = read_jsonl(POOL / "train.jsonl"), read_jsonl(POOL / "eval.jsonl")
    quota = Counter(r["stratum"] for r in old)
    index = TrainingSolutions(train)
    seen = {Problem.from_json(r).identity for r in train + old}
    rng = random.Random(seed * 1000 + STREAM_SEED)
    torch.set_num_threads(1)
    model, tok = load_policy("countdown-tiny", torch.device("cpu"))
    engine, task = HFEngine(model, tok), CountdownTask(name=TASK)
    kept: dict[str, list] = {s: [] for s in STRATA}  # (stream position, problem, correct count)
    draws = repeats = shared = scored = chunks = 0
    while any(len(kept[s]) < quota[s] for s in STRATA):
        candidates = []
        while len(candidates) < chunk:
            p = random_problem(rng, n_numbers=cfg.numbers)
            draws += 1
            if p.identity in seen:
                repeats += 1
                continue
            seen.add(p.identity)
            if index.shares_solution(p.to_json()):
                shared += 1
                continue
            candidates.append(p)
        correct, _ = sample_correctness(
            engine,
            task,
            candidates,
            n=cfg.strata_samples,
            temperature=cfg.strata_temperature,
            max_new_tokens=cfg.max_new_tokens,
            seed=seed * 10**6 + STRATA_SEED * 1000 + chunks,
        )
        for p, c in zip(candidates, correct):
            s = stratum(sum(c), cfg.strata_samples)
            if len(kept[s]) < quota[s]:
                kept[s].append((scored, p, sum(c)))
            scored += 1
        chunks += 1
        print(f"chunk {chunks}: " + ", ".join(f"{s} {len(kept[s])}/{quota[s]}" for s in STRATA), flush=True)
    chosen = sorted(x for s in STRATA for x in kept[s])  # stream order
    NEW_EVAL.parent.mkdir(parents=True, exist_ok=True)
    with open(NEW_EVAL, "w") as f:
        for _, p, c in chosen:
            f.write(json.dumps({**p.to_json(), "initial_correct": c, "stratum": stratum(c, cfg.strata_samples)}) + "\n")
    rows = read_jsonl(NEW_EVAL)
    info = {
        "command": "python benchmarks/solution_sharing.py build-eval",
        "generator": "entropy_rft.tasks.countdown.random_problem, five numbers (the old evaluation set's)",
        "stream": f"random.Random({seed * 1000 + STREAM_SEED}) (the old set: {seed * 1000 + 31})",
        "draws": draws,
        "dropped_seen": repeats,
        "dropped_shared_solution": shared,
        "candidates_scored": scored,
        "candidate_strata": "counted in chunk order; the first of each stratum kept up to the old set's count",
        "strata": {s: sum(r["stratum"] == s for r in rows) for s in STRATA},
        "old_strata": {s: quota[s] for s in STRATA},
        "initial_avg": sum(r["initial_correct"] for r in rows) / (len(rows) * cfg.strata_samples),
        "old_initial_avg": sum(r["initial_correct"] for r in old) / (len(old) * cfg.strata_samples),
        "new_set": sharing_counts(train, rows),
        "old_set": sharing_counts(train, old),
        "identities_in_train_or_old_eval": len(
            {Problem.from_json(r).identity for r in rows} & {Problem.from_json(r).identity for r in train + old}
        ),
        "seconds": round(time.time() - t0, 1),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
    }
    (NEW_EVAL.parent / "build.json").write_text(json.dumps(info, indent=2) + "\n")
    return info


def evaluate_new_set(run: Path, cfg) -> dict:
    """The final policy (run/checkpoint-<steps>) and the shipped initial policy on the new set: per-problem correct
    counts out of EVAL_N, sampled as the cell's own evaluations are (run_eval with the cell's settings and its
    evaluation seed, cfg.seed + 10**6)."""
    import torch

    from entropy_rft.evaluate import run_eval
    from entropy_rft.rollout import HFEngine
    from entropy_rft.run.checkpoint import checkpoint_dir
    from entropy_rft.tasks import TASKS as TASK_REGISTRY
    from entropy_rft.train.policy import load_policy
    from entropy_rft.train.problems import load_problems

    task = TASK_REGISTRY.get(TASK)
    problems = load_problems(NEW_EVAL, task)
    out = {}
    for name, model in (
        ("new_final_correct", str(checkpoint_dir(run, cfg.steps))),
        ("new_initial_correct", cfg.model),
    ):
        policy, tok = load_policy(model, torch.device("cpu"))
        result = run_eval(HFEngine(policy, tok), task, problems, cfg, seed=cfg.seed + 10**6).to_json()
        out[name] = [round(r * EVAL_N) for r in result["pass_rates"]]
    return out


def cmd_cell(args) -> None:
    import study  # benchmarks/study.py

    record = study.run_cell(args.task, args.method, args.seed, Path(args.out), args.steps, after=evaluate_new_set)
    if record is None:
        raise SystemExit(3)


def cmd_run(args) -> None:
    import study

    cells = [(TASK, m, s) for s in SEEDS for m in METHODS]
    study.run_cells(Path(args.out), cells, args.jobs, script=Path(__file__))


COMPARED = (
    "entropy",
    "clip_frac",
    "control",
    "eval_correct",
    "initial_correct",
    "final_correct",
)  # the training record


def reproduction(record: dict) -> dict:
    """The re-run's training record against its committed cell (same method, seed and settings key): each field of
    COMPARED equal or not, and the first step where a per-step curve differs."""
    committed = COMMITTED / TASK / record["method"] / f"seed{record['seed']}-{record['key']}" / "cell.json"
    if not committed.exists():
        return {"committed": None, "identical": False, "differs": ["no committed cell with this settings key"]}
    old = json.loads(committed.read_text())
    differs = [f for f in COMPARED if record[f] != old[f]]
    first = {
        f: next((i + 1 for i, (a, b) in enumerate(zip(record[f], old[f])) if a != b), None)
        for f in ("entropy", "clip_frac", "control")
        if f in differs
    }
    return {"committed": str(committed.relative_to(REPO)), "identical": not differs, "differs": differs, "first": first}


def cmd_check(args) -> None:
    """Every finished re-run against its committed cell; exits 1 if any differs."""
    records = [json.loads(p.read_text()) for p in sorted(Path(args.out).glob("cells/*/*/*/cell.json"))]
    bad = 0
    for r in records:
        rep = reproduction(r)
        bad += not rep["identical"]
        print(f"{r['method']:7} seed {r['seed']}: {'identical' if rep['identical'] else 'DIFFERS ' + str(rep)}")
    print(f"{len(records) - bad} of {len(records)} re-runs reproduce their committed training records exactly")
    raise SystemExit(1 if bad else 0)


REPLICATES_PRIMARY, REPLICATES, ANALYSIS_SEED, ALPHA = 20_000, 4_000, 52, 0.05


def difference_of_differences(d_old, d_new, gen, *, replicates: int = REPLICATES) -> dict:
    """mean(d_old) - mean(d_new) for per-(seed, problem) differences on two problem sets sharing the seeds, with a
    95% interval and two-sided p from one bootstrap: seeds resampled jointly, each set's problems independently."""
    import numpy as np

    from entropy_rft.commands.evidence import bootstrap_p

    seeds = d_old.shape[0]
    a = gen.multinomial(seeds, np.full(seeds, 1.0 / seeds), size=replicates)  # (B, S)
    reps = 0.0
    for d, sign in ((d_old, 1.0), (d_new, -1.0)):
        problems = d.shape[1]
        b = gen.multinomial(problems, np.full(problems, 1.0 / problems), size=replicates)  # (B, P)
        reps = reps + sign * ((a @ d) * b).sum(1) / (seeds * problems)
    low, high = np.quantile(reps, [0.025, 0.975])
    return {"value": float(d_old.mean() - d_new.mean()), "low": float(low), "high": float(high), "p": bootstrap_p(reps)}


def analyse(records: list[dict], strata: dict[str, list[str]]) -> dict:
    """The registered figures (docs/prereg_solution_sharing.md) from the re-runs' records: Clip_V - GRPO on the new
    and the old set (final Avg@32 primary on the new set; Pass@8, Pass@32; by stratum), the old-minus-new difference
    of the Avg@32 differences, each method's absolute figures, and the reproduction check of every record."""
    import numpy as np

    from entropy_rft.commands.evidence import avg_scores, estimate, paired_test, pass_at_k_scores

    by = {(r["method"], r["seed"]): r for r in records}
    seeds = sorted(s for s in SEEDS if all((m, s) in by for m in METHODS))
    if len(seeds) < 2:
        raise ValueError(f"need at least 2 seeds with both methods finished, got {seeds}")
    gen = np.random.default_rng(ANALYSIS_SEED)
    sets = {"new": "new_final_correct", "old": "final_correct"}
    counts = {(m, k): np.array([by[(m, s)][f] for s in seeds]) for m in METHODS for k, f in sets.items()}
    metric = {
        "avg@32": lambda c: avg_scores(c, EVAL_N),
        "pass@8": lambda c: pass_at_k_scores(c, EVAL_N, 8),
        "pass@32": lambda c: pass_at_k_scores(c, EVAL_N, 32),
    }

    def test(k, name, cols=slice(None), reps=REPLICATES):
        x, base = (metric[name](counts[(m, k)])[:, cols] for m in ("clip_v", "grpo"))
        est, p = paired_test(x, base, gen, samples=EVAL_N, replicates=reps)
        return {**est.to_json(), "p": p}

    out: dict = {"seeds": seeds, "problems": {k: int(counts[("grpo", k)].shape[1]) for k in sets}}
    out["primary"] = test("new", "avg@32", reps=REPLICATES_PRIMARY)
    out["old_avg@32"] = test("old", "avg@32", reps=REPLICATES_PRIMARY)
    d = {k: avg_scores(counts[("clip_v", k)], EVAL_N) - avg_scores(counts[("grpo", k)], EVAL_N) for k in sets}
    out["old_minus_new"] = difference_of_differences(d["old"], d["new"], gen, replicates=REPLICATES_PRIMARY)
    out["secondary"] = {f"{k} {name}": test(k, name) for k in sets for name in ("pass@8", "pass@32")}
    out["by_stratum"] = {
        k: {
            st: {"problems": int(np.sum(np.array(strata[k]) == st))}
            | {name: test(k, name, np.flatnonzero(np.array(strata[k]) == st)) for name in ("avg@32", "pass@32")}
            for st in ("unsolved", "hard", "easier")
        }
        for k in sets
    }
    out["absolute"] = {
        f"{m} {k}": {name: estimate(f(counts[(m, k)]), gen, samples=EVAL_N).to_json() for name, f in metric.items()}
        for m in METHODS
        for k in sets
    }
    initial = np.array([by[("grpo", s)]["new_initial_correct"] for s in seeds])
    out["absolute"]["initial new"] = {n: estimate(f(initial), gen, samples=EVAL_N).to_json() for n, f in metric.items()}
    out["reproduction"] = {f"{r['method']} {r['seed']}": reproduction(r) for r in records}
    verdict = out["primary"]
    out["verdict"] = (
        "no difference shown on the new set"
        if verdict["p"] >= ALPHA
        else ("Clip_V lowers" if verdict["value"] < 0 else "Clip_V raises") + " Avg@32 on the new set"
    )
    return out


def _pts(e: dict) -> str:
    return f"{100 * e['value']:+.2f} [{100 * e['low']:+.2f}, {100 * e['high']:+.2f}]"


def markdown(r: dict) -> str:
    lines = [
        "# Solution sharing: Clip_V - GRPO on the old and the new evaluation set (issue 52 item 2)",
        "",
        f"Seeds {r['seeds'][0]}-{r['seeds'][-1]} ({len(r['seeds'])}), final policies (step 1,500), 32 samples per "
        f"problem at temperature 0.7; differences in points with 95% two-way bootstrap intervals and two-sided p. "
        f"Registered in docs/prereg_solution_sharing.md.",
        "",
        f"Verdict (primary, new set): **{r['verdict']}**.",
        "",
        "| comparison | new set (no shared solution) | old set (669 of 1,000 shared) |",
        "|---|---|---|",
        f"| Avg@32, Clip_V - GRPO | {_pts(r['primary'])} (p {r['primary']['p']:.4f}) | "
        f"{_pts(r['old_avg@32'])} (p {r['old_avg@32']['p']:.4f}) |",
    ]
    for name in ("pass@8", "pass@32"):
        a, b = r["secondary"][f"new {name}"], r["secondary"][f"old {name}"]
        lines.append(
            f"| {name.capitalize()}, Clip_V - GRPO | {_pts(a)} (p {a['p']:.4f}) | {_pts(b)} (p {b['p']:.4f}) |"
        )
    dd = r["old_minus_new"]
    lines += [
        "",
        f"Old minus new (Avg@32 difference): {_pts(dd)}, p {dd['p']:.4f}.",
        "",
        "| stratum | new: problems | new: Avg@32 | new: Pass@32 | old: problems | old: Avg@32 | old: Pass@32 |",
        "|---|---|---|---|---|---|---|",
    ]
    for st in ("unsolved", "hard", "easier"):
        n, o = r["by_stratum"]["new"][st], r["by_stratum"]["old"][st]
        lines.append(
            f"| {st} | {n['problems']} | {_pts(n['avg@32'])} | {_pts(n['pass@32'])} | {o['problems']} | "
            f"{_pts(o['avg@32'])} | {_pts(o['pass@32'])} |"
        )
    lines += ["", "| policy | set | Avg@32 | Pass@8 | Pass@32 |", "|---|---|---|---|---|"]
    for name, a in r["absolute"].items():
        who, _, where = name.rpartition(" ")
        lines.append(
            f"| {who} | {where} | {100 * a['avg@32']['value']:.1f} | {100 * a['pass@8']['value']:.1f} | "
            f"{100 * a['pass@32']['value']:.1f} |"
        )
    same = sum(v["identical"] for v in r["reproduction"].values())
    lines += ["", f"Reproduction: {same} of {len(r['reproduction'])} re-runs equal their committed training records."]
    return "\n".join(lines) + "\n"


def cmd_analyse(args) -> None:
    cells = Path(args.cells)
    records = (
        [json.loads(p.read_text()) for p in sorted(cells.glob("cells/*/*/*/cell.json"))]
        if cells.is_dir()
        else read_jsonl(cells)
    )
    strata = {
        "new": [r["stratum"] for r in read_jsonl(NEW_EVAL)],
        "old": [r["stratum"] for r in read_jsonl(POOL / "eval.jsonl")],
    }
    result = analyse(records, strata)
    dest = Path(args.dest)
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "cells.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (dest / "sharing.json").write_text(json.dumps(result, indent=1) + "\n")
    (dest / "sharing.md").write_text(markdown(result))
    print(markdown(result))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("build-eval", help="the new evaluation set")
    r = sub.add_parser("run", help="the 20 cells (resumable), --jobs at a time")
    r.add_argument("--out", default="runs/solution_sharing")
    r.add_argument("--jobs", type=int, default=1)
    c = sub.add_parser("cell", help="one cell in this process (what run starts)")
    c.add_argument("--out", required=True)
    c.add_argument("--task", required=True, choices=[TASK])
    c.add_argument("--method", required=True, choices=METHODS)
    c.add_argument("--seed", type=int, required=True)
    c.add_argument("--steps", type=int, default=None)
    k = sub.add_parser("check", help="each finished re-run against its committed cell")
    k.add_argument("--out", default="runs/solution_sharing")
    a = sub.add_parser("analyse", help="the registered analysis")
    a.add_argument("--cells", default="runs/solution_sharing", help="the run directory or a cells.jsonl")
    a.add_argument("--dest", default=str(HERE))
    args = parser.parse_args(argv)
    if args.command == "build-eval":
        print(json.dumps(build_eval(), indent=2))
    else:
        {"run": cmd_run, "cell": cmd_cell, "check": cmd_check, "analyse": cmd_analyse}[args.command](args)


if __name__ == "__main__":
    main()
