"""`entropy-rft compare`: its options (add) and what it does (run)."""

from __future__ import annotations

from pathlib import Path

from ..options import methods_list, setting, whole
from .grammar import add_settings_options, given_sets, guard, quiet_option


def run(args) -> None:
    from ..compare import run_compare

    guard(args, args.out, ("runs", "results.json", "results.md", "entropy.png"))
    run_compare(
        args.methods,
        args.seeds,
        args.out,
        steps=args.steps,
        config=args.config,
        sets=given_sets(args, reserved={"method": "--methods", "out": "--out"}),
        progress=False if args.quiet else None,  # else the settings' own (grammar rule 6)
    )
    print((Path(args.out) / "results.md").read_text())


def add(command) -> None:
    """The `compare` subcommand's options."""
    from ..compare import DEFAULT_METHODS

    c = command("compare", "methods x seeds on countdown: Avg@K, Pass@K, entropy (paper Table 3)", run)
    c.add_argument("--methods", type=methods_list, default=DEFAULT_METHODS, help="comma-separated method names")
    c.add_argument("--seeds", type=whole(1), default=3, help="seeds per method (the settings' seed, +1, +2, ...)")
    c.add_argument(
        "--steps",
        type=setting("steps"),
        default=None,
        help="RL steps per cell (default: the config's, 150 in the shipped demo)",
    )
    add_settings_options(
        c,
        file_kind="demo-style YAML (shared `common` and per-method settings) or a flat recipe "
        "(shared settings); default: the shipped configs/demo.yaml",
    )
    c.add_argument(
        "--out",
        default="runs/compare",
        help="directory of the cells (runs/<method>/seed<i>-<settings "
        "key>) and the table; a rerun reuses only cells with the same settings",
    )
    quiet_option(c)
