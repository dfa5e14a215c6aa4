"""What watching a run costs TRL's GRPOTrainer: the wall time of each optimizer step, plain, monitored, and monitored
with the entropy probe on every step, side by side in one process, on the countdown setup
(integrations/trl_countdown.py: the shipped policy, the demo's batch and settings, CPU).

Each round trains the same run (same seed) once in each mode, the order rotating from round to round:
- plain: TRL's GRPOTrainer;
- monitor: EntropyGRPOTrainer(method="none", probe_every=0): one extra no-grad forward per generation batch, the
  whole-batch gathers, the metrics, metrics.jsonl and the token samples at their default samples_every;
- probe: the same with probe_every=1: on every step also the gradient of the batch's mean entropy (one forward and
  backward) and the mean entropy after TRL's optimizer step (one no-grad forward).
All three train identically (tests/test_trl.py: bit-equal weights). logging_steps is 1, so the monitor's forward runs
for every batch (its worst case; at logging_steps L it runs for one batch in L).

Measured per step, not from TRL's `step_time` (at logging_steps L that metric is the mean over the L steps of a log
window, so it would give one number per window): the wall time between consecutive starts of optimizer steps
(generation, the monitor, TRL's update, the probe and the logging all in it), step 1 and 2 left out as warm-up.
Printed and saved (--out, JSON): each mode's median step time pooled over the rounds; the paired difference, i.e.
for each round the difference of that round's medians (monitor - plain, probe - plain), and the median of those over
the rounds; the medians of the monitor's extra forward and of the probe's two parts (gradient; after-step forward).

    python benchmarks/monitor_overhead.py [--rounds 3] [--steps 12] [--rows 256] \
        [--out benchmarks/results/monitor_overhead.json]

Time it on a quiet machine: other processes on the cores move every median (the saved results say what the machine
was doing when they were measured).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path

MODES = ("plain", "monitor", "probe")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument(
        "--rows", type=int, default=None, help="rows per step (default: the demo's prompts_per_step x group_size, 256)"
    )
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    parser.add_argument("--note", default="", help="what the machine was doing (saved with the results)")
    args = parser.parse_args()
    from transformers import TrainerCallback

    from entropy_rft.integrations.trl import EntropyGRPOTrainer
    from entropy_rft.integrations.trl_countdown import countdown_trainer

    parts: dict[str, list[float]] = {"forward": [], "probe_gradient": [], "probe_after": []}

    def timed(name, fn):
        start = time.perf_counter()
        try:
            return fn()
        finally:
            parts[name].append(time.perf_counter() - start)

    class Timed(EntropyGRPOTrainer):
        def _token_stats(self, out):
            return timed("forward", lambda: super(Timed, self)._token_stats(out))

        def _start_probe(self, out, before):
            return timed("probe_gradient", lambda: super(Timed, self)._start_probe(out, before))

        def _finish_probe(self, step):
            if self._probe is None or self._probe[-1] != step:
                return super()._finish_probe(step)
            return timed("probe_after", lambda: super(Timed, self)._finish_probe(step))

    class StepClock(TrainerCallback):
        def __init__(self):
            self.starts = []

        def on_step_begin(self, args, state, control, **kwargs):
            self.starts.append(time.perf_counter())

        def on_train_end(self, args, state, control, **kwargs):
            self.starts.append(time.perf_counter())

    over = {"logging_steps": 1}
    if args.rows is not None:
        over["per_device_train_batch_size"] = args.rows
    step_time: dict[str, list[list[float]]] = {m: [] for m in MODES}
    with tempfile.TemporaryDirectory() as tmp:
        for rnd in range(args.rounds):
            for mode in MODES[rnd % 3 :] + MODES[: rnd % 3]:
                out = Path(tmp) / f"{mode}{rnd}"
                if mode == "plain":
                    trainer = countdown_trainer(out, method=None, steps=args.steps, **over)
                else:
                    trainer = countdown_trainer(out, method="none", steps=args.steps, cls=Timed, **over)
                    trainer.probe_every = 1 if mode == "probe" else 0
                clock = StepClock()
                trainer.add_callback(clock)
                trainer.train()
                times = [b - a for a, b in zip(clock.starts, clock.starts[1:])]
                step_time[mode].append(times[2:])
                rows = trainer.args.per_device_train_batch_size
    median = {m: statistics.median(t for r in step_time[m] for t in r) for m in MODES}
    paired = {
        m: statistics.median(
            statistics.median(a) - statistics.median(b) for a, b in zip(step_time[m], step_time["plain"])
        )
        for m in MODES[1:]
    }
    result = {
        "setup": f"TRL GRPOTrainer on countdown, {rows} rows a step, CPU, logging_steps 1, {args.rounds} rounds x "
        f"{args.steps - 2} timed steps per mode",
        "machine": f"{platform.machine()}, {platform.python_version()}; {args.note}".strip("; "),
        "median_step_s": median,
        "paired_difference_s": paired,
        "paired_difference_pct": {m: 100 * d / median["plain"] for m, d in paired.items()},
        "median_part_s": {k: statistics.median(v) for k, v in parts.items() if v},
        "step_times_s": step_time,
    }
    print(result["setup"] + ":")
    for m in MODES:
        extra = (
            ""
            if m == "plain"
            else (f" (paired difference {paired[m]:+.4f} s, {result['paired_difference_pct'][m]:+.1f}% of plain)")
        )
        print(f"  {m}: median step {median[m]:.4f} s{extra}")
    for k, v in result["median_part_s"].items():
        print(f"  {k}: median {v * 1000:.1f} ms ({100 * v / median['plain']:.1f}% of a plain step)")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
