"""The sampling loop's two decode paths on the demo's rollouts, measured in one process.

Each round samples one demo batch (the shipped countdown policy, 32 prompts x 8 samples, at most 16 new tokens,
temperature 1.0) twice with the same seed: once decoding through the model's forward (`decode="hf"`), once with
rollout/decode.py's hand-written step (`decode="hand"`), in alternating order. Prints the median of the paired time
ratios, how many rounds sampled identical tokens and the largest sampler log-prob difference between the paths.

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
    from entropy_rft.rollout.sampling import sample
    from entropy_rft.tasks import TASKS
    from entropy_rft.policy import load_policy
    from entropy_rft.problems import default_data, load_problems
    from entropy_rft.rollout.hf import HFEngine

    model, tokenizer = load_policy("countdown-tiny", torch.device("cpu"))
    model.eval()
    task = TASKS.get("countdown")
    problems = load_problems(default_data(load_config(None), "train"), task)
    engine = HFEngine(model, tokenizer)
    times = {"hf": [], "hand": []}
    same, gap = 0, 0.0
    for i in range(args.rounds + 1):
        ids, mask = engine.encode_prompts([task.prompt(p) for p in problems[i * 32 : (i + 1) * 32]])
        out = {}
        for path in (("hf", "hand") if i % 2 else ("hand", "hf")):
            t = time.perf_counter()
            out[path] = sample(model, ids, mask, n=8, temperature=1.0, top_p=1.0, max_new_tokens=16,
                               eos_ids=engine.eos_ids, pad_id=tokenizer.pad_token_id,
                               generator=torch.Generator().manual_seed(i), decode=path)
            if i:  # round 0 warms both paths up
                times[path].append(time.perf_counter() - t)
        (a, la), (b, lb) = out["hf"], out["hand"]
        if i and a.shape == b.shape and torch.equal(a, b):
            same += 1
            gap = max(gap, float((la - lb).abs().max()))
    ratios = [h / f for f, h in zip(times["hf"], times["hand"])]
    print(f"hf decode {statistics.median(times['hf']):.4f} s, hand decode {statistics.median(times['hand']):.4f} s "
          f"per rollout (medians of {args.rounds})")
    q = statistics.quantiles(ratios, n=4)
    print(f"hand / hf: median {statistics.median(ratios):.3f} (quartiles {q[0]:.3f} - {q[2]:.3f})")
    print(f"identical tokens in {same} of {args.rounds} rounds; largest sampler log-prob gap {gap:.2e}")


if __name__ == "__main__":
    main()
