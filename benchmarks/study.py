"""The study of issue 24: GRPO, Clip_B, Clip_V, the mu controller, EntroPIC and the adaptive entropy bonus on the
demo's task (countdown, 150 steps) and the harder one (countdown5, 450 steps), 5 seeds each, from the shipped policy;
and the pre-registered Avg@K study of issue 31 (--study avgk: GRPO, Clip_B, Clip_V on countdown5_large, 1,500 steps,
evaluated every 300 steps on 1,000 problems; docs/prereg_avgk.md, analysed by benchmarks/avgk_analysis.py).

    python benchmarks/study.py measure                        # one step's and one evaluation's time on each task
    python benchmarks/study.py run --out runs/study --jobs 2   # every cell; rerun to resume
    python benchmarks/study.py summarise --out runs/study                   # tables, JSON, figures in OUT/summary
    python benchmarks/study.py summarise --out runs/study --dest benchmarks/study   # the committed results
    python benchmarks/study.py run --study avgk --out runs/study_avgk --jobs 2      # issue 31's 15 cells

summarise uses only the cells of the study's own settings (each task's steps, or --steps: a trial's cells have other
settings keys and never mix in) and writes the committed benchmarks/study only when --dest names it.

A cell is (task, method, seed), keyed by its settings (config.settings_key, as compare's cells):
cells/<task>/<method>/seed<s>-<key>/. A finished cell holds cell.json (per-problem correct counts of the initial
and final policy at n = 32 samples, and of every evaluation in eval_correct; the entropy and control curves, times);
a cell killed part-way resumes from its newest checkpoint (save_every 50, exact: see trainer.py and checkpoint.py;
train's resume="auto"), and one that never checkpointed starts again. Changed settings give another key, so they never
reuse a cell trained with other settings. Each cell runs in its own process with one thread (OMP_NUM_THREADS=1,
torch.set_num_threads(1)), so per-step times are comparable across --jobs. A cell being run holds its directory's run
lock (rundir.RunLock, naming the process); another runner skips it while that process lives, so a runner may be killed
and restarted with more --jobs at any time (the cells it started finish on their own).

Settings: the demo's (entropy_rft/configs/demo.yaml: 32 prompts x 8 rollouts, lr 5e-5, 16 new tokens, rollout
temperature 1.0, evaluation at 0.7) with evaluation at n = 32 samples per problem on the task's 200 held-out
problems; Clip_B mu 1.5 and Clip_V mu 3.0 / max_frac 0.05 as the demo; the three entropy targets aim at the same
value per task: 0.33 nats on countdown (as configs/entropy_target.yaml, from an initial 0.38) and 0.45 on countdown5
(from an initial 0.52), with their defaults otherwise (EntroPIC: the authors' K_p 1, K_i 0.01, tau 0.95; the bonus:
step 0.005 up to 0.5, as configs/entropy_target.yaml); and EntroPIC once more with the gains K_p 10, K_i 0.5 of the
tabular check in tests/test_control.py (`entropic_k10`), added after seed 0's countdown cells showed the authors'
gains leave alpha near -0.17 after 150 steps.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from statistics import median

REPO = Path(__file__).resolve().parents[1]
TASKS = {  # task name -> (steps, entropy target in nats)
    "countdown": {"steps": 150, "target": 0.33},
    "countdown5": {"steps": 450, "target": 0.45},
    # issue 31: the 8,000-problem pool (1,500 steps x 32 prompts draw each problem about 6 times; docs/prereg_avgk.md
    # Amendment 2), evaluated every 300 steps on its 1,000 held-out problems; the target only matters to the target
    # methods, not run there
    "countdown5_large": {"steps": 1500, "target": 0.45, "eval_every": 300},
}
METHODS = {  # study name -> TrainConfig overrides; "TARGET" is replaced by the task's target
    "grpo": {"method": "grpo"},
    "clip_b": {"method": "clip_b", "mu": 1.5},
    "clip_v": {"method": "clip_v", "mu": 3.0, "max_frac": 0.05},
    "mu_control": {"method": "clip_b", "entropy_target": "TARGET", "entropy_control": "mu"},
    "entropic": {"method": "grpo", "entropy_target": "TARGET", "entropy_control": "pi"},
    # EntroPIC with the gains of tests/test_control.py's tabular check (K_p 10, K_i 0.5), not tuned on countdown: the
    # authors' 1 / 0.01 are set for thousands of LLM steps and move alpha only to about -0.17 in 150 steps here
    "entropic_k10": {
        "method": "grpo",
        "entropy_target": "TARGET",
        "entropy_control": "pi",
        "pi_kp": 10.0,
        "pi_ki": 0.5,
    },
    "bonus": {
        "method": "grpo",
        "entropy_target": "TARGET",
        "entropy_control": "bonus",
        "bonus_delta": 0.005,
        "bonus_max": 0.5,
    },
}
STUDIES = {  # study name -> the tasks and methods its run / measure / summarise default to
    "issue24": {"tasks": ["countdown", "countdown5"], "methods": [m for m in METHODS]},
    "avgk": {"tasks": ["countdown5_large"], "methods": ["grpo", "clip_b", "clip_v"]},  # docs/prereg_avgk.md
}
EVAL_N = 32  # samples per evaluation problem: Pass@8 (unbiased from 32) and Pass@32
SAVE_EVERY = 50


def one_thread() -> None:
    """One BLAS / OpenMP thread in this process (set before torch is imported by the caller)."""
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = "1"


def cell_config(task: str, method: str, seed: int, out: Path | None = None, *, steps: int | None = None, **extra):
    """The TrainConfig of one cell (out: its run directory, when known; extra: further overrides)."""
    sys.path.insert(0, str(REPO))
    from entropy_rft.config import load_demo_config, run_config

    spec = load_demo_config()
    settings = {k: (TASKS[task]["target"] if v == "TARGET" else v) for k, v in METHODS[method].items()}
    return run_config(
        {"common": spec["common"]},
        None,
        **settings,
        task=task,
        steps=steps or TASKS[task]["steps"],
        seed=seed,
        eval_k=EVAL_N,
        save_every=SAVE_EVERY,
        progress=False,
        eval_every=TASKS[task].get("eval_every", 0),
        out=str(out) if out else "unset",
        **extra,
    )


def cell_dir(out: Path, task: str, method: str, seed: int, steps: int | None = None) -> Path:
    from entropy_rft.config import settings_key

    return out / "cells" / task / method / f"seed{seed}-{settings_key(cell_config(task, method, seed, steps=steps))}"


def run_cell(task: str, method: str, seed: int, out: Path, steps: int | None = None, after=None) -> dict | None:
    """Train and evaluate one cell in this process; returns its record (None when another process holds it).
    after(run, cfg) -> dict, when given, runs once training has finished and before the checkpoints are removed (its
    final checkpoint is run/checkpoint-<steps>); what it returns joins the record (benchmarks/solution_sharing.py
    evaluates the final policy on a second evaluation set there)."""
    one_thread()
    import torch

    torch.set_num_threads(1)
    from entropy_rft.logging import read_metrics
    from entropy_rft.run.checkpoint import RunDirError, find_checkpoint
    from entropy_rft.run.rundir import RunLock
    from entropy_rft.train.trainer import train

    run_dir = cell_dir(out, task, method, seed, steps)
    if (run_dir / "cell.json").exists():
        drop_checkpoints(run_dir / "run")  # a stop may have come between the record and the clean-up
        return json.loads((run_dir / "cell.json").read_text())
    lock = RunLock(run_dir)
    try:
        lock.acquire()
    except RunDirError:  # another runner's process has the cell
        return None
    try:
        cfg = cell_config(task, method, seed, run_dir / "run", steps=steps)
        run = run_dir / "run"
        resumed = run.exists() and find_checkpoint(run) is not None
        t0 = time.time()
        summary = train(cfg, resume="auto")  # from the newest checkpoint, else from the start
        wall = time.time() - t0
        evals = {int(k): v for k, v in summary["evals"].items()}
        rows = read_metrics(run)
        record = {
            "task": task,
            "method": method,
            "seed": seed,
            "key": run_dir.name.split("-")[-1],
            "settings": cfg.to_dict(),
            "resumed": resumed,
            "wall_seconds_this_process": wall,
            "eval_n": EVAL_N,
            "steps": cfg.steps,
            "initial_correct": [round(r * EVAL_N) for r in evals[0]["pass_rates"]],
            "final_correct": [round(r * EVAL_N) for r in evals[cfg.steps]["pass_rates"]],
            "eval_correct": {str(s): [round(r * EVAL_N) for r in e["pass_rates"]] for s, e in sorted(evals.items())},
            "step_seconds": [round(m["seconds"], 4) for m in rows],
            "entropy": [round(m["entropy"], 5) for m in rows],
            "clip_frac": [round(m["clip_frac"], 5) for m in rows],
            "control": [control_value(m) for m in rows],
            "torch_threads": torch.get_num_threads(),
            "code": os.environ.get("STUDY_CODE", "worktree"),
        }
        if after is not None:
            record.update(after(run, cfg))
        tmp = run_dir / "cell.json.tmp"
        tmp.write_text(json.dumps(record) + "\n")
        os.replace(tmp, run_dir / "cell.json")
        drop_checkpoints(run)  # after the record: a stop before it resumes from the final checkpoint
        return record
    finally:
        lock.release()


def drop_checkpoints(run: Path) -> None:
    """A finished cell keeps its record and drops its weights (about 10 MB a checkpoint)."""
    from entropy_rft.run.checkpoint import checkpoint_dirs

    for ckpt in checkpoint_dirs(run, complete=False):
        shutil.rmtree(ckpt, ignore_errors=True)


def control_value(metrics: dict) -> float | None:
    """What the step's entropy control set: the mu controller's mu (None: no clipping), EntroPIC's alpha, or the
    adaptive bonus's coefficient (0 for methods without a target)."""
    if "filter/mu" in metrics:
        return None if metrics["filter/mu"] is None else round(metrics["filter/mu"], 4)
    if "entropic/alpha" in metrics:
        return round(metrics["entropic/alpha"], 5)
    return round(metrics.get("entropy_coef", 0.0), 5)


def all_cells(tasks, methods, seeds) -> list[tuple[str, str, int]]:
    """Seed-major order: every method of seed 0 (both tasks) before seed 1, so paired comparisons fill in early."""
    return [(t, m, s) for s in seeds for t in tasks for m in methods]


def cmd_run(args) -> None:
    cells = all_cells(args.tasks.split(","), args.methods.split(","), range(args.seeds))
    run_cells(Path(args.out), cells, args.jobs, args.steps)


def run_cells(
    out: Path, cells: list[tuple[str, str, int]], jobs: int, steps: int | None = None, script=None, where=None
) -> None:
    """Each cell not yet done in its own process (`SCRIPT cell --out OUT --task T --method M --seed S`; script:
    this file unless given), at most `jobs` at a time, one thread each; their output goes to OUT/cells.log. A cell is
    done when where(out, task, method, seed, steps)/cell.json exists (where: this file's cell_dir unless given)."""
    script = Path(script or __file__).resolve()
    cell_dir_of = where or cell_dir
    out.mkdir(parents=True, exist_ok=True)
    pending = [c for c in cells if not (cell_dir_of(out, *c, steps) / "cell.json").exists()]
    print(
        f"{len(cells) - len(pending)} of {len(cells)} cells done; running {len(pending)} with --jobs {jobs}",
        flush=True,
    )
    running: list[tuple[subprocess.Popen, tuple, float]] = []
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
    }
    queue = list(pending)
    while queue or running:
        while queue and len(running) < jobs:
            task, method, seed = queue.pop(0)
            cmd = [sys.executable, str(script), "cell", "--out", str(out), "--task", task, "--method", method]
            cmd += ["--seed", str(seed)] + (["--steps", str(steps)] if steps else [])
            log = open(out / "cells.log", "a")
            running.append(
                (
                    subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT),
                    (task, method, seed),
                    time.time(),
                )
            )
            print(
                f"{time.strftime('%H:%M:%S')} start {task} {method} seed {seed} (pid {running[-1][0].pid})", flush=True
            )
        time.sleep(2)
        for proc, cell, t0 in list(running):
            if proc.poll() is not None:
                running.remove((proc, cell, t0))
                done = (cell_dir_of(out, *cell, steps) / "cell.json").exists()
                state = (
                    "done"
                    if done
                    else (
                        "held by another process"
                        if proc.returncode == 3
                        else f"FAILED (exit {proc.returncode}; see {out / 'cells.log'})"
                    )
                )
                print(
                    f"{time.strftime('%H:%M:%S')} {state}: {' '.join(map(str, cell))} in {time.time() - t0:.0f} s",
                    flush=True,
                )
    print("all cells finished", flush=True)


def cmd_cell(args) -> None:
    record = run_cell(args.task, args.method, args.seed, Path(args.out), args.steps)
    if record is None:
        raise SystemExit(3)


def cmd_measure(args) -> None:
    """One training step's time (median over --measure-steps steps after one warm-up step) per method and one
    evaluation's (n = 32 on the task's eval problems: 200, or 1,000 on countdown5_large) on each task, with one
    thread; and the study's estimated duration (steps x step time + evaluations x evaluation time per cell)."""
    one_thread()
    import torch

    torch.set_num_threads(1)
    from entropy_rft.evaluate import run_eval
    from entropy_rft.rollout import HFEngine
    from entropy_rft.tasks import TASKS as TASK_REGISTRY
    from entropy_rft.train.policy import load_policy
    from entropy_rft.train.problems import task_problems
    from entropy_rft.train.trainer import train

    report = {}
    for task in args.tasks.split(","):
        per_method = {}
        for method in args.methods.split(","):
            cfg = cell_config(
                task, method, 0, Path(args.scratch) / task / method, steps=1 + args.measure_steps, eval_problems=1
            )
            shutil.rmtree(cfg.out, ignore_errors=True)
            rows = train(cfg)["history"]
            per_method[method] = float(median(m["seconds"] for m in rows[1:]))
        cfg = cell_config(task, "grpo", 0)
        model, tok = load_policy(cfg.model, torch.device("cpu"))
        engine = HFEngine(model, tok)
        problems = task_problems(cfg, TASK_REGISTRY.get(task), "eval")
        t0 = time.time()
        run_eval(engine, TASK_REGISTRY.get(task), problems, cfg, seed=10**6)
        eval_s = time.time() - t0
        steps, every = TASKS[task]["steps"], TASKS[task].get("eval_every", 0)
        evals = 2 + ((steps - 1) // every if every else 0)  # before training, every `every` steps, and the last
        cell_s = {m: steps * s + evals * eval_s for m, s in per_method.items()}
        report[task] = {
            "step_seconds": per_method,
            "eval_seconds": eval_s,
            "steps": steps,
            "evals": evals,
            "cell_seconds": cell_s,
            "cells_seconds_per_seed": sum(cell_s.values()),
        }
        print(json.dumps({task: report[task]}, indent=1), flush=True)
    total = args.seeds * sum(r["cells_seconds_per_seed"] for r in report.values())
    print(
        f"estimated study: {total / 3600:.1f} h of one core for {args.seeds} seeds "
        f"({total / 3600 / 2:.1f} h with --jobs 2 on two free cores)"
    )


def names(known: dict, what: str):
    """An option type: comma-separated names, each a key of `known` (an unknown one is one line, exit 2)."""

    def parse(text: str) -> str:
        items = [x.strip() for x in text.split(",") if x.strip()]
        unknown = [x for x in items if x not in known]
        if not items or unknown:
            raise argparse.ArgumentTypeError(f"unknown {what} {(unknown or [text])[0]!r}; known: {', '.join(known)}")
        return ",".join(items)

    return parse


def main(argv=None) -> None:
    sys.path.insert(0, str(REPO))
    from entropy_rft.commands.cli import Parser  # argparse with one-line errors (exit 2)
    from entropy_rft.commands.options import whole as at_least  # a whole number >= its bound

    p = Parser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=Parser)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--study",
        choices=list(STUDIES),
        default="issue24",
        help="which study's tasks and methods --tasks / --methods default to",
    )
    common.add_argument(
        "--tasks", type=names(TASKS, "task"), default=None, help="comma-separated tasks (default: the study's)"
    )
    common.add_argument(
        "--methods", type=names(METHODS, "method"), default=None, help="comma-separated methods (default: the study's)"
    )
    common.add_argument("--seeds", type=at_least(1), default=5)
    r = sub.add_parser("run", parents=[common], help="train and evaluate every cell not yet done")
    r.add_argument("--out", required=True)
    r.add_argument("--jobs", type=at_least(1), default=1)
    r.add_argument("--steps", type=at_least(1), default=None, help="override every task's steps (a trial run)")
    r.set_defaults(fn=cmd_run)
    c = sub.add_parser("cell", help="one cell in this process (what run starts)")
    c.add_argument("--out", required=True)
    c.add_argument("--task", type=names(TASKS, "task"), required=True)
    c.add_argument("--method", type=names(METHODS, "method"), required=True)
    c.add_argument("--seed", type=at_least(0), required=True)
    c.add_argument("--steps", type=at_least(1), default=None)
    c.set_defaults(fn=cmd_cell)
    m = sub.add_parser("measure", parents=[common], help="one step's and one evaluation's time on each task")
    m.add_argument("--scratch", default="/tmp/study-measure")
    m.add_argument("--measure-steps", type=int, default=3, help="timed steps per method (after one warm-up step)")
    m.set_defaults(fn=cmd_measure)
    s = sub.add_parser("summarise", parents=[common], help="tables, raw JSON and figures from the finished cells")
    s.add_argument("--out", required=True)
    s.add_argument(
        "--steps",
        type=at_least(1),
        default=None,
        help="the steps of the study summarised (default: "
        "each task's own, 150 and 450); cells of other settings are left out",
    )
    s.add_argument(
        "--dest",
        default=None,
        help="directory for the summary (default: OUT/summary; the committed "
        "results are benchmarks/study, written only when named here)",
    )
    s.set_defaults(fn=cmd_summarise)
    args = p.parse_args(argv)
    if hasattr(args, "study"):  # run, measure, summarise (not cell)
        args.tasks = args.tasks or ",".join(STUDIES[args.study]["tasks"])
        args.methods = args.methods or ",".join(STUDIES[args.study]["methods"])
    args.fn(args)


def cmd_summarise(args) -> None:
    from study_summary import summarise  # benchmarks/study_summary.py

    out = Path(args.out)
    if not (out / "cells").is_dir():
        fail(
            f"summarise: --out {out} holds no study cells (cells/<task>/<method>/seed*/); pass the --out given to "
            "`study.py run`"
        )
    dest = Path(args.dest) if args.dest else out / "summary"
    try:
        summarise(out, dest, args.tasks.split(","), args.methods.split(","), args.seeds, steps=args.steps)
    except ValueError as err:
        fail(f"summarise: {err}")


def fail(message: str) -> None:
    """A user error: one line, exit code 2 (as argparse's own)."""
    print(f"study.py: error: {message}", file=sys.stderr)
    raise SystemExit(2)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.path.insert(0, str(REPO))  # this checkout's entropy_rft, before an installed one (measure imports it here)
    main()
