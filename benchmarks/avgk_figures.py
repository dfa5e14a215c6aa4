"""The Avg@K study's figures (docs/prereg_avgk.md) from the analysis's avgk.json (benchmarks/avgk_analysis.py):

- learning_curves.png: each method's Avg@32, Pass@8 and Pass@32 at every evaluation (0, 300, ..., 1,500 steps) with
  their 95% intervals as bands, and its mean token entropy per step with the range over seeds as a band;
- by_stratum.png: the paired Avg@32 and Pass@32 differences of Clip_B and Clip_V against GRPO within each
  initial-difficulty stratum of the evaluation problems, with their 95% intervals.

    python benchmarks/avgk_figures.py [--result benchmarks/study_avgk/avgk.json] [--dest benchmarks/study_avgk]

avgk_analysis.py calls `draw` after writing avgk.json. `draw` returns what it plotted (series per panel), so the
tests can hold the figure to the numbers."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

METRICS = ("avg@32", "pass@8", "pass@32")
COLOURS = {"grpo": "tab:gray", "clip_b": "tab:blue", "clip_v": "tab:orange"}


def draw(result: dict, dest: Path) -> dict:
    """Write learning_curves.png and by_stratum.png into dest; returns {panel: {series: (x, y, low, high)}}."""
    dest.mkdir(parents=True, exist_ok=True)
    plotted: dict = {}
    fig, axes = plt.subplots(1, 4, figsize=(17, 3.8))
    for ax, metric in zip(axes, METRICS):
        plotted[metric] = {}
        for method, curve in result["curves"].items():
            steps = sorted(int(s) for s in curve["evals"])
            evals = [curve["evals"][s if s in curve["evals"] else str(s)][metric] for s in steps]
            pick = {key: [100 * e[key] for e in evals] for key in ("value", "low", "high")}.__getitem__
            y, low, high = pick("value"), pick("low"), pick("high")
            ax.plot(steps, y, marker="o", ms=3, color=COLOURS.get(method), label=method)
            ax.fill_between(steps, low, high, color=COLOURS.get(method), alpha=0.2, lw=0)
            plotted[metric][method] = (steps, y, low, high)
        ax.set_title(f"{metric.replace('avg', 'Avg').replace('pass', 'Pass')} (95% CI)")
        ax.set_xlabel("step")
        ax.set_ylabel("percent")
    ax = axes[3]
    plotted["entropy"] = {}
    for method, curve in result["curves"].items():
        steps = list(range(1, len(curve["entropy_mean"]) + 1))
        ax.plot(steps, curve["entropy_mean"], lw=1, color=COLOURS.get(method), label=method)
        ax.fill_between(steps, curve["entropy_low"], curve["entropy_high"], color=COLOURS.get(method), alpha=0.2, lw=0)
        plotted["entropy"][method] = (steps, curve["entropy_mean"], curve["entropy_low"], curve["entropy_high"])
    ax.set_title("token entropy (mean, range over seeds)")
    ax.set_xlabel("step")
    ax.set_ylabel("nats")
    axes[0].legend()
    fig.suptitle(
        f"{result['task']}: {len(result['seeds'])} seeds x {result['problems']} problems x {result['eval_n']} samples"
    )
    fig.tight_layout()
    fig.savefig(dest / "learning_curves.png", dpi=110)
    plt.close(fig)

    strata = list(result["by_stratum"])
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), sharey=False)
    for ax, metric in zip(axes, ("avg@32", "pass@32")):
        plotted[f"stratum {metric}"] = {}
        for j, method in enumerate(m for m in result["primary"]):
            rows = [result["by_stratum"][s][f"{method} {metric}"] for s in strata]
            x = [i + (j - 0.5) * 0.3 for i in range(len(strata))]
            y = [100 * r["value"] for r in rows]
            err = [[100 * (r["value"] - r["low"]) for r in rows], [100 * (r["high"] - r["value"]) for r in rows]]
            ax.errorbar(x, y, yerr=err, fmt="o", capsize=3, color=COLOURS.get(method), label=f"{method} - grpo")
            plotted[f"stratum {metric}"][method] = (
                strata,
                y,
                [100 * r["low"] for r in rows],
                [100 * r["high"] for r in rows],
            )
        ax.axhline(0, color="black", lw=0.8)
        ax.set_xticks(range(len(strata)))
        ax.set_xticklabels([f"{s}\n({result['by_stratum'][s]['problems']} problems)" for s in strata])
        ax.set_title(f"final {metric.replace('avg', 'Avg').replace('pass', 'Pass')} minus GRPO's, by stratum")
        ax.set_ylabel("points (95% CI)")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(dest / "by_stratum.png", dpi=110)
    plt.close(fig)
    return plotted


def main(argv=None) -> None:
    here = Path(__file__).resolve().parent / "study_avgk"
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--result", default=str(here / "avgk.json"))
    p.add_argument("--dest", default=str(here))
    args = p.parse_args(argv)
    draw(json.loads(Path(args.result).read_text()), Path(args.dest))


if __name__ == "__main__":
    main()
