"""One GRPO step of entropy-rft's trainer against TRL's GRPOTrainer on the same work, measured in one process.

The work is the demo's: the shipped countdown policy, 32 prompts x 8 rollouts, at most 16 new tokens, temperature
1.0, token-mean clipped surrogate (TRL's loss_type "dapo"), no KL, one Adam step with gradient clipping at 1.0.
Rounds alternate: K steps of ours (entropy_rft.train.trainer.train, from the initial policy), then K steps of TRL's
(a fresh GRPOTrainer driven one step at a time), so machine noise hits both alike; before the first round each
side runs `--warmup` steps that are discarded, so the process's one-time costs fall on neither. Step i of ours is paired
with step i of TRL's in the same round; the script prints the median of the paired ratios, and a phase breakdown.

TRL's step: `training_step` (generation, rewards and advantages through `_prepare_inputs`, then forward, loss,
backward) + clip + optimizer step, which is what its `train()` runs per step with steps_per_generation 1 and
gradient_accumulation_steps 1, with the run's gradient checkpointing (off), set explicitly: GRPOConfig's default is
on, which Trainer.train() would enable (this script drives the steps itself, and the model's flag stays off either
way, checked on TRL 1.16 for both models). Ours: the
`seconds` metric (rollout to update and diagnostics, evaluation and checkpoints excluded) and its `time/*` phases.

    python benchmarks/step_vs_trl.py [--rounds 3] [--steps 6] [--warmup 2] [--method grpo]

`--model smollm2-135m` (issue 64; `make real-lm`): the packaged real model with its recipe on both sides
(configs/smollm2-135m.yaml: countdown in words as chat turns, at most 64 new tokens, lr 2e-6; TRL gets it through
integrations/trl_countdown.py), each batch of `--prompts` (4 and 8) x 4 rollouts, each torch thread count of
`--threads` (1 and 2), the rounds of every (prompts, threads) cell alternating in one process. It prints, per cell,
the paired ratio and each side's phases (ours: rollout, statistics, update, diagnostics; TRL's: generation and
scoring, then forward, loss, backward and optimizer step).

    python benchmarks/step_vs_trl.py --model smollm2-135m [--prompts 4 8] [--threads 1 2] [--rounds 2] [--steps 2]

`--peak-memory ours|trl` runs one step of that side alone and prints the process's peak resident memory (the 8 x 4
cells need the two sides' peaks together: benchmarks/results/step_vs_trl-smollm2-cpu.log).
"""

from __future__ import annotations

import argparse
import gc
import statistics
import tempfile
import time
from pathlib import Path

import torch

DEMO = "countdown-tiny"


def ours(steps: int, method: str, out: Path, probe_every: int, model: str = DEMO, prompts: int | None = None) -> list:
    from entropy_rft.config import load_demo_config, resolve_config, run_config
    from entropy_rft.train.trainer import train

    common = dict(out=str(out), steps=steps, progress=False, eval_problems=1, eval_k=1, probe_every=probe_every)
    if model == DEMO:
        cfg = run_config(load_demo_config(), method, **common)
    else:  # the packaged model's recipe beneath (config.resolve_config)
        cfg = resolve_config({"model": model, "method": method, **common, "prompts_per_step": prompts or 4})
    history = train(cfg)["history"]
    gc.collect()  # the run's model and optimizer (reference cycles): a real model's cells would pile them up
    return history


def trl_steps(steps: int, out: Path, seed: int, model: str = DEMO, prompts: int | None = None) -> list[dict]:
    from entropy_rft.integrations.trl_countdown import countdown_trainer, run_settings

    # plain GRPOTrainer with the run's settings (trl_countdown's mapping), driven one step at a time
    # the run's gradient checkpointing (off), explicitly: GRPOConfig's default is on (module docstring)
    cfg = run_settings(model)
    extra = {"gradient_checkpointing": cfg.gradient_checkpointing}
    if model != DEMO:  # the recipe's batch but `prompts` prompts of its group size
        extra["per_device_train_batch_size"] = (prompts or cfg.prompts_per_step) * cfg.group_size
    trainer = countdown_trainer(out, method=None, seed=seed, steps=steps, logging_steps=10**6, model=model, **extra)
    args, policy = trainer.args, trainer.model
    trainer.create_optimizer_and_scheduler(num_training_steps=steps)
    batches = iter(trainer.get_train_dataloader())
    generate = trainer._generate_and_score_completions
    spent = []

    def timed_generate(inputs):  # generation, rewards and advantages, as TRL's training_step runs them
        t = time.perf_counter()
        out = generate(inputs)
        spent.append(time.perf_counter() - t)
        return out

    trainer._generate_and_score_completions = timed_generate
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer.train()'s loop, which this script replaces
    policy.train()
    rows = []
    for _ in range(steps):
        batch = next(batches)
        t0 = time.perf_counter()
        trainer.training_step(policy, batch, num_items_in_batch=None)  # generates, then forward and backward
        t1 = time.perf_counter()
        torch.nn.utils.clip_grad_norm_(policy.parameters(), args.max_grad_norm)
        trainer.optimizer.step()
        trainer.optimizer.zero_grad(set_to_none=True)
        t2 = time.perf_counter()
        rows.append(
            {
                "seconds": t2 - t0,
                "time/rollout": spent[-1],
                "time/update": t2 - t0 - spent[-1],
                "time/backward": t1 - t0 - spent[-1],  # forward, loss and backward
                "time/optimizer": t2 - t1,  # clipping and Adam's step
            }
        )
    del trainer, policy, batches
    # a trainer's model, optimizer and accelerator state are cycles (11 GB resident in the second real-model cell
    # without this collection)
    gc.collect()
    return rows


def med(rows, key):
    values = [row[key] for row in rows if key in row]
    return statistics.median(values) if values else float("nan")


def report(label: str, ratios: list[float], ours_rows: list[dict], trl_rows: list[dict]) -> dict:
    """Print one cell's phase table and paired ratio; return them as a dict."""
    print(f"\n{label}: {len(ratios)} pairs, torch threads {torch.get_num_threads()}")
    print("| phase (median s/step) | entropy-rft | TRL GRPOTrainer |")
    print("|---|---|---|")
    print(f"| rollout + scoring | {med(ours_rows, 'time/rollout'):.3f} | {med(trl_rows, 'time/rollout'):.3f} |")
    print(f"| statistics pass | {med(ours_rows, 'time/stats'):.3f} | (in the update) |")
    print(f"| advantages, filter, update | {med(ours_rows, 'time/update'):.3f} | {med(trl_rows, 'time/update'):.3f} |")
    print(f"| of which forward, loss, backward | - | {med(trl_rows, 'time/backward'):.3f} |")
    print(f"| of which clip + optimizer step | - | {med(trl_rows, 'time/optimizer'):.3f} |")
    print(f"| diagnostics | {med(ours_rows, 'time/diagnostics'):.3f} | - |")
    print(f"| step | {med(ours_rows, 'seconds'):.3f} | {med(trl_rows, 'seconds'):.3f} |")
    ratio = statistics.median(ratios)
    q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratio, ratio, ratio]
    print(
        f"our step / TRL's step, median of paired ratios: {ratio:.3f} (quartiles {q[0]:.3f} - {q[2]:.3f})", flush=True
    )
    return {"cell": label, "ratio": ratio, "ours_s": med(ours_rows, "seconds"), "trl_s": med(trl_rows, "seconds")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=6, help="steps per round and side")
    parser.add_argument("--method", default="grpo", help="our method: grpo, clip_b or clip_v (demo settings)")
    parser.add_argument("--warmup", type=int, default=2, help="steps of each side run first and discarded")
    parser.add_argument("--probe-every", type=int, default=0, help="our entropy probe (0: off, as TRL has none)")
    parser.add_argument("--model", default=DEMO, help=f"{DEMO} (the demo's policy) or a packaged model")
    parser.add_argument("--prompts", type=int, nargs="+", default=None, help="packaged model: prompts a step (4 8)")
    parser.add_argument("--threads", type=int, nargs="+", default=None, help="torch threads (packaged model: 1 2)")
    parser.add_argument(
        "--peak-memory",
        choices=("ours", "trl"),
        help="instead: one step of that side alone in this process, on the first --prompts and --threads, and its "
        "peak resident memory (a fresh process per side: the timed cells hold both)",
    )
    args = parser.parse_args()
    if args.peak_memory:
        return peak_memory(args)
    real = args.model != DEMO
    prompts = args.prompts or ([4, 8] if real else [None])
    threads = args.threads or ([1, 2] if real else [torch.get_num_threads()])
    torch.manual_seed(0)
    cells = []
    with tempfile.TemporaryDirectory() as tmp:
        for n_threads in threads:
            torch.set_num_threads(n_threads)
            for n_prompts in prompts:
                label = f"{args.model}" + (f", {n_prompts} x 4 rollouts" if n_prompts else "") + f", {n_threads} thr"
                root = Path(tmp) / f"t{n_threads}p{n_prompts}"
                side = dict(model=args.model, prompts=n_prompts)
                if args.warmup:  # the process's one-time costs (thread pools, allocator, imports) hit neither side
                    ours(args.warmup, args.method, root / "ours-warmup", args.probe_every, **side)
                    trl_steps(args.warmup, root / "trl-warmup", seed=99, **side)
                ratios, ours_rows, trl_rows = [], [], []
                for r in range(args.rounds):
                    a = ours(args.steps, args.method, root / f"ours{r}", args.probe_every, **side)
                    b = trl_steps(args.steps, root / f"trl{r}", seed=r, **side)
                    ratios += [x["seconds"] / y["seconds"] for x, y in zip(a, b)]
                    ours_rows += a
                    trl_rows += b
                    print(
                        f"{label}, round {r + 1}: ours {med(a, 'seconds'):.3f} s/step, "
                        f"TRL {med(b, 'seconds'):.3f} s/step",
                        flush=True,
                    )
                cells.append(report(label, ratios, ours_rows, trl_rows))
    if len(cells) > 1:
        print("\n| cell | ours s/step | TRL s/step | paired ratio |\n|---|---|---|---|")
        for c in cells:
            print(f"| {c['cell']} | {c['ours_s']:.3f} | {c['trl_s']:.3f} | {c['ratio']:.3f} |")


def peak_memory(args) -> None:
    """One step of one side, then the process's peak resident set (getrusage: Linux reports KiB)."""
    import resource

    n_prompts = (args.prompts or ([4] if args.model != DEMO else [None]))[0]
    torch.set_num_threads((args.threads or [torch.get_num_threads()])[0])
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter()
        if args.peak_memory == "ours":
            ours(1, args.method, Path(tmp) / "ours", args.probe_every, model=args.model, prompts=n_prompts)
        else:
            trl_steps(1, Path(tmp) / "trl", seed=0, model=args.model, prompts=n_prompts)
        seconds = time.perf_counter() - t
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    label = f"{args.model}, {n_prompts} x 4 rollouts, {args.peak_memory}"
    print(f"{label}: one step {seconds:.1f} s, peak RSS {peak:.1f} GB")


if __name__ == "__main__":
    main()
