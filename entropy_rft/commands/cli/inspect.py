"""`entropy-rft inspect`: its options (add) and what it does (run)."""

from __future__ import annotations

import sys
from pathlib import Path

from ..options import steps_list, whole
from .grammar import guard


def run(args) -> None:
    """`entropy-rft inspect RUN_DIR [RUN_DIR ...]`: the runs' token samples as one self-contained HTML page."""
    from ..inspect_page import MAX_STEPS, build_page, default_out

    out = Path(args.out) if args.out else default_out(args.runs)
    if out.is_dir():
        out = out / "inspect.html"
    elif out.suffix != ".html":  # the page is HTML: --out NAME writes NAME.html
        out = out.with_name(out.name + ".html")
    guard(args, out, directory=False, named=True)  # the default page, RUN_DIR/inspect.html, names the run
    from ...logging import read_metrics

    for run_dir in args.runs:  # the page shows samples, but a damaged record is named as every reader names it
        if (Path(run_dir) / "metrics.jsonl").is_file():
            try:
                read_metrics(run_dir)
            except ValueError as err:
                print(f"entropy-rft inspect: warning: {' '.join(str(err).split())}", file=sys.stderr)
    page = build_page(args.runs, out, steps=args.steps, max_steps=args.max_steps or MAX_STEPS)
    print(
        f"wrote {page} ({page.stat().st_size / 1e6:.2f} MB); open it in a browser (it loads nothing from the network)"
    )


def add(command) -> None:
    """The `inspect` subcommand's options."""
    i = command(
        "inspect",
        "one HTML page of runs' token samples: each token coloured by H, S*, S_c or its term of "
        "the entropy change, clipped tokens marked, runs side by side",
        run,
    )
    i.add_argument("runs", nargs="+", help="run directories with samples/ (written when samples_every > 0)")
    i.add_argument(
        "--out",
        default=None,
        help="the page to write (default: RUN_DIR/inspect.html for one run, "
        "inspect.html in the runs' common directory for several)",
    )
    i.add_argument(
        "--steps",
        type=steps_list,
        default=None,
        help="comma-separated steps to show (default: every sampled step, at most --max-steps of them evenly spaced)",
    )
    i.add_argument(
        "--max-steps",
        type=whole(1),
        default=None,
        help="most steps per page when --steps is not given (default: inspect_page.MAX_STEPS, 60)",
    )
