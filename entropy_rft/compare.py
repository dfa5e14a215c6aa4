"""`entropy-rft compare`: several methods x seeds on countdown from the shipped policy, in the shape of the
paper's Table 3: Avg@K and Pass@K (mean and std over seeds, and a 95% interval over seeds and evaluation problems
with each method's paired difference against GRPO, entropy_rft/evidence.py), entropy at the start and the end, and
the entropy curves. Each (method, seed) cell is a run directory; a rerun skips finished cells, so an interrupted
comparison resumes. Shared settings come from the demo config's `common` section, and a method listed under its `methods`
section takes its settings from there too (the demo's mu for Clip_B / Clip_V)."""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import numpy as np

from .demo import load_demo_config, run_config
from .evidence import evaluate_grid, markdown_table
from .logging import read_metrics
from .report import plot_curves

DEFAULT_METHODS = "grpo,clip_b,clip_v,clip_cov,kl_cov,unlikely,forking,entropy_bonus,dapo"


def _mean_std(values: list[float]) -> tuple[float, float]:
    return statistics.mean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def run_compare(methods: list[str], seeds: int, out: Path | str, *, steps: int | None = None,
                config: Path | str | None = None, progress: bool = True, log=print) -> dict:
    from .trainer import train

    out = Path(out)
    spec = load_demo_config(config)
    base = spec.get("common", {})
    t0 = time.time()
    for method in methods:
        for seed in range(seeds):
            run_dir = out / "runs" / method / f"seed{seed}"
            if (run_dir / "eval.json").exists():
                log(f"{method} seed {seed}: done, skipped")
                continue
            train(run_config(spec, method, method=method, seed=base.get("seed", 0) + seed, out=str(run_dir),
                             progress=progress, steps=steps))
    results = summarise(out, methods, seeds)
    results["wall_seconds_this_call"] = time.time() - t0
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    (out / "results.md").write_text(results_table(results))
    curves = {m: r["entropy_curve"] for m, r in results["methods"].items()}
    plot_curves(curves, out / "entropy.png", ylabel="token entropy (mean over seeds)", title="Entropy by method")
    return results


def summarise(out: Path, methods: list[str], seeds: int) -> dict:
    table = {}
    k = None
    for method in methods:
        cells = []
        for seed in range(seeds):
            run_dir = out / "runs" / method / f"seed{seed}"
            evals = {int(a): b for a, b in json.loads((run_dir / "eval.json").read_text()).items()}
            metrics = read_metrics(run_dir)
            first, last = evals[min(evals)], evals[max(evals)]
            k = last["k"]
            ent = [m["entropy"] for m in metrics]
            tail = ent[-max(1, len(ent) // 10):]
            cells.append({"correct": [round(r * last["k"]) for r in last["pass_rates"]],  # of k samples each
                          "correct0": [round(r * first["k"]) for r in first["pass_rates"]],
                          "avg": last["avg_at_k"], "pass": last["pass_at_k"], "avg0": first["avg_at_k"],
                          "pass0": first["pass_at_k"], "H0": ent[0], "H": sum(tail) / len(tail), "curve": ent,
                          "clip": sum(m["clip_frac"] for m in metrics) / len(metrics)})
        width = min(len(c["curve"]) for c in cells)
        table[method] = {
            "avg_at_k": _mean_std([c["avg"] for c in cells]), "pass_at_k": _mean_std([c["pass"] for c in cells]),
            "avg_at_k_before": _mean_std([c["avg0"] for c in cells]),
            "pass_at_k_before": _mean_std([c["pass0"] for c in cells]),
            "entropy_first": _mean_std([c["H0"] for c in cells]), "entropy_final": _mean_std([c["H"] for c in cells]),
            "clip_fraction": _mean_std([c["clip"] for c in cells]),
            "entropy_curve": [sum(c["curve"][i] for c in cells) / len(cells) for i in range(width)],
            "correct": [c["correct"] for c in cells], "correct0": [c["correct0"] for c in cells],
        }
    # intervals over seeds and problems; the initial policy is the same for every method (its seed's evaluation)
    grids = {"initial policy": np.array(table[methods[0]]["correct0"]),
             **{m: np.array(r["correct"]) for m, r in table.items()}}
    evidence = evaluate_grid(grids, k, np.random.default_rng(0), ks=(k,), baseline="grpo")
    return {"k": k, "seeds": seeds, "methods": table, "evidence": evidence}


def results_table(results: dict) -> str:
    k = results["k"]
    lines = [f"# Comparison on countdown ({results['seeds']} seeds, mean ± std)\n",
             f"| Method | Avg@{k} | Pass@{k} | entropy start | entropy end (last 10% of steps) | mean clipped fraction |",
             "|---|---|---|---|---|---|"]
    fmt = lambda ms, scale=100: f"{scale * ms[0]:.2f} ± {scale * ms[1]:.2f}"  # noqa: E731
    first = next(iter(results["methods"].values()))
    lines.append(f"| initial policy | {fmt(first['avg_at_k_before'])} | {fmt(first['pass_at_k_before'])} | | | |")
    for name, r in results["methods"].items():
        lines.append(f"| {name} | {fmt(r['avg_at_k'])} | {fmt(r['pass_at_k'])} | {fmt(r['entropy_first'], 1)} | "
                     f"{fmt(r['entropy_final'], 1)} | {r['clip_fraction'][0]:.4f} |")
    if "evidence" in results:
        lines += ["", "## 95% intervals over seeds and evaluation problems", "", markdown_table(results["evidence"])]
    return "\n".join(lines) + "\n"

