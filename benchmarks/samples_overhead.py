"""What writing token samples costs a training step, measured in one process on the demo's settings.

Each round trains the same run (the demo's config and method, same seed) twice, alternating which goes first: once
writing samples at every step (samples_every 1, the demo's samples_groups) and once writing none (samples_every 0).
Both runs do the same training (the samples only read the step's tensors). Printed: the median step time of each
(the trainer's `seconds`, step 1 left out as warm-up), the paired difference, the median time of the write itself
(`time/samples`, measured around the call inside the step), its size on disk, and the share of step time it takes at
samples_every 1, 5, 10 and 20 (the default, TrainConfig's samples_every, is 10: see docs/howto/inspect.md).

    python benchmarks/samples_overhead.py [--rounds 3] [--steps 20] [--method clip_b]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--method", default="clip_b", help="a method of the demo config")
    args = parser.parse_args()
    from entropy_rft.config import load_demo_config, run_config
    from entropy_rft.train.trainer import train

    spec = load_demo_config()
    step_time = {"on": [], "off": []}
    write_time, sizes = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for rnd in range(args.rounds):
            for mode in ("on", "off") if rnd % 2 == 0 else ("off", "on"):
                out = Path(tmp) / f"{mode}{rnd}"
                cfg = run_config(
                    spec,
                    args.method,
                    out=str(out),
                    steps=args.steps,
                    progress=False,
                    eval_problems=8,
                    eval_k=1,
                    samples_every=1 if mode == "on" else 0,
                )
                history = train(cfg)["history"]
                step_time[mode] += [h["seconds"] for h in history[1:]]
                if mode == "on":
                    write_time += [h["time/samples"] for h in history[1:]]
                    sizes += [p.stat().st_size for p in (out / "samples").iterdir()]
    on, off = statistics.median(step_time["on"]), statistics.median(step_time["off"])
    write = statistics.median(write_time)
    print(
        f"{args.method}, demo settings ({cfg.prompts_per_step} x {cfg.group_size}, samples_groups "
        f"{cfg.samples_groups}), {args.rounds} rounds x {args.steps - 1} steps each way:"
    )
    print(
        f"step time: {on:.4f} s with samples every step, {off:.4f} s without (difference {on - off:+.4f} s, "
        f"{100 * (on - off) / off:+.2f}%)"
    )
    print(
        f"the write itself: median {write * 1000:.1f} ms ({100 * write / off:.2f}% of a step), "
        f"{statistics.median(sizes) / 1000:.1f} kB per file (gzip)"
    )
    for every in (1, 5, 10, 20):
        print(f"  samples_every {every:>2}: {100 * write / (every * off):.3f}% of step time")


if __name__ == "__main__":
    main()
