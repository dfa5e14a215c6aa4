"""`entropy-rft demo`: GRPO, GRPO+Clip_B and GRPO+Clip_V from the shipped tiny policy on countdown, evaluated
before and after (Avg@K, Pass@K at temperature 0.7), with a Table-1-shaped report, entropy / clipped-fraction
plots and the token view of the three runs (inspect.html). Settings: entropy_rft/configs/demo.yaml (TrainConfig
overrides)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import yaml

from .config import load_config
from .inspect_page import build_page
from .report import plot_curves, table1
from .trainer import train

DEMO_CONFIG = Path(__file__).parent / "configs" / "demo.yaml"


def load_demo_config(path: Path | str | None = None) -> dict:
    data = yaml.safe_load(Path(path or DEMO_CONFIG).read_text())
    if not isinstance(data, dict) or "methods" not in data:
        raise ValueError(f"{path}: a demo config needs 'common' and 'methods' mappings")
    return data


def run_config(spec: dict, entry: str | None = None, **overrides):
    """TrainConfig from a demo-style spec: its `common` settings, then `methods[entry]` (when listed), then the
    overrides; None overrides (an option not given) leave the spec's value in place."""
    given = {k: v for k, v in overrides.items() if v is not None}
    return load_config(None, **{**spec.get("common", {}), **spec.get("methods", {}).get(entry, {}), **given})


def run_demo(out: Path | str, *, config: Path | str | None = None, steps: int | None = None,
             methods: list[str] | None = None, progress: bool = True) -> dict:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    spec = load_demo_config(config)
    chosen = methods or list(spec["methods"])
    t0 = time.time()
    results: dict[str, dict] = {}
    for name in chosen:
        if name not in spec["methods"]:
            raise KeyError(f"demo method {name!r} is not in the demo config; known: {', '.join(spec['methods'])}")
        cfg = run_config(spec, name, out=str(out / "runs" / name), progress=progress, steps=steps)
        summary = train(cfg)
        first, last = summary["evals"][0], summary["evals"][cfg.steps]
        history = summary["history"]
        results[name] = {
            "entropy": [m["entropy"] for m in history],
            "clip_fraction": [m["clip_frac"] for m in history],
            "reward": [m["reward_mean"] for m in history],
            "avg_at_k_before": first["avg_at_k"], "avg_at_k_after": last["avg_at_k"],
            "pass_at_k_before": first["pass_at_k"], "pass_at_k_after": last["pass_at_k"],
            "run_dir": cfg.out,
        }
        k = cfg.eval_k
    summary = {"k": k, "wall_seconds": time.time() - t0, "methods": results}
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    plot_curves({n: r["entropy"] for n, r in results.items()}, out / "entropy.png",
                ylabel="token entropy (all valid response tokens)", title="Entropy during RL on countdown")
    plot_curves({n: r["clip_fraction"] for n, r in results.items()}, out / "clip_fraction.png",
                ylabel="clipped fraction of tokens", title="Tokens removed by the method's filter")
    plot_curves({n: r["reward"] for n, r in results.items()}, out / "reward.png", ylabel="mean reward")
    first = next(iter(results.values()))
    rows = [(n, r["avg_at_k_after"], r["pass_at_k_after"]) for n, r in results.items()]
    report = [
        "# entropy-rft demo: countdown, shipped tiny policy\n",
        table1(rows, k=k, initial=(first["avg_at_k_before"], first["pass_at_k_before"])),
        "\n| Method | entropy first step | entropy last step | mean clipped fraction |\n|---|---|---|---|",
        *[f"| {n} | {r['entropy'][0]:.4f} | {r['entropy'][-1]:.4f} | {sum(r['clip_fraction']) / len(r['clip_fraction']):.5f} |"
          for n, r in results.items()],
        f"\nWall time: {summary['wall_seconds']:.0f} s. Plots: entropy.png, clip_fraction.png, reward.png. "
        "Per-step metrics: runs/<method>/metrics.jsonl.\n",
    ]
    inspector = build_page([r["run_dir"] for r in results.values()], out / "inspect.html",
                           title="entropy-rft demo: countdown, the same seed under each method")
    report.append(f"Token view: {inspector.name} (each sampled step's tokens coloured by H, S*, S_c or their term of the "
                  "entropy change, the tokens each method clipped marked; `entropy-rft inspect`).\n")
    (out / "report.md").write_text("\n".join(report))
    return summary
