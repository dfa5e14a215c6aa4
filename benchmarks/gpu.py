"""GPU measurements behind benchmarks/gpu.md (issue 12): run on a CUDA machine.

    python benchmarks/gpu.py stats                 # token statistics from hidden states against TRL's chunked kernel
    python benchmarks/gpu.py trainer SHAPE [...]   # trainer steps on a random-init model of a real shape
    python benchmarks/gpu.py trl SHAPE             # a few steps of the TRL adapter

`stats`: N 8192 tokens, D 3584, V 151936 (Qwen2.5-7B's head), bf16 autocast on float32 weights as the trainer
runs it. Forward (log p and H) and forward + backward of sum(g1 log p + g2 H), against TRL's
ChunkedLogProbFunction (Triton) with entropy, and against the LM-head matmuls alone (the floor: one GEMM forward,
two backward). CUDA events, median of 10 after 3 warm-ups; peak memory above the inputs.

`trainer`: SHAPE names a config.json under entropy_rft/assets/shapes (written by hand from the public configs);
the model is built at random from it on the GPU. One warm-up step with 8 new tokens, then `--steps` measured
steps of the real trainer parts in the trainer's order (HF engine rollout, statistics pass, GRPO advantages of
random rewards, Clip_B filter, step.Step.update), with `torch.cuda.max_memory_allocated` per step.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
SHAPES = ROOT / "entropy_rft" / "assets" / "shapes"
CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"  # the CPU only for a smoke run of the script itself


def sync() -> None:
    if CUDA:
        torch.cuda.synchronize()


def reset_peak() -> None:
    if CUDA:
        torch.cuda.reset_peak_memory_stats()


def max_gib() -> float:
    return torch.cuda.max_memory_allocated() / 2**30 if CUDA else float("nan")


def timed(fn, warmup: int = 3, reps: int = 10) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def peak_above(fn) -> float:
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**30


def bench_stats(n: int, d: int, v: int) -> list[dict]:
    from entropy_rft.dynamics import token_stats, token_stats_from_hidden

    torch.manual_seed(0)
    hidden = (torch.randn(n, d, device="cuda") * 0.5).requires_grad_()
    weight = (torch.randn(v, d, device="cuda") * 0.02).requires_grad_()
    tokens = torch.randint(0, v, (n,), device="cuda")
    g1, g2 = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
    amp = lambda: torch.autocast("cuda", dtype=torch.bfloat16)  # noqa: E731

    def ours(use_triton, **kw):
        def run(backward):
            with amp():
                s = token_stats_from_hidden(hidden, weight, tokens, use_triton=use_triton, **kw)
            if backward:
                ((s.logp * g1).sum() + (s.entropy * g2).sum()).backward()
            return s
        return run

    def trl(backward):
        from trl.kernels import ChunkedLogProbFunction

        with amp():
            logp, ent, *_ = ChunkedLogProbFunction.apply(hidden, weight, None, tokens, 1.0, 32768, None, 1.0,
                                                         ("entropy",))
        if backward:
            ((logp * g1).sum() + (ent * g2).sum()).backward()
        return logp, ent

    hb, wb = hidden.detach().bfloat16(), weight.detach().bfloat16()
    gz = torch.randn(n, v // 8, device="cuda", dtype=torch.bfloat16)

    def floor(backward):  # the head's GEMMs alone, in 8 vocabulary slices (as much as a [N, V] bf16 buffer)
        for w in wb.chunk(8):
            z = hb @ w.T
            if backward:
                _ = gz[:, : w.shape[0]] @ w
                _ = gz[:, : w.shape[0]].T @ hb
        return z

    # correctness on the GPU: ours (Triton and torch) and TRL against float64 token_stats on 256 rows
    rows = slice(0, 256)
    with torch.no_grad(), amp():
        ref = token_stats((hidden[rows].bfloat16() @ weight.bfloat16().T).double(), tokens[rows])
        got_t = token_stats_from_hidden(hidden[rows], weight, tokens[rows], use_triton=True)
        got_c = token_stats_from_hidden(hidden[rows], weight, tokens[rows], use_triton=False)
    check = {f"{name}_{k}": (getattr(got, k).double() - getattr(ref, k)).abs().max().item()
             for name, got in (("triton", got_t), ("torch", got_c)) for k in ("logp", "entropy", "s_star", "s_expect")}
    trl_lp, trl_h = trl(False)
    check["trl_logp"] = (trl_lp[rows].double() - ref.logp).abs().max().item()
    check["trl_entropy"] = (trl_h[rows].double() - ref.entropy).abs().max().item()
    # gradients: Triton path against the torch path (both exact for bf16 tiles)
    for name, fn in (("triton", ours(True)), ("torch", ours(False))):
        hidden.grad = weight.grad = None
        fn(True)
        check[f"{name}_grad_h"] = hidden.grad.clone()
        check[f"{name}_grad_w"] = weight.grad.clone()
    hidden.grad = weight.grad = None
    trl(True)
    for k, theirs in (("grad_h", hidden.grad), ("grad_w", weight.grad)):
        a, b = check.pop(f"triton_{k}"), check.pop(f"torch_{k}")
        check[f"triton_vs_torch_{k}_rel"] = ((a - b).norm() / b.norm()).item()
        check[f"triton_vs_trl_{k}_rel"] = ((a - theirs).norm() / theirs.norm()).item()
    print(json.dumps({"check": check}), flush=True)

    results = []
    candidates = [
        ("matmul floor", floor),
        ("TRL ChunkedLogProbFunction", trl),
        ("ours, Triton 8192x8192 (default)", ours(True)),
        ("ours, Triton 4096x16384", ours(True, row_chunk=4096, vocab_chunk=16384)),
        ("ours, Triton 4096x32768", ours(True, row_chunk=4096, vocab_chunk=32768)),
        ("ours, torch ops 512x2048", ours(False)),
        ("ours, torch ops 4096x16384", ours(False, row_chunk=4096, vocab_chunk=16384)),
    ]
    for name, fn in candidates:
        row = {"name": name}
        for backward in (False, True):
            def call():
                hidden.grad = weight.grad = None
                if backward:
                    fn(True)
                else:
                    with torch.no_grad():
                        fn(False)
            key = "fwd_bwd" if backward else "fwd"
            row[f"{key}_ms"] = timed(call, warmup=2, reps=5 if "512x2048" in name else 10)
            row[f"{key}_peak_gib"] = peak_above(call)
        print(json.dumps(row), flush=True)
        results.append(row)
    return results


class IdTokenizer:
    """Prompts are strings of token ids ('17 4 99'): random-init models have no real tokenizer."""

    def __init__(self, pad: int, eos: int):
        self.pad_token_id, self.eos_token_id, self.padding_side, self.chat_template = pad, eos, "left", None

    def __call__(self, texts, return_tensors=None, padding=None, add_special_tokens=None):
        rows = [[int(t) for t in s.split()] for s in texts]
        width = max(map(len, rows))
        return {"input_ids": torch.tensor([[self.pad_token_id] * (width - len(r)) + r for r in rows]),
                "attention_mask": torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])}

    def decode(self, ids, skip_special_tokens=False):
        return ""


def bench_trainer(shape: str, args) -> list[dict]:
    from transformers import AutoConfig, AutoModelForCausalLM

    from entropy_rft.advantages import ADVANTAGES
    from entropy_rft.config import load_config
    from entropy_rft.forward import batch_forward
    from entropy_rft.methods import METHODS
    from entropy_rft.rollout import HFEngine
    from entropy_rft.policy import prepare_policy
    from entropy_rft.step import Decision, Step

    torch.manual_seed(0)
    config = AutoConfig.from_pretrained(Path(args.shapes) / shape)
    cfg = load_config(None, prompts_per_step=args.prompts, group_size=args.group, max_new_tokens=args.response,
                      micro_batch_size=args.micro, precision="bf16", gradient_checkpointing=True,
                      lora_rank=args.lora_rank, lr=1e-6, method="clip_b", probe_every=0, progress=False)
    with torch.device(DEVICE):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model = prepare_policy(model, cfg)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.Adam(params, lr=cfg.lr)
    engine = HFEngine(model, IdTokenizer(pad=0, eos=config.eos_token_id if isinstance(config.eos_token_id, int) else 0),
                      batch_size=512)
    gen = torch.Generator().manual_seed(0)
    out = []
    for step in range(args.steps + 1):
        new_tokens = 8 if step == 0 else args.response
        prompts = [" ".join(str(t) for t in torch.randint(100, config.vocab_size - 100, (args.prompt_tokens,),
                                                          generator=gen).tolist()) for _ in range(args.prompts)]
        sync()
        reset_peak()
        t0 = time.perf_counter()
        with torch.autocast(DEVICE, dtype=torch.bfloat16, enabled=args.generate_bf16):
            rollout = engine.generate(prompts, n=args.group, temperature=1.0, max_new_tokens=new_tokens, seed=step)
        sync()
        t1 = time.perf_counter()
        gen_peak = max_gib()
        reset_peak()
        mask = rollout.response_mask
        stats, _ = batch_forward(model, rollout, 1.0, cfg.micro_batch_size, precision="bf16")
        sync()
        t2 = time.perf_counter()
        rewards = torch.randint(0, 2, (len(rollout.texts),), generator=gen).float()
        groups = torch.arange(args.prompts).repeat_interleave(args.group)
        adv = ADVANTAGES.get("grpo")(rewards, groups)
        keep, _ = METHODS.get("clip_b").apply(stats, adv, mask, mu=cfg.mu)
        Step(cfg, model, optimizer, update_gen=gen).update(rollout, Decision(adv, stats.logp, keep, mask & keep))
        sync()
        t3 = time.perf_counter()
        row = {"shape": shape, "step": step, "lora_rank": args.lora_rank, "rows": len(rollout.texts),
               "prompt_tokens": args.prompt_tokens, "response_tokens": int(mask.sum()),
               "rollout_s": t1 - t0, "stats_s": t2 - t1, "update_s": t3 - t2, "step_s": t3 - t0,
               "rollout_tok_per_s": int(mask.sum()) / (t1 - t0),
               "train_tok_per_s": int(mask.sum()) / (t3 - t1),
               "peak_generate_gib": gen_peak, "peak_train_gib": max_gib(),
               "trainable_params": sum(p.numel() for p in params)}
        print(json.dumps(row), flush=True)
        if step > 0:
            out.append(row)
    return out


def bench_trl(shape: str, args) -> list[dict]:
    from datasets import Dataset
    from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerFast
    from trl import GRPOConfig

    from entropy_rft.integrations.trl import EntropyGRPOTrainer

    torch.manual_seed(0)
    tok_dir = ROOT / "entropy_rft" / "assets" / "countdown-tiny"
    tokenizer = PreTrainedTokenizerFast.from_pretrained(tok_dir)
    config = AutoConfig.from_pretrained(Path(args.shapes) / shape)
    config.vocab_size = max(config.vocab_size, len(tokenizer))
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).to(DEVICE)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    ds = Dataset.from_list([{"prompt": f"{a},{b},{c}>{a + b + c}:"} for a in range(1, 5) for b in range(1, 5)
                            for c in range(1, 3)])
    reward = lambda completions, **kw: [float(len(c) % 2) for c in completions]  # noqa: E731
    targs = GRPOConfig(output_dir="/tmp/trl-gpu", per_device_train_batch_size=16, num_generations=8,
                       max_completion_length=args.response, learning_rate=1e-6, max_steps=args.steps, bf16=True,
                       logging_steps=1, report_to=[], save_strategy="no", gradient_checkpointing=True)
    trainer = EntropyGRPOTrainer(model=model, reward_funcs=reward, train_dataset=ds, args=targs,
                                 processing_class=tokenizer, method="clip_b", method_options={"mu": 2.5})
    reset_peak()
    t0 = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - t0
    logs = [h for h in trainer.state.log_history if "loss" in h]
    row = {"shape": shape, "steps": args.steps, "seconds": seconds, "peak_gib": max_gib(), "log": logs}
    print(json.dumps(row, default=str), flush=True)
    return [row]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["stats", "trainer", "trl"])
    parser.add_argument("shape", nargs="?", default="Qwen--Qwen2.5-0.5B-Instruct")
    parser.add_argument("--n", type=int, default=8192)
    parser.add_argument("--d", type=int, default=3584)
    parser.add_argument("--v", type=int, default=151936)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--response", type=int, default=2048)
    parser.add_argument("--micro", type=int, default=4)
    parser.add_argument("--lora-rank", type=int, default=0)
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--generate-bf16", action="store_true", help="generate under bf16 autocast")
    parser.add_argument("--shapes", default=str(SHAPES), help="folder of shape folders (config.json each)")
    parser.add_argument("--out", default=None, help="append the JSON results to this file")
    args = parser.parse_args()
    print(json.dumps({"gpu": torch.cuda.get_device_name() if CUDA else "none", "torch": torch.__version__}), flush=True)
    if args.what == "stats":
        results = bench_stats(args.n, args.d, args.v)
    elif args.what == "trainer":
        results = bench_trainer(args.shape, args)
    else:
        results = bench_trl(args.shape, args)
    if args.out:
        with open(args.out, "a") as f:
            for r in results:
                f.write(json.dumps({"what": args.what, **r}, default=str) + "\n")


if __name__ == "__main__":
    main()
