"""What watching a run costs TRL's GRPOTrainer: step time with and without the monitor, side by side in one process,
on the countdown setup (integrations/trl_countdown.py: the shipped policy, the demo's batch and settings, CPU).

Each round trains the same run (same seed) twice, alternating which goes first: EntropyGRPOTrainer(method="none")
(the monitor: one extra no-grad forward per generation batch, the whole-batch gathers, the metrics, metrics.jsonl and
the token samples at their default samples_every) and a plain GRPOTrainer. Both train identically (tests/test_trl.py:
bit-equal weights). The monitor's forward runs only for batches that feed a logged or sampled step: at logging_steps
1 (the default here) that is every batch, its worst case. Printed: the median step time of each (TRL's `step_time`, generation included, step 1 left out
as warm-up), the paired difference in percent (the target is at most 10% on the CPU), and the median time of the
monitor's extra forward itself.

    python benchmarks/monitor_overhead.py [--rounds 3] [--steps 20] [--rows 256] [--logging-steps 1]

Time it on a quiet machine: other processes on the cores move both medians.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--logging-steps", type=int, default=1,
                        help="TRL's logging_steps: the monitor's forward runs for the batches of logged steps only "
                             "(1, every step, is its worst case)")
    parser.add_argument("--rows", type=int, default=None,
                        help="rows per step (default: the demo's prompts_per_step x group_size, 256)")
    args = parser.parse_args()
    from entropy_rft.integrations.trl import EntropyGRPOTrainer
    from entropy_rft.integrations.trl_countdown import countdown_trainer

    forward_time: list[float] = []

    class Timed(EntropyGRPOTrainer):
        def _token_stats(self, out):
            start = time.perf_counter()
            try:
                return super()._token_stats(out)
            finally:
                forward_time.append(time.perf_counter() - start)

    over = {"logging_steps": args.logging_steps}
    if args.rows is not None:
        over["per_device_train_batch_size"] = args.rows
    step_time = {"monitor": [], "plain": []}
    with tempfile.TemporaryDirectory() as tmp:
        for rnd in range(args.rounds):
            for mode in (("monitor", "plain") if rnd % 2 == 0 else ("plain", "monitor")):
                out = Path(tmp) / f"{mode}{rnd}"
                if mode == "monitor":
                    trainer = countdown_trainer(out, method="none", steps=args.steps, cls=Timed, **over)
                else:
                    trainer = countdown_trainer(out, method=None, steps=args.steps, **over)
                trainer.train()
                times = [h["step_time"] for h in trainer.state.log_history if "step_time" in h]
                step_time[mode] += times[1:]
                rows = trainer.args.per_device_train_batch_size
    on, off = statistics.median(step_time["monitor"]), statistics.median(step_time["plain"])
    print(f"TRL GRPOTrainer on countdown ({rows} rows a step, CPU, logging_steps {args.logging_steps}), {args.rounds} "
          f"rounds x {args.steps - 1} steps each way:")
    print(f"step time: {on:.4f} s monitored, {off:.4f} s plain (difference {on - off:+.4f} s, "
          f"{100 * (on - off) / off:+.2f}%)")
    print(f"the monitor's extra forward: median {statistics.median(forward_time) * 1000:.1f} ms "
          f"({100 * statistics.median(forward_time) / off:.2f}% of a plain step)")


if __name__ == "__main__":
    main()
