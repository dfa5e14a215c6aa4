"""One GRPO step of entropy-rft's trainer against TRL's GRPOTrainer on the same work, measured in one process.

The work is the demo's: the shipped countdown policy, 32 prompts x 8 rollouts, at most 16 new tokens, temperature
1.0, token-mean clipped surrogate (TRL's loss_type "dapo"), no KL, one Adam step with gradient clipping at 1.0.
Rounds alternate: K steps of ours (entropy_rft.trainer.train, from the initial policy), then K steps of TRL's
(a fresh GRPOTrainer driven one step at a time), so machine noise hits both alike; before the first round each
side runs `--warmup` steps that are discarded, so the process's one-time costs fall on neither. Step i of ours is paired
with step i of TRL's in the same round; the script prints the median of the paired ratios, and a phase breakdown.

TRL's step: `training_step` (generation, rewards and advantages through `_prepare_inputs`, then forward, loss,
backward) + clip + optimizer step, which is what its `train()` runs per step with steps_per_generation 1 and
gradient_accumulation_steps 1. Ours: the `seconds` metric (rollout to update and diagnostics, evaluation and
checkpoints excluded) and its `time/*` phases.

    python benchmarks/step_vs_trl.py [--rounds 3] [--steps 6] [--warmup 2] [--method grpo]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch


def ours(steps: int, method: str, out: Path, probe_every: int) -> list[dict]:
    from entropy_rft.commands.demo import load_demo_config, run_config
    from entropy_rft.trainer import train

    cfg = run_config(
        load_demo_config(),
        method,
        out=str(out),
        steps=steps,
        progress=False,
        eval_problems=1,
        eval_k=1,
        probe_every=probe_every,
    )
    return train(cfg)["history"]


def trl_steps(steps: int, out: Path, seed: int) -> list[dict]:
    from entropy_rft.integrations.trl_countdown import countdown_trainer

    # plain GRPOTrainer with the demo's settings (trl_countdown's mapping), driven one step at a time
    trainer = countdown_trainer(out, method=None, seed=seed, steps=steps, logging_steps=10**6)
    args, model = trainer.args, trainer.model
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
    model.train()
    rows = []
    for _ in range(steps):
        batch = next(batches)
        t0 = time.perf_counter()
        trainer.training_step(model, batch, num_items_in_batch=None)  # generates, then forward and backward
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm)
        trainer.optimizer.step()
        trainer.optimizer.zero_grad(set_to_none=True)
        seconds = time.perf_counter() - t0
        rows.append({"seconds": seconds, "time/rollout": spent[-1], "time/update": seconds - spent[-1]})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=6, help="steps per round and side")
    parser.add_argument("--method", default="grpo", help="our method: grpo, clip_b or clip_v (demo settings)")
    parser.add_argument("--warmup", type=int, default=2, help="steps of each side run first and discarded")
    parser.add_argument("--probe-every", type=int, default=0, help="our entropy probe (0: off, as TRL has none)")
    args = parser.parse_args()
    torch.manual_seed(0)
    ratios, ours_rows, trl_rows = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        if args.warmup:  # the process's one-time costs (thread pools, allocator, imports) hit neither side's figures
            ours(args.warmup, args.method, Path(tmp) / "ours-warmup", args.probe_every)
            trl_steps(args.warmup, Path(tmp) / "trl-warmup", seed=99)
        for r in range(args.rounds):
            a = ours(args.steps, args.method, Path(tmp) / f"ours{r}", args.probe_every)
            b = trl_steps(args.steps, Path(tmp) / f"trl{r}", seed=r)
            ratios += [x["seconds"] / y["seconds"] for x, y in zip(a, b)]
            ours_rows += a
            trl_rows += b
            print(
                f"round {r + 1}: ours {statistics.median(x['seconds'] for x in a):.3f} s/step, "
                f"TRL {statistics.median(y['seconds'] for y in b):.3f} s/step",
                flush=True,
            )

    def med(rows, key):
        values = [row[key] for row in rows if key in row]
        return statistics.median(values) if values else float("nan")

    print(
        f"\nsteps: {len(ratios)} pairs ({args.rounds} rounds x {args.steps}), torch threads {torch.get_num_threads()}"
    )
    print("| phase (median s/step) | entropy-rft | TRL GRPOTrainer |")
    print("|---|---|---|")
    print(f"| rollout + scoring | {med(ours_rows, 'time/rollout'):.3f} | {med(trl_rows, 'time/rollout'):.3f} |")
    print(f"| statistics pass | {med(ours_rows, 'time/stats'):.3f} | (in the update) |")
    print(f"| advantages, filter, update | {med(ours_rows, 'time/update'):.3f} | {med(trl_rows, 'time/update'):.3f} |")
    print(f"| diagnostics | {med(ours_rows, 'time/diagnostics'):.3f} | - |")
    print(f"| step | {med(ours_rows, 'seconds'):.3f} | {med(trl_rows, 'seconds'):.3f} |")
    q = statistics.quantiles(ratios, n=4)
    print(
        f"\nour step / TRL's step, median of paired ratios: {statistics.median(ratios):.3f} "
        f"(quartiles {q[0]:.3f} - {q[2]:.3f})"
    )


if __name__ == "__main__":
    main()
