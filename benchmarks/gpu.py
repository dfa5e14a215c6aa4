"""GPU measurements behind benchmarks/gpu.md (issue 12): run on a CUDA machine.

    python benchmarks/gpu.py stats                 # token statistics from hidden states against TRL's chunked kernel
    python benchmarks/gpu.py trainer SHAPE [...]   # trainer steps on a random-init model of a real shape
    python benchmarks/gpu.py trl SHAPE             # a few steps of the TRL adapter
    python benchmarks/gpu.py decode [SHAPE ...]    # decode arms hf, static, compile and transformers' generate
    python benchmarks/gpu.py step-vs-trl [SHAPE]   # the whole GRPO step against TRL's GRPOTrainer (issue 56)

`stats`: N 8192 tokens, D 3584, V 151936 (Qwen2.5-7B's head), bf16 autocast on float32 weights as the trainer
runs it. Forward (log p and H) and forward + backward of sum(g1 log p + g2 H), against TRL's
ChunkedLogProbFunction (Triton) with entropy, and against the LM-head matmuls alone (the floor: one GEMM forward,
two backward). CUDA events, median of 10 after 3 warm-ups; peak memory above the inputs.

`trainer`: SHAPE names a config.json under entropy_rft/assets/shapes (written by hand from the public configs);
the model is built at random from it on the GPU. One warm-up step with 8 new tokens, then `--steps` measured
steps of the real trainer parts in the trainer's order (HF engine rollout, statistics pass, GRPO advantages of
random rewards, Clip_B filter, step.Step.update), with `torch.cuda.max_memory_allocated` per step.

`decode` (issues 45, 53): each SHAPE (default the Qwen2.5-0.5B shape; `0.5B` or `1.5B` name the shipped Qwen2.5
shapes) at random init, `--rows` (default 32 and 256), `--dtypes` (comma list, default bf16; fp32 also: bf16,fp32),
`--prompt-tokens` random prompt tokens (128; one prompt per row) and no EOS, so every row decodes to the end.
`--arms` (comma list, default all; run static, compile, generate, hf), a JSON line each per (shape, dtype,
rows), appended to --out as it is done:
- hf: this trainer's loop (rollout/sampling.py `sample`) with decode="hf", the model's own forward and cache;
- static: decode="static", the fixed-shape step captured in a CUDA graph and replayed;
- compile: decode="compile" (decode="auto" on CUDA), that step compiled whole by Inductor (`--compile-mode`) and
  captured, so its first rollout of a shape pays the cold compile (compile_s, the session's own measurement);
- compile_53: issue 53's compiled step, to compare against (seven projection GEMMs a layer, the noise filled outside
  the graph each step, attention over the whole cache); compile and static take CUDA's defaults since issue 64 (QKV
  and gate/up fused, the noise drawn inside the step from a per-rollout seed, attention in length buckets);
- generate: transformers' `generate(cache_implementation="static")` with every sampling field set (top_k=0,
  top_p=1, no penalties), so it samples softmax(z) as ours do.
`--rl` (issue 64): RL-length ragged responses: 4096 new tokens after 256 prompt tokens by default, each row ending
at a random length (about vocab / `--rl-mean` EOS ids of a near-uniform random model: geometric lengths of mean
about --rl-mean, capped), so the fixed-shape arms run to the longest row as an RL batch makes them (its rows give
mean_response and response_quartiles). `--kernels`: the compiled arms' CUDA kernels per decode step
(kernels_per_step: torch.profiler, the prefill subtracted).
hf and generate run a model in the dtype itself; static and compile the float32 model decoded with bfloat16
copies where bf16 (as a policy trained under bf16 autocast is), fp32 as it is. Temperature 1, no top-p.
ms_per_step: static and compile time their decode loop alone (the session's timing: prefill, compile and capture
left out), median of `--reps` rollouts of `--response` new tokens (256); hf and generate, whose loops are not ours,
as (T(N) - T(N/2)) / (N/2) of whole rollouts (median of `--reps` after a warm-up each; generate compiles once per
cache length). tok_per_s = rows / step time; weight_read_frac = (bytes of the weights one step reads: every layer,
the final norm and the LM head, the embedding rows aside) / the card's memory bandwidth (`--bandwidth` GB/s, else a
table by name) / step time; with_kv_frac adds the key/value reads at the mean sequence length; peak_gib: the peak
allocated during the last timed rollout; cold_s: the first rollout's time above a warm one's (compile, capture,
autotune); recompiles_after_update (compile, generate): graphs dynamo compiled in one more rollout after every
weight was changed in place (0 expected); tokens_same_as_static / rows_same_as_static (compile): agreement with
the static arm's tokens from the same seed (the same noise; a rounding difference at a near tie changes a row's
rest). The default run (0.5B, bf16, 32 and 256 rows, every arm, `--reps 2`) is sized for about 4 minutes on an H100
(an estimate: not run on a GPU yet). On a machine without CUDA it says so and exits; `--smoke` runs a tiny model of
the shape on the CPU (compile arm through aot_eager) to check the script itself.

`step-vs-trl` (issue 56): SHAPE (default Qwen2.5-0.5B) at random init, the same weights in every arm, float32 master
weights under bf16 autocast, one generation batch of `--prompts` x `--group` rows (2 x 16; 8 x 16 with --prompts 8)
of `--prompt-tokens` random prompt tokens (32) and up to `--response` new tokens (256; a random model seldom samples
its EOS, so nearly every response runs to the limit: truncated_frac says how many did), rewarded by the same
function of the completion text (completion_reward), GRPO advantages, the token-mean clipped loss (TRL: loss_type
"dapo"), no KL, one Adam step per batch, gradient checkpointing on both sides (`--checkpointing`). Arms (`--arms`):
ours_grpo and ours_clip_b, the built-in trainer's step driven as trainer._loop drives it (OursArm; its default decode
path, on CUDA the captured fixed-shape step); trl_grpo, TRL's GRPOTrainer with its default transformers generate;
trl_none and trl_clip_b, EntropyGRPOTrainer in monitor mode and with Clip_B. trl_fields lists every GRPOConfig field
set to match. All arms live in one process: TRL's own train() loops run in threads held at each step's start, and
the main thread releases one step at a time, so nothing overlaps. After `--warmup` discarded steps an arm, `--steps`
rounds of one step an arm, the order rotating each round. Per step: seconds split into rollout (generation and
decoding; ours also scoring), stats (ours: the statistics pass; TRL: the rest of generating and scoring, rewards,
advantages and the adapter's statistics pass), update (loss forward and backward, clipping, the optimizer step) and
other (ours: the metrics line; TRL: its logging), the response tokens, tokens a second, and peak memory (CUDA's
peak above what was allocated at the step's start, plus the arm's own weights, gradients and Adam state). At the
end each arm's medians and the median of the per-round ratios: ours_grpo / trl_grpo, trl_none / trl_grpo (the
monitor's overhead at logging_steps 1, its worst case), trl_clip_b / trl_grpo and ours_clip_b / trl_clip_b.
`--smoke` runs it on the CPU with a two-layer model (the script's own check).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import traceback
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
    from entropy_rft.core.dynamics import token_stats, token_stats_from_hidden

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

    from entropy_rft.config import load_config
    from entropy_rft.core.advantages import ADVANTAGES
    from entropy_rft.core.methods import METHODS
    from entropy_rft.rollout import HFEngine
    from entropy_rft.train.forward import batch_forward
    from entropy_rft.train.policy import prepare_policy
    from entropy_rft.train.step import Decision, Step

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


# step-vs-trl (issue 56): the built-in trainer's whole GRPO step against TRL's GRPOTrainer on the same work

ARMS = ("ours_grpo", "trl_grpo", "trl_none", "trl_clip_b", "ours_clip_b")  # ours_*: the built-in trainer; trl_*:
# GRPOTrainer (grpo) or EntropyGRPOTrainer (none: monitor mode; clip_b)


def tiny_config(config):
    """A smoke run's model on the CPU: two layers of the shape's family, vocabulary 1000 (EOS 999, pad 998)."""
    config.update(
        {
            "num_hidden_layers": 2,
            "vocab_size": 1000,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "tie_word_embeddings": True,
            "bos_token_id": 998,
            "eos_token_id": 999,
        }
    )
    config.head_dim = 16
    if getattr(config, "layer_types", None):  # set from the shape's 24 layers (some transformers versions read it)
        config.layer_types = config.layer_types[:2]
    return config


def id_tokenizer(vocab_size: int, eos: int, pad: int):
    """A word-level tokenizer over the whole vocabulary: id i is the word 't<i>' (EOS '<|im_end|>', pad
    '<|endoftext|>'), so both trainers read the same random prompts and decode the same completion text from a
    random-init model, which has no tokenizer of its own."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"t{i}": i for i in range(vocab_size)}
    specials = {eos: "<|im_end|>", pad: "<|endoftext|>"}
    for i, name in specials.items():
        del vocab[f"t{i}"]
        vocab[name] = i
    tok = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=specials[eos], pad_token=specials[pad], unk_token="t0", padding_side="left"
    )


def completion_reward(text: str) -> float:
    """The share of even token ids in a completion ('t17 t4 ...'): a deterministic function of the completion alone,
    the same in both trainers, that varies within a group (so no group's advantages are all 0)."""
    ids = [int(w[1:]) for w in text.split() if w[:1] == "t" and w[1:].isdigit()]
    return sum(i % 2 == 0 for i in ids) / len(ids) if ids else 0.0


def trl_reward(completions, **_):
    return [completion_reward(c) for c in completions]


class IdTask:
    """The built-in trainer's task interface (problems.sample_batch): the problem is the prompt text, the reward
    completion_reward ('correct' above 0.5, for the metrics line only)."""

    def prompt(self, problem: str) -> str:
        return problem

    def score_batch(self, texts, finished, problems):
        return [(r, r > 0.5) for r in map(completion_reward, texts)]


def build_model(config):
    """The shape at random init, float32 master weights (bf16 runs autocast), the same weights on every call."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    with torch.device(DEVICE):
        return AutoModelForCausalLM.from_config(config, dtype=torch.float32)


def tensor_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))


def resident_bytes(model, optimizer) -> int:
    """What an arm holds between steps: weights, gradients still allocated, optimizer state."""
    inner = getattr(optimizer, "optimizer", optimizer)  # accelerate's AcceleratedOptimizer wraps torch's
    state = [v for s in inner.state.values() for v in s.values()] if inner is not None else []
    params = list(model.parameters())
    return tensor_bytes(params) + tensor_bytes(p.grad for p in params) + tensor_bytes(state)


class OursArm:
    """The built-in trainer's step (trainer._loop's body: rollout and scoring through problems.sample_batch,
    step.Step's statistics, decide, probe, update, the engine's weight sync and diagnose), evaluation, checkpoints,
    metric sinks and token samples aside."""

    def __init__(self, name: str, method: str, config, tokenizer, prompts: list[str], args):
        from entropy_rft.rollout import ENGINES
        from entropy_rft.train.dropout import disable_dropout
        from entropy_rft.train.policy import make_optimizer, prepare_policy
        from entropy_rft.train.problems import ProblemSampler
        from entropy_rft.train.step import Step

        self.name = name
        self.cfg = step_config(method, args)
        model = prepare_policy(build_model(config), self.cfg)
        disable_dropout(model)
        self.model = model
        self.engine = ENGINES.get("hf")(model, tokenizer, self.cfg, "")
        self.optimizer = make_optimizer([{"params": [p for p in model.parameters() if p.requires_grad]}], self.cfg)
        self.step_ = Step(self.cfg, model, self.optimizer, update_gen=torch.Generator().manual_seed(1))
        self.task, self.sampler, self.done = IdTask(), ProblemSampler(prompts, 0), 0

    def resident(self) -> int:
        return resident_bytes(self.model, self.optimizer)

    def step(self) -> dict:
        from entropy_rft.run.stops import finite_sampling
        from entropy_rft.train.problems import sample_batch

        cfg, step_, i = self.cfg, self.step_, self.done
        sync()
        t0 = time.perf_counter()
        with finite_sampling():
            batch = sample_batch(self.engine, self.task, self.sampler, cfg, i)
        sync()
        t1 = time.perf_counter()
        behaviour = step_.statistics(batch, i)
        sync()
        t2 = time.perf_counter()
        decision = step_.decide(batch, behaviour)
        probe = step_.probe(batch.rollout, behaviour, i)
        updated = step_.update(batch.rollout, decision, held=behaviour.held)
        sync()
        t3 = time.perf_counter()
        self.engine.sync_weights()
        step_.diagnose(i, batch, behaviour, decision, updated, probe)
        sync()
        t4 = time.perf_counter()
        self.done += 1
        return {
            "rollout_s": t1 - t0,
            "stats_s": t2 - t1,
            "update_s": t3 - t2,
            "other_s": t4 - t3,
            "tokens": int(batch.rollout.response_mask.sum()),
            "truncated_frac": float((~batch.rollout.finished).float().mean()),
            "reward_mean": float(batch.rewards.mean()),
        }

    def close(self) -> None:
        self.engine.close()


def step_config(method: str, args):
    """The built-in trainer's settings for the comparison; trl_fields maps them onto GRPOConfig."""
    from entropy_rft.config import resolve_config

    return resolve_config(
        {
            "method": method,
            "prompts_per_step": args.prompts,
            "group_size": args.group,
            "max_new_tokens": args.response,
            "temperature": 1.0,
            "top_p": 1.0,
            "micro_batch_size": args.micro,
            "precision": "bf16" if CUDA else "fp32",
            "gradient_checkpointing": args.checkpointing == "on",
            "lr": args.lr,
            "loss_agg": "token-mean",
            "dual_clip_c": None,  # TRL's delta (its dual clip) is off by default
            "kl_coef": 0.0,
            "probe_every": 0,  # TRL has no probe
            "device": DEVICE,
            "decode": "auto",  # the default: on CUDA the fixed-shape step captured in a CUDA graph
            "progress": False,
            "seed": 0,
        }
    )


def trl_fields(cfg, args, out_dir: str) -> dict:
    """GRPOConfig fields that give TRL the built-in trainer's work (cfg: step_config's): one generation batch of
    prompts x group rows per optimizer step, strict on-policy, the same sampling, loss, optimizer and precision."""
    rows = cfg.prompts_per_step * cfg.group_size
    per_pass = cfg.micro_batch_size if 0 < cfg.micro_batch_size < rows else rows
    return {
        "output_dir": out_dir,
        "per_device_train_batch_size": per_pass,
        "gradient_accumulation_steps": rows // per_pass,  # micro-batches of one optimizer step, as ours
        "steps_per_generation": rows // per_pass,  # one generation batch per optimizer step
        "num_iterations": 1,
        "num_generations": cfg.group_size,
        "max_completion_length": cfg.max_new_tokens,
        "temperature": cfg.temperature,
        "top_p": cfg.top_p,
        "top_k": 0,
        "min_p": None,
        "repetition_penalty": 1.0,
        "cache_implementation": None,  # TRL's default transformers generate (dynamic cache)
        "use_vllm": False,
        "learning_rate": cfg.lr,
        "lr_scheduler_type": "constant",
        "warmup_steps": 0,
        "optim": "adamw_torch_fused" if CUDA else "adamw_torch",
        "adam_beta1": cfg.betas[0],
        "adam_beta2": cfg.betas[1],
        "weight_decay": cfg.weight_decay,  # 0: AdamW is Adam
        "max_grad_norm": cfg.grad_clip,
        "beta": 0.0,  # no KL term, no reference model (ours: kl_coef 0)
        "loss_type": "dapo",  # the token mean over the generation batch: ours loss_agg token-mean
        "epsilon": cfg.eps_low,
        "epsilon_high": cfg.eps_high,
        "delta": None,
        "importance_sampling_level": "token",
        "scale_rewards": "group",  # (R - mean_G) / std_G: ours advantage grpo
        "mask_truncated_completions": False,  # truncated responses stay in the loss, as ours
        "top_entropy_quantile": 1.0,
        "bf16": CUDA,  # float32 weights under bfloat16 autocast: ours precision bf16
        "use_cpu": not CUDA,
        "gradient_checkpointing": cfg.gradient_checkpointing,
        "gradient_checkpointing_kwargs": {"use_reentrant": False},  # ours: prepare_policy's
        "disable_dropout": True,
        "max_steps": args.warmup + args.steps + 1,  # the last is never released (TrlArm)
        "logging_steps": 1,  # every step logged: the monitor's statistics pass runs every step (its worst case)
        "save_strategy": "no",
        "report_to": [],
        "disable_tqdm": True,
        "log_completions": False,
        "shuffle_dataset": False,
        "seed": 0,
    }


class StopArm(Exception):
    """Ends a TRL arm's train() at its next step."""


class TrlArm:
    """TRL's own train() loop in a thread, held at each on_step_begin until the main thread releases one step, so
    TRL steps and ours alternate in one process with nothing else running. A step's window runs from the release
    to the next on_step_begin: generation (GRPOTrainer._generate), the rest of _generate_and_score_completions
    (rewards, advantages; EntropyGRPOTrainer's statistics pass and filter), TRL's forward/backward, clipping and
    optimizer step, then its logging."""

    def __init__(self, name: str, method: str | None, config, tokenizer, prompts: list[str], args, out_dir: str):
        import threading

        from datasets import Dataset
        from transformers import PrinterCallback, TrainerCallback
        from trl import GRPOConfig, GRPOTrainer

        self.name, self.error = name, None
        cfg = step_config("grpo", args)
        self.fields = trl_fields(cfg, args, out_dir)
        extra = {}
        cls = GRPOTrainer
        if method is not None:
            from entropy_rft.integrations.trl import EntropyGRPOTrainer

            cls, extra = EntropyGRPOTrainer, {"method": method, "probe_every": 0, "samples_every": 0}
        model = build_model(config)
        self.trainer = trainer = cls(
            model=model,
            reward_funcs=trl_reward,
            args=GRPOConfig(**self.fields),
            train_dataset=Dataset.from_list([{"prompt": p} for p in prompts]),
            processing_class=tokenizer,
            **extra,
        )
        self.times: dict[str, float] = {}
        generate, generate_and_score = trainer._generate, trainer._generate_and_score_completions

        def timed_generate(*a, **k):
            t = time.perf_counter()
            out = generate(*a, **k)
            sync()
            self.times["generate"] = time.perf_counter() - t
            return out

        def timed_generate_and_score(*a, **k):
            t = time.perf_counter()
            out = generate_and_score(*a, **k)
            sync()
            self.times["generate_and_score"] = time.perf_counter() - t
            self.times["tokens"] = int(out["completion_mask"].sum())
            return out

        trainer._generate, trainer._generate_and_score_completions = timed_generate, timed_generate_and_score
        trainer.remove_callback(PrinterCallback)  # TRL's log lines: the step's row carries what it needs of them
        self.go, self.parked, self.abort = threading.Event(), threading.Event(), False
        arm = self

        class Gate(TrainerCallback):
            def on_step_begin(self, args, state, control, **kwargs):
                arm.parked.set()
                arm.go.wait()
                arm.go.clear()
                if arm.abort:
                    raise StopArm

            def on_step_end(self, args, state, control, **kwargs):
                sync()
                arm.times["step_end"] = time.perf_counter()

        trainer.add_callback(Gate())

        def run():
            try:
                trainer.train()
            except StopArm:
                pass
            except BaseException as err:  # reported by step() in the main thread
                self.error = err
            finally:
                self.parked.set()

        self.thread = threading.Thread(target=run, name=name, daemon=True)
        self.thread.start()
        self.wait()  # train()'s set-up (accelerate, optimizer, dataloader) before the first step

    def wait(self) -> None:
        self.parked.wait()
        self.parked.clear()
        if self.error is not None:
            raise RuntimeError(f"{self.name}: TRL's train() failed") from self.error

    def resident(self) -> int:
        return resident_bytes(self.trainer.model, self.trainer.optimizer)

    def step(self) -> dict:
        self.times = {}
        sync()
        t0 = time.perf_counter()
        self.go.set()
        self.wait()
        sync()
        t1 = time.perf_counter()
        gen, gas, end = self.times["generate"], self.times["generate_and_score"], self.times["step_end"]
        log = self.trainer.state.log_history[-1] if self.trainer.state.log_history else {}
        return {
            "rollout_s": gen,
            "stats_s": gas - gen,
            "update_s": end - t0 - gas,
            "other_s": t1 - end,
            "tokens": self.times["tokens"],
            "truncated_frac": log.get("completions/clipped_ratio"),  # TRL's: responses that reached the limit
            "reward_mean": log.get("reward"),
        }

    def close(self) -> None:
        self.abort = True
        self.go.set()
        self.thread.join(timeout=60)


def emit(row: dict, args) -> None:
    """Print a result line and append it to --out at once (a run cut short by its timeout keeps what it measured)."""
    print(json.dumps(row, default=str), flush=True)
    if args.out:
        with open(args.out, "a") as f:
            f.write(json.dumps({"what": args.what, **row}, default=str) + "\n")


def bench_step_vs_trl(shape: str, args) -> None:
    import tempfile

    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(Path(args.shapes) / shape)
    if args.smoke:
        config = tiny_config(config)
    eos, pad = int(config.eos_token_id), int(config.bos_token_id)
    tokenizer = id_tokenizer(config.vocab_size, eos=eos, pad=pad)
    gen = torch.Generator().manual_seed(0)
    prompts = [
        " ".join(f"t{t}" for t in torch.randint(100, config.vocab_size - 100, (args.prompt_tokens,), generator=gen))
        for _ in range(args.prompts * (args.warmup + args.steps + 2))
    ]
    arms = [a for a in args.arms.split(",") if a]
    unknown = sorted(set(arms) - set(ARMS))
    if unknown:
        raise SystemExit(f"step-vs-trl: unknown arm(s) {unknown}; choose from {', '.join(ARMS)}")
    try:
        import trl
    except ImportError as err:
        dropped = [a for a in arms if a.startswith("trl_")]
        arms = [a for a in arms if not a.startswith("trl_")]
        print(f"step-vs-trl: TRL is not importable ({err}); the TRL arms {dropped} are left out", flush=True)
    else:
        print(json.dumps({"trl": trl.__version__}), flush=True)
    with torch.device("meta"):
        n_params = sum(p.numel() for p in AutoModelForCausalLM.from_config(config).parameters())
    if CUDA:  # every arm keeps its model, gradients and Adam state (16 bytes a parameter) for the whole run
        need, have = 16 * n_params * len(arms), torch.cuda.get_device_properties(0).total_memory
        if need > 0.7 * have:
            raise SystemExit(
                f"step-vs-trl: {len(arms)} arms of {n_params / 1e9:.2f}B parameters hold about {need / 2**30:.0f} GiB "
                f"of the card's {have / 2**30:.0f}: pass fewer --arms (e.g. ours_grpo,trl_grpo)"
            )
    header = {
        "shape": shape,
        "params": n_params,
        "prompts": args.prompts,
        "group": args.group,
        "prompt_tokens": args.prompt_tokens,
        "response": args.response,
        "micro": args.micro,
        "checkpointing": args.checkpointing,
        "warmup": args.warmup,
        "steps": args.steps,
        "arms": arms,
        "gpu": torch.cuda.get_device_name() if CUDA else "none",
        "torch": torch.__version__,
        "transformers": __import__("transformers").__version__,
    }
    tmp = tempfile.TemporaryDirectory()
    built: dict = {}

    def failed(name: str, err: Exception) -> None:  # one arm failing (memory, a TRL change) leaves the others
        traceback.print_exception(err)
        emit({"arm": name, "error": f"{type(err).__name__}: {err}"[:500]}, args)
        if name in built:
            built.pop(name).close()
        if CUDA:
            torch.cuda.empty_cache()

    for name in arms:
        kind, method = name.split("_", 1)
        t = time.perf_counter()
        try:
            if kind == "ours":
                built[name] = OursArm(name, method, config, tokenizer, prompts, args)
                if "ours_decode" not in header:  # the path the default decode="auto" takes for this model here
                    from entropy_rft.rollout.sampling import decode_path

                    length = args.prompt_tokens + args.response
                    header["ours_decode"] = decode_path(built[name].model, "auto", length, torch.device(DEVICE))[0]
            else:
                method = None if method == "grpo" else method
                built[name] = TrlArm(name, method, config, tokenizer, prompts, args, f"{tmp.name}/{name}")
                header.setdefault("trl_config", {k: v for k, v in built[name].fields.items() if k != "output_dir"})
        except Exception as err:
            failed(name, err)
            continue
        print(f"built {name} in {time.perf_counter() - t:.1f} s", flush=True)
    emit({"header": header}, args)
    rows = []
    try:
        for r in range(args.warmup + args.steps):
            order = arms[r % len(arms) :] + arms[: r % len(arms)]  # the order rotates from round to round
            for name in (n for n in order if n in built):
                arm = built[name]
                sync()
                reset_peak()
                base = torch.cuda.memory_allocated() if CUDA else 0
                held = arm.resident()
                try:
                    row = {"shape": shape, "arm": name, "round": r, "warmup": r < args.warmup, **arm.step()}
                except Exception as err:
                    failed(name, err)
                    continue
                row["step_s"] = sum(row[k] for k in ("rollout_s", "stats_s", "update_s", "other_s"))
                row["tok_per_s"] = row["tokens"] / row["step_s"]
                row["rollout_tok_per_s"] = row["tokens"] / row["rollout_s"]
                row["peak_gib"] = (torch.cuda.max_memory_allocated() - base + held) / 2**30 if CUDA else None
                emit(row, args)
                rows.append(row)
    finally:
        for arm in built.values():
            arm.close()
        tmp.cleanup()
    summary = step_summary(rows, arms)
    emit({"summary": summary}, args)
    print_step_table(summary, header)


def step_summary(rows: list[dict], arms: list[str]) -> dict:
    """Each arm's medians over its measured steps, and the paired ratios (same round) of the pairs that answer the
    issue: ours against TRL (GRPO; Clip_B), the adapter's monitor and Clip_B against plain TRL."""
    measured = [r for r in rows if not r["warmup"]]
    out: dict = {"arms": {}, "ratios": {}}
    for name in arms:
        mine = [r for r in measured if r["arm"] == name]
        if mine:
            keys = ("step_s", "rollout_s", "stats_s", "update_s", "other_s", "tok_per_s", "rollout_tok_per_s")
            out["arms"][name] = {k: statistics.median(r[k] for r in mine) for k in keys}
            peaks = [r["peak_gib"] for r in mine if r["peak_gib"] is not None]
            out["arms"][name]["peak_gib"] = max(peaks) if peaks else None
            out["arms"][name]["tokens"] = statistics.median(r["tokens"] for r in mine)
    pairs = [
        ("ours_grpo", "trl_grpo"),
        ("trl_none", "trl_grpo"),
        ("trl_clip_b", "trl_grpo"),
        ("ours_clip_b", "trl_clip_b"),
    ]
    for a, b in pairs:
        by_round = {}
        for r in measured:
            if r["arm"] in (a, b):
                by_round.setdefault(r["round"], {})[r["arm"]] = r["step_s"]
        ratios = [x[a] / x[b] for x in by_round.values() if a in x and b in x]
        if ratios:
            out["ratios"][f"{a}/{b}"] = {"median": statistics.median(ratios), "each": ratios}
    return out


def print_step_table(summary: dict, header: dict) -> None:
    print(
        f"\n{header['shape']}, {header['prompts']} x {header['group']} rows, {header['prompt_tokens']} prompt tokens, "
        f"up to {header['response']} new tokens, medians of {header['steps']} measured steps per arm after "
        f"{header['warmup']} warm-up"
    )
    print("| arm | step s | rollout s | stats s | update s | other s | tokens | tok/s | rollout tok/s | peak GiB |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, a in summary["arms"].items():
        print(
            f"| {name} | {a['step_s']:.3f} | {a['rollout_s']:.3f} | {a['stats_s']:.3f} | {a['update_s']:.3f} | "
            f"{a['other_s']:.3f} | {a['tokens']:.0f} | {a['tok_per_s']:.0f} | {a['rollout_tok_per_s']:.0f} | "
            f"{'-' if a['peak_gib'] is None else format(a['peak_gib'], '.2f')} |"
        )
    for pair, r in summary["ratios"].items():
        print(f"step time {pair}: {r['median']:.3f} (per round: {', '.join(f'{x:.3f}' for x in r['each'])})")


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


# in the order they run (static before compile, hf the slowest); compile_53 is issue 53's compiled step (seven
# projection GEMMs a layer, the noise filled outside the graph, attention over the whole cache), to compare against
DECODE_ARMS = ("static", "compile", "compile_53", "generate", "hf")
DECODE_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def comma_list(text: str, allowed) -> list[str]:
    items = [t for t in text.split(",") if t]
    bad = [t for t in items if t not in allowed]
    if bad or not items:
        raise argparse.ArgumentTypeError(f"{text!r}: choose from {', '.join(allowed)} (a comma list)")
    return items


def rows_list(values: list[str]) -> list[int]:
    """--rows 32 256 or --rows 32,256."""
    return [int(v) for value in values for v in value.split(",") if v]


def decode_arm(arm: str, model32, model, ids, mask, dtype, session, eos_ids=(-1,)):
    """fn(tokens, seed) -> (rows, tokens) sampled tokens: one rollout of `arm` (module docstring)."""
    from entropy_rft.rollout.decode import HandDecoder
    from entropy_rft.rollout.sampling import Sampling, StaticLoop, sample, sample_static

    def issue53(tokens: int, seed: int = 0):
        loop = StaticLoop(dtype=dtype if dtype == torch.bfloat16 else None, capture=CUDA, noise="device", compiled=True)
        sampling = Sampling(n=1, temperature=1.0, top_p=1.0, max_new_tokens=tokens, eos_ids=list(eos_ids), pad_id=0)
        with torch.inference_mode():
            return sample_static(
                model32,
                HandDecoder(model32),
                ids,
                mask,
                sampling,
                generator=torch.Generator(DEVICE).manual_seed(seed),
                session=session,
                loop=loop,
            )[0]

    def ours(tokens: int, seed: int = 0):
        return sample(
            model if arm == "hf" else model32,
            ids,
            mask,
            Sampling(n=1, temperature=1.0, top_p=1.0, max_new_tokens=tokens, eos_ids=list(eos_ids), pad_id=0),
            generator=torch.Generator(DEVICE).manual_seed(seed),
            dtype=dtype if dtype == torch.bfloat16 else None,
            decode=arm,
            session=session,
        )[0]

    def generate(tokens: int, seed: int = 0):
        torch.manual_seed(seed)
        out = model.generate(  # every sampling field set: nothing merged from a generation_config changes it
            input_ids=ids,
            attention_mask=mask.long(),
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            min_p=None,
            typical_p=1.0,
            epsilon_cutoff=0.0,
            eta_cutoff=0.0,
            repetition_penalty=1.0,
            no_repeat_ngram_size=0,
            num_beams=1,
            max_new_tokens=tokens,
            min_new_tokens=tokens,
            eos_token_id=None,
            pad_token_id=0,
            cache_implementation="static",
        )
        return out[:, ids.shape[1] :]

    return {"generate": generate, "compile_53": issue53}.get(arm, ours)


def kernels_per_step(fn, session, tokens: int, block: int | None) -> float | None:
    """CUDA kernels one decode step of fn (a compiled arm, already compiled for this shape) launches, counted by
    torch.profiler (CUPTI records the kernels a CUDA graph replays): a rollout of `tokens` new tokens against one of
    a single token (the prefill and the first sample alone, no step), divided by the steps the session's timing saw
    plus the steps run uncaptured (the compile check's one, two warm-up steps a captured bucket: one bucket, or one a
    `block` columns reached). None on the CPU."""
    if not CUDA:
        return None
    from torch.profiler import ProfilerActivity, profile

    counts = []
    for n in (1, tokens):
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn(n, seed=7)
            sync()
        counts.append(sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA))
    steps = session.loops[-1][0]
    buckets = 1 if block is None else -(-steps // block)
    return (counts[1] - counts[0]) / (steps + 1 + 2 * buckets)


def decode_line(row: dict, out: str | None) -> None:
    """Print a decode row and append it to --out at once (a timeout keeps the rows before it)."""
    print(json.dumps(row), flush=True)
    if out:
        with open(out, "a") as f:
            f.write(json.dumps({"what": "decode", **row}, default=str) + "\n")


def bench_decode(shapes: list[str], args) -> list[dict]:
    from transformers import AutoConfig, AutoModelForCausalLM

    from entropy_rft.rollout.sampling import LENGTH_BLOCK, DecodeSession, compiled_graphs

    out = []
    gbs = bandwidth_gbs(torch.cuda.get_device_name() if CUDA else "cpu", args.bandwidth)
    new = args.response or (16 if args.smoke else 4096 if args.rl else 256)
    half = new // 2
    prompt_tokens = args.prompt_tokens or (8 if args.smoke else 256 if args.rl else 128)
    arms = [a for a in DECODE_ARMS if a in args.decode_arms]
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
        for dtype_name in args.dtypes:
            dtype = DECODE_DTYPES[dtype_name]
            model = model32  # hf and generate: a model in the dtype itself; static and compile: float32 weights
            if dtype != torch.float32:  # decoded through bf16 copies, as a policy trained under bf16 autocast is
                with torch.device(DEVICE):
                    model = AutoModelForCausalLM.from_config(config, dtype=dtype).eval()
                model.load_state_dict(model32.state_dict())
            for rows in args.rows:
                ids = torch.randint(100, config.vocab_size - 100, (rows, prompt_tokens), device=DEVICE)
                mask = torch.ones_like(ids, dtype=torch.bool)
                static_tokens = None
                # --rl: ragged responses, each step ending a row with probability about 1 / rl_mean (that many EOS
                # ids of a near-uniform random model): lengths from 1 to the limit, as an RL batch's are
                eos = tuple(range(100, 100 + max(1, config.vocab_size // args.rl_mean))) if args.rl else (-1,)
                for arm in arms:
                    row = {"shape": shape, "dtype": dtype_name, "rows": rows, "arm": arm, "rl": bool(args.rl)}
                    row.update(prompt_tokens=prompt_tokens, new_tokens=new)
                    session = DecodeSession(backend=args.compile_backend, mode=args.compile_mode, timing=True)
                    fn = decode_arm(arm, model32, model, ids, mask, dtype, session, eos)
                    looped = arm in ("static", "compile", "compile_53")  # the session times their decode loops
                    try:
                        sync()
                        t0 = time.perf_counter()
                        fn(new if looped else half)  # cold: compile, capture, autotune, allocator
                        sync()
                        first = time.perf_counter() - t0
                        row["compile_s"] = session.pop_compile_seconds() if arm.startswith("compile") else 0.0
                        times = {}
                        for tokens in (new,) if looped else (half, new):
                            if tokens != half and not looped:
                                fn(tokens)  # warm-up of this length (generate: its compile of this cache)
                            reps = []
                            for r in range(args.reps):
                                sync()
                                reset_peak()
                                t0 = time.perf_counter()
                                tokens_out = fn(tokens, seed=r + 1)
                                sync()
                                reps.append(time.perf_counter() - t0)
                                if args.rl and r == 0 and tokens == new:  # how ragged the responses were
                                    lengths = (tokens_out != 0).sum(1).float()
                                    row["mean_response"] = lengths.mean().item()
                                    row["response_quartiles"] = lengths.quantile(
                                        torch.tensor([0.25, 0.5, 0.75], device=lengths.device)
                                    ).tolist()
                                if r == 0 and tokens == new and arm in ("static", "compile"):
                                    if arm == "static":
                                        static_tokens = tokens_out.clone()
                                    elif static_tokens is not None:
                                        same = tokens_out == static_tokens
                                        row["tokens_same_as_static"] = same.float().mean().item()
                                        row["rows_same_as_static"] = same.all(1).float().mean().item()
                            times[tokens] = statistics.median(reps)
                        row["peak_gib"] = max_gib()
                        if looped:
                            steps, seconds = zip(*session.loops[-args.reps :])
                            step_s = statistics.median(s / n for s, n in zip(seconds, steps))
                        else:
                            step_s = (times[new] - times[half]) / (new - half)
                        row["cold_s"] = first - times.get(new if looped else half, 0.0)
                        if arm.startswith("compile") and args.kernels:
                            block = LENGTH_BLOCK if arm == "compile" else None
                            row["kernels_per_step"] = kernels_per_step(fn, session, new, block)
                        if arm in ("compile", "compile_53", "generate"):  # the weights changed in place, then one
                            before = compiled_graphs()
                            with torch.no_grad():
                                for m in {id(model32): model32, id(model): model}.values():
                                    for p in m.parameters():
                                        p.mul_(1.0 + 1e-3)
                            fn(new if looped else half, seed=99)
                            row["recompiles_after_update"] = compiled_graphs() - before
                    except Exception as e:  # one arm failing (memory, a transformers change) leaves the others
                        row["error"] = f"{type(e).__name__}: {e}"[:300]
                        decode_line(row, args.out)
                        out.append(row)
                        continue
                    row["ms_per_step"] = step_s * 1e3
                    row["tok_per_s"] = rows / step_s
                    row["rollout_s"] = times[new]
                    if arm.startswith("compile") and session.failed:
                        row["compile_failed"] = session.failed
                    if gbs:
                        limit = step_bytes(model32, dtype) / (gbs * 1e9)
                        with_kv = limit + kv_bytes(config, rows, prompt_tokens + 0.75 * new, dtype) / (gbs * 1e9)
                        row["weight_read_frac"] = limit / step_s
                        row["with_kv_frac"] = with_kv / step_s
                    decode_line(row, args.out)
                    out.append(row)
            del model
        del model32
        if CUDA:
            torch.cuda.empty_cache()
    return out


def fill(args, **defaults) -> None:
    """The subcommand's own default for each option left out (None)."""
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["stats", "trainer", "trl", "decode", "step-vs-trl"])
    parser.add_argument(
        "shape",
        nargs="*",
        default=None,
        help="shape folder(s) (trainer, trl, step-vs-trl: one; default Qwen--Qwen2.5-0.5B-Instruct; decode: any, "
        "`0.5B` and `1.5B` short for the Qwen2.5 shapes)",
    )
    parser.add_argument("--n", type=int, default=8192)
    parser.add_argument("--d", type=int, default=3584)
    parser.add_argument("--v", type=int, default=151936)
    parser.add_argument("--prompts", type=int, default=None, help="prompts per step (trainer: 8; step-vs-trl: 2)")
    parser.add_argument("--group", type=int, default=None, help="responses per prompt (trainer: 4; step-vs-trl: 16)")
    parser.add_argument("--prompt-tokens", type=int, default=None, help="trainer: 512; decode: 128; step-vs-trl: 32")
    parser.add_argument(
        "--response", type=int, default=None, help="new tokens (trainer: 2048; decode, step-vs-trl: 256)"
    )
    parser.add_argument(
        "--micro", type=int, default=None, help="rows per forward pass (trainer: 4; step-vs-trl: 0, all)"
    )
    parser.add_argument("--lora-rank", type=int, default=0)
    parser.add_argument(
        "--steps", type=int, default=None, help="measured steps (trainer, trl: 1; step-vs-trl: 2 an arm)"
    )
    parser.add_argument("--generate-bf16", action="store_true", help="generate under bf16 autocast")
    parser.add_argument("--rows", nargs="+", default=["32", "256"], help="decode: rows per rollout (32 256 or 32,256)")
    parser.add_argument(
        "--dtypes",
        type=lambda t: comma_list(t, DECODE_DTYPES),
        default=["bf16"],
        help="decode: weight dtypes, a comma list of bf16,fp32, run in that order (default bf16)",
    )
    parser.add_argument(
        "--compile-mode",
        default=None,
        choices=["max-autotune-no-cudagraphs", "reduce-overhead"],
        help="decode, compile arm: Inductor's mode (default: its default mode inside our own CUDA graph capture)",
    )
    parser.add_argument(
        "--compile-backend", default=None, help="decode, compile arm: dynamo backend (inductor; --smoke: aot_eager)"
    )
    parser.add_argument("--reps", type=int, default=2, help="decode: timed rollouts per length")
    parser.add_argument(
        "--rl",
        action="store_true",
        help="decode: RL-length ragged responses (default 4096 new tokens after 256 prompt tokens, rows ending at "
        "random lengths of mean about --rl-mean)",
    )
    parser.add_argument("--rl-mean", type=int, default=2048, help="decode --rl: a row's mean response length")
    parser.add_argument(
        "--kernels", action="store_true", help="decode: CUDA kernels per step of the compiled arms (torch.profiler)"
    )
    parser.add_argument("--bandwidth", type=float, default=None, help="decode: memory bandwidth, GB/s")
    parser.add_argument(
        "--smoke", action="store_true", help="decode, step-vs-trl: run a tiny model on the CPU (checks the script)"
    )
    parser.add_argument(
        "--arms",
        default=None,
        help=f"a comma list; decode: of {','.join(DECODE_ARMS)} (default all); step-vs-trl: of {','.join(ARMS)} "
        "(default all)",
    )
    parser.add_argument("--warmup", type=int, default=1, help="step-vs-trl: discarded steps an arm before the rounds")
    parser.add_argument("--lr", type=float, default=1e-6, help="step-vs-trl: learning rate of both trainers")
    parser.add_argument(
        "--checkpointing", choices=["on", "off"], default="on", help="step-vs-trl: gradient checkpointing in both"
    )
    parser.add_argument("--shapes", default=str(SHAPES), help="folder of shape folders (config.json each)")
    parser.add_argument("--out", default=None, help="append the JSON results to this file")
    args = parser.parse_args()
    if args.what == "decode" and not CUDA and not args.smoke:
        print("benchmarks/gpu.py decode needs CUDA (it times the CUDA-graph decode step); no CUDA device here")
        return
    if args.what == "stats" and not CUDA:
        print("benchmarks/gpu.py stats needs CUDA (it times the Triton kernels against TRL's); no CUDA device here")
        return
    if args.what == "step-vs-trl" and not CUDA and not args.smoke:
        print("benchmarks/gpu.py step-vs-trl needs CUDA (--smoke checks the script on the CPU); no CUDA device here")
        return
    args.rows = rows_list(args.rows)
    if args.what == "decode":
        try:
            args.decode_arms = comma_list(args.arms or ",".join(DECODE_ARMS), DECODE_ARMS)
        except argparse.ArgumentTypeError as err:
            parser.error(f"--arms {err}")
    args.arms = args.arms or ",".join(ARMS)  # step-vs-trl's
    args.compile_backend = args.compile_backend or ("aot_eager" if args.smoke and not CUDA else "inductor")
    print(json.dumps({"gpu": torch.cuda.get_device_name() if CUDA else "none", "torch": torch.__version__}), flush=True)
    shapes = [
        name if (Path(args.shapes) / name).is_dir() else f"Qwen--Qwen2.5-{name}-Instruct"
        for name in args.shape or ["Qwen--Qwen2.5-0.5B-Instruct"]
    ]
    if args.what == "stats":
        results = bench_stats(args.n, args.d, args.v)
    elif args.what == "trainer":
        fill(args, prompt_tokens=512, response=2048, prompts=8, group=4, micro=4, steps=1)
        results = bench_trainer(shapes[0], args)
    elif args.what == "decode":
        bench_decode(shapes, args)  # it writes its lines to --out as it goes
        return
    elif args.what == "step-vs-trl":
        if args.smoke:  # the CPU check: 2 x 4 rows of 8 tokens after 8-token prompts, one measured step
            fill(args, prompts=2, group=4, prompt_tokens=8, response=8, micro=0, steps=1)
        fill(args, prompts=2, group=16, prompt_tokens=32, response=256, micro=0, steps=2)
        bench_step_vs_trl(shapes[0], args)  # it writes its lines to --out as it goes
        return
    else:
        fill(args, response=2048, steps=1)
        results = bench_trl(shapes[0], args)
    if args.out:
        with open(args.out, "a") as f:
            for r in results:
                f.write(json.dumps({"what": args.what, **r}, default=str) + "\n")


if __name__ == "__main__":
    main()
