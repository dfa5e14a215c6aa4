"""The TRL adapter (EntropyGRPOTrainer in TRL's own training loop) against the built-in trainer on the same work:
the demo's countdown settings (entropy_rft/integrations/trl_countdown.py maps them), the same method, several seeds.
Not a timing benchmark: it compares what the two runs learn and how the filter behaves, step by step.

For each seed and side it records per step the policy's mean token entropy over every valid response token, the
filter's clipped fraction and the mean reward, and prints, over the seeds, mean and standard deviation of those
quantities averaged over the first, middle and last thirds of training, and of the paired difference (TRL - ours)
with a t-based 95% interval. The two sides draw different samples (different sampling code and random streams), so
agreement is expected in distribution, not step by step.

    python benchmarks/trl_vs_builtin.py [--method clip_b] [--steps 150] [--seeds 0,1,2] [--out runs/trl_vs_builtin]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path

T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}  # t_{0.975, df}


def ours(method: str, steps: int, seed: int, out: Path) -> dict:
    from entropy_rft.config import load_demo_config, run_config
    from entropy_rft.train.trainer import train

    cfg = run_config(
        load_demo_config(),
        method,
        out=str(out),
        steps=steps,
        seed=seed,
        progress=False,
        probe_every=0,
        eval_problems=1,
        eval_k=1,
    )
    history = train(cfg)["history"]
    return {
        "entropy": [m["entropy"] for m in history],
        "clip_frac": [m["clip_frac"] for m in history],
        "reward": [m["reward_mean"] for m in history],
    }


def trl(method: str, steps: int, seed: int, out: Path) -> dict:
    from entropy_rft.integrations.trl_countdown import countdown_trainer

    trainer = countdown_trainer(out, method=method, steps=steps, seed=seed)
    trainer.train()
    logs = [row for row in trainer.state.log_history if "entropy_rft/entropy" in row]
    return {
        "entropy": [r["entropy_rft/entropy"] for r in logs],
        "clip_frac": [r["entropy_rft/frac_clipped"] for r in logs],
        "reward": [r["reward"] for r in logs],
    }


def _sd(xs: list[float]) -> float:
    return statistics.stdev(xs) if len(xs) > 1 else 0.0


def thirds(values: list[float]) -> list[float]:
    n = len(values)
    cuts = [0, n // 3, 2 * n // 3, n]
    return [statistics.fmean(values[a:b]) for a, b in zip(cuts, cuts[1:])]


def interval(xs: list[float]) -> str:
    m = statistics.fmean(xs)
    if len(xs) < 2:
        return f"{m:+.4f}"
    half = T975[len(xs) - 1] * statistics.stdev(xs) / math.sqrt(len(xs))
    return f"{m:+.4f} [{m - half:+.4f}, {m + half:+.4f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--method", default="clip_b")
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--out", default="runs/trl_vs_builtin")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = json.loads((out / "results.json").read_text()) if (out / "results.json").exists() else {}
    for seed in (int(s) for s in args.seeds.split(",")):
        for side, run in (("ours", ours), ("trl", trl)):
            key = f"{args.method}/{side}/{seed}/{args.steps}"
            if key not in results:  # resumable: finished runs are kept in results.json
                results[key] = run(args.method, args.steps, seed, out / key.replace("/", "-"))
                (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
            print(f"done {key}", flush=True)
    seeds = [int(s) for s in args.seeds.split(",")]
    print(
        f"\n{args.method}, {args.steps} steps, seeds {seeds}: mean over the seeds of each third of training "
        "(std across seeds); last column: TRL - ours, paired by seed, with a t-based 95% interval"
    )
    print("| quantity | third | entropy-rft | TRL adapter | TRL - ours |\n|---|---|---|---|---|")
    for q in ("entropy", "clip_frac", "reward"):
        a = [thirds(results[f"{args.method}/ours/{s}/{args.steps}"][q]) for s in seeds]
        b = [thirds(results[f"{args.method}/trl/{s}/{args.steps}"][q]) for s in seeds]
        for t, name in enumerate(("first", "middle", "last")):
            xa, xb = [r[t] for r in a], [r[t] for r in b]
            print(
                f"| {q} | {name} | {statistics.fmean(xa):.4f} ({_sd(xa):.4f}) | {statistics.fmean(xb):.4f} "
                f"({_sd(xb):.4f}) | {interval([y - x for x, y in zip(xa, xb)])} |"
            )


if __name__ == "__main__":
    main()
