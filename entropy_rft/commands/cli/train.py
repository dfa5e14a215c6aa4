"""`entropy-rft train`: its options (add) and what it does (run)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ..options import setting
from .grammar import add_settings_options, given_sets, out_dir, quiet_option, run_dir_options


def run(args) -> None:
    from ...config import describe, read_recipe, recipe_file, resolve_config
    from ...run.record import check_hand_edits, stored_settings

    if args.help_config:
        print(describe())
        return
    resume = "auto" if args.resume_or_start else args.resume
    recipe = read_recipe(args.config)
    sets = given_sets(args)
    options = {
        k: v for k, v in {"method": args.method, "model": args.model, "steps": args.steps}.items() if v is not None
    }
    if args.quiet:  # else the recipe's or the resumed run's own setting
        options["progress"] = False
    out = args.out or (out_dir(args, "") if args.name else None) or sets.get("out") or recipe.get("out")
    if resume and out is None:
        raise ValueError("--resume needs the run's directory: --out DIR or --name NAME")
    if args.dry_run:
        if resume:
            raise ValueError("--dry-run runs two steps in a scratch directory; it does not resume (drop --resume)")
        from ..pipeline import dry_run

        cfg = resolve_config(recipe, sets, options)
        given = args.out or (out_dir(args, "") if args.name else None)  # never the recipe's own out: a real run's
        scratch = given or f"runs/dry-run/{recipe_file(args.config).stem if args.config else cfg.method}"
        print(json.dumps(dry_run(cfg, scratch, overwrite=args.overwrite or given is None), indent=1))
        print(f"dry run passed: the recipe is valid and ran two steps on the CPU stand-in ({scratch})")
        _print_plan(cfg)
        return
    if resume:  # a config.yaml edited by hand since the run wrote it is refused, or accepted field by field
        check_hand_edits(Path(out), given={*recipe, *sets, *options, "out"})
    base = (stored_settings(Path(out)) or {}) if resume else {}  # resume: the run's own settings, then the changes
    cfg = resolve_config(base, recipe, sets, options, {"out": out} if out else {})
    from ...train.trainer import train  # the one owner of the pre-flight, the memory check and a new directory

    summary = train(cfg, resume=resume, overwrite=args.overwrite)
    run_dir = summary["config"]["out"]
    if summary.get("finished_before"):
        print(f"{run_dir} had already finished its {cfg.steps} steps; nothing to do", file=sys.stderr)
    print(
        json.dumps(
            {
                "run_dir": run_dir,
                "checkpoint": summary["checkpoint"],
                "evals": {k: {m: v[m] for m in ("avg_at_k", "pass_at_k")} for k, v in summary["evals"].items()},
            },
            indent=1,
        )
    )


def _print_plan(cfg) -> None:
    """The recipe's memory plan after a dry run, when its model's config.json can be found (never fails the run)."""
    from ...train.plan import plan_for_config, suggestions

    try:
        plan, shape, kw = plan_for_config(cfg)
    except (FileNotFoundError, ValueError) as err:
        print(f"memory plan skipped: {err}")
        return
    print(plan.table())
    if not plan.fits:
        print("would fit: " + "; ".join(suggestions(cfg, shape, plan, **kw)) + " (`entropy-rft plan --config ...`)")


def add(command) -> None:
    """The `train` subcommand's options."""
    t = command("train", "RL fine-tuning from a flat YAML recipe of TrainConfig fields", run)
    add_settings_options(t, file_kind="flat YAML recipe: TrainConfig fields, one `key: value` a line")
    t.add_argument(
        "--method", default=None, help="token filter / baseline (registry METHODS; default: the recipe's, else grpo)"
    )
    t.add_argument(
        "--model",
        default=None,
        help="policy: shipped name, local directory or hub id (default: the recipe's, else countdown-tiny)",
    )
    t.add_argument("--steps", type=setting("steps"), default=None, help="RL steps (default: the recipe's, else 100)")
    how = run_dir_options(
        t,
        "run",
        "runs/<method>-<YYYYmmdd-HHMMSS>",
        "continue the run in --out/--name from its "
        "newest checkpoint with its own settings (only steps, sinks, progress, save_every, "
        "eval_every and keep_checkpoints may change); refused when there is nothing to resume",
    )
    how.add_argument(
        "--resume-or-start",
        action="store_true",
        help="continue the run in --out/--name if it has a "
        "checkpoint, else start it there (for job scripts that requeue); never replaces another run",
    )
    quiet_option(t)
    t.add_argument("--help-config", action="store_true", help="list every config field with default and help")
    t.add_argument(
        "--dry-run",
        action="store_true",
        help="validate the recipe and run two steps on the CPU with a "
        "tiny stand-in model and synthetic data (in runs/dry-run/<recipe>, replaced each time)",
    )
