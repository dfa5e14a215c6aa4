"""Command line: entropy-rft demo | train | plan | eval | filter | compare | report | inspect | theory | sweep |
pretrain-toy | recipes (and --version).

One grammar for every subcommand:
1. Settings are TrainConfig fields, layered, later winning per key: a recipe (--config, a file or a shipped recipe's
   name), then --set KEY=VALUE (repeatable, merged), then the subcommand's own options. train and plan take a flat
   recipe; demo, compare and sweep take a demo-style file (`common` + `methods`) or a flat recipe (their shared
   settings); a file of the wrong kind is refused naming the subcommands that take it. eval, filter, theory and
   pretrain-toy take no recipe: their --set takes the fields their options mirror (SET_OPTIONS).
2. An option that mirrors a TrainConfig field carries the field's name (eval --eval-k, --eval-temperature,
   --eval-problems, --vllm-gpu-memory) and the field's own rules (config.check_values). Departure: eval's old
   spellings --k, --temperature, --limit and --vllm-memory (and filter's --vllm-memory) still work, with a note.
3. A bad value exits with code 2 and one line naming the option or setting and the fix, never a traceback; values,
   the device, optional packages (vLLM, TensorBoard, W&B) and the run directory are checked before any model loads.
4. A run directory is one run's record (entropy_rft/run/rundir.py): train and demo write a new runs/<method>-<time>
   unless given --out or --name, and refuse another run's record unless told --resume, --resume-or-start or
   --overwrite. compare and sweep key each cell by its settings, so a rerun continues its own cells only. Every
   other output path follows one rule (rundir.check_output): never a file of a run's record, never into a live
   run's directory or a run's directory at all unless the path was named.
5. --help shows every option with its default.
6. Every subcommand that draws progress bars (demo, train, eval, filter, compare, sweep, pretrain-toy) takes --quiet
   to draw none; train's, demo's, compare's and sweep's is their `progress` setting, so a recipe's `progress: false`
   (or --set progress=false) stays off without it.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import warnings

from ... import __version__
from . import compare, demo, eval, filter, inspect, plan, pretrain_toy, recipes, report, sweep, theory, train
from .grammar import apply_sets

# the subcommands' modules, each with add(command) (its options) and run(args), in --help's order
SUBCOMMANDS = (demo, train, plan, eval, filter, compare, report, inspect, theory, sweep, pretrain_toy, recipes)

# old spellings still accepted (grammar departure 2): subcommand -> {old: new}
RENAMED = {
    "eval": {
        "--k": "--eval-k",
        "--temperature": "--eval-temperature",
        "--limit": "--eval-problems",
        "--vllm-memory": "--vllm-gpu-memory",
    },
    "filter": {"--vllm-memory": "--vllm-gpu-memory"},
}


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors: what is wrong and where the options are listed (no usage block)."""

    def error(self, message: str):
        hint = "" if "--help" in message else f" (`{self.prog} --help` lists every option)"
        self.exit(2, f"{self.prog}: error: {suggest(self, message)}{hint}\n")


def suggest(parser: argparse.ArgumentParser, message: str) -> str:
    """argparse's message with the close match of a mistyped choice or option: `invalid choice: 'trian'` and
    `unrecognized arguments: --metod` gain "(did you mean ...?)" (registry.did_you_mean, the one rule)."""
    import re

    from ...core.registry import did_you_mean

    choice = re.match(r"argument (\S+): invalid choice: '([^']*)' \(choose from (.*)\)$", message)
    if choice:
        known = [c.strip(" '") for c in choice.group(3).split(",")]
        return message + did_you_mean(choice.group(2), known)
    if message.startswith("unrecognized arguments: "):
        options = [o for a in parser._actions for o in a.option_strings]
        # options share their leading "--", so a closer match is asked of them than of names
        hints = [
            arg + (did_you_mean(arg.split("=", 1)[0], options, cutoff=0.75) if arg.startswith("-") else "")
            for arg in message.split(": ", 1)[1].split()
        ]
        return "unrecognized arguments: " + " ".join(hints)
    return message


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Each option's help ends with its default, unless the help already says it or there is none to show."""

    def _get_help_string(self, action):
        text = action.help or ""
        if (
            "default" in text
            or not action.option_strings
            or action.default is None
            or action.default is False
            or action.default in ([], argparse.SUPPRESS)
            or action.nargs == 0
        ):
            return text
        return text + " (default: %(default)s)"


def build_parser() -> argparse.ArgumentParser:
    """The parser of every subcommand (SUBCOMMANDS); each sets `fn`, its run(args)."""
    p = Parser(
        prog="entropy-rft",
        formatter_class=HelpFormatter,
        description="Reinforcement fine-tuning with entropy control (entropy-discriminator clipping, arXiv 2602.03392)",
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = p.add_subparsers(dest="command", required=True, parser_class=Parser)

    def command(name: str, help: str, fn) -> argparse.ArgumentParser:
        sp = sub.add_parser(name, help=help, description=help, formatter_class=HelpFormatter)
        sp.set_defaults(fn=fn)
        return sp

    for module in SUBCOMMANDS:  # one module per subcommand, in --help's order
        module.add(command)
    return p


def _note_renamed(command: str, argv: list[str]) -> None:
    for arg in argv:
        old = arg.split("=", 1)[0]
        if old in RENAMED.get(command, {}):
            print(
                f"entropy-rft {command}: note: {old} is now {RENAMED[command][old]} (the TrainConfig name); the old "
                "spelling still works",
                file=sys.stderr,
            )


def main(argv: list[str] | None = None) -> None:
    from ...run.checkpoint import RunDirError
    from ...run.stops import NonFinite

    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    if not argv:  # a bare `entropy-rft`: what it can do, not an error
        parser.print_help()
        raise SystemExit(0)
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # refused by the subcommand's parser, so that the error names its options and its --help
        parser._subparsers._group_actions[0].choices[args.command].error(f"unrecognized arguments: {' '.join(unknown)}")
    args.argv = argv
    _note_renamed(args.command, argv)
    shown = warnings.showwarning
    warnings.showwarning = functools.partial(_show_warning, args.command, shown)
    try:
        apply_sets(args, parser._subparsers._group_actions[0].choices[args.command], argv)
        args.fn(args)
    except BrokenPipeError:  # the reader closed the pipe (`entropy-rft recipes | head`): nothing went wrong here
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error when Python flushes stdout
        raise SystemExit(0) from None
    except (FileNotFoundError, KeyError, ValueError, OSError, ImportError, RunDirError, NonFinite) as err:
        msg = err.args[0] if isinstance(err, KeyError) and err.args else err
        print(f"entropy-rft {args.command}: error: {' '.join(str(msg).split())}", file=sys.stderr)
        raise SystemExit(2) from None
    except KeyboardInterrupt as err:  # before a run started (a started run saves and exits from the trainer)
        print(
            f"entropy-rft {args.command}: {getattr(err, 'name', 'SIGINT')} before any step; no run record was changed",
            file=sys.stderr,
        )
        raise SystemExit(128 + getattr(err, "signum", 2)) from None
    finally:
        warnings.showwarning = shown


def _show_warning(command: str, shown, message, category, filename, lineno, file=None, line=None) -> None:
    """A SettingWarning as one line naming the subcommand (`entropy-rft train: warning: lr=0: ...`); any other
    warning as Python shows it."""
    from ...recipes import SettingWarning

    if issubclass(category, SettingWarning):
        print(f"entropy-rft {command}: warning: {message}", file=sys.stderr)
    else:
        shown(message, category, filename, lineno, file, line)
