"""The grammar every subcommand shares (the rules in entropy_rft/commands/cli/__init__.py): --config and --set, the
run directory options, --out's guard, --quiet, the machine checks."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..options import set_item


def add_settings_options(p: argparse.ArgumentParser, *, file_kind: str | None) -> None:
    """--config (when the subcommand reads a recipe) and --set."""
    if file_kind:
        p.add_argument(
            "--config",
            default=None,
            metavar="YAML",
            help=file_kind + "; a shipped recipe by name too (`entropy-rft recipes` lists them)",
        )
    mirrored = SET_OPTIONS.get(p.prog.split()[-1])
    p.add_argument(
        "--set",
        action="extend",
        nargs="+",
        type=set_item,
        default=[],
        metavar="KEY=VALUE",
        help="override any TrainConfig field; repeatable, later wins per key (`entropy-rft train "
        "--help-config` lists them)"
        if mirrored is None
        else "a TrainConfig field this subcommand "
        f"uses: {', '.join(mirrored)}; repeatable, later wins per key; its own option wins",
    )


# subcommand -> {TrainConfig field: the option (dest) it sets}: --set for subcommands that take no recipe
SET_OPTIONS = {
    "eval": {
        f: f
        for f in (
            "model",
            "task",
            "eval_k",
            "eval_temperature",
            "top_p",
            "max_new_tokens",
            "engine",
            "vllm_gpu_memory",
            "data_dir",
            "eval_problems",
            "seed",
            "device",
        )
    }
    | {"eval_data": "data"},
    "filter": {
        f: f
        for f in (
            "model",
            "task",
            "temperature",
            "max_new_tokens",
            "engine",
            "vllm_gpu_memory",
            "data_dir",
            "seed",
            "device",
        )
    }
    | {"train_data": "data", "group_size": "n"},
    "theory": {f: f for f in ("model", "task", "seed", "device")} | {"train_data": "data"},
    "pretrain-toy": {"seed": "seed"},
}


def apply_sets(args, parser: argparse.ArgumentParser, argv: list[str]) -> None:
    """--set KEY=VALUE of a subcommand in SET_OPTIONS: each key sets the option mirroring it, unless that option is
    given itself (grammar rule 1: the subcommand's own options win); a key it does not use is refused."""
    mirrored = SET_OPTIONS.get(args.command)
    if mirrored is None or not args.set:
        return
    given = {a.split("=", 1)[0] for a in argv if a.startswith("--")}
    actions = {a.dest: a for a in parser._actions}
    for key, value in given_sets(args).items():
        if key not in mirrored:
            raise ValueError(f"--set {key}=...: {args.command} does not use {key}; it takes {', '.join(mirrored)}")
        action = actions[mirrored[key]]
        if action.choices and value not in action.choices:
            raise ValueError(f"--set {key}={value}: {args.command} takes {key} {' or '.join(action.choices)}")
        if not given & set(action.option_strings):
            setattr(args, action.dest, value)


def guard(args, path, writes: tuple[str, ...] = (), *, directory: bool = True, named: bool | None = None) -> Path:
    """rundir.check_output for this subcommand's --out (named: --out given on the command line)."""
    from ...run.rundir import check_output

    if named is None:
        named = any(a == "--out" or a.startswith("--out=") for a in args.argv)
    return check_output(path, command=f"entropy-rft {args.command}", writes=writes, directory=directory, named=named)


def given_sets(args, *, reserved: dict[str, str] | None = None) -> dict:
    """--set items merged (later wins); `reserved` maps keys the subcommand sets itself to the option to use."""
    sets = dict(args.set or [])
    for key, option in (reserved or {}).items():
        if key in sets:
            raise ValueError(f"--set {key}=...: {args.command} sets {key} itself; use {option}")
    return sets


def run_dir_options(p: argparse.ArgumentParser, what: str, default: str, resume_help: str):
    """--out/--name (one of them) and --resume/--overwrite (one of them); returns the latter group."""
    where = p.add_mutually_exclusive_group()
    where.add_argument("--out", default=None, metavar="DIR", help=f"{what} directory (default: a new {default})")
    where.add_argument("--name", default=None, help=f"{what} directory runs/NAME")
    how = p.add_mutually_exclusive_group()
    how.add_argument("--resume", action="store_true", help=resume_help)
    how.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the record in --out/--name (deleted only once the new run is ready to start)",
    )
    return how


def out_dir(args, default_method: str) -> str:
    from ...run.rundir import new_run_dir

    if args.out is not None:
        return args.out
    return str(new_run_dir(default_method, args.name))


def quiet_option(parser) -> None:
    """--quiet, the same on every subcommand that shows progress bars."""
    parser.add_argument("--quiet", action="store_true", help="no progress bars")


def check_machine(args) -> None:
    """The device and the engine's package, before any model loads."""
    from ...config import check_device, check_installed

    check_device(args.device)
    check_installed(getattr(args, "engine", "hf"))
