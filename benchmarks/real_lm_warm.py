"""Issue 61: the second real-model study, from the paper's starting regime (docs/prereg_real_lm_warm.md).

The first real-model study (benchmarks/real_lm_study.py, docs/prereg_real_lm.md) trained SmolLM2-135M from the base
model, whose training accuracy was 0.3-2.5% over the first 10 steps: below the paper's data filter, with a Clip_B
threshold near S* = 0 that masked 13-17% of negative-advantage tokens. This study starts where GRPO had left that stall
and trains on the problems the start point neither solves nor fails (the paper's filter), with Clip_B's mu calibrated
to a tail clip before any cell.

    python benchmarks/real_lm_warm.py start        # GRPO seed 0, the first study's settings, to START_STEP
    python benchmarks/real_lm_warm.py filter       # 312 x 16 samples under the start point; data/train.jsonl
    python benchmarks/real_lm_warm.py calibrate    # Clip_B from the start point at each mu of MU_GRID
    STUDY_CODE=$(git rev-parse --short HEAD) nice -n 10 python benchmarks/real_lm_warm.py run --jobs 2
    python benchmarks/real_lm_warm.py analyse --cells benchmarks/real_lm_warm

Everything it writes that the study's cells depend on is committed under benchmarks/real_lm_warm/ (start.json,
filter.json, data/, calibration.json); the start point's weights (540 MB) are not: `start` rebuilds them bit for bit
(start.json holds their SHA-256, and every cell checks it before its first step).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import real_lm_study as first  # benchmarks/real_lm_study.py: the family, split and evaluation

HERE = Path(__file__).resolve().parent / "real_lm_warm"
RUNS = Path("runs/real_lm_warm")
DATA = HERE / "data"

# ---------------------------------------------------------------------------------------------------------------
# The start point (registration, "Start point"): GRPO seed 0 of the first study, rerun to the first step at which its
# training accuracy over a trailing window of 10 steps reaches 10% in the committed record (start_step_of).

START_SEED, START_ACCURACY, START_WINDOW = 0, 0.10, 10
START_LATER = 10  # the rule's later checkpoints: START_STEP + 10, + 20, ... while fewer than MIN_TRAIN problems pass
MIN_TRAIN = 100
FILTER_K, FILTER_TEMPERATURE, FILTER_SEED = 16, 1.0, 2 * 10**6
KEEP_LOW, KEEP_HIGH = 2, 14  # pass rate in (1/16, 15/16): 2 to 14 right of 16, the paper's filter (section 5.1)


def first_record(method: str = "grpo", seed: int = START_SEED) -> dict:
    """The first study's committed cell record."""
    (path,) = sorted((first.HERE / "cells" / method).glob(f"seed{seed}-*/cell.json"))
    return json.loads(path.read_text())


def start_step_of(record: dict) -> int:
    """The first step whose trailing 10-step mean training accuracy is at least 10% (1-based)."""
    acc = first.trailing_mean(record["curves"]["accuracy"], START_WINDOW)
    return next(i + 1 for i, a in enumerate(acc) if a >= START_ACCURACY)


def start_config(step: int, out: Path):
    from entropy_rft.config import resolve_config

    layer = {"seed": START_SEED, "out": str(out), "steps": step, "save_every": 10, "keep_checkpoints": 1}
    return resolve_config(first.COMMON, first.METHODS["grpo"], layer)


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


COMPARED_KEYS = ("accuracy", "reward_mean", "response_length", "loss/policy", "grad_norm", "entropy", "s_star_mean")


def same_as_first_study(rows: list[dict], committed: list[dict]) -> dict:
    """Per compared metric, the steps where this run's row differs from the first study's and the largest relative
    difference: the sampled tokens are the same run's when accuracy and response lengths agree at every step."""
    out = {}
    for k in COMPARED_KEYS:
        diff = [(r["step"], r.get(k), c.get(k)) for r, c in zip(rows, committed) if r.get(k) != c.get(k)]
        rel = max((abs(a - b) / max(abs(b), 1e-30) for _, a, b in diff), default=0.0)
        out[k] = {"steps_differing": [d[0] for d in diff], "max_relative_difference": rel}
    return out


def start_record(step: int, seconds: float) -> dict:
    """start.json: the start step, its rule, the weights' SHA-256, this run's own trailing accuracy and entropy at the
    step, and how its metrics compare with the first study's GRPO seed 0 record."""
    from entropy_rft.logging import read_metrics
    from entropy_rft.run.checkpoint import checkpoint_dir

    record, run = first_record(), RUNS / "start"
    rows = read_metrics(run)[:step]
    committed = first.read(next((first.HERE / "cells" / "grpo").glob(f"seed{START_SEED}-*/metrics.jsonl")))[:step]
    ckpt = checkpoint_dir(run, step)
    acc = first.trailing_mean([r["accuracy"] for r in rows], START_WINDOW)
    ent = first.trailing_mean([r["entropy"] for r in rows], START_WINDOW)
    return {
        "step": step,
        "rule": f"first step with trailing {START_WINDOW}-step training accuracy >= {START_ACCURACY} "
        f"in the first study's GRPO seed {START_SEED}",
        "rule_step": start_step_of(record),
        "checkpoint": str(ckpt),
        "weights_sha256": sha256(ckpt / "model.safetensors"),
        "trailing_accuracy": float(acc[-1]),
        "trailing_entropy": float(ent[-1]),
        "entropy_first_10_steps": float(sum(r["entropy"] for r in rows[:10]) / 10),
        "steps_compared": len(rows),
        "same_as_first_study": same_as_first_study(rows, committed),
        "seconds": round(seconds, 1),
        "code": os.environ.get("STUDY_CODE", "worktree"),
    }


def cmd_start(step: int | None) -> dict:
    """Train GRPO seed 0 with the first study's settings to `step` (default: the rule's), then write start.json."""
    import torch

    from entropy_rft.train.trainer import train

    torch.set_num_threads(1)
    step = step or start_step_of(first_record())
    t0 = time.time()
    train(start_config(step, RUNS / "start"), resume="auto")
    out = start_record(step, time.time() - t0)
    HERE.mkdir(parents=True, exist_ok=True)
    (HERE / "start.json").write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({k: v for k, v in out.items() if k != "same_as_first_study"}))
    return out


def start_model() -> Path:
    """The start point's weights, checked against start.json's SHA-256 (rebuild them with `start`)."""
    info = json.loads((HERE / "start.json").read_text())
    ckpt = Path(info["checkpoint"])
    if not (ckpt / "model.safetensors").exists():
        raise SystemExit(
            f"{ckpt} is missing: run `python benchmarks/real_lm_warm.py start --step {info['step']}` first"
        )
    return ckpt


def evaluate_problems(model_dir: str, problems: list, *, k: int, temperature: float, seed: int) -> list[int]:
    """Per-problem correct counts of `k` samples at `temperature` (the first study's engine, task and length)."""
    import torch

    from entropy_rft.evaluate import evaluate_policy
    from entropy_rft.rollout import ENGINES
    from entropy_rft.tasks import TASKS
    from entropy_rft.train.policy import load_policy, resolve_model_path

    cfg = first.cell_config("grpo", 0)
    model, tok = load_policy(model_dir, torch.device("cpu"))
    engine = ENGINES.get(cfg.engine)(model, tok, cfg, resolve_model_path(model_dir))
    result = evaluate_policy(
        engine,
        TASKS.get(cfg.task),
        problems,
        k=k,
        temperature=temperature,
        top_p=1.0,
        max_new_tokens=cfg.max_new_tokens,
        seed=seed,
    ).to_json()
    return [round(r * k) for r in result["pass_rates"]]


def cmd_filter() -> dict:
    """The paper's data filter under the start point: FILTER_K samples of each of the 312 training problems at
    temperature 1.0; keep those with KEEP_LOW..KEEP_HIGH right. Writes filter.json and data/train.jsonl."""
    import torch

    from entropy_rft.tasks import TASKS
    from entropy_rft.train.problems import task_problems

    torch.set_num_threads(1)
    cfg = first.cell_config("grpo", 0)
    problems = task_problems(cfg, TASKS.get(cfg.task), "train")
    rows = first.read(first.DATA / "train.jsonl")
    assert [p.question for p in problems] == [r["question"] for r in rows], "problems out of step with train.jsonl"
    t0 = time.time()
    correct = evaluate_problems(
        str(start_model()), problems, k=FILTER_K, temperature=FILTER_TEMPERATURE, seed=FILTER_SEED
    )
    kept = [r for r, c in zip(rows, correct) if KEEP_LOW <= c <= KEEP_HIGH]
    out = {
        "start_step": json.loads((HERE / "start.json").read_text())["step"],
        "k": FILTER_K,
        "temperature": FILTER_TEMPERATURE,
        "seed": FILTER_SEED,
        "keep": [KEEP_LOW, KEEP_HIGH],
        "correct": correct,
        "kept": len(kept),
        "none_right": sum(c == 0 for c in correct),
        "one_right": sum(c == 1 for c in correct),
        "fifteen_or_more": sum(c >= KEEP_HIGH + 1 for c in correct),
        "mean_pass_rate": sum(correct) / (FILTER_K * len(correct)),
        "seconds": round(time.time() - t0, 1),
    }
    (HERE / "filter.json").write_text(json.dumps(out) + "\n")
    first.write(kept, DATA / "train.jsonl")
    print(json.dumps({k: v for k, v in out.items() if k != "correct"}))
    if len(kept) < MIN_TRAIN:
        print(
            f"only {len(kept)} < {MIN_TRAIN} problems kept: by the rule, rerun `start --step "
            f"{out['start_step'] + START_LATER}` and filter again"
        )
    return out


# ---------------------------------------------------------------------------------------------------------------
# The cells (registration, "Arms"): every cell starts from the start point's weights with a fresh optimizer, trains on
# the filtered problems with the first study's step settings, and is evaluated at MID_STEP and at the end.

MID_STEP = 50
CAL_STEPS, CAL_SEED = 25, 1000  # the calibration: Clip_B from the start point, one run per mu, not a study seed
MU_GRID = (1.0, 1.25, 1.5, 1.75, 2.0, 2.5)
SHARE_BAND = (0.01, 0.03)  # realised share of negative-advantage tokens clipped, mean over the calibration steps
TAIL = -0.03  # the threshold mean_B(S*) - mu std_B(S*) must sit below this S* (median over the calibration steps)


def common() -> dict:
    """Every cell's settings beneath its arm's: the first study's, from the start point, on the filtered problems."""
    return {
        **first.COMMON,
        "model": str(start_model()),
        "train_data": f"{first.FAMILY}={DATA / 'train.jsonl'}",
        "eval_data": f"{first.FAMILY}={first.DATA / 'eval.jsonl'}",
    }


def calibrated_mu() -> float:
    return json.loads((HERE / "calibration.json").read_text())["mu"]


def arms() -> dict[str, dict]:
    """The study's arms: GRPO, Clip_B at the calibrated mu, Clip_B at the first study's mu 1.0."""
    return {
        "grpo": {"method": "grpo"},
        "clip_b_cal": {"method": "clip_b", "mu": calibrated_mu()},
        "clip_b_mu1": {"method": "clip_b", "mu": 1.0},
    }


ARMS = ("grpo", "clip_b_cal", "clip_b_mu1")
SEEDS = range(8)


def cell_config(arm: str, seed: int, out: Path | None = None, steps: int | None = None):
    from entropy_rft.config import resolve_config

    layer = {"seed": seed, "out": str(out) if out else "unset"} | ({"steps": steps} if steps else {})
    return resolve_config(common(), arms()[arm], layer)


def cell_dir(out: Path, task: str, arm: str, seed: int, steps: int | None = None) -> Path:
    from entropy_rft.config import settings_key

    return out / "cells" / arm / f"seed{seed}-{settings_key(cell_config(arm, seed))}"


def has_negative_tokens(frac_zero_advantage: float) -> bool:
    """Whether a step had negative-advantage tokens: some group's rewards differed (a group-normalised advantage then
    has both signs). On a step with none the authors' formula gives filter/frac_clipped_neg = 1 - 0 / max(0, 1) = 1,
    not a share: such steps are left out of the realised share."""
    return frac_zero_advantage < 1.0


def threshold(row: dict, mu: float) -> float | None:
    """Clip_B's threshold on S* at one step: mean_B(S*) - mu std_B(S*) from the step's filter/ES and filter/varS (mu
    is the run's setting: filter/mu is logged only under the entropy controller)."""
    if "filter/ES" not in row:
        return None
    return row["filter/ES"] - mu * row["filter/varS"] ** 0.5


CURVES = first.CURVES + ("filter/frac_clipped_neg", "filter/ES", "filter/varS")


def _train_steps(cfg, steps: int) -> None:
    """Train (resuming from the newest checkpoint) up to `steps`; steps is bookkeeping, so the run is the same."""
    import dataclasses

    from entropy_rft.train.trainer import train

    train(dataclasses.replace(cfg, steps=steps), resume="auto")


def run_cell(arm: str, seed: int, out: Path) -> dict | None:
    """One cell: checks the start weights, trains to MID_STEP, evaluates, trains to the end, evaluates (each as the
    first study's final_eval: 400 x 8 at 0.7, sampling seed 10**6 + seed); writes cell.json beside a copy of
    metrics.jsonl. Resumes from its newest checkpoint; None when another process holds the cell."""
    import shutil

    import torch

    from entropy_rft.logging import read_metrics
    from entropy_rft.run.checkpoint import RunDirError, checkpoint_dir, checkpoint_dirs
    from entropy_rft.run.rundir import RunLock

    torch.set_num_threads(1)
    where = cell_dir(out, "", arm, seed)
    if (where / "cell.json").exists():
        return json.loads((where / "cell.json").read_text())
    lock = RunLock(where)
    try:
        lock.acquire()
    except RunDirError:
        return None
    try:
        start = json.loads((HERE / "start.json").read_text())
        if sha256(start_model() / "model.safetensors") != start["weights_sha256"]:
            raise SystemExit(f"{start_model()} is not the registered start point (SHA-256 differs from start.json)")
        run = where / "run"
        cfg = cell_config(arm, seed, run)
        t0 = time.time()
        evals = {}
        if (where / "mid.json").exists():
            evals = json.loads((where / "mid.json").read_text())
        else:
            _train_steps(cfg, MID_STEP)
            evals = {str(MID_STEP): first.final_eval(str(checkpoint_dir(run, MID_STEP)), seed)}
            tmp = where / "mid.json.tmp"
            tmp.write_text(json.dumps(evals) + "\n")
            os.replace(tmp, where / "mid.json")
        _train_steps(cfg, cfg.steps)
        evals[str(cfg.steps)] = first.final_eval(str(checkpoint_dir(run, cfg.steps)), seed)
        rows = read_metrics(run)
        record = {
            "arm": arm,
            "method": cfg.method,
            "seed": seed,
            "key": where.name.split("-")[-1],
            "settings": cfg.to_dict(),
            "start": {"step": start["step"], "weights_sha256": start["weights_sha256"]},
            "steps": cfg.steps,
            "eval_k": first.EVAL_K,
            "eval_correct": {k: v["correct"] for k, v in evals.items()},
            "eval_seconds": {k: v["seconds"] for k, v in evals.items()},
            "curves": {k: [m.get(k) for m in rows] for k in CURVES},
            "wall_seconds_this_process": round(time.time() - t0, 1),
            "torch_threads": torch.get_num_threads(),
            "code": os.environ.get("STUDY_CODE", "worktree"),
        }
        shutil.copy(run / "metrics.jsonl", where / "metrics.jsonl")
        tmp = where / "cell.json.tmp"
        tmp.write_text(json.dumps(record) + "\n")
        os.replace(tmp, where / "cell.json")  # the record first, then the checkpoints go (1.6 GB each)
        for ckpt in checkpoint_dirs(run, complete=False):
            shutil.rmtree(ckpt, ignore_errors=True)
        return record
    finally:
        lock.release()


def calibration_config(mu: float, out: Path):
    from entropy_rft.config import resolve_config

    layer = {"method": "clip_b", "mu": mu, "seed": CAL_SEED, "out": str(out), "steps": CAL_STEPS}
    return resolve_config(common(), layer, {"save_every": 5, "keep_checkpoints": 1, "eval_problems": 0})


def calibration_run(mu: float) -> dict:
    """One calibration run (resumable): Clip_B at mu from the start point for CAL_STEPS steps."""
    import torch

    from entropy_rft.logging import read_metrics
    from entropy_rft.train.trainer import train

    torch.set_num_threads(1)
    run = RUNS / "calibration" / f"mu{mu:g}"
    cfg = calibration_config(mu, run)
    train(cfg, resume="auto")
    rows = read_metrics(run)
    signal = [r for r in rows if has_negative_tokens(r["frac_zero_advantage"])]
    share = [r["filter/frac_clipped_neg"] for r in signal]
    thr = [threshold(r, mu) for r in signal]
    return {
        "mu": mu,
        "signal_steps": len(signal),
        "share_mean": sum(share) / len(share) if share else float("nan"),
        "share_max": max(share, default=float("nan")),
        "threshold_median": sorted(thr)[len(thr) // 2] if thr else float("nan"),
        "share": share,
        "threshold": thr,
        "entropy": [r["entropy"] for r in rows],
        "accuracy": [r["accuracy"] for r in rows],
        "seconds": [r["seconds"] for r in rows],
    }


def pick_mu(runs: list[dict]) -> tuple[float | None, str]:
    """The registered rule: the smallest mu of the grid whose mean realised share is within SHARE_BAND and whose
    median threshold lies below TAIL; None (with the reason) when no mu meets it."""
    lo, hi = SHARE_BAND
    for r in sorted(runs, key=lambda r: r["mu"]):
        if lo <= r["share_mean"] <= hi and r["threshold_median"] < TAIL:
            return r["mu"], f"mu {r['mu']:g}: share {r['share_mean']:.4f}, median threshold {r['threshold_median']:.4f}"
    return None, "no mu of the grid clips 1-3% of negative-advantage tokens with its threshold below S* = -0.03"


def cmd_calibrate(jobs: int) -> dict:
    """Every mu of the grid (each in its own process, `jobs` at a time), then the rule; writes calibration.json."""
    import subprocess

    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    pending = [mu for mu in MU_GRID if not (RUNS / "calibration" / f"mu{mu:g}.json").exists()]
    running: list = []
    while pending or running:
        while pending and len(running) < jobs:
            mu = pending.pop(0)
            (RUNS / "calibration").mkdir(parents=True, exist_ok=True)
            log = open(RUNS / "calibration" / f"mu{mu:g}.log", "a")
            cmd = [sys.executable, __file__, "calibrate-one", "--mu", str(mu)]
            running.append((subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT), mu))
            print(f"{time.strftime('%H:%M:%S')} calibration mu {mu:g} started", flush=True)
        time.sleep(2)
        for proc, mu in list(running):
            if proc.poll() is not None:
                running.remove((proc, mu))
                print(f"{time.strftime('%H:%M:%S')} calibration mu {mu:g} exit {proc.returncode}", flush=True)
                if proc.returncode:
                    raise SystemExit(f"calibration mu {mu:g} failed; see {RUNS / 'calibration'}/mu{mu:g}.log")
    runs = [json.loads((RUNS / "calibration" / f"mu{mu:g}.json").read_text()) for mu in MU_GRID]
    mu, why = pick_mu(runs)
    out = {
        "mu": mu,
        "why": why,
        "grid": list(MU_GRID),
        "steps": CAL_STEPS,
        "seed": CAL_SEED,
        "band": list(SHARE_BAND),
        "tail": TAIL,
        "runs": runs,
    }
    (HERE / "calibration.json").write_text(json.dumps(out, indent=1) + "\n")
    for r in runs:
        print(
            f"mu {r['mu']:<5g} share {r['share_mean']:.4f} (max {r['share_max']:.4f}) threshold median "
            f"{r['threshold_median']:+.4f} entropy {r['entropy'][0]:.3f}->{r['entropy'][-1]:.3f} "
            f"{sum(r['seconds']) / len(r['seconds']):.1f} s/step"
        )
    print("picked:", why)
    return out


BUDGET_HOURS, BUDGET_JOBS = 12.0, 2  # the whole study within about 12 hours of the 2-core CPU, two at a time
EVAL_SAMPLES = 400 * 8  # one registered evaluation


def budget(start: dict, filt: dict, calibration: dict) -> dict:
    """The registered budget, from measured times: a cell is 100 steps at the calibration's median seconds a step plus
    two evaluations of 3,200 samples at the filter's seconds a sample; 10 seeds when the preliminaries and 30 cells fit
    BUDGET_HOURS of the CPU two at a time, else 8."""
    import statistics

    step_s = statistics.median(x for r in calibration["runs"] for x in r["seconds"])
    sample_s = filt["seconds"] / (len(filt["correct"]) * filt["k"])
    cell_s = first.COMMON["steps"] * step_s + 2 * EVAL_SAMPLES * sample_s
    before = start["seconds"] + filt["seconds"] + sum(sum(r["seconds"]) for r in calibration["runs"])
    hours = {n: (before + 3 * n * cell_s) / 3600 / BUDGET_JOBS for n in (8, 10)}
    return {
        "step_seconds_median": step_s,
        "eval_seconds_per_sample": sample_s,
        "cell_seconds": cell_s,
        "preliminary_seconds": before,
        "wall_hours_two_at_a_time": hours,
        "seeds": 10 if hours[10] <= BUDGET_HOURS else 8,
    }


def before_first_cell(start: dict, filt: dict, calibration: dict, plan: dict) -> str:
    """The registration's "Before the first cell" section, from start.json, filter.json, calibration.json and
    budget.json (tests/test_real_lm_warm.py holds the page to it)."""
    same, hours = start["same_as_first_study"], plan["wall_hours_two_at_a_time"]
    start_item = (
        f"- **Start point**: step {start['step']} (the rule's). The rebuilt run has the first study's accuracy, "
        f"rewards, response lengths and policy loss at every one of the {start['steps_compared']} steps (the same "
        f"sampled tokens); its gradient norms differ by at most {same['grad_norm']['max_relative_difference']:.1e} "
        f"relative (float32 rounding of today's code). At step {start['step']} its 10-step training accuracy is "
        f"{100 * start['trailing_accuracy']:.1f}% and its 10-step entropy {start['trailing_entropy']:.2f} nats "
        f"(first 10 steps: {start['entropy_first_10_steps']:.2f}). Weights' SHA-256 {start['weights_sha256'][:16]}...; "
        f"{start['seconds']:,.0f} s."
    )
    filter_item = (
        f"- **Filter**: {filt['kept']} of {len(filt['correct'])} training problems have 2 to 14 of 16 right under "
        f"the start point ({filt['none_right']} none, {filt['one_right']} one, {filt['fifteen_or_more']} 15 or 16; "
        f"mean pass rate {100 * filt['mean_pass_rate']:.1f}%); {filt['seconds']:,.0f} s."
    )
    lines = [
        start_item,
        filter_item,
        f"- **Calibration** ({calibration['steps']} steps a mu, seed {calibration['seed']}; the share of "
        "negative-advantage tokens clipped is the mean over the steps that had such tokens; the threshold mean_B(S*) - "
        "mu std_B(S*) its median over them):",
        "",
        "  | mu | steps with A < 0 tokens | share clipped (mean) | share (max) | threshold (median) | entropy, first "
        "to last step (nats) | seconds a step (median) |",
        "  |---|---|---|---|---|---|---|",
    ]
    for r in calibration["runs"]:
        secs = sorted(r["seconds"])[len(r["seconds"]) // 2]
        lines.append(
            f"  | {r['mu']:g} | {r['signal_steps']} | {100 * r['share_mean']:.2f}% | {100 * r['share_max']:.1f}% | "
            f"{r['threshold_median']:+.4f} | {r['entropy'][0]:.2f} to {r['entropy'][-1]:.2f} | {secs:.1f} |"
        )
    chosen = calibration["mu"]
    verdict = (
        f"The rule gives **mu {chosen:g}** ({calibration['why']}): the `clip_b_cal` arm."
        if chosen is not None
        else f"No mu meets the rule ({calibration['why']}): Clip_B cannot be a tail filter on this task."
    )
    budget_item = (
        f"- **Budget**: {plan['step_seconds_median']:.1f} s a step (the calibration's median, beside other work), "
        f"{plan['eval_seconds_per_sample']:.3f} s a sample of evaluation (the filter's): "
        f"{plan['cell_seconds'] / 60:.0f} minutes a cell. With the start point, filter and calibration "
        f"({plan['preliminary_seconds'] / 3600:.1f} hours of one core), 8 seeds come to {hours['8']:.1f} hours two "
        f"at a time and 10 seeds to {hours['10']:.1f}: **{plan['seeds']} seeds** (0-{plan['seeds'] - 1}), "
        f"{3 * plan['seeds']} cells."
    )
    lines += ["", "  " + verdict, budget_item]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------------------------
# The registered analysis (registration, "Endpoints and test"), written before the first cell.

BASELINE, COMPARED = "grpo", ("clip_b_cal", "clip_b_mu1")
REPLICATES, ANALYSIS_SEED, ALPHA = 20_000, 61, 0.05


def avg_per_seed(record: dict, step: int) -> float:
    """The cell's Avg@8 at an evaluation step: the mean correct fraction over 400 problems x 8 samples."""
    correct = record["eval_correct"][str(step)]
    return sum(correct) / (len(correct) * first.EVAL_K)


def seed_level(diffs: list[float]) -> dict:
    """The primary test of one arm: the paired t over seeds (interval and p) and the exact sign-flip p."""
    from entropy_rft.commands.evidence import seed_t_test, sign_flip_p

    est, p_t = seed_t_test(diffs)
    return {**est.to_json(), "p_t": p_t, "p_sign_flip": sign_flip_p(diffs), "per_seed": list(diffs)}


def verdict(p_t_holm: float, p_flip_holm: float, value: float) -> str:
    """ "raises"/"lowers" Avg@8 only when both Holm-adjusted seed-level p are below ALPHA; else no difference shown."""
    if p_t_holm < ALPHA and p_flip_holm < ALPHA:
        return ("raises" if value > 0 else "lowers") + " Avg@8"
    return "no difference shown"


def thresholds(record: dict):
    """The cell's Clip_B threshold at every step (threshold), with the cell's own mu."""
    import numpy as np

    c, mu = record["curves"], record["settings"]["mu"]
    return np.array(
        [threshold({"filter/ES": e, "filter/varS": v}, mu) for e, v in zip(c["filter/ES"], c["filter/varS"])]
    )


def clip_summary(record: dict) -> dict:
    """The realised filter of a Clip_B cell: its share of negative-advantage tokens clipped and its threshold on S*,
    over all steps and over the second half."""
    import numpy as np

    c = record["curves"]
    signal = np.array([has_negative_tokens(z) for z in c["frac_zero_advantage"]])
    second = signal & (np.arange(len(signal)) >= len(signal) // 2)
    share = np.asarray(c["filter/frac_clipped_neg"], dtype=float)
    thr = thresholds(record)
    if not second.any():
        return {"signal_steps": int(signal.sum())}
    return {
        "signal_steps": int(signal.sum()),
        "share_mean": float(share[signal].mean()),
        "share_mean_second_half": float(share[second].mean()),
        "share_max": float(share[signal].max()),
        "threshold_median": float(np.median(thr[signal])),
        "threshold_median_second_half": float(np.median(thr[second])),
    }


def share_curve(records: list[dict]) -> list[float | None]:
    """Per step, the mean over seeds of the share of negative-advantage tokens clipped, over the seeds whose step had
    such tokens (None where none had): on a step without them the authors' formula logs 1, not a share. (Changed
    after the result: the figure first averaged those 1s in, spikes of 1/8 per such seed; docs/prereg_real_lm_warm.md,
    "Changes after the cells started".)"""
    import numpy as np

    share = np.array([r["curves"]["filter/frac_clipped_neg"] for r in records], dtype=float)
    signal = np.array([[has_negative_tokens(z) for z in r["curves"]["frac_zero_advantage"]] for r in records])
    total, n = np.where(signal, share, 0.0).sum(0), signal.sum(0)
    return [round(float(t / k), 5) if k else None for t, k in zip(total, n)]


def analyse(records: list[dict]) -> dict:
    """Every registered figure from the cell records."""
    import numpy as np

    from entropy_rft.commands.evidence import avg_scores, holm, paired_test, pass_at_k_scores, seed_t_interval

    by = {(r["arm"], r["seed"]): r for r in records}
    arms_here = [a for a in (BASELINE, *COMPARED) if any(k[0] == a for k in by)]
    compared = [a for a in COMPARED if a in arms_here]
    seeds = sorted(s for s in {k[1] for k in by} if all((a, s) in by for a in arms_here))
    if len(seeds) < 2 or not compared or BASELINE not in arms_here:
        raise ValueError(f"need GRPO and a compared arm on at least 2 common seeds, got {sorted(by)}")
    steps = first.COMMON["steps"]
    for r in records:
        if r["eval_k"] != first.EVAL_K or r["steps"] != steps or set(r["eval_correct"]) != {str(MID_STEP), str(steps)}:
            raise ValueError(
                f"cell {r['arm']} seed {r['seed']}: eval_k {r['eval_k']}, steps {r['steps']}, evaluations "
                f"{sorted(r['eval_correct'])}; registered {first.EVAL_K}, {steps}, [{MID_STEP}, {steps}]"
            )
    final = {a: np.array([avg_per_seed(by[(a, s)], steps) for s in seeds]) for a in arms_here}
    primary = {a: seed_level((final[a] - final[BASELINE]).tolist()) for a in compared}
    adj_t = holm({a: primary[a]["p_t"] for a in compared})
    adj_f = holm({a: primary[a]["p_sign_flip"] for a in compared})
    for a in compared:
        primary[a].update(p_t_holm=adj_t[a], p_sign_flip_holm=adj_f[a])
        primary[a]["verdict"] = verdict(adj_t[a], adj_f[a], primary[a]["value"])
    gen = np.random.default_rng(ANALYSIS_SEED)
    counts = {
        (a, st): np.array([by[(a, s)]["eval_correct"][str(st)] for s in seeds])
        for a in arms_here
        for st in (MID_STEP, steps)
    }
    score = {"avg@8": lambda c: avg_scores(c, first.EVAL_K), "pass@8": lambda c: pass_at_k_scores(c, first.EVAL_K, 8)}
    secondary = {}
    for a in compared:
        for st in (MID_STEP, steps):
            for name in ("avg@8", "pass@8"):
                x, b = score[name](counts[(a, st)]), score[name](counts[(BASELINE, st)])
                est, p = paired_test(x, b, gen, samples=first.EVAL_K, replicates=REPLICATES)
                per_seed = (x.mean(1) - b.mean(1)).tolist()
                secondary[f"{a} {name} step {st}"] = {
                    "two_way_bootstrap": {**est.to_json(), "p": p},
                    "seed_level": seed_level(per_seed),
                }
    last = {a: np.array([first.last_tenth(by[(a, s)]["curves"]["entropy"]) for s in seeds]) for a in arms_here}
    entropy = {a: {"value": seed_t_interval(last[a]).to_json()} for a in arms_here}
    for a in compared:
        entropy[a]["vs_grpo"] = seed_t_interval(last[a] - last[BASELINE]).to_json()
    clipping = {a: [clip_summary(by[(a, s)]) for s in seeds] for a in compared}
    absolute = {
        a: {
            f"{name} step {st}": seed_t_interval(score[name](counts[(a, st)]).mean(1)).to_json()
            for st in (MID_STEP, steps)
            for name in score
        }
        for a in arms_here
    }
    curves = {
        a: {
            k: np.array([by[(a, s)]["curves"][k] for s in seeds], dtype=float).mean(0).round(5).tolist()
            for k in ("entropy", "accuracy", "response_length")
        }
        for a in arms_here
    }
    for a in compared:
        curves[a]["clip_share"] = share_curve([by[(a, s)] for s in seeds])
        curves[a]["threshold"] = np.array([thresholds(by[(a, s)]) for s in seeds]).mean(0).round(5).tolist()
    return {
        "family": first.FAMILY,
        "seeds": seeds,
        "arms": {a: arms()[a] for a in arms_here},
        "problems": int(counts[(BASELINE, steps)].shape[1]),
        "eval_k": first.EVAL_K,
        "primary": primary,
        "secondary": secondary,
        "entropy_last_tenth": entropy,
        "clipping": clipping,
        "absolute": absolute,
        "training_accuracy_mean": {
            a: seed_t_interval([np.mean(by[(a, s)]["curves"]["accuracy"]) for s in seeds]).to_json() for a in arms_here
        },
        "curves": curves,
    }


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def markdown(r: dict) -> str:
    lines = [
        "# SmolLM2-135M from the paper's starting regime: GRPO and Clip_B (issue 61, docs/prereg_real_lm_warm.md)",
        "",
        f"Family {r['family']}; seeds {r['seeds']}; arms {json.dumps(r['arms'])}; {r['problems']} held-out problems "
        f"x {r['eval_k']} samples at temperature {first.EVAL_TEMPERATURE}. Differences against GRPO in points, paired "
        "by seed; 95% Student-t intervals over seeds.",
        "",
        *(
            [
                f"**Incomplete**: {len(r['incomplete'])} of {len(ARMS) * len(SEEDS)} registered cells missing "
                f"({', '.join(r['incomplete'])}); no registered conclusion is drawn (the stopping rule).",
                "",
            ]
            if r.get("incomplete")
            else []
        ),
        "| primary: final Avg@8 - GRPO | difference | per seed | t p | t Holm p | sign-flip p | sign-flip Holm p "
        "| verdict |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for a, e in r["primary"].items():
        per = ", ".join(f"{100 * d:+.1f}" for d in e["per_seed"])
        lines.append(
            f"| {a} | {first._pts(e)} | {per} | {e['p_t']:.4f} | {e['p_t_holm']:.4f} | {e['p_sign_flip']:.4f} | "
            f"{e['p_sign_flip_holm']:.4f} | {e['verdict']} |"
        )
    lines += ["", "| secondary - GRPO | seed-level t | two-way bootstrap | bootstrap p |", "|---|---|---|---|"]
    for name, e in r["secondary"].items():
        b = e["two_way_bootstrap"]
        lines.append(f"| {name} | {first._pts(e['seed_level'])} | {first._pts(b)} | {b['p']:.4f} |")
    lines += [
        "",
        "| arm | Avg@8 step 50 | Avg@8 final | Pass@8 final | entropy, last 10% (nats) |",
        "|---|---|---|---|---|",
    ]
    steps = first.COMMON["steps"]
    for a, d in r["absolute"].items():
        h = r["entropy_last_tenth"][a]["value"]
        lines.append(
            f"| {a} | {100 * d[f'avg@8 step {MID_STEP}']['value']:.1f} | "
            f"{100 * d[f'avg@8 step {steps}']['value']:.1f} | "
            f"{100 * d[f'pass@8 step {steps}']['value']:.1f} | {h['value']:.3f} [{h['low']:.3f}, {h['high']:.3f}] |"
        )
    for a in r["primary"]:
        lines.append(
            f"\n{a} - GRPO, entropy over the last 10% of steps: "
            f"{first._pts(r['entropy_last_tenth'][a]['vs_grpo'], 1, 3)} nats"
        )
    lines += [
        "",
        "| realised filter (per seed) | share of A < 0 tokens clipped | second half | threshold median |",
        "|---|---|---|---|",
    ]
    for a, rows in r["clipping"].items():
        lines.append(
            f"| {a} | "
            + ", ".join(_pct(c.get("share_mean")) for c in rows)
            + " | "
            + ", ".join(_pct(c.get("share_mean_second_half")) for c in rows)
            + " | "
            + ", ".join("-" if "threshold_median" not in c else f"{c['threshold_median']:+.3f}" for c in rows)
            + " |"
        )
    return "\n".join(lines) + "\n"


def figure(r: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(17, 3.6))
    for a, c in r["curves"].items():
        x = range(1, len(c["entropy"]) + 1)
        axes[0].plot(x, c["entropy"], label=a)
        axes[1].plot(x, first.trailing_mean(c["accuracy"]), label=a)
        if "clip_share" in c:
            axes[2].plot(x, [float("nan") if v is None else v for v in c["clip_share"]], label=a)
            axes[3].plot(x, c["threshold"], label=a)
    axes[0].set(xlabel="step", ylabel="token entropy (nats)", title="entropy (mean over seeds)")
    axes[1].set(xlabel="step", ylabel="training accuracy", title="accuracy (10-step mean)")
    axes[2].set(xlabel="step", ylabel="share of A < 0 tokens clipped", title="realised filter")
    axes[3].axhline(TAIL, color="grey", lw=0.8, ls="--")
    axes[3].set(xlabel="step", ylabel="mean - mu std of S*", title="Clip_B threshold")
    for ax in axes:
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def check_stopping_rule(records: dict[Path, dict], *, incomplete: bool = False) -> list[str]:
    """The registration's stopping rule: the analysis reads every registered arm x seed once, after all of them.
    Raises ValueError naming the cells found twice (two folders of one cell: a run from a checkout at another
    directory keys its cells apart), those outside the design, and the cells missing; with `incomplete` (the
    registration's report of a study whose cells cannot all finish) missing cells are returned instead."""
    where: dict[tuple[str, int], list[str]] = {}
    for path, r in records.items():
        where.setdefault((r["arm"], r["seed"]), []).append(str(path))
    problems = [f"{a} seed {s}: in {', '.join(paths)}" for (a, s), paths in sorted(where.items()) if len(paths) > 1]
    problems += [f"{a} seed {s}: not registered" for a, s in sorted(where) if a not in ARMS or s not in SEEDS]
    missing = [f"{a} seed {s}" for a in ARMS for s in SEEDS if (a, s) not in where]
    if missing and not incomplete:
        problems.append(f"{len(missing)} of {len(ARMS) * len(SEEDS)} cells missing ({', '.join(missing)})")
    if problems:
        raise ValueError(
            "the stopping rule (docs/prereg_real_lm_warm.md): the registered analysis reads each of its "
            f"{len(ARMS) * len(SEEDS)} cells once, after all of them; " + "; ".join(problems) + ". Finish the cells "
            "with `python benchmarks/real_lm_warm.py run` and keep one folder per arm and seed (or, when they cannot "
            "all finish, report the study as incomplete: analyse --incomplete)"
        )
    return missing


INCOMPLETE_VERDICT = "none: the study is incomplete"


def cmd_analyse(cells: Path, dest: Path, *, incomplete: bool = False) -> dict:
    by_path = {p: json.loads(p.read_text()) for p in sorted(cells.glob("cells/*/*/cell.json"))}
    missing = check_stopping_rule(by_path, incomplete=incomplete)
    records = list(by_path.values())
    result = analyse(records)
    if missing:  # the registration: reported as incomplete with what it has, and no registered conclusion drawn
        result["incomplete"] = missing
        for e in result["primary"].values():
            e["verdict"] = INCOMPLETE_VERDICT
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "cells.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (dest / "study.json").write_text(json.dumps(result, indent=1) + "\n")
    (dest / "study.md").write_text(markdown(result))
    figure(result, dest / "curves.png")
    print(markdown(result))
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("start", help="GRPO seed 0 of the first study to the start step, compared with its record")
    s.add_argument("--step", type=int, default=None, help="default: the rule's step (start_step_of)")
    sub.add_parser("filter", help="the paper's pass-rate filter of the training problems under the start point")
    sub.add_parser("budget", help="the registered budget from the measured step and evaluation; writes budget.json")
    c = sub.add_parser("calibrate", help="Clip_B from the start point at each mu of the grid, then the rule")
    c.add_argument("--jobs", type=int, default=2)
    one = sub.add_parser("calibrate-one", help="one calibration run (what calibrate starts)")
    one.add_argument("--mu", type=float, required=True)
    r = sub.add_parser("run", help="every cell not yet done (resumable), --jobs at a time")
    r.add_argument("--out", default=str(RUNS))
    r.add_argument("--jobs", type=int, default=2)
    r.add_argument("--arms", default=",".join(ARMS))
    cell = sub.add_parser("cell", help="one cell in this process (what run starts)")
    cell.add_argument("--out", required=True)
    cell.add_argument("--task", default=first.FAMILY)
    cell.add_argument("--method", required=True, choices=ARMS, help="the arm")
    cell.add_argument("--seed", type=int, required=True)
    cell.add_argument("--steps", type=int, default=None)
    a = sub.add_parser("analyse", help="the registered analysis")
    a.add_argument("--cells", default=str(RUNS), help="a directory holding cells/")
    a.add_argument("--dest", default=str(HERE))
    a.add_argument(
        "--incomplete",
        action="store_true",
        help="the registration's report of a study whose cells cannot all finish: what it has, no verdict",
    )
    args = parser.parse_args(argv)
    if args.command == "start":
        cmd_start(args.step)
    elif args.command == "filter":
        cmd_filter()
    elif args.command == "budget":
        read = {n: json.loads((HERE / f"{n}.json").read_text()) for n in ("start", "filter", "calibration")}
        out = budget(read["start"], read["filter"], read["calibration"])
        (HERE / "budget.json").write_text(json.dumps(out, indent=1) + "\n")
        print(json.dumps(out))
        print(before_first_cell(read["start"], read["filter"], read["calibration"], json.loads(json.dumps(out))))
    elif args.command == "calibrate":
        cmd_calibrate(args.jobs)
    elif args.command == "calibrate-one":
        out = calibration_run(args.mu)
        path = RUNS / "calibration" / f"mu{args.mu:g}.json"
        path.write_text(json.dumps(out) + "\n")
    elif args.command == "run":
        import study  # benchmarks/study.py

        cells = [(first.FAMILY, arm, s) for s in SEEDS for arm in args.arms.split(",")]
        study.run_cells(Path(args.out), cells, args.jobs, script=Path(__file__), where=cell_dir)
    elif args.command == "cell":
        if run_cell(args.method, args.seed, Path(args.out)) is None:
            raise SystemExit(3)
    elif args.command == "analyse":
        try:
            cmd_analyse(Path(args.cells), Path(args.dest), incomplete=args.incomplete)
        except ValueError as e:
            raise SystemExit(f"analyse: {e}") from None


if __name__ == "__main__":
    main()
