"""`entropy-rft demo`: its options (add) and what it does (run)."""

from __future__ import annotations

import shlex
from pathlib import Path

from ...run.stops import RunStopped
from ..options import entries_list, setting
from .grammar import add_settings_options, given_sets, guard, out_dir, quiet_option, run_dir_options


def run(args) -> None:
    from ..demo import run_demo

    if args.resume and args.out is None and args.name is None:
        raise ValueError("--resume needs the demo's directory: --out DIR or --name NAME")
    if args.out is not None:
        guard(args, args.out, ("summary.json", "report.md", "runs", "inspect.html"))
    out = out_dir(args, "demo")
    try:
        summary = run_demo(
            out,
            config=args.config,
            steps=args.steps,
            methods=args.methods,
            sets=given_sets(args, reserved={"out": "--out", "method": "--methods"}),
            progress=False if args.quiet else None,  # else the settings' own (grammar rule 6)
            resume=args.resume,
            overwrite=args.overwrite,
        )
    except RunStopped as stop:  # the demo's own resume, not the stopped method's `train --resume`
        raise SystemExit(f"{stop.line} Continue the demo with `{resume_command(args, out)}`.") from None
    print((Path(out) / "report.md").read_text())
    print(f"wrote {out}/summary.json, report.md and plots in {summary['wall_seconds']:.0f} s")


def resume_command(args, out: Path) -> str:
    """The command that continues this demo: the one given, less --overwrite, with --resume (and --out when the
    directory was chosen for it)."""
    again = [a for a in args.argv if a != "--overwrite"]
    if "--resume" not in again:
        again.append("--resume")
    if args.out is None and args.name is None:
        again += ["--out", str(out)]
    return "entropy-rft " + shlex.join(again)


def add(command) -> None:
    """The `demo` subcommand's options."""
    d = command("demo", "train GRPO, Clip_B and Clip_V on countdown on the CPU and report", run)
    run_dir_options(
        d,
        "the demo's",
        "runs/demo-<YYYYmmdd-HHMMSS>",
        "continue the demo in --out/--name: each "
        "method's run resumes from its newest checkpoint, or is kept when it finished with these settings",
    )
    add_settings_options(
        d,
        file_kind="demo-style YAML (common + methods sections) or a flat recipe (settings shared "
        "by the methods; default: the shipped configs/demo.yaml)",
    )
    d.add_argument(
        "--steps",
        type=setting("steps"),
        default=None,
        help="RL steps of each method (default: the config's, 150 in the shipped demo)",
    )
    d.add_argument(
        "--methods",
        type=entries_list,
        default=None,
        help="comma-separated entries of the demo config's methods (a flat recipe: method names; default: "
        "every entry, or grpo,clip_b,clip_v)",
    )
    quiet_option(d)
