"""The shipped tiny policy for countdown: a character-level Qwen2 causal LM of about 0.8M parameters, warm-started
by supervised training on synthetic solutions, and the pass-rate-filtered problem splits that go with it.

`entropy-rft pretrain-toy --out DIR` rebuilds everything the package ships under assets/countdown-tiny:
    config.json, model.safetensors, generation_config.json   the policy (save_pretrained format)
    tokenizer.json, tokenizer_config.json                    a character-level tokenizers.WordLevel vocabulary
    data/train.jsonl   RL training problems with the initial policy's pass rate at 16 samples, filtered as in
                       the paper (Section 5.1): drop problems solved in >= 15/16 or <= 1/16 of the samples
    data/eval.jsonl    the held-out evaluation split (unfiltered, disjoint from train and warm-up problems)
    data/countdown5/   the harder setting (task `countdown5`): five numbers instead of three, which the policy never
                       saw in its warm-up; train.jsonl filtered the same way with the same policy, eval.jsonl held out.
                       The policy solves few of these (Pass@8 about 0.4 at the start), so exploration matters there.
    build.json         the settings and figures of the build
The build is seeded and deterministic on CPU for a given torch version and thread count. `build_split` alone
rebuilds a data split for an existing policy (about 90 s for countdown5 on 2 cores).
"""

from __future__ import annotations

import json
import math
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from .tasks.countdown import CountdownTask, Problem, make_problems, random_problem

ASSET_DIR = Path(__file__).parent / "assets" / "countdown-tiny"
SPECIALS = ["<pad>", "<eos>", "<unk>"]
CHARS = list("0123456789+-*()=>:,")


def build_tokenizer(chars: list[str] = CHARS):
    """A character-level fast tokenizer: one token per character, <pad>, <eos>, <unk>."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIALS + chars)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")


@dataclass
class ToyConfig:
    seed: int = 0
    hidden_size: int = 128  # width of the Qwen2 policy
    layers: int = 4
    heads: int = 4
    kv_heads: int = 2
    sft_steps: int = 300  # supervised warm-up steps; fewer leaves a weaker, higher-entropy policy
    sft_batch: int = 256
    sft_lr: float = 3e-3
    n_train_pool: int = 1500  # candidate RL problems before pass-rate filtering
    n_eval: int = 200  # held-out evaluation problems
    filter_samples: int = 16  # samples per problem for the pass-rate filter (paper: 16)
    filter_temperature: float = 1.0  # the rollout temperature
    max_new_tokens: int = 16
    hard_numbers: int = 5  # countdown5: numbers per problem of the harder split
    n_hard_pool: int = 1500  # countdown5: candidate RL problems before pass-rate filtering
    n_hard_eval: int = 200  # countdown5: held-out evaluation problems


def build_model(tokenizer, cfg: ToyConfig):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=cfg.hidden_size, intermediate_size=3 * cfg.hidden_size,
        num_hidden_layers=cfg.layers, num_attention_heads=cfg.heads, num_key_value_heads=cfg.kv_heads,
        max_position_embeddings=64, tie_word_embeddings=True, pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id, bos_token_id=None,
    )
    return Qwen2ForCausalLM(config)


def _sft_batch(tokenizer, problems: list[Problem]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded prompt + solution + EOS, with labels only on the completion."""
    task = CountdownTask()
    rows, label_rows = [], []
    for p in problems:
        prompt_ids = tokenizer.encode(task.prompt(p), add_special_tokens=False)
        comp_ids = tokenizer.encode(p.solution, add_special_tokens=False) + [tokenizer.eos_token_id]
        rows.append(prompt_ids + comp_ids)
        label_rows.append([-100] * len(prompt_ids) + comp_ids)
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), tokenizer.pad_token_id)
    labels = torch.full((len(rows), width), -100)
    for i, (r, lab) in enumerate(zip(rows, label_rows)):
        ids[i, : len(r)] = torch.tensor(r)
        labels[i, : len(lab)] = torch.tensor(lab)
    return ids, (ids != tokenizer.pad_token_id) | (labels != -100), labels


def pretrain(cfg: ToyConfig, out: Path, *, progress: bool = True) -> dict:
    """Build the tokenizer, warm up the policy on synthetic solutions, filter problems, save everything."""
    from .rollout import HFEngine
    from .evaluate import filter_by_pass_rate, sample_correctness

    t0 = time.time()
    torch.manual_seed(cfg.seed)
    torch.use_deterministic_algorithms(True)
    out = Path(out)
    (out / "data").mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    model = build_model(tokenizer, cfg)
    n_params = sum(p.numel() for p in model.parameters())

    eval_set = make_problems(cfg.n_eval, seed=cfg.seed + 1)
    pool = make_problems(cfg.n_train_pool, seed=cfg.seed + 2, exclude={p.key for p in eval_set})
    held_out = {p.key for p in eval_set} | {p.key for p in pool}
    rng = random.Random(cfg.seed + 3)

    opt = torch.optim.AdamW(model.parameters(), lr=cfg.sft_lr, betas=(0.9, 0.98), weight_decay=0.01)
    model.train()
    bar = tqdm(range(cfg.sft_steps), desc="warm-up (SFT)", disable=not progress)
    for step in bar:
        lr = cfg.sft_lr * min(1.0, (step + 1) / 100) * 0.5 * (1 + math.cos(math.pi * step / cfg.sft_steps))
        for group in opt.param_groups:
            group["lr"] = lr
        batch = []
        while len(batch) < cfg.sft_batch:
            p = random_problem(rng)
            if p.key not in held_out:
                batch.append(p)
        ids, attn, labels = _sft_batch(tokenizer, batch)
        loss = model(input_ids=ids, attention_mask=attn.long(), labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 50 == 0:
            bar.set_postfix(loss=f"{loss.item():.3f}")
    model.eval()
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)

    engine = HFEngine(model, tokenizer)
    task = CountdownTask()
    correct, _ = sample_correctness(engine, task, pool, n=cfg.filter_samples, temperature=cfg.filter_temperature,
                                    max_new_tokens=cfg.max_new_tokens, seed=cfg.seed + 4)
    rates = [sum(c) / cfg.filter_samples for c in correct]
    kept = filter_by_pass_rate(pool, rates)  # paper: drop pass rates <= 1/16 and >= 15/16
    with open(out / "data" / "train.jsonl", "w") as f:
        for p, r in kept:
            f.write(json.dumps({**p.to_json(), "pass_rate": r}) + "\n")
    with open(out / "data" / "eval.jsonl", "w") as f:
        for p in eval_set:
            f.write(json.dumps(p.to_json()) + "\n")
    info = {
        "config": asdict(cfg), "parameters": n_params, "final_sft_loss": float(loss.detach()),
        "pool": len(pool), "train_after_filter": len(kept), "eval": len(eval_set),
        "pool_mean_pass_rate": sum(rates) / len(rates),
        "dropped_low": sum(r <= 1 / 16 for r in rates), "dropped_high": sum(r >= 15 / 16 for r in rates),
        "seconds": time.time() - t0, "torch": torch.__version__, "threads": torch.get_num_threads(),
    }
    info["countdown5"] = build_split(engine, out / "data" / "countdown5", cfg)
    info["seconds"] = time.time() - t0
    (out / "build.json").write_text(json.dumps(info, indent=2) + "\n")
    torch.use_deterministic_algorithms(False)
    return info


def build_split(engine, out: Path, cfg: ToyConfig) -> dict:
    """The countdown5 split for the policy behind `engine`: cfg.n_hard_eval held-out problems of cfg.hard_numbers
    numbers (eval.jsonl, unfiltered) and a disjoint pool of cfg.n_hard_pool filtered by the policy's pass rate at
    cfg.filter_samples samples as in the paper (train.jsonl). Returns its figures for build.json."""
    from .evaluate import filter_by_pass_rate, sample_correctness

    t0 = time.time()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    eval_set = make_problems(cfg.n_hard_eval, seed=cfg.seed + 11, n_numbers=cfg.hard_numbers)
    pool = make_problems(cfg.n_hard_pool, seed=cfg.seed + 12, n_numbers=cfg.hard_numbers,
                         exclude={p.key for p in eval_set})
    correct, _ = sample_correctness(engine, CountdownTask(), pool, n=cfg.filter_samples,
                                    temperature=cfg.filter_temperature, max_new_tokens=cfg.max_new_tokens,
                                    seed=cfg.seed + 13)
    rates = [sum(c) / cfg.filter_samples for c in correct]
    kept = filter_by_pass_rate(pool, rates)
    with open(out / "train.jsonl", "w") as f:
        for p, r in kept:
            f.write(json.dumps({**p.to_json(), "pass_rate": r}) + "\n")
    with open(out / "eval.jsonl", "w") as f:
        for p in eval_set:
            f.write(json.dumps(p.to_json()) + "\n")
    return {"numbers": cfg.hard_numbers, "pool": len(pool), "train_after_filter": len(kept), "eval": len(eval_set),
            "pool_mean_pass_rate": sum(rates) / len(rates), "dropped_low": sum(r <= 1 / 16 for r in rates),
            "dropped_high": sum(r >= 15 / 16 for r in rates), "seconds": time.time() - t0}


# ---------------------------------------------------------------------------------------------------------------
# A stand-in for a real chat model: random weights, a character tokenizer over printable ASCII, a chat template.
# `entropy-rft train --config RECIPE --dry-run` runs a recipe's pipeline on it (prompt template, chat template,
# math reward, losses) in seconds on a CPU; it learns nothing.

STAND_IN_CHAT_TEMPLATE = ("{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}\n"
                          "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}")


def build_stand_in(out: Path, *, seed: int = 0, hidden_size: int = 32, layers: int = 2) -> Path:
    """Write a random tiny Qwen2 chat model (save_pretrained format) to out and return out."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tokenizer = build_tokenizer([chr(c) for c in range(32, 127)] + ["\n"])
    tokenizer.chat_template = STAND_IN_CHAT_TEMPLATE
    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=2 * hidden_size,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=8192, tie_word_embeddings=True, pad_token_id=tokenizer.pad_token_id,
                         eos_token_id=tokenizer.eos_token_id, bos_token_id=None)
    model = Qwen2ForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    out = Path(out)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out
