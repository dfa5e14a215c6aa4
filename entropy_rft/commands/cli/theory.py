"""`entropy-rft theory`: its options (add) and what it does (run)."""

from __future__ import annotations

import json
from pathlib import Path

from ..options import positive, setting, whole
from .grammar import add_settings_options, guard


def run(args) -> None:
    import torch

    from ...tasks import TASKS
    from ...train.policy import BUILTIN_MODELS, load_policy, pick_device
    from ...train.problems import load_problems
    from ..theory import Probe, format_table, model_checks, tabular_checks

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


def add(command) -> None:
    """The `theory` subcommand's options."""
    th = command("theory", "check Theorems 1-2 and Corollaries 1-4 numerically", run)
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
