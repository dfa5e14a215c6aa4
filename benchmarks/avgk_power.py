"""The power of the pre-registered Avg@K study (docs/prereg_avgk.md): the smallest true Avg@32 difference it detects
with 80% probability, by simulation with variance components estimated from the committed countdown5 cells.

    python benchmarks/avgk_power.py --out benchmarks/study_avgk/power.json   # about 5 min on one core

1. Components. For each of the issue-24 study's countdown5 comparisons Clip_B - GRPO and Clip_V - GRPO
   (benchmarks/study/cells.jsonl: 5 seeds x 200 problems, final correct counts out of 32), the paired difference of
   per-problem Avg@32, d[s, p], is modelled as mu + a_s + b_p + e_sp (seed, problem, and seed-by-problem interaction
   with the sampling noise of the 32 samples), and the three variances are estimated by the two-way ANOVA method of
   moments without replication (negative estimates set to 0); the two comparisons' estimates are averaged.
2. Simulation. For each true difference delta on a grid, `--sims` studies of the pre-registered size (5 seeds x
   1,000 problems) are drawn as delta + a_s + b_p + e_sp with normal components of those variances, and each is
   tested as the analysis tests it: evidence.paired_test (two-way bootstrap, --replicates 1,000 here). Power is the
   share of studies with p < 0.025 (a bound for Holm over the two comparisons: Holm rejects a hypothesis whenever
   Bonferroni does) and with p < 0.05 (Holm's best case, when the other comparison is rejected as well).
3. The minimum detectable effect at 80% is read off by linear interpolation between grid points; the normal-theory
   figure (z_{1-a/2} + z_0.8) x SE, SE^2 = s_a^2 / S + s_b^2 / P + s_e^2 / (S P), is printed beside it.
4. The amendment (issue 39, docs/prereg_avgk.md): `--amendment` takes the components from the first Avg@K run's own
   records instead (benchmarks/study_avgk/cells.jsonl: 5 seeds x 1,000 problems, 1,500 steps; also on its 561
   problems that did not overlap training, benchmarks/study_avgk/overlap_posthoc.json) and finds, for each, the
   power at --delta for each seed count of --seed-grid and the smallest seed count with 80% power.

    python benchmarks/avgk_power.py --amendment --out benchmarks/study_avgk/power_amendment.json
Limits: the components come from 450-step runs on a 614-problem pool, not from the study's regime. On countdown5
the seed component of both differences is estimated at 0 (the seeds' mean differences spread no more than the
per-problem noise explains), which the longer runs need not repeat; so a second scenario uses the largest seed
component of a difference the committed study shows on either task (countdown, Clip_V - GRPO: variance 1.8e-4, a
seed SD of 1.3 points), with the other two components as measured. Normal components stand in for bounded,
discrete per-problem scores.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from statistics import NormalDist

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # this checkout's entropy_rft, before an installed one

from entropy_rft.commands.evidence import avg_scores, paired_test


def components(d: np.ndarray) -> dict[str, float]:
    """Method-of-moments variances of seed, problem and residual in d (seeds, problems) under d = mu + a_s + b_p +
    e_sp: MS_seed = P var(row means), MS_problem = S var(column means), MS_res from the doubly centred residuals;
    s_e^2 = MS_res, s_a^2 = (MS_seed - MS_res) / P, s_b^2 = (MS_problem - MS_res) / S, each at least 0."""
    d = np.asarray(d, dtype=np.float64)
    s, p = d.shape
    rows, cols, grand = d.mean(1, keepdims=True), d.mean(0, keepdims=True), d.mean()
    ms_seed = p * ((rows - grand) ** 2).sum() / (s - 1)
    ms_prob = s * ((cols - grand) ** 2).sum() / (p - 1)
    ms_res = ((d - rows - cols + grand) ** 2).sum() / ((s - 1) * (p - 1))
    return {"seed": max(0.0, (ms_seed - ms_res) / p), "problem": max(0.0, (ms_prob - ms_res) / s), "residual": ms_res}


def observed_components(cells_path: Path, task: str = "countdown5") -> dict:
    """The components of Clip_B - GRPO and Clip_V - GRPO final Avg@32 on the committed study's task, their mean, and
    the largest seed component of those differences on any task of the study."""
    cells = [json.loads(line) for line in cells_path.read_text().splitlines() if line.strip()]
    by = {(c["method"], c["seed"]): c for c in cells if c["task"] == task}
    seeds = sorted(s for m, s in by if m == "grpo")
    n = by[("grpo", seeds[0])]["eval_n"]
    grid = {
        m: avg_scores(np.array([by[(m, s)]["final_correct"] for s in seeds]), n) for m in ("grpo", "clip_b", "clip_v")
    }
    each = {m: components(grid[m] - grid["grpo"]) for m in ("clip_b", "clip_v")}
    mean = {k: float(np.mean([e[k] for e in each.values()])) for k in ("seed", "problem", "residual")}
    largest = max((components(diff)["seed"], t, m) for t, m, diff in differences(cells))
    return {
        "task": task,
        "seeds": len(seeds),
        "problems": int(grid["grpo"].shape[1]),
        "each": each,
        "mean": mean,
        "largest_seed": {"variance": float(largest[0]), "task": largest[1], "method": largest[2]},
    }


def avgk_components(cells_path: Path, clean: list[bool] | None = None) -> dict:
    """Components of Clip_B - GRPO and Clip_V - GRPO final Avg@32 in the first Avg@K run's records, each and their
    mean, on all problems or on the columns where `clean` is true."""
    cells = [json.loads(line) for line in cells_path.read_text().splitlines() if line.strip()]
    by = {(c["method"], c["seed"]): c for c in cells if c["task"] == "countdown5_large"}
    seeds = sorted(s for m, s in by if m == "grpo")
    n = by[("grpo", seeds[0])]["eval_n"]
    cols = np.flatnonzero(clean) if clean is not None else slice(None)
    grid = {
        m: avg_scores(np.array([by[(m, s)]["final_correct"] for s in seeds]), n)[:, cols]
        for m in ("grpo", "clip_b", "clip_v")
    }
    each = {m: components(grid[m] - grid["grpo"]) for m in ("clip_b", "clip_v")}
    mean = {k: float(np.mean([e[k] for e in each.values()])) for k in ("seed", "problem", "residual")}
    return {"seeds": len(seeds), "problems": int(grid["grpo"].shape[1]), "each": each, "mean": mean}


def amendment(args) -> dict:
    """Power of the clean-pool re-run at args.delta for each seed count of args.seed_grid (module docstring, 4)."""
    overlap = json.loads((REPO / "benchmarks" / "study_avgk" / "overlap_posthoc.json").read_text())
    clean = [s == 0 for s in overlap["orderings_seen"]["countdown5_large"]]
    cells = REPO / "benchmarks" / "study_avgk" / "cells.jsonl"
    gen = np.random.default_rng(2026)
    seeds_grid = [int(x) for x in args.seed_grid.split(",")] if args.seed_grid else []
    result = {
        "delta": args.delta,
        "problems": args.problems,
        "sims": args.sims,
        "replicates": args.replicates,
        "scenarios": {},
    }
    for name, obs in (
        ("first run, all 1,000 problems", avgk_components(cells)),
        ("first run, 561 clean problems", avgk_components(cells, clean)),
    ):
        comp = obs["mean"]
        rows = {}
        for s in seeds_grid:
            rows[s] = power(
                args.delta, comp, seeds=s, problems=args.problems, sims=args.sims, gen=gen, replicates=args.replicates
            )
            print(
                f"{name}: {s} seeds, delta {100 * args.delta:.1f} points: power {rows[s]['bonferroni']:.2f} at "
                f"p < 0.025, {rows[s]['unadjusted']:.2f} at p < 0.05; normal theory MDE "
                f"{100 * normal_mde(comp, s, args.problems, 0.025):.2f} points",
                flush=True,
            )
        enough = [s for s in seeds_grid if rows[s]["bonferroni"] >= 0.8]
        scen = {
            "observed": obs,
            "components": comp,
            "power": rows,
            "fewest_seeds_80_bonferroni": min(enough) if enough else None,
            "normal_mde_80_alpha_0.025": {s: normal_mde(comp, s, args.problems, 0.025) for s in seeds_grid},
        }
        if args.mde_seeds:  # the smallest difference detected with 80% power by a design of --mde-seeds seeds
            grid = [float(x) for x in args.grid.split(",")]
            at = [
                power(
                    d,
                    comp,
                    seeds=args.mde_seeds,
                    problems=args.problems,
                    sims=args.sims,
                    gen=gen,
                    replicates=args.replicates,
                )
                for d in grid
            ]
            scen["mde"] = {
                "seeds": args.mde_seeds,
                "grid": grid,
                "power": at,
                "mde_80_bonferroni": mde(grid, [r["bonferroni"] for r in at]),
                "mde_80_unadjusted": mde(grid, [r["unadjusted"] for r in at]),
            }
            print(
                f"{name}: {args.mde_seeds} seeds: 80% power at {scen['mde']['mde_80_bonferroni']} (p < 0.025), "
                f"{scen['mde']['mde_80_unadjusted']} (p < 0.05)",
                flush=True,
            )
        result["scenarios"][name] = scen
    return result


def differences(cells: list[dict]):
    """(task, method, d) for each task of the study and method Clip_B / Clip_V: d the (seeds, problems) grid of final
    Avg@32 minus GRPO's."""
    for task in sorted({c["task"] for c in cells}):
        by = {(c["method"], c["seed"]): c for c in cells if c["task"] == task}
        seeds = sorted(s for m, s in by if m == "grpo")
        n = by[("grpo", seeds[0])]["eval_n"]
        base = avg_scores(np.array([by[("grpo", s)]["final_correct"] for s in seeds]), n)
        for m in ("clip_b", "clip_v"):
            yield task, m, avg_scores(np.array([by[(m, s)]["final_correct"] for s in seeds]), n) - base


def power(
    delta: float, comp: dict, *, seeds: int, problems: int, sims: int, gen: np.random.Generator, replicates: int = 1000
) -> dict[str, float]:
    """Share of simulated studies whose paired test gives p < 0.025 and p < 0.05."""
    hits_b = hits_u = 0
    for _ in range(sims):
        d = (
            delta
            + gen.normal(0, np.sqrt(comp["seed"]), (seeds, 1))
            + gen.normal(0, np.sqrt(comp["problem"]), (1, problems))
            + gen.normal(0, np.sqrt(comp["residual"]), (seeds, problems))
        )
        _, p = paired_test(d, np.zeros_like(d), gen, replicates=replicates)
        hits_b += p < 0.025
        hits_u += p < 0.05
    return {"bonferroni": hits_b / sims, "unadjusted": hits_u / sims}


def mde(grid: list[float], powers: list[float], target: float = 0.8) -> float | None:
    """The smallest delta at which power reaches target, by linear interpolation on the grid (None: not reached)."""
    for (d0, p0), (d1, p1) in zip(zip(grid, powers), zip(grid[1:], powers[1:])):
        if p0 < target <= p1:
            return d0 + (target - p0) * (d1 - d0) / (p1 - p0)
    return grid[0] if powers and powers[0] >= target else None


def normal_mde(comp: dict, seeds: int, problems: int, alpha: float) -> float:
    se = np.sqrt(comp["seed"] / seeds + comp["problem"] / problems + comp["residual"] / (seeds * problems))
    return float((NormalDist().inv_cdf(1 - alpha / 2) + NormalDist().inv_cdf(0.8)) * se)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--cells", default=str(REPO / "benchmarks" / "study" / "cells.jsonl"))
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--problems", type=int, default=1000)
    p.add_argument("--sims", type=int, default=200)
    p.add_argument("--replicates", type=int, default=1000, help="bootstrap replicates per simulated test")
    p.add_argument("--grid", default="0,0.005,0.01,0.015,0.02,0.03,0.04", help="true differences (Avg@32, 0-1)")
    p.add_argument("--out", default=None, help="write the figures as JSON here")
    p.add_argument(
        "--amendment",
        action="store_true",
        help="issue 39: components from the first Avg@K run, power at --delta over --seed-grid (module docstring, 4)",
    )
    p.add_argument("--delta", type=float, default=0.015, help="with --amendment: the true difference (Avg@32, 0-1)")
    p.add_argument("--seed-grid", default="5,8,10,12,15,20", help="with --amendment: seed counts ('' for none)")
    p.add_argument(
        "--mde-seeds",
        type=int,
        default=0,
        help="with --amendment: also the 80%%-power difference over --grid for a design of this many seeds",
    )
    args = p.parse_args()
    if args.amendment:
        result = amendment(args)
        if args.out:
            Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
        return
    obs = observed_components(Path(args.cells))
    print(json.dumps(obs, indent=1))
    gen = np.random.default_rng(2026)
    grid = [float(x) for x in args.grid.split(",")]
    result = {
        "observed": obs,
        "design": {"seeds": args.seeds, "problems": args.problems},
        "sims": args.sims,
        "grid": grid,
        "scenarios": {},
    }
    for name, comp in (
        ("as measured", obs["mean"]),
        ("largest seed component", {**obs["mean"], "seed": obs["largest_seed"]["variance"]}),
    ):
        rows = [
            power(
                d, comp, seeds=args.seeds, problems=args.problems, sims=args.sims, gen=gen, replicates=args.replicates
            )
            for d in grid
        ]
        scen = {
            "components": comp,
            "power": rows,
            "mde_80_bonferroni": mde(grid, [r["bonferroni"] for r in rows]),
            "mde_80_unadjusted": mde(grid, [r["unadjusted"] for r in rows]),
            "normal_mde_80_alpha_0.025": normal_mde(comp, args.seeds, args.problems, 0.025),
            "normal_mde_80_alpha_0.05": normal_mde(comp, args.seeds, args.problems, 0.05),
        }
        result["scenarios"][name] = scen
        print(
            f"{name}: "
            + ", ".join(
                f"delta {100 * d:.1f}: {r['bonferroni']:.2f} / {r['unadjusted']:.2f}" for d, r in zip(grid, rows)
            )
        )
        print(
            f"  80% power at p < 0.025 (Holm bound): {scen['mde_80_bonferroni']}; at p < 0.05: "
            f"{scen['mde_80_unadjusted']}; normal theory {scen['normal_mde_80_alpha_0.025']:.4f} / "
            f"{scen['normal_mde_80_alpha_0.05']:.4f}"
        )
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
