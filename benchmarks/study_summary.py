"""Tables, raw JSON and figures of the issue-24 study from its finished cells (benchmarks/study.py summarise).

Only the cells of the study's own settings are read (each task's steps, or the --steps given: cell_dir's settings
key), so a trial's cells of other step counts never mix in. Per task, only the seeds whose every method has finished
are used, so every comparison is paired on the same seeds and problems. Written to DEST:
    cells.jsonl       one finished cell a line: settings, per-problem correct counts (initial and final, n = 32),
                      per-step entropy, clipped fraction, control value and seconds (the raw results)
    study.json        the intervals: Avg@K, Pass@8, Pass@32 with two-way bootstrap intervals over seeds and problems
                      and paired differences against GRPO (entropy_rft/commands/evidence.py); per-run metrics (final
                      entropy,
                      entropy tracking error, clipped fraction, seconds per step, cell wall time) with seed intervals
    study.md          the same as tables
    entropy_<task>.png, differences_<task>.png, control_<task>.png (mu, alpha or the bonus coefficient per step,
                      mean over seeds; the mu controller's steps without clipping are left out of its mean)
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
from study import METHODS, TASKS, cell_dir  # benchmarks/study.py

from entropy_rft.commands.evidence import evaluate_grid, markdown_table, paired_difference, seed_estimate

KS = (8, 32)


def load_cells(out: Path, tasks: list[str], methods: list[str], seeds: int, steps: int | None = None) -> list[dict]:
    """The finished cells of these settings (each task's steps, or `steps`), in task, method, seed order."""
    paths = [cell_dir(out, t, m, s, steps) / "cell.json" for t in tasks for m in methods for s in range(seeds)]
    return [json.loads(p.read_text()) for p in paths if p.exists()]


def tracking_error(entropy: list[float], target: float) -> float:
    """Mean |H_t - target| over the second half of the steps (H_t: the batch's token-mean entropy before step t)."""
    tail = entropy[len(entropy) // 2 :]
    return float(np.mean([abs(h - target) for h in tail]))


def per_run(cell: dict, target: float) -> dict:
    ent = cell["entropy"]
    tail = ent[-max(1, len(ent) // 10) :]
    return {
        "entropy_final": float(np.mean(tail)),
        "tracking_error": tracking_error(ent, target),
        "clip_fraction": float(np.mean(cell["clip_frac"])),
        "seconds_per_step": float(np.median(cell["step_seconds"])),
        "cell_wall_seconds": cell["wall_seconds_this_process"],
    }


def saturation(cells: list[dict]) -> str | None:
    """One line on EntroPIC cells whose alpha ended at a bound (+-pi_alpha_max, 1 by default): per method, the range
    over seeds of the first step at that bound and of the fraction of later steps spent there."""
    parts = []
    for method in sorted({c["method"] for c in cells if c["settings"].get("entropy_control") == "pi"}):
        firsts, fracs, edges = [], [], set()
        for c in (c for c in cells if c["method"] == method):
            bound = c["settings"].get("pi_alpha_max") or 1.0
            end = c["control"][-1] or 0.0
            at = [v is not None and v * (1 if end > 0 else -1) >= bound - 1e-9 for v in c["control"]]
            if abs(end) >= bound - 1e-9:
                edges.add(f"{bound if end > 0 else -bound:+g}")
                first = at.index(True)
                firsts.append(first + 1)
                fracs.append(sum(at[first:]) / len(at[first:]))
        if firsts:
            n = sum(c["method"] == method for c in cells)
            parts.append(
                f"{method}: alpha at its bound {' / '.join(sorted(edges))} "
                f"from step {min(firsts)} to {max(firsts)} in {len(firsts)} of {n} "
                f"seeds, then there for {100 * min(fracs):.0f}% to {100 * max(fracs):.0f}% of the remaining "
                "steps"
            )
    return (
        (
            "EntroPIC's controller saturated (" + "; ".join(parts) + "): its results here are those of alpha pinned "
            "at the bound."
        )
        if parts
        else None
    )


def summarise_task(
    cells: list[dict], task: str, methods: list[str], seeds: int, gen: np.random.Generator
) -> dict | None:
    by = {(c["method"], c["seed"]): c for c in cells if c["task"] == task}
    complete = [s for s in range(seeds) if all((m, s) in by for m in methods)]
    if not complete:
        return None
    target, n = TASKS[task]["target"], by[(methods[0], complete[0])]["eval_n"]
    grids = {"initial policy": np.array([by[(methods[0], s)]["initial_correct"] for s in complete])}
    grids.update({m: np.array([by[(m, s)]["final_correct"] for s in complete]) for m in methods})
    evidence = evaluate_grid(grids, n, gen, ks=KS, baseline="grpo")
    runs = {m: [per_run(by[(m, s)], target) for s in complete] for m in methods}
    per_run_est = {}
    for m in methods:
        per_run_est[m] = {k: seed_estimate([r[k] for r in runs[m]], gen).to_json() for k in runs[m][0]}
        if m != "grpo":
            per_run_est[m]["tracking_error_vs_grpo"] = paired_difference(
                np.array([r["tracking_error"] for r in runs[m]]),
                np.array([r["tracking_error"] for r in runs["grpo"]]),
                gen,
            ).to_json()
    curves = {m: np.mean([by[(m, s)]["entropy"] for s in complete], axis=0).tolist() for m in methods}
    warnings.filterwarnings("ignore", "Mean of empty slice")  # the mu controller left every seed unclipped there
    controls = {
        m: np.nanmean([[np.nan if v is None else v for v in by[(m, s)]["control"]] for s in complete], axis=0).tolist()
        for m in methods
        if "entropy_target" in METHODS[m]
    }
    return {
        "target": target,
        "steps": by[(methods[0], complete[0])]["steps"],
        "seeds": complete,
        "eval_n": n,
        "problems": int(grids["grpo"].shape[1]),
        "evidence": evidence,
        "per_run": per_run_est,
        "saturation": saturation([by[(m, s)] for m in methods for s in complete]),
        "entropy_curves": curves,
        "control_curves": controls,
        "resumed_cells": sum(by[(m, s)]["resumed"] for m in methods for s in complete),
    }


def task_markdown(task: str, r: dict) -> str:
    lines = [
        f"## {task}: {r['steps']} steps, entropy target {r['target']} nats, seeds {r['seeds']}",
        "",
        markdown_table(r["evidence"]).rstrip(),
        "",
        *([r["saturation"], ""] if r.get("saturation") else []),
        "| method | entropy, last 10% of steps | tracking error mean abs(H - target), 2nd half | "
        "- GRPO's (paired) | mean clipped fraction | s / step (median) | cell wall s |",
        "|---|---|---|---|---|---|---|",
    ]
    for m, e in r["per_run"].items():

        def t(k, scale=1.0, digits=3, e=e):
            x = e[k]
            return f"{scale * x['value']:.{digits}f} [{scale * x['low']:.{digits}f}, {scale * x['high']:.{digits}f}]"

        vs = e.get("tracking_error_vs_grpo")
        vs_text = (
            f"{vs['value']:+.3f} [{vs['low']:+.3f}, {vs['high']:+.3f}]" + (" *" if vs["excludes_zero"] else "")
            if vs
            else ""
        )
        lines.append(
            f"| {m} | {t('entropy_final')} | {t('tracking_error')} | {vs_text} | {t('clip_fraction', digits=4)} "
            f"| {t('seconds_per_step', digits=2)} | {t('cell_wall_seconds', digits=0)} |"
        )
    lines += [
        "",
        f"Per-run columns: mean over {len(r['seeds'])} seeds with a 95% bootstrap interval over seeds. Times "
        "are one thread per cell on a shared 2-core machine; other work ran beside the study, so they are "
        f"comparable only roughly. Cells resumed from a checkpoint: {r['resumed_cells']} (their wall time covers "
        "the last process only).",
    ]
    return "\n".join(lines) + "\n"


def plots(task: str, r: dict, dest: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.8), dpi=120)
    for m, curve in r["entropy_curves"].items():
        ax.plot(range(1, len(curve) + 1), curve, label=m, linewidth=1.4)
    ax.axhline(r["target"], color="k", linestyle=":", linewidth=1, label=f"target {r['target']}")
    ax.set_xlabel("step")
    ax.set_ylabel(f"token entropy (mean of {len(r['seeds'])} seeds)")
    ax.set_title(f"{task}: entropy by method")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(dest / f"entropy_{task}.png")
    plt.close(fig)

    if r["control_curves"]:
        names = list(r["control_curves"])
        fig, axes = plt.subplots(1, len(names), figsize=(3.2 * len(names), 2.8), dpi=120)
        what = {"mu_control": "mu chosen (no clipping: gap)", "bonus": "bonus coefficient"}
        for ax, m in zip(np.atleast_1d(axes), names):
            curve = r["control_curves"][m]
            ax.plot(range(1, len(curve) + 1), curve, linewidth=1.2)
            ax.set_title(f"{m}: {what.get(m, 'alpha')}", fontsize=8)
            ax.set_xlabel("step")
            ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(dest / f"control_{task}.png")
        plt.close(fig)

    metrics = [k for k in next(iter(r["evidence"].values())) if not k.startswith("vs_")]
    others = [m for m in r["evidence"] if "vs_grpo" in r["evidence"][m]]
    fig, axes = plt.subplots(
        1, len(metrics), figsize=(3.2 * len(metrics), 0.45 * len(others) + 1.4), dpi=120, sharey=True
    )
    for ax, metric in zip(np.atleast_1d(axes), metrics):
        for i, m in enumerate(others):
            d = r["evidence"][m]["vs_grpo"][metric]
            color = "tab:blue" if d["excludes_zero"] else "tab:gray"
            ax.plot([100 * d["low"], 100 * d["high"]], [i, i], color=color, linewidth=2)
            ax.plot([100 * d["value"]], [i], "o", color=color)
        ax.axvline(0, color="k", linewidth=0.8)
        ax.set_title(metric.replace("avg", "Avg@K").replace("pass", "Pass") + " - GRPO (points)", fontsize=9)
        ax.set_yticks(range(len(others)))
        ax.set_yticklabels(others)
        ax.grid(alpha=0.3, axis="x")
    fig.tight_layout()
    fig.savefig(dest / f"differences_{task}.png")
    plt.close(fig)


def summarise(
    out: Path, dest: Path, tasks: list[str], methods: list[str], seeds: int, *, steps: int | None = None
) -> dict:
    cells = load_cells(out, tasks, methods, seeds, steps)
    if not cells:
        raise ValueError(
            f"{out} holds no finished cell of these settings ({', '.join(tasks)}; "
            + (f"{steps} steps" if steps else "each task's own steps")
            + "); a trial run's cells are "
            "summarised with its --steps"
        )
    dest.mkdir(parents=True, exist_ok=True)
    gen = np.random.default_rng(0)
    results = {"methods": {m: METHODS[m] for m in methods}, "tasks": {}}
    md = ["# Study: entropy control on countdown and countdown5 (benchmarks/study.py)", ""]
    for task in tasks:
        r = summarise_task(cells, task, methods, seeds, gen)
        if r is None:
            md.append(f"## {task}: no seed has every method finished yet\n")
            continue
        results["tasks"][task] = r
        md.append(task_markdown(task, r))
        plots(task, r, dest)
    with open(dest / "cells.jsonl", "w") as f:
        for c in cells:
            f.write(json.dumps(c) + "\n")
    (dest / "study.json").write_text(json.dumps(results, indent=1) + "\n")
    (dest / "study.md").write_text("\n".join(md))
    print("\n".join(md))
    return results
