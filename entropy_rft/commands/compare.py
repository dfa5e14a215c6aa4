"""`entropy-rft compare`: several methods x seeds on countdown from the shipped policy, in the shape of the
paper's Table 3: Avg@K and Pass@K (mean and std over seeds, and a 95% interval over seeds and evaluation problems
with each method's paired difference against GRPO, entropy_rft/commands/evidence.py), entropy at the start and the end,
and the curves over steps (entropy.png and reward.png: the mean over seeds with their range shaded; regions.png: the
predicted entropy change split into its four regions, mean over seeds, a panel per method); and `entropy-rft sweep`,
one method over several mu (Figure 2).

Each cell (method, seed; or mu) is a run directory named by a key of its full resolved settings,
OUT/runs/<method>/seed<i>-<key> (config.settings_key: a hash of every field that changes what a run computes), and
its config.yaml holds those settings. A rerun with the same settings skips finished cells and resumes interrupted
ones exactly; a changed setting makes new cells and never reuses a cell trained with other settings. The table
states the settings it rests on. Settings come from a demo-style file (`common`, and a method listed under
`methods` takes its settings from there too, as the demo's mu for Clip_B / Clip_V) or a flat recipe (shared
settings), then --set, then --steps; each cell's seed is the settings' seed plus its index."""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
import time
from pathlib import Path

import numpy as np

from ..config import TrainConfig, settings_key
from ..logging import read_metrics_file
from ..run.checkpoint import RunDirError
from ..run.rundir import RunLock, is_finished
from .evidence import Estimate, evaluate_grid, markdown_table, seed_t_interval

# the per-step series compare averages over seeds for its region figure (train/diagnostics.py logs them on every
# step of every method; entropy_change/realised only on the probed steps)
REGION_KEYS = (
    *(f"entropy_change/by_region/{r}" for r in ("pos_likely", "pos_unlikely", "neg_likely", "neg_unlikely")),
    "entropy_change/predicted",
    "entropy_change/realised",
)
DEFAULT_METHODS = "grpo,clip_b,clip_v,clip_cov,kl_cov,unlikely,forking,entropy_bonus,dapo"


def _mean_std(values: list[float]) -> tuple[float, float]:
    return statistics.mean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def _seed_mean(curves: list[list[float | None]], width: int) -> list[float | None]:
    """The mean over seeds at each of the first `width` steps; None where a seed has no value (a probe-only metric on
    a step it was not probed, a metric the run did not log), so that results.json stays strict JSON."""
    means = []
    for i in range(width):
        values = [curve[i] for curve in curves]
        finite = all(v is not None and math.isfinite(v) for v in values)
        means.append(sum(values) / len(values) if finite else None)  # type: ignore[arg-type]
    return means


def keyed(cfg: TrainConfig, parent: Path, stem: str) -> TrainConfig:
    """cfg with out = PARENT/<stem>-<settings key>."""
    return dataclasses.replace(cfg, out=str(parent / f"{stem}-{settings_key(cfg)}"))


def compare_cells(
    spec: dict,
    methods: list[str],
    seeds: int,
    out: Path,
    *,
    sets: dict | None = None,
    steps: int | None = None,
    progress: bool | None = True,
) -> dict[str, list[TrainConfig]]:
    """{method: [TrainConfig of each seed]}, each with its keyed run directory."""
    from ..config import run_config

    cells = {}
    for method in methods:
        base = run_config(spec, method, sets=sets, method=method, steps=steps, progress=progress, out=str(out))
        cells[method] = [
            keyed(dataclasses.replace(base, seed=base.seed + i), out / "runs" / method, f"seed{i}")
            for i in range(seeds)
        ]
    return cells


def run_cells(cells: list[TrainConfig], log=print) -> None:
    """Train each cell not yet finished (an interrupted one resumes from its checkpoint)."""
    from ..train.trainer import train

    for cfg in cells:
        if is_finished(Path(cfg.out), cfg.steps):
            log(f"{cfg.out}: done, skipped")
            continue
        train(cfg, resume="auto")


def run_compare(
    methods: list[str],
    seeds: int,
    out: Path | str,
    *,
    steps: int | None = None,
    config: Path | str | None = None,
    sets: dict | None = None,
    progress: bool | None = True,
    log=print,
) -> dict:
    from ..config import load_demo_config
    from .report import plot_curves, region_plot

    out = Path(out)
    cells = compare_cells(load_demo_config(config), methods, seeds, out, sets=sets, steps=steps, progress=progress)
    t0 = time.time()
    with RunLock(out):
        run_cells([cfg for per_seed in cells.values() for cfg in per_seed], log=log)
        results = summarise(cells)
        results["wall_seconds_this_call"] = time.time() - t0
        (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
        (out / "results.md").write_text(results_table(results))
        curves = {m: r["entropy_curve"] for m, r in results["methods"].items()}
        bands = {m: r["entropy_band"] for m, r in results["methods"].items()} if seeds > 1 else None
        plot_curves(
            curves,
            out / "entropy.png",
            ylabel="token entropy (mean over seeds)",
            title="Entropy by method" + (" (shaded: range over seeds)" if bands else ""),
            bands=bands,
        )
        plot_curves(
            {m: r["reward_curve"] for m, r in results["methods"].items()},
            out / "reward.png",
            ylabel="training reward (mean over seeds)",
            title="Training reward by method" + (" (shaded: range over seeds)" if bands else ""),
            bands={m: r["reward_band"] for m, r in results["methods"].items()} if bands else None,
        )
        region_plot(
            [{"name": m, "metrics": region_rows(r["regions"])} for m, r in results["methods"].items()],
            out / "regions.png",
            columns=4,
            what=f"mean over {seeds} seed{'s' if seeds > 1 else ''}",
        )
    return results


def region_rows(regions: dict[str, list[float | None]]) -> list[dict]:
    """A method's seed-averaged region series as per-step metric rows (the shape report's region figure reads)."""
    width = len(next(iter(regions.values())))
    return [{"step": i + 1, **{key: values[i] for key, values in regions.items()}} for i in range(width)]


def run_sweep(
    method: str,
    mus: list[float],
    out: Path | str,
    *,
    config: Path | str | None = None,
    steps: int | None = None,
    max_frac: float | None = None,
    sets: dict | None = None,
    progress: bool | None = True,
    log=print,
) -> list[Path]:
    """One run of `method` per mu with the spec's common settings; returns the cells' run directories."""
    from ..config import load_demo_config, run_config

    out = Path(out)
    spec = load_demo_config(config)
    cells = [
        keyed(
            run_config(
                {"common": spec["common"]},
                None,
                sets=sets,
                method=method,
                mu=mu,
                steps=steps,
                progress=progress,
                max_frac=max_frac if method == "clip_v" else None,
                out=str(out),
            ),
            out / "runs",
            f"{method}_mu{mu:g}",
        )
        for mu in mus
    ]
    with RunLock(out):
        run_cells(cells, log=log)
    return [Path(c.out) for c in cells]


def shared_settings(cells: dict[str, list[TrainConfig]]) -> dict:
    """What the table rests on: the settings every cell shares that differ from TrainConfig's defaults, each
    method's own (those not shared; the seed excepted), the seeds, and the cells' directories."""
    from ..config import BOOKKEEPING, _plain

    defaults = _plain(TrainConfig().to_dict())
    flat = {m: [_plain(c.to_dict()) for c in cfgs] for m, cfgs in cells.items()}
    every = [d for ds in flat.values() for d in ds]
    skip = {*BOOKKEEPING, "seed", "method"}
    shared = {k: v for k, v in every[0].items() if k not in skip and all(d[k] == v for d in every)}
    return {
        "shared": {k: v for k, v in shared.items() if v != defaults.get(k)},
        "per_method": {
            m: {k: v for k, v in ds[0].items() if k not in skip and k not in shared} for m, ds in flat.items()
        },
        "seeds": sorted({d["seed"] for d in every}),
        "cells": {m: [f"{Path(c.out).parent.name}/{Path(c.out).name}" for c in cfgs] for m, cfgs in cells.items()},
    }


def summarise(cells: dict[str, list[TrainConfig]]) -> dict:
    table = {}
    k = None
    for method, cfgs in cells.items():
        rows = []
        for cfg in cfgs:
            run_dir = Path(cfg.out)
            evals = {int(a): b for a, b in json.loads((run_dir / "eval.json").read_text()).items()}
            metrics = cell_metrics(run_dir, cfg.steps)
            first, last = evals[min(evals)], evals[max(evals)]
            k = last["k"]
            ent = [m["entropy"] for m in metrics]
            tail = ent[-max(1, len(ent) // 10) :]
            rows.append(
                {
                    "correct": [round(r * last["k"]) for r in last["pass_rates"]],  # of k samples each
                    "correct0": [round(r * first["k"]) for r in first["pass_rates"]],
                    "avg": last["avg_at_k"],
                    "pass": last["pass_at_k"],
                    "avg0": first["avg_at_k"],
                    "pass0": first["pass_at_k"],
                    "H0": ent[0],
                    "H": sum(tail) / len(tail),
                    "curve": ent,
                    "reward": [m["reward_mean"] for m in metrics],
                    "regions": {key: [m.get(key) for m in metrics] for key in REGION_KEYS},
                    "clip": sum(m["clip_frac"] for m in metrics) / len(metrics),
                }
            )
        width = min(len(c["curve"]) for c in rows)
        table[method] = {
            "avg_at_k": _mean_std([c["avg"] for c in rows]),
            "pass_at_k": _mean_std([c["pass"] for c in rows]),
            "avg_at_k_before": _mean_std([c["avg0"] for c in rows]),
            "pass_at_k_before": _mean_std([c["pass0"] for c in rows]),
            "entropy_first": _mean_std([c["H0"] for c in rows]),
            "entropy_final": _mean_std([c["H"] for c in rows]),
            "clip_fraction": _mean_std([c["clip"] for c in rows]),
            "entropy_curve": [sum(c["curve"][i] for c in rows) / len(rows) for i in range(width)],
            "entropy_band": [[min(step), max(step)] for step in zip(*(c["curve"][:width] for c in rows))],
            "entropy_final_seeds": [c["H"] for c in rows],
            "reward_curve": _seed_mean([c["reward"] for c in rows], width),
            "reward_band": [[min(step), max(step)] for step in zip(*(c["reward"][:width] for c in rows))],
            "regions": {key: _seed_mean([c["regions"][key] for c in rows], width) for key in REGION_KEYS},
            "correct": [c["correct"] for c in rows],
            "correct0": [c["correct0"] for c in rows],
        }
    seeds = len(next(iter(cells.values())))
    # intervals over seeds and problems; the initial policy is the same for every method (its seed's evaluation)
    first_method = next(iter(table))
    grids = {
        "initial policy": np.array(table[first_method]["correct0"]),
        **{m: np.array(r["correct"]) for m, r in table.items()},
    }
    evidence = evaluate_grid(grids, k, 0, ks=(k,), baseline="grpo")  # seed 0: each estimate its own stream
    task = next(iter(cells.values()))[0].task
    return {
        "k": k,
        "seeds": seeds,
        "task": task,
        "methods": table,
        "settings": shared_settings(cells),
        "evidence": evidence,
        **({"entropy_evidence": entropy_evidence(table)} if seeds > 1 else {}),
    }


def cell_metrics(run_dir: Path, steps: int) -> list[dict]:
    """A finished cell's metrics rows, one per step 1..steps (logging.read_metrics_file, the reader train --resume
    uses); a cell whose record lacks a step (a cut-off last line, a deleted line) is refused naming the file: its
    entropy would read short, and the table would move without a word."""
    metrics = read_metrics_file(run_dir)
    logged = [row["step"] for row in metrics.rows]
    missing = next((s for s in range(1, steps + 1) if s not in logged), None)
    if missing is None:
        return metrics.rows
    what = metrics.cut_off(missing) or f"{metrics.path} holds no line for step {missing}"
    raise RunDirError(
        f"{what}, though the cell finished its {steps} steps (eval.json): its entropy would read short. Restore the "
        f"file, or delete {run_dir} and compare trains the cell again (its settings and seed make it the same run)"
    )


def entropy_evidence(table: dict, baseline: str = "grpo") -> dict:
    """Each method's final entropy (mean of its last 10% of steps) with the Student-t interval over seeds, and its
    difference from the baseline's paired by seed (cell i of every method starts from seed + i, so their first
    rollouts are the same): evidence.seed_t_interval, as a handful of seeds is too few for the bootstrap."""
    out = {}
    for method, r in table.items():
        row = {"final": seed_t_interval(r["entropy_final_seeds"]).to_json()}
        if baseline in table and method != baseline:
            base = table[baseline]["entropy_final_seeds"]
            row[f"vs_{baseline}"] = seed_t_interval(np.subtract(r["entropy_final_seeds"], base)).to_json()
        out[method] = row
    return out


def results_table(results: dict) -> str:
    k = results["k"]
    lines = [
        f"# Comparison on {results.get('task', 'countdown')} ({results['seeds']} seeds, mean ± std)\n",
        f"| Method | Avg@{k} | Pass@{k} | entropy start | entropy end (last 10% of steps) | mean clipped fraction |",
        "|---|---|---|---|---|---|",
    ]
    fmt = lambda ms, scale=100: f"{scale * ms[0]:.2f} ± {scale * ms[1]:.2f}"  # noqa: E731
    first = next(iter(results["methods"].values()))
    lines.append(f"| initial policy | {fmt(first['avg_at_k_before'])} | {fmt(first['pass_at_k_before'])} | | | |")
    for name, r in results["methods"].items():
        lines.append(
            f"| {name} | {fmt(r['avg_at_k'])} | {fmt(r['pass_at_k'])} | {fmt(r['entropy_first'], 1)} | "
            f"{fmt(r['entropy_final'], 1)} | {r['clip_fraction'][0]:.4f} |"
        )
    settings = results.get("settings")
    if settings:
        show = lambda d: ", ".join(f"{k}={v}" for k, v in d.items()) or "TrainConfig's defaults"  # noqa: E731
        lines += [
            "",
            f"Settings of every cell (besides TrainConfig's defaults): {show(settings['shared'])}.",
            *[f"- {m}: {show(d)}" for m, d in settings["per_method"].items() if d],
            f"Seeds {', '.join(map(str, settings['seeds']))}. Each cell's full settings are its config.yaml: "
            + "; ".join(c for cs in settings["cells"].values() for c in cs)
            + ".",
        ]
    if "evidence" in results:
        lines += ["", "## 95% intervals over seeds and evaluation problems", "", markdown_table(results["evidence"])]
    if "entropy_evidence" in results:
        lines += ["", entropy_table(results["entropy_evidence"], results["seeds"])]
    elif results["seeds"] < 2:
        lines += [
            "",
            "No interval for the final entropy: its Student-t interval over seeds needs at least 2 seeds, and this "
            f"comparison has {results['seeds']} (--seeds 2 or more).",
        ]
    return "\n".join(lines) + "\n"


def entropy_table(evidence: dict, seeds: int, baseline: str = "grpo") -> str:
    """The final entropies and their differences from the baseline, each with its 95% Student-t interval."""
    text = lambda d: Estimate.from_json(d).text(scale=1.0, digits=3)  # noqa: E731
    lines = [
        "## Entropy at the end (mean of the last 10% of steps), 95% Student-t intervals over seeds",
        "",
        f"| method | entropy (nats) | minus {baseline}, paired by seed |",
        "|---|---|---|",
    ]
    for method, row in evidence.items():
        diff = row.get(f"vs_{baseline}")
        star = " *" if diff and diff["excludes_zero"] else ""
        lines.append(f"| {method} | {text(row['final'])} | {text(diff) + star if diff else ''} |")
    lines += [
        "",
        f"Each interval rests on {seeds} seeds (t with {seeds - 1} degrees of freedom, "
        "entropy_rft/commands/evidence.py, departure 4); * marks a difference whose interval excludes 0.",
    ]
    return "\n".join(lines)
