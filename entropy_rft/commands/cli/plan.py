"""`entropy-rft plan`: its options (add) and what it does (run)."""

from __future__ import annotations

import json
import sys

from ..options import positive, whole
from .grammar import add_settings_options, given_sets


def run(args) -> None:
    from ...config import read_recipe, resolve_config
    from ...train.plan import plan_for_config, suggestions

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


def add(command) -> None:
    """The `plan` subcommand's options."""
    pl = command(
        "plan",
        "memory of a recipe's run (weights, gradients, Adam, activations, statistics, vLLM) from "
        "the model's config.json alone; exits 1 when it cannot fit",
        run,
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
