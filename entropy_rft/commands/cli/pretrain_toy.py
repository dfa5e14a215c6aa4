"""`entropy-rft pretrain-toy`: its options (add) and what it does (run)."""

from __future__ import annotations

import json
from pathlib import Path

from ..options import setting, whole
from .grammar import add_settings_options, guard, quiet_option


def run(args) -> None:
    from ...toy import PoolConfig, ToyConfig, build_pool_split, pretrain
    from ...train.policy import load_policy

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


def add(command) -> None:
    """The `pretrain-toy` subcommand's options."""
    pt = command("pretrain-toy", "rebuild the shipped tiny countdown policy and its data splits", run)
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
