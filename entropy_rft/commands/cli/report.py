"""`entropy-rft report`: its options (add) and what it does (run)."""

from __future__ import annotations

import sys
from pathlib import Path

from .grammar import guard


def run(args) -> None:
    from ...run.record import set_aside_note
    from ..report import REPORT_FILES, build_report

    runs = list({Path(r).resolve(): r for r in args.runs}.values())  # a run given twice is reported once
    for run_dir in runs:  # an --overwrite killed before its first step: the run's record is set aside, not in view
        note = set_aside_note(Path(run_dir))
        if note:
            print(f"entropy-rft report: note: {note}", file=sys.stderr)
    page = build_report(runs, guard(args, args.out, REPORT_FILES))
    print(page.read_text().split("\n## ")[0])
    print(f"wrote {page} and its figures")


def add(command) -> None:
    """The `report` subcommand's options."""
    r = command("report", "the paper's figures from one or more run directories", run)
    r.add_argument("runs", nargs="+", help="run directories written by `entropy-rft train`")
    r.add_argument("--out", default="runs/report", help="directory for report.md and its figures")
