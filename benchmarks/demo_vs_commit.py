"""The demo's wall time against the same demo at an earlier commit, measured on this machine in one run.

Each demo method (GRPO, Clip_B, Clip_V) runs as `entropy-rft demo --methods M` of the baseline commit (checked out
with `git worktree` into a temporary folder, imported from there with this environment's packages), then of the
working tree, alternating method by method, so a machine that speeds up or slows down during the run (2-core
machines here varied 1.5x within an hour) hits both sides alike. Prints each method's seconds and the ratio.

    python benchmarks/demo_vs_commit.py [--baseline 74c2509] [--methods grpo,clip_b,clip_v]

74c2509 is main before issue 11's work (the demo the issue timed at 682 s).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_demo(source: Path, method: str, out: Path) -> float:
    """Seconds of one demo method run from the package at `source` (a separate process, quiet)."""
    code = (
        f"import sys; sys.path.insert(0, {str(source)!r}); import entropy_rft; "
        f"assert entropy_rft.__file__.startswith({str(source)!r}), entropy_rft.__file__; "
        "from entropy_rft.commands.cli import main; main()"
    )
    t = time.perf_counter()
    subprocess.run(
        [sys.executable, "-c", code, "demo", "--out", str(out), "--methods", method, "--quiet"],
        check=True,
        cwd=source,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return time.perf_counter() - t


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default="74c2509", help="commit to compare against")
    parser.add_argument("--methods", default="grpo,clip_b,clip_v")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        old = Path(tmp) / "baseline"
        subprocess.run(
            ["git", "worktree", "add", "--detach", "-f", str(old), args.baseline],
            cwd=ROOT,
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            rows = []
            for method in args.methods.split(","):
                before = run_demo(old, method, Path(tmp) / "out-old")
                after = run_demo(ROOT, method, Path(tmp) / "out-new")
                rows.append((method, before, after))
                print(
                    f"{method}: {args.baseline} {before:.0f} s, working tree {after:.0f} s, {before / after:.2f}x",
                    flush=True,
                )
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(old)], cwd=ROOT, check=False)
    before, after = sum(r[1] for r in rows), sum(r[2] for r in rows)
    print(f"\nall methods: {args.baseline} {before:.0f} s, working tree {after:.0f} s: {before / after:.2f}x faster")


if __name__ == "__main__":
    main()
