"""GPU measurements behind benchmarks/gpu.md (issue 12): run on a CUDA machine.

    python benchmarks/gpu.py stats                 # token statistics from hidden states against TRL's chunked kernel
    python benchmarks/gpu.py trainer SHAPE [...]   # trainer steps on a random-init model of a real shape
    python benchmarks/gpu.py trl SHAPE             # a few steps of the TRL adapter
    python benchmarks/gpu.py decode [SHAPE ...]    # the decode step against transformers' static-cache generate

`stats`: N 8192 tokens, D 3584, V 151936 (Qwen2.5-7B's head), bf16 autocast on float32 weights as the trainer
runs it. Forward (log p and H) and forward + backward of sum(g1 log p + g2 H), against TRL's
ChunkedLogProbFunction (Triton) with entropy, and against the LM-head matmuls alone (the floor: one GEMM forward,
two backward). CUDA events, median of 10 after 3 warm-ups; peak memory above the inputs.

`trainer`: SHAPE names a config.json under entropy_rft/assets/shapes (written by hand from the public configs);
the model is built at random from it on the GPU. One warm-up step with 8 new tokens, then `--steps` measured
steps of the real trainer parts in the trainer's order (HF engine rollout, statistics pass, GRPO advantages of
random rewards, Clip_B filter, step.Step.update), with `torch.cuda.max_memory_allocated` per step.

`decode` (issue 45): each SHAPE (default the Qwen2.5-0.5B and 1.5B shapes) at random init, rows 32 and 256
(`--rows`), weights float32 and bfloat16, `--prompt-tokens` random prompt tokens (one prompt per row) and no EOS,
so every row decodes to the end. This trainer's rollout (rollout/sampling.py `sample`, decode="auto": on CUDA the
fixed-shape step captured in a CUDA graph; bf16 means float32 weights decoded with bfloat16 copies, as a policy
trained under bf16 autocast is) beside transformers' `generate(cache_implementation="static")` on a model in the
same dtype, sampling at temperature 1 with no top-k/top-p, in the same run. A rollout of N and one of N/2 new
tokens are timed (median of `--reps` after one warm-up each); ms per step = (T(N) - T(N/2)) / (N/2), which
leaves out the prefill, the capture and other per-rollout work (reported as rollout_s at N). tokens/s = rows / step
time; weight_read_frac = (bytes of the weights one step reads: every layer, the final norm and the LM head, the
embedding rows aside) / the card's memory bandwidth (`--bandwidth` GB/s, else a table by name) / step time;
with_kv_frac adds the key/value reads at the mean sequence length. On a machine without CUDA it says so and exits.
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
            logp, ent, *_ = ChunkedLogProbFunction.apply(
                hidden, weight, None, tokens, 1.0, 32768, None, 1.0, ("entropy",)
            )
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
    check = {
        f"{name}_{k}": (getattr(got, k).double() - getattr(ref, k)).abs().max().item()
        for name, got in (("triton", got_t), ("torch", got_c))
        for k in ("logp", "entropy", "s_star", "s_expect")
    }
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

            def call(backward=backward, fn=fn):
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
        return {
            "input_ids": torch.tensor([[self.pad_token_id] * (width - len(r)) + r for r in rows]),
            "attention_mask": torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows]),
        }

    def decode(self, ids, skip_special_tokens=False):
        return ""


def bench_trainer(shape: str, args) -> list[dict]:
    from transformers import AutoConfig, AutoModelForCausalLM

    from entropy_rft.advantages import ADVANTAGES
    from entropy_rft.config import load_config
    from entropy_rft.forward import batch_forward
    from entropy_rft.methods import METHODS
    from entropy_rft.policy import prepare_policy
    from entropy_rft.rollout import HFEngine
    from entropy_rft.step import Decision, Step

    torch.manual_seed(0)
    config = AutoConfig.from_pretrained(Path(args.shapes) / shape)
    cfg = load_config(
        None,
        prompts_per_step=args.prompts,
        group_size=args.group,
        max_new_tokens=args.response,
        micro_batch_size=args.micro,
        precision="bf16",
        gradient_checkpointing=True,
        lora_rank=args.lora_rank,
        lr=1e-6,
        method="clip_b",
        probe_every=0,
        progress=False,
    )
    with torch.device(DEVICE):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model = prepare_policy(model, cfg)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.Adam(params, lr=cfg.lr)
    engine = HFEngine(
        model,
        IdTokenizer(pad=0, eos=config.eos_token_id if isinstance(config.eos_token_id, int) else 0),
        batch_size=512,
    )
    gen = torch.Generator().manual_seed(0)
    out = []
    for step in range(args.steps + 1):
        new_tokens = 8 if step == 0 else args.response
        prompts = [
            " ".join(
                str(t)
                for t in torch.randint(100, config.vocab_size - 100, (args.prompt_tokens,), generator=gen).tolist()
            )
            for _ in range(args.prompts)
        ]
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
        row = {
            "shape": shape,
            "step": step,
            "lora_rank": args.lora_rank,
            "rows": len(rollout.texts),
            "prompt_tokens": args.prompt_tokens,
            "response_tokens": int(mask.sum()),
            "rollout_s": t1 - t0,
            "stats_s": t2 - t1,
            "update_s": t3 - t2,
            "step_s": t3 - t0,
            "rollout_tok_per_s": int(mask.sum()) / (t1 - t0),
            "train_tok_per_s": int(mask.sum()) / (t3 - t1),
            "peak_generate_gib": gen_peak,
            "peak_train_gib": max_gib(),
            "trainable_params": sum(p.numel() for p in params),
        }
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
    ds = Dataset.from_list(
        [{"prompt": f"{a},{b},{c}>{a + b + c}:"} for a in range(1, 5) for b in range(1, 5) for c in range(1, 3)]
    )
    reward = lambda completions, **kw: [float(len(c) % 2) for c in completions]  # noqa: E731
    targs = GRPOConfig(
        output_dir="/tmp/trl-gpu",
        per_device_train_batch_size=16,
        num_generations=8,
        max_completion_length=args.response,
        learning_rate=1e-6,
        max_steps=args.steps,
        bf16=True,
        logging_steps=1,
        report_to=[],
        save_strategy="no",
        gradient_checkpointing=True,
    )
    trainer = EntropyGRPOTrainer(
        model=model,
        reward_funcs=reward,
        train_dataset=ds,
        args=targs,
        processing_class=tokenizer,
        method="clip_b",
        method_options={"mu": 2.5},
    )
    reset_peak()
    t0 = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - t0
    logs = [h for h in trainer.state.log_history if "loss" in h]
    row = {"shape": shape, "steps": args.steps, "seconds": seconds, "peak_gib": max_gib(), "log": logs}
    print(json.dumps(row, default=str), flush=True)
    return [row]


BANDWIDTH_GBS = {"H200": 4800, "H100 PCIe": 2000, "H100": 3350, "A100": 2039, "L40S": 864, "A10": 600}  # spec sheets


def bandwidth_gbs(name: str, given: float | None) -> float | None:
    if given:
        return given
    return next((bw for key, bw in BANDWIDTH_GBS.items() if key in name), None)


def step_bytes(model, dtype: torch.dtype) -> int:
    """Bytes of the weights one decode step reads in dtype: all but the embedding table (one row per token), which
    counts once when the LM head shares it."""
    size = torch.empty((), dtype=dtype).element_size()
    embed = model.get_input_embeddings().weight
    head = model.get_output_embeddings().weight
    total = sum(p.numel() for p in model.parameters())
    if head.data_ptr() != embed.data_ptr():
        total -= embed.numel()
    return total * size


def kv_bytes(config, rows: int, columns: float, dtype: torch.dtype) -> float:
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    size = torch.empty((), dtype=dtype).element_size()
    return 2 * config.num_hidden_layers * rows * config.num_key_value_heads * columns * head_dim * size


def bench_decode(shapes: list[str], args) -> list[dict]:
    from transformers import AutoConfig, AutoModelForCausalLM

    from entropy_rft.rollout.sampling import decode_path, sample

    out = []
    gbs = bandwidth_gbs(torch.cuda.get_device_name() if CUDA else "cpu", args.bandwidth)
    new, half = args.response or 256, (args.response or 256) // 2
    prompt_tokens = args.prompt_tokens or 128
    for shape in shapes:
        config = AutoConfig.from_pretrained(Path(args.shapes) / shape)
        if args.smoke:  # the script's own check on a CPU: a two-layer model of the shape's family, small vocab
            config.update(
                {
                    "num_hidden_layers": 2,
                    "vocab_size": 1000,
                    "hidden_size": 64,
                    "intermediate_size": 128,
                    "num_attention_heads": 4,
                    "num_key_value_heads": 2,
                    "tie_word_embeddings": True,
                }
            )
            config.head_dim = 16
        torch.manual_seed(0)
        with torch.device(DEVICE):
            model32 = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
        for dtype in (torch.float32, torch.bfloat16):
            hf_model = (
                model32
                if dtype == torch.float32
                else AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).to(DEVICE).eval()
            )
            if dtype == torch.bfloat16:
                hf_model.load_state_dict(model32.state_dict())
            for rows in args.rows:
                ids = torch.randint(100, config.vocab_size - 100, (rows, prompt_tokens), device=DEVICE)
                mask = torch.ones_like(ids, dtype=torch.bool)

                def ours(tokens: int, seed: int = 0, model=model32, ids=ids, mask=mask, dtype=dtype):
                    return sample(
                        model,
                        ids,
                        mask,
                        n=1,
                        temperature=1.0,
                        top_p=1.0,
                        max_new_tokens=tokens,
                        eos_ids=[-1],
                        pad_id=0,
                        generator=torch.Generator(DEVICE).manual_seed(seed),
                        dtype=dtype if dtype == torch.bfloat16 else None,
                        decode="auto",
                    )

                def theirs(tokens: int, seed: int = 0, model=hf_model, ids=ids, mask=mask):
                    torch.manual_seed(seed)
                    return model.generate(
                        input_ids=ids,
                        attention_mask=mask.long(),
                        do_sample=True,
                        temperature=1.0,
                        top_k=0,
                        top_p=1.0,
                        max_new_tokens=tokens,
                        min_new_tokens=tokens,
                        eos_token_id=None,
                        pad_token_id=0,
                        cache_implementation="static",
                    )

                row = {
                    "shape": shape,
                    "dtype": str(dtype).removeprefix("torch."),
                    "rows": rows,
                    "prompt_tokens": prompt_tokens,
                    "new_tokens": new,
                    "ours_path": decode_path(model32, "auto", prompt_tokens + new, ids.device)[0],
                }
                for name, fn in (("ours", ours), ("hf_static", theirs)):
                    try:
                        times = {}
                        for tokens in (half, new):
                            fn(tokens)  # warm-up: capture, compilation, allocator
                            reps = []
                            for r in range(args.reps):
                                sync()
                                t0 = time.perf_counter()
                                fn(tokens, seed=r + 1)
                                sync()
                                reps.append(time.perf_counter() - t0)
                            times[tokens] = statistics.median(reps)
                    except Exception as e:  # one path failing (memory, a transformers change) leaves the other
                        row[f"{name}_error"] = f"{type(e).__name__}: {e}"[:300]
                        continue
                    step_s = (times[new] - times[half]) / (new - half)
                    row[f"{name}_ms_per_step"] = step_s * 1e3
                    row[f"{name}_tok_per_s"] = rows / step_s
                    row[f"{name}_rollout_s"] = times[new]
                    if gbs:
                        limit = step_bytes(model32, dtype) / (gbs * 1e9)
                        with_kv = limit + kv_bytes(config, rows, prompt_tokens + 0.75 * new, dtype) / (gbs * 1e9)
                        row[f"{name}_weight_read_frac"] = limit / step_s
                        row[f"{name}_with_kv_frac"] = with_kv / step_s
                if "ours_ms_per_step" in row and "hf_static_ms_per_step" in row:
                    row["hf_static_over_ours"] = row["hf_static_ms_per_step"] / row["ours_ms_per_step"]
                print(json.dumps(row), flush=True)
                out.append(row)
            del hf_model
        del model32
        if CUDA:
            torch.cuda.empty_cache()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["stats", "trainer", "trl", "decode"])
    parser.add_argument(
        "shape",
        nargs="*",
        default=None,
        help="shape folder(s) (trainer, trl: one; default Qwen2.5-0.5B; decode: 0.5B and 1.5B)",
    )
    parser.add_argument("--n", type=int, default=8192)
    parser.add_argument("--d", type=int, default=3584)
    parser.add_argument("--v", type=int, default=151936)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--prompt-tokens", type=int, default=None, help="trainer: 512; decode: 128")
    parser.add_argument("--response", type=int, default=None, help="new tokens (trainer: 2048; decode: 256)")
    parser.add_argument("--micro", type=int, default=4)
    parser.add_argument("--lora-rank", type=int, default=0)
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--generate-bf16", action="store_true", help="generate under bf16 autocast")
    parser.add_argument("--rows", type=int, nargs="+", default=[32, 256], help="decode: rows per rollout")
    parser.add_argument("--reps", type=int, default=3, help="decode: timed rollouts per length")
    parser.add_argument("--bandwidth", type=float, default=None, help="decode: memory bandwidth, GB/s")
    parser.add_argument("--smoke", action="store_true", help="decode: run a tiny model on the CPU (checks the script)")
    parser.add_argument("--shapes", default=str(SHAPES), help="folder of shape folders (config.json each)")
    parser.add_argument("--out", default=None, help="append the JSON results to this file")
    args = parser.parse_args()
    if args.what == "decode" and not CUDA and not args.smoke:
        print("benchmarks/gpu.py decode needs CUDA (it times the CUDA-graph decode step); no CUDA device here")
        return
    print(json.dumps({"gpu": torch.cuda.get_device_name() if CUDA else "none", "torch": torch.__version__}), flush=True)
    shapes = args.shape or (
        ["Qwen--Qwen2.5-0.5B-Instruct", "Qwen--Qwen2.5-1.5B-Instruct"]
        if args.what == "decode"
        else ["Qwen--Qwen2.5-0.5B-Instruct"]
    )
    if args.what == "stats":
        results = bench_stats(args.n, args.d, args.v)
    elif args.what == "trainer":
        args.prompt_tokens, args.response = args.prompt_tokens or 512, args.response or 2048
        results = bench_trainer(shapes[0], args)
    elif args.what == "decode":
        results = bench_decode(shapes, args)
    else:
        args.response = args.response or 2048
        results = bench_trl(shapes[0], args)
    if args.out:
        with open(args.out, "a") as f:
            for r in results:
                f.write(json.dumps({"what": args.what, **r}, default=str) + "\n")


if __name__ == "__main__":
    main()
