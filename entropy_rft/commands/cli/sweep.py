"""`entropy-rft sweep`: its options (add) and what it does (run)."""

from __future__ import annotations

from ..options import mu_list, setting
from .grammar import add_settings_options, given_sets, guard, quiet_option


def run(args) -> None:
    from ..compare import run_sweep
    from ..report import REPORT_FILES, build_report

    guard(args, args.out, ("runs", *REPORT_FILES))
    runs = run_sweep(
        args.method,
        args.mu,
        args.out,
        config=args.config,
        steps=args.steps,
        max_frac=args.max_frac,
        sets=given_sets(args, reserved={"method": "--method", "mu": "--mu", "out": "--out"}),
        progress=False if args.quiet else None,  # else the settings' own (grammar rule 6)
    )
    page = build_report(runs, args.out)
    print(page.read_text().split("\n## ")[0])


def add(command) -> None:
    """The `sweep` subcommand's options."""
    sw = command("sweep", "clipped fraction and entropy against mu (paper Figure 2) on countdown", run)
    sw.add_argument("--method", choices=["clip_b", "clip_v"], default="clip_b", help="the filter swept")
    sw.add_argument("--mu", type=mu_list, default="0.5,1,1.5,2,2.5", help="comma-separated mu values")
    sw.add_argument("--max-frac", type=setting("max_frac"), default=0.05, help="Clip_V cap for the sweep")
    add_settings_options(
        sw,
        file_kind="demo-style YAML (its `common` settings are used) or a flat recipe; default: "
        "the shipped configs/demo.yaml",
    )
    sw.add_argument("--steps", type=setting("steps"), default=None, help="RL steps per mu (default: the config's)")
    sw.add_argument(
        "--out",
        default="runs/sweep",
        help="directory of the cells (runs/<method>_mu<mu>-<settings key>) "
        "and the report; a rerun reuses only cells with the same settings",
    )
    quiet_option(sw)
