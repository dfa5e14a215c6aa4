"""The sampling loop's decode paths on the demo's rollouts, measured in one process.

Each round samples one demo batch (the shipped countdown policy, 32 prompts x 8 samples, at most 16 new tokens,
temperature 1.0) three times with the same seed: decoding through the model's forward (`decode="hf"`), with
rollout/decode.py's hand-written step dropping finished rows (`decode="hand"`, the CPU's default) and with the
same step at fixed shapes (`decode="static"`, the path a GPU captures in a CUDA graph; run eagerly here), in a
rotating order. Prints the median of the paired time ratios against "hand", how many rounds sampled identical
tokens and the largest sampler log-prob difference from "hand".

    python benchmarks/decode_ab.py [--rounds 20]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    from entropy_rft.config import load_config
    from entropy_rft.rollout.hf import HFEngine
    from entropy_rft.rollout.sampling import Sampling, sample
    from entropy_rft.tasks import TASKS
    from entropy_rft.train.policy import load_policy
    from entropy_rft.train.problems import default_data, load_problems

    model, tokenizer = load_policy("countdown-tiny", torch.device("cpu"))
    model.eval()
    task = TASKS.get("countdown")
    problems = load_problems(default_data(load_config(None), "train"), task)
    engine = HFEngine(model, tokenizer)
    paths = ("hf", "hand", "static")
    times = {path: [] for path in paths}
    same = {path: 0 for path in paths}
    sampling = Sampling(
        n=8, temperature=1.0, top_p=1.0, max_new_tokens=16, eos_ids=engine.eos_ids, pad_id=tokenizer.pad_token_id
    )
    gap = {path: 0.0 for path in paths}
    for i in range(args.rounds + 1):
        ids, mask = engine.encode_prompts([task.prompt(p) for p in problems[i * 32 : (i + 1) * 32]])
        out = {}
        for path in paths[i % 3 :] + paths[: i % 3]:
            t = time.perf_counter()
            out[path] = sample(
                model,
                ids,
                mask,
                sampling,
                generator=torch.Generator().manual_seed(i),
                decode=path,
            )
            if i:  # round 0 warms every path up
                times[path].append(time.perf_counter() - t)
        b, lb = out["hand"]
        for path in paths:
            a, la = out[path]
            if i and a.shape == b.shape and torch.equal(a, b):
                same[path] += 1
                gap[path] = max(gap[path], float((la - lb).abs().max()))
    print(
        f"per rollout (medians of {args.rounds}): "
        + ", ".join(f"{path} {statistics.median(times[path]):.4f} s" for path in paths)
    )
    for path in ("hf", "static"):
        ratios = [x / h for x, h in zip(times[path], times["hand"])]
        q = statistics.quantiles(ratios, n=4)
        print(
            f"{path} / hand: median {statistics.median(ratios):.3f} (quartiles {q[0]:.3f} - {q[2]:.3f}); "
            f"identical tokens in {same[path]} of {args.rounds} rounds, largest sampler log-prob gap "
            f"{gap[path]:.2e}"
        )


if __name__ == "__main__":
    main()
