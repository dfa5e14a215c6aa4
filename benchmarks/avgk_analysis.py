"""The pre-registered analysis of issue 31's Avg@K study (docs/prereg_avgk.md): GRPO, Clip_B and Clip_V on
countdown5_large, 5 seeds x 1,500 steps, evaluated every 300 steps on 1,000 held-out problems x 32 samples.

    python benchmarks/avgk_analysis.py --cells runs/study_avgk --dest benchmarks/study_avgk

--cells is the study's run directory (its cells/<task>/<method>/seed<s>-<key>/cell.json, written by
`benchmarks/study.py run --study avgk`) or a cells.jsonl of those records. Writes to --dest: cells.jsonl (the records
analysed), avgk.json (every figure below), avgk.md (the tables) and, through avgk_figures.py, learning_curves.png and
by_stratum.png. What it computes, as pre-registered:
- primary: the final Avg@32 difference Clip_B - GRPO and Clip_V - GRPO, paired by seed and problem, with its 95%
  two-way bootstrap interval and two-sided bootstrap p (entropy_rft/commands/evidence.py, paired_test, 20,000
  replicates),
  Holm-adjusted over the two; a method "raises Avg@32" when its adjusted p < 0.05 and the difference is > 0;
- secondary: the final Pass@8 and Pass@32 differences (Holm over their four), the per-run entropy over the last 10%
  of steps (paired over seeds), and the Avg@32 and Pass@32 differences within each initial-difficulty stratum of the
  evaluation problems (unadjusted, descriptive);
- the learning curves: each method's Avg@32, Pass@8 and Pass@32 with intervals at every evaluation (0, 300, ...,
  1,500), and its mean entropy per step with the range over seeds.
Only seeds whose three methods all finished are used; a record whose settings are not the pre-registered ones
(task, steps, samples per problem, problem count) is refused, naming the cell.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # this checkout's entropy_rft, before an installed one

from entropy_rft.commands.evidence import avg_scores, estimate, holm, paired_test, pass_at_k_scores

TASK = "countdown5_large"
BASELINE = "grpo"
METHODS = ("clip_b", "clip_v")  # compared with the baseline, in this order
STEPS, EVAL_N = 1500, 32
ALPHA = 0.05
REPLICATES_PRIMARY = 20_000
REPLICATES = 4_000
SEED = 31  # the analysis's bootstrap generator
STRATA = ("unsolved", "hard", "easier")  # toy.STRATA, the order of the by-stratum rows


def load_records(path: Path) -> list[dict]:
    """The cell records under a study run directory (cells/*/*/*/cell.json) or in a JSONL file."""
    path = Path(path)
    if path.is_dir():
        return [json.loads(p.read_text()) for p in sorted(path.glob("cells/*/*/*/cell.json"))]
    if path.exists():
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    raise FileNotFoundError(
        f"no study records at {path}: give the run directory of `benchmarks/study.py run --study avgk` or a cells.jsonl"
    )


def load_strata(path: Path) -> list[str]:
    """Each evaluation problem's stratum, in file order (the order of the records' per-problem counts)."""
    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    missing = [i for i, r in enumerate(rows) if "stratum" not in r]
    if missing:
        raise ValueError(
            f"{path}: rows {missing[:5]} have no 'stratum'; build it with `entropy-rft pretrain-toy "
            "--split countdown5_large`"
        )
    return [r["stratum"] for r in rows]


def paired_cells(cells: list[dict], *, problems: int, steps: int = STEPS, n: int = EVAL_N) -> tuple[dict, list[int]]:
    """{(method, seed): record} of this study's task and the seeds whose baseline and compared methods all finished;
    refuses a record with other settings than the pre-registered ones."""
    by = {}
    for c in cells:
        if c["task"] != TASK or c["method"] not in (BASELINE, *METHODS):
            continue
        where = f"cell {c['method']} seed {c['seed']} (key {c.get('key')})"
        if c["steps"] != steps or c["eval_n"] != n or len(c["final_correct"]) != problems:
            raise ValueError(
                f"{where} has steps {c['steps']}, {c['eval_n']} samples, {len(c['final_correct'])} "
                f"problems; the pre-registration fixes {steps}, {n}, {problems}"
            )
        if (c["method"], c["seed"]) in by:
            raise ValueError(f"{where} appears twice; give one record per method and seed")
        by[(c["method"], c["seed"])] = c
    seeds = sorted(s for s in {s for _, s in by} if all((m, s) in by for m in (BASELINE, *METHODS)))
    if len(seeds) < 2:
        raise ValueError(f"need at least 2 seeds with every method finished, got {seeds}")
    return by, seeds


def scores(counts: np.ndarray, n: int) -> dict[str, np.ndarray]:
    """Per (seed, problem) Avg@32 (c / n), Pass@8 and Pass@32 (unbiased, from n samples)."""
    return {
        "avg@32": avg_scores(counts, n),
        "pass@8": pass_at_k_scores(counts, n, 8),
        "pass@32": pass_at_k_scores(counts, n, 32),
    }


def final_entropy(record: dict) -> float:
    """The run's mean token entropy over its last 10% of steps."""
    ent = record["entropy"]
    return float(np.mean(ent[-max(1, len(ent) // 10) :]))


def analyse(
    cells: list[dict],
    strata: list[str],
    *,
    steps: int = STEPS,
    n: int = EVAL_N,
    replicates_primary: int = REPLICATES_PRIMARY,
    replicates: int = REPLICATES,
    seed: int = SEED,
) -> dict:
    """Every pre-registered figure from the records and the evaluation problems' strata (see the module docstring)."""
    by, seeds = paired_cells(cells, problems=len(strata), steps=steps, n=n)
    gen = np.random.default_rng(seed)
    grid = {m: np.array([by[(m, s)]["final_correct"] for s in seeds]) for m in (BASELINE, *METHODS)}
    grid["initial policy"] = np.array([by[(BASELINE, s)]["initial_correct"] for s in seeds])
    sc = {m: scores(g, n) for m, g in grid.items()}

    def test(metric, m, reps, cols=slice(None)):
        est, p = paired_test(sc[m][metric][:, cols], sc[BASELINE][metric][:, cols], gen, samples=n, replicates=reps)
        return {**est.to_json(), "p": p}

    primary = {m: test("avg@32", m, replicates_primary) for m in METHODS}
    for m, adj in holm({m: r["p"] for m, r in primary.items()}).items():
        primary[m]["p_holm"] = adj
        primary[m]["raises"] = adj < ALPHA and primary[m]["value"] > 0
        primary[m]["lowers"] = adj < ALPHA and primary[m]["value"] < 0
    secondary = {f"{m} {k}": test(k, m, replicates) for m in METHODS for k in ("pass@8", "pass@32")}
    for name, adj in holm({k: r["p"] for k, r in secondary.items()}).items():
        secondary[name]["p_holm"] = adj
    ent = {m: np.array([final_entropy(by[(m, s)]) for s in seeds]) for m in (BASELINE, *METHODS)}
    entropy = {}
    for m in ent:
        entropy[m] = {"value": estimate(ent[m], gen, replicates=replicates).to_json()}
        if m != BASELINE:
            d, p = paired_test(ent[m], ent[BASELINE], gen, replicates=replicates)
            entropy[m]["vs_grpo"] = {"difference": d.to_json(), "p": p}
    labels = np.array(strata)
    by_stratum = {}
    for name in sorted(set(strata), key=lambda s: (STRATA.index(s) if s in STRATA else len(STRATA), s)):
        cols = np.flatnonzero(labels == name)
        by_stratum[name] = {
            "problems": int(cols.size),
            **{f"{m} {k}": test(k, m, replicates, cols) for m in METHODS for k in ("avg@32", "pass@32")},
        }
    absolute = {
        m: {k: estimate(v, gen, samples=n, replicates=replicates).to_json() for k, v in sc[m].items()} for m in sc
    }
    return {
        "task": TASK,
        "steps": steps,
        "eval_n": n,
        "seeds": seeds,
        "problems": len(strata),
        "alpha": ALPHA,
        "primary": primary,
        "secondary": secondary,
        "entropy": entropy,
        "by_stratum": by_stratum,
        "absolute": absolute,
        "curves": curves(by, seeds, n, gen, replicates),
    }


def curves(by: dict, seeds: list[int], n: int, gen: np.random.Generator, replicates: int) -> dict:
    """Each method's metrics with intervals at every evaluation step all its seeds have, and its entropy per step
    (mean, lowest and highest over seeds)."""
    out = {}
    for m in (BASELINE, *METHODS):
        recs = [by[(m, s)] for s in seeds]
        steps = sorted(set.intersection(*(set(map(int, r.get("eval_correct", {}))) for r in recs)))
        evals = {}
        for step in steps:
            counts = np.array([r["eval_correct"][str(step)] for r in recs])
            evals[step] = {
                k: estimate(v, gen, samples=n, replicates=replicates).to_json() for k, v in scores(counts, n).items()
            }
        ent = np.array([r["entropy"] for r in recs])
        out[m] = {
            "evals": evals,
            "entropy_mean": ent.mean(0).round(5).tolist(),
            "entropy_low": ent.min(0).round(5).tolist(),
            "entropy_high": ent.max(0).round(5).tolist(),
        }
    return out


def _pt(e: dict, digits: int = 1) -> str:
    return f"{100 * e['value']:+.{digits}f} [{100 * e['low']:+.{digits}f}, {100 * e['high']:+.{digits}f}]"


def markdown(r: dict) -> str:
    """The pre-registered tables, in points (percent), and the conclusion the rule in docs/prereg_avgk.md gives."""
    lines = [
        f"# Avg@K study (issue 31): {r['task']}, {r['steps']} steps, seeds {r['seeds']}, {r['problems']} problems x "
        f"{r['eval_n']} samples",
        "",
        "## Primary: final Avg@32 minus GRPO's (paired by seed and problem)",
        "",
        "| method | difference, points [95% CI] | p | p, Holm over the two | verdict |",
        "|---|---|---|---|---|",
    ]
    for m, e in r["primary"].items():
        verdict = "raises Avg@32" if e["raises"] else "lowers Avg@32" if e["lowers"] else "no difference shown"
        lines.append(f"| {m} | {_pt(e)} | {e['p']:.4f} | {e['p_holm']:.4f} | {verdict} |")
    lines += [
        "",
        "## Secondary",
        "",
        "| comparison | difference, points [95% CI] | p | p, Holm over the four |",
        "|---|---|---|---|",
    ]
    lines += [f"| {k} | {_pt(e)} | {e['p']:.4f} | {e['p_holm']:.4f} |" for k, e in r["secondary"].items()]
    lines += [
        "",
        "| method | Avg@32 | Pass@8 | Pass@32 | entropy, last 10% of steps | - GRPO's (paired over seeds) |",
        "|---|---|---|---|---|---|",
    ]
    for m, a in r["absolute"].items():
        ent = r["entropy"].get(m)
        e_txt = f"{ent['value']['value']:.3f} [{ent['value']['low']:.3f}, {ent['value']['high']:.3f}]" if ent else ""
        d = ent.get("vs_grpo") if ent else None
        d_txt = (
            f"{d['difference']['value']:+.3f} [{d['difference']['low']:+.3f}, {d['difference']['high']:+.3f}] "
            f"(p {d['p']:.3f})"
            if d
            else ""
        )
        lines.append(
            f"| {m} | "
            + " | ".join(
                f"{100 * a[k]['value']:.1f} [{100 * a[k]['low']:.1f}, {100 * a[k]['high']:.1f}]"
                for k in ("avg@32", "pass@8", "pass@32")
            )
            + f" | {e_txt} | {d_txt} |"
        )
    lines += [
        "",
        "By initial-difficulty stratum (the initial policy's pass rate at 64 samples; unadjusted):",
        "",
        "| stratum | problems | " + " | ".join(f"{m} {k}" for m in METHODS for k in ("avg@32", "pass@32")) + " |",
        "|---|---|" + "---|" * (2 * len(METHODS)),
    ]
    for name, s in r["by_stratum"].items():
        lines.append(
            f"| {name} | {s['problems']} | "
            + " | ".join(_pt(s[f"{m} {k}"]) for m in METHODS for k in ("avg@32", "pass@32"))
            + " |"
        )
    lines += [
        "",
        "Intervals: 95%, two-way bootstrap over seeds and problems (entropy_rft/commands/evidence.py); p: two-sided "
        "bootstrap p of the same replicates.",
    ]
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--cells", required=True, help="the study's run directory, or a cells.jsonl")
    p.add_argument(
        "--eval",
        default=str(REPO / "entropy_rft" / "assets" / "countdown-tiny" / "data" / TASK / "eval.jsonl"),
        help="the evaluation problems with their strata",
    )
    p.add_argument("--dest", default=str(REPO / "benchmarks" / "study_avgk"))
    args = p.parse_args(argv)
    cells = load_records(Path(args.cells))
    result = analyse(cells, load_strata(Path(args.eval)))
    dest = Path(args.dest)
    dest.mkdir(parents=True, exist_ok=True)
    used = {(m, s) for m in (BASELINE, *METHODS) for s in result["seeds"]}
    with open(dest / "cells.jsonl", "w") as f:
        for c in cells:
            if c["task"] == TASK and (c["method"], c["seed"]) in used:
                f.write(json.dumps(c) + "\n")
    (dest / "avgk.json").write_text(json.dumps(result, indent=1) + "\n")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from avgk_figures import draw  # learning_curves.png, by_stratum.png

    draw(json.loads((dest / "avgk.json").read_text()), dest)
    md = markdown(result)
    (dest / "avgk.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
