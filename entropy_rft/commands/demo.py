"""`entropy-rft demo`: GRPO, GRPO+Clip_B and GRPO+Clip_V from the shipped tiny policy on countdown, evaluated
before and after (Avg@K, Pass@K at temperature 0.7), with a Table-1-shaped report, entropy / clipped-fraction
plots and the token view of the three runs (inspect.html). Settings: entropy_rft/configs/demo.yaml (TrainConfig
overrides: `common`, then each entry of `methods`), or another demo-style file, or a flat recipe (shared settings
for grpo, clip_b and clip_v); then --set and --steps. The demo's directory follows the run-directory rules
(entropy_rft/run/rundir.py): an earlier demo there is continued (--resume) or replaced (--overwrite), never silently
mixed with a new one."""

from __future__ import annotations

import json
import time
from pathlib import Path

from ..config import load_demo_config, run_config
from ..run.checkpoint import RunDirError
from ..run.rundir import RunLock, record_entries
from ..train.trainer import train
from .inspect_page import build_page
from .report import plot_curves, table1

DEFAULT_METHODS = ("grpo", "clip_b", "clip_v")  # a flat recipe's demo


def run_demo(
    out: Path | str,
    *,
    config: Path | str | None = None,
    steps: int | None = None,
    methods: list[str] | None = None,
    sets: dict | None = None,
    progress: bool | None = True,
    resume: bool = False,
    overwrite: bool = False,
) -> dict:
    """Train each of the demo's methods into OUT/runs/<entry> and write summary.json, report.md and plots. A
    directory holding an earlier demo is refused unless resume (each method continues, or is kept when finished
    with the same settings) or overwrite (each method's run is replaced)."""
    out = Path(out)
    spec = load_demo_config(config)
    chosen = methods or list(spec["methods"]) or list(DEFAULT_METHODS)
    if spec["methods"]:
        unknown = [n for n in chosen if n not in spec["methods"]]
        if unknown:
            raise KeyError(f"demo method {unknown[0]!r} is not in the demo config; known: {', '.join(spec['methods'])}")
    configs = {
        name: run_config(spec, name, sets=sets, out=str(out / "runs" / name), progress=progress, steps=steps)
        for name in chosen
    }  # every config is checked before any training
    with RunLock(out):
        earlier = [
            p for p in [out / "summary.json", *(out / "runs" / n for n in chosen)] if (p.is_file() or record_entries(p))
        ]
        if earlier and not (resume or overwrite):
            raise RunDirError(
                f"{out} holds an earlier demo ({', '.join(str(p.relative_to(out)) for p in earlier)}); "
                "continue it with --resume, replace it with --overwrite, or choose a new --out/--name"
            )
        return _run_demo(out, configs, resume=resume, overwrite=overwrite)


def _run_demo(out: Path, configs: dict, *, resume: bool, overwrite: bool) -> dict:
    t0 = time.time()
    results: dict[str, dict] = {}
    for name, cfg in configs.items():
        summary = train(cfg, resume="auto" if resume else False, overwrite=overwrite)
        first, last = summary["evals"][0], summary["evals"][cfg.steps]
        history = summary["history"]
        results[name] = {
            "entropy": [m["entropy"] for m in history],
            "clip_fraction": [m["clip_frac"] for m in history],
            "reward": [m["reward_mean"] for m in history],
            "avg_at_k_before": first["avg_at_k"],
            "avg_at_k_after": last["avg_at_k"],
            "pass_at_k_before": first["pass_at_k"],
            "pass_at_k_after": last["pass_at_k"],
            "run_dir": cfg.out,
        }
        k = cfg.eval_k
    summary = {"k": k, "wall_seconds": time.time() - t0, "methods": results}
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    plot_curves(
        {n: r["entropy"] for n, r in results.items()},
        out / "entropy.png",
        ylabel="token entropy (all valid response tokens)",
        title="Entropy during RL on countdown",
    )
    plot_curves(
        {n: r["clip_fraction"] for n, r in results.items()},
        out / "clip_fraction.png",
        ylabel="clipped fraction of tokens",
        title="Tokens removed by the method's filter",
    )
    plot_curves({n: r["reward"] for n, r in results.items()}, out / "reward.png", ylabel="mean reward")
    first = next(iter(results.values()))
    rows = [(n, r["avg_at_k_after"], r["pass_at_k_after"]) for n, r in results.items()]
    report = [
        "# entropy-rft demo: countdown, shipped tiny policy\n",
        table1(rows, k=k, initial=(first["avg_at_k_before"], first["pass_at_k_before"])),
        "\n| Method | entropy first step | entropy last step | mean clipped fraction |\n|---|---|---|---|",
        *[
            f"| {n} | {r['entropy'][0]:.4f} | {r['entropy'][-1]:.4f} "
            f"| {sum(r['clip_fraction']) / len(r['clip_fraction']):.5f} |"
            for n, r in results.items()
        ],
        f"\nWall time: {summary['wall_seconds']:.0f} s. Plots: entropy.png, clip_fraction.png, reward.png. "
        "Per-step metrics: runs/<method>/metrics.jsonl.\n",
    ]
    inspector = build_page(
        [r["run_dir"] for r in results.values()],
        out / "inspect.html",
        title="entropy-rft demo: countdown, the same seed under each method",
    )
    report.append(
        f"Token view: {inspector.name} (each sampled step's tokens coloured by H, S*, S_c or their term of the "
        "entropy change, the tokens each method clipped marked; `entropy-rft inspect`).\n"
    )
    (out / "report.md").write_text("\n".join(report))
    return summary
