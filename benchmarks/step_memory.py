"""Peak memory of one training update against the vocabulary size: token statistics streamed from hidden states
(the trainer's default) against materialised [B, T, V] logits.

A random-init Qwen2 with Qwen2.5-0.5B's widths (hidden 896, intermediate 4864, 14 heads, 2 KV heads) and fewer
layers (--layers, default 2: the layers' activations do not depend on V, the head's do), vocabulary V, one
`step.Step.update` call (forward, clipped surrogate, backward, Adam step) on B rows of P + R tokens. Each
configuration runs in its own process; the figure is the growth of peak resident memory during the update, above
the model, its Adam state and the inputs (which are built and touched first).

    python benchmarks/step_memory.py [--rows 8] [--response 256] [--vocab 32768,151936]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys


def child(vocab: int, from_hidden: bool, rows: int, response: int, layers: int) -> dict:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from entropy_rft.config import load_config
    from entropy_rft.rollout import Rollout
    from entropy_rft.train.step import Decision, Step

    torch.manual_seed(0)
    config = Qwen2Config(
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=layers,
        num_attention_heads=14,
        num_key_value_heads=2,
        vocab_size=vocab,
        tie_word_embeddings=True,
        max_position_embeddings=4096,
    )
    model = Qwen2ForCausalLM(config)
    prompt = torch.randint(0, vocab, (rows, 32))
    response = torch.randint(0, vocab, (rows, response))
    rollout = Rollout(
        prompt,
        torch.ones_like(prompt, dtype=torch.bool),
        response,
        torch.ones_like(response, dtype=torch.bool),
        torch.ones(rows, dtype=torch.bool),
        [""] * rows,
    )
    cfg = load_config(None, prompts_per_step=rows, group_size=1, lr=1e-6, stats_from_hidden=from_hidden, progress=False)
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    for p in model.parameters():  # Adam's state exists before the measurement
        p.grad = torch.zeros_like(p)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    old_logp = torch.zeros(rows, response.shape[1])
    adv = torch.randn(rows)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    import time

    t0 = time.perf_counter()
    mask = rollout.response_mask
    Step(cfg, model, optimizer, update_gen=torch.Generator()).update(rollout, Decision(adv, old_logp, mask, mask))
    seconds = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"vocab": vocab, "from_hidden": from_hidden, "peak_growth_mib": (after - before) / 1024, "seconds": seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--response", type=int, default=256)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--vocab", default="32768,151936")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        vocab, hidden = args.child.split(":")
        print(json.dumps(child(int(vocab), hidden == "1", args.rows, args.response, args.layers)))
        return
    tokens = args.rows * args.response
    print(f"{args.rows} rows x {args.response} response tokens ({tokens} tokens), hidden 896, {args.layers} layers")
    print(
        "| V | [B, T, V] logits, one fp32 copy | materialised logits: peak growth | streamed from hidden: peak growth |"
    )
    print("|---|---|---|---|")
    for vocab in (int(v) for v in args.vocab.split(",")):
        out = {}
        for hidden in (False, True):
            cmd = [
                sys.executable,
                __file__,
                "--child",
                f"{vocab}:{int(hidden)}",
                "--rows",
                str(args.rows),
                "--response",
                str(args.response),
                "--layers",
                str(args.layers),
            ]
            out[hidden] = json.loads(
                subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.splitlines()[-1]
            )
        logits_mib = tokens * vocab * 4 / 2**20
        print(
            f"| {vocab} | {logits_mib:.0f} MiB "
            f"| {out[False]['peak_growth_mib']:.0f} MiB ({out[False]['seconds']:.1f} s) "
            f"| {out[True]['peak_growth_mib']:.0f} MiB ({out[True]['seconds']:.1f} s) |",
            flush=True,
        )


if __name__ == "__main__":
    main()
