"""The shipped tiny policy for countdown: a character-level Qwen2 causal LM of about 0.8M parameters, warm-started
by supervised training on synthetic solutions, and the pass-rate-filtered problem splits that go with it.

`entropy-rft pretrain-toy --out DIR` rebuilds everything the package ships under assets/countdown-tiny:
    config.json, model.safetensors, generation_config.json   the policy (save_pretrained format)
    tokenizer.json, tokenizer_config.json                    a character-level tokenizers.WordLevel vocabulary
    data/train.jsonl   RL training problems with the initial policy's pass rate at 16 samples, filtered as in
                       the paper (Section 5.1): drop problems solved in >= 15/16 or <= 1/16 of the samples
    data/eval.jsonl    the held-out evaluation split (unfiltered; no puzzle in it is in train.jsonl or was in the
                       warm-up, puzzles told apart by identity: sorted numbers and target, tasks/splits.py)
    data/countdown5/   the harder setting (task `countdown5`): five numbers instead of three, which the policy never
                       saw in its warm-up; train.jsonl filtered the same way with the same policy, eval.jsonl held out.
                       The policy solves few of these (Pass@8 about 0.4 at the start), so exploration matters there.
    data/countdown5_large/   (task `countdown5_large`, issue 31) 8,000 five-number training problems filtered the
                       same way with the same policy, and 1,000 held-out evaluation problems, each with the policy's
                       correct count at 64 samples (temperature 0.7) and its initial-difficulty `stratum`; built by
                       `build_pool`, not by `pretrain-toy` without --split (see below)
    build.json         the settings and figures of the build
The build is seeded and deterministic on CPU for a given torch version and thread count. `build_split` alone
rebuilds a data split for an existing policy (about 90 s for countdown5 on 2 cores). `entropy-rft pretrain-toy
--split countdown5_large --out DIR` runs `build_pool` with the shipped policy on one thread. Before issue 39 (puzzles
told apart by ordered numbers) 61,000 candidates x 16 samples and 1,000 x 64 took 368 s under `nice` on a shared
2-core machine; with candidates distinct by identity the stream reaches rarer, harder puzzles and needs more of them
(five numbers from 1..9 with a target up to 99: about 89,000 distinct puzzles in the first 2,000,000 draws), and
the issue-39 rebuild kept 4 to 5 problems a second under `nice` with the machine's load at 20 to 35 (its build.json
records the time). tests/test_pool.py regenerates its first rows and its evaluation file.

Departures:
1. (issue 39) The warm-up leaves out the evaluation puzzles of the three-number split by identity, not the RL
   training pool's. Three numbers from 1..9 with a target up to 99 make only 2,562 puzzles the generator reaches;
   evaluation (200) and pool (1,500) together take 1,700 of them, and a warm-up without those would see only the
   rarest third. So the RL training problems are puzzles the warm-up may have seen (as they already were before
   issue 39, when the exclusion compared ordered numbers and missed reorderings); the evaluation puzzles are not.
   countdown5 and countdown5_large have five numbers, which the warm-up never shows.
2. (issue 39) Builds before issue 39 told puzzles apart by their ordered numbers: reorderings of evaluation puzzles
   were in training (85 of 200 for the three-number split, 3 of 200 for countdown5, 439 of 1,000 for
   countdown5_large) and in the warm-up (all 200 three-number evaluation problems). build.json records the counts
   of tasks/splits.split_overlaps, all zero now, and the command that rebuilds each file.
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
from .tasks.splits import check_clean, split_overlaps

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


def warmup_batches(cfg: ToyConfig, exclude: set[str]):
    """The supervised warm-up's problems, one list of cfg.sft_batch per step for cfg.sft_steps steps: a seeded stream
    of random three-number problems without the puzzles whose identity is in `exclude` (departure 1)."""
    rng = random.Random(cfg.seed + 3)
    for _ in range(cfg.sft_steps):
        batch = []
        while len(batch) < cfg.sft_batch:
            p = random_problem(rng)
            if p.identity not in exclude:
                batch.append(p)
        yield batch


def build_model(tokenizer, cfg: ToyConfig):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=cfg.hidden_size,
        intermediate_size=3 * cfg.hidden_size,
        num_hidden_layers=cfg.layers,
        num_attention_heads=cfg.heads,
        num_key_value_heads=cfg.kv_heads,
        max_position_embeddings=64,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
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


def _warm_up(model, tokenizer, cfg: ToyConfig, eval_ids: set, *, progress: bool) -> tuple[dict[str, Problem], float]:
    """The supervised warm-up on synthetic solutions (AdamW, 100 steps of linear warm-up, then cosine); returns
    one problem per identity it showed (for the clean-split check) and its last loss."""
    warmup: dict[str, Problem] = {}  # one problem per identity the warm-up showed, for the clean-split check

    opt = torch.optim.AdamW(model.parameters(), lr=cfg.sft_lr, betas=(0.9, 0.98), weight_decay=0.01)
    model.train()
    bar = tqdm(warmup_batches(cfg, eval_ids), total=cfg.sft_steps, desc="warm-up (SFT)", disable=not progress)
    for step, batch in enumerate(bar):
        lr = cfg.sft_lr * min(1.0, (step + 1) / 100) * 0.5 * (1 + math.cos(math.pi * step / cfg.sft_steps))
        for group in opt.param_groups:
            group["lr"] = lr
        warmup.update((p.identity, p) for p in batch)
        ids, attn, labels = _sft_batch(tokenizer, batch)
        loss = model(input_ids=ids, attention_mask=attn.long(), labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 50 == 0:
            bar.set_postfix(loss=f"{loss.item():.3f}")
    return warmup, float(loss.detach())


def pretrain(cfg: ToyConfig, out: Path, *, progress: bool = True) -> dict:
    """Build the tokenizer, warm up the policy on synthetic solutions, filter problems, save everything."""
    from .evaluate import filter_by_pass_rate, sample_correctness
    from .rollout import HFEngine

    t0 = time.time()
    torch.manual_seed(cfg.seed)
    torch.use_deterministic_algorithms(True)
    out = Path(out)
    (out / "data").mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    model = build_model(tokenizer, cfg)
    n_params = sum(p.numel() for p in model.parameters())

    eval_set = make_problems(cfg.n_eval, seed=cfg.seed + 1)
    eval_ids = {p.identity for p in eval_set}
    pool = make_problems(cfg.n_train_pool, seed=cfg.seed + 2, exclude=eval_ids)
    warmup, loss = _warm_up(model, tokenizer, cfg, eval_ids, progress=progress)
    model.eval()
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)

    engine = HFEngine(model, tokenizer)
    task = CountdownTask()
    correct, _ = sample_correctness(
        engine,
        task,
        pool,
        n=cfg.filter_samples,
        temperature=cfg.filter_temperature,
        max_new_tokens=cfg.max_new_tokens,
        seed=cfg.seed + 4,
    )
    rates = [sum(c) / cfg.filter_samples for c in correct]
    kept = filter_by_pass_rate(pool, rates)  # paper: drop pass rates <= 1/16 and >= 15/16
    check_clean([p for p, _ in kept], eval_set, warmup=warmup.values(), name="the countdown split")
    with open(out / "data" / "train.jsonl", "w") as f:
        for p, r in kept:
            f.write(json.dumps({**p.to_json(), "pass_rate": r}) + "\n")
    with open(out / "data" / "eval.jsonl", "w") as f:
        for p in eval_set:
            f.write(json.dumps(p.to_json()) + "\n")
    info = {
        "config": asdict(cfg),
        "parameters": n_params,
        "final_sft_loss": loss,
        "pool": len(pool),
        "train_after_filter": len(kept),
        "eval": len(eval_set),
        "pool_mean_pass_rate": sum(rates) / len(rates),
        "dropped_low": sum(r <= 1 / 16 for r in rates),
        "dropped_high": sum(r >= 15 / 16 for r in rates),
        "warmup_puzzles": len(warmup),
        "identity": "sorted numbers and target (Problem.identity)",
        "overlaps": split_overlaps([p for p, _ in kept], eval_set, warmup=warmup.values()),
        "command": f"entropy-rft pretrain-toy --seed {cfg.seed} --sft-steps {cfg.sft_steps} --out DIR",
        "seconds": time.time() - t0,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
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
    pool = make_problems(
        cfg.n_hard_pool, seed=cfg.seed + 12, n_numbers=cfg.hard_numbers, exclude={p.identity for p in eval_set}
    )
    correct, _ = sample_correctness(
        engine,
        CountdownTask(),
        pool,
        n=cfg.filter_samples,
        temperature=cfg.filter_temperature,
        max_new_tokens=cfg.max_new_tokens,
        seed=cfg.seed + 13,
    )
    rates = [sum(c) / cfg.filter_samples for c in correct]
    kept = filter_by_pass_rate(pool, rates)
    check_clean([p for p, _ in kept], eval_set, name="the countdown5 split")  # five numbers: never in the warm-up
    with open(out / "train.jsonl", "w") as f:
        for p, r in kept:
            f.write(json.dumps({**p.to_json(), "pass_rate": r}) + "\n")
    with open(out / "eval.jsonl", "w") as f:
        for p in eval_set:
            f.write(json.dumps(p.to_json()) + "\n")
    return {
        "numbers": cfg.hard_numbers,
        "pool": len(pool),
        "train_after_filter": len(kept),
        "eval": len(eval_set),
        "pool_mean_pass_rate": sum(rates) / len(rates),
        "dropped_low": sum(r <= 1 / 16 for r in rates),
        "dropped_high": sum(r >= 15 / 16 for r in rates),
        "overlaps": split_overlaps([p for p, _ in kept], eval_set),
        "seconds": time.time() - t0,
    }


# ---------------------------------------------------------------------------------------------------------------
# countdown5_large (issue 31): a training pool of 8,000 distinct puzzles, filtered exactly as build_split filters
# countdown5, and 1,000 held-out puzzles, each with a stratum of initial difficulty. Puzzles are told apart by identity
# (issue 39): the pool shipped before it held 25,000 rows but 12,335 distinct puzzles, 439 of the evaluation's among
# them. 8,000, not the 25,000 first planned: about 10,150 distinct puzzles of the stream pass the filter under the
# shipped policy (benchmarks/pool_capacity.py; docs/prereg_avgk.md, Amendment 2), so a 1,500-step run at 32 prompts
# a step draws each about 6 times.

STRATA = ("unsolved", "hard", "easier")  # see stratum()


def stratum(correct: int, n: int) -> str:
    """The initial-difficulty stratum of a problem the initial policy solved in `correct` of n samples: unsolved
    (0 of n), hard (pass rate in (0, 1/4)), easier ([1/4, 1]). Three, not more: at 64 samples the shipped policy
    leaves about 28% of countdown5 problems unsolved, 50% hard, and only about 2% at 3/4 or more."""
    if not 0 <= correct <= n or n < 1:
        raise ValueError(f"stratum needs 0 <= correct <= n and n >= 1, got correct={correct}, n={n}")
    rate = correct / n
    if rate == 0:
        return "unsolved"
    return "hard" if rate < 0.25 else "easier"


@dataclass
class PoolConfig:
    """The countdown5_large build. Defaults are the shipped split's. Candidates come from one seeded stream that
    skips the evaluation problems, filtered chunk by chunk, each chunk sampled with its own seed: a smaller n_train
    (same seed, n_eval and chunk) gives a prefix of the training file, a smaller n_eval a prefix of the evaluation
    file (with a training pool that then may differ)."""

    seed: int = 0
    n_train: int = 8_000  # filtered training problems kept (the first n_train that pass the filter)
    n_eval: int = 1_000  # held-out evaluation problems (unfiltered)
    numbers: int = 5  # numbers per problem, as countdown5
    chunk: int = 500  # candidates filtered per seeded sampling call
    filter_samples: int = 16  # as ToyConfig.filter_samples (paper: 16)
    filter_temperature: float = 1.0  # as ToyConfig.filter_temperature: the rollout temperature
    strata_samples: int = 64  # samples per evaluation problem behind its stratum
    strata_temperature: float = 0.7  # the study's evaluation temperature (configs/demo.yaml eval_temperature)
    max_new_tokens: int = 16
    max_stale_draws: int = 1_000_000  # candidate draws in a row without a new puzzle before the build gives up


PARTIAL = ".pool-partial.pkl"  # build_pool's state after its last finished chunk (removed when the build ends)


class _PoolState:
    """A countdown5_large build in progress: the evaluation problems and their correct counts, the candidates
    filtered so far with their pass rates, the candidate stream's position (its generator's state and draws) and the
    chunk count. Saved after each chunk, so a stopped build resumes where it stopped and writes the same files."""

    def __init__(self, cfg: PoolConfig, eval_set: list[Problem], counts: list[int], eval_seconds: float):
        self.cfg, self.eval_set, self.counts, self.eval_seconds = cfg, eval_set, counts, eval_seconds
        self.candidates: list[Problem] = []
        self.rates: list[float] = []
        self.kept: list[tuple[Problem, float]] = []
        self.rng = random.Random(cfg.seed * 1000 + 33)  # the candidate stream
        self.chunks = self.draws = 0
        self.elapsed = 0.0  # seconds spent by earlier processes on this build

    def save(self, out: Path, seconds: float) -> None:
        import pickle

        state = {**self.__dict__, "cfg": asdict(self.cfg), "elapsed": self.elapsed + seconds}
        tmp = out / (PARTIAL + ".tmp")
        tmp.write_bytes(pickle.dumps(state))
        tmp.replace(out / PARTIAL)  # atomic: a stop mid-write leaves the previous chunk's state

    @classmethod
    def load(cls, out: Path, cfg: PoolConfig) -> _PoolState | None:
        """The saved state of a build of cfg in out, or None (none saved, or saved by a build of other settings)."""
        import pickle

        path = out / PARTIAL
        if not path.exists():
            return None
        state = pickle.loads(path.read_bytes())
        if state["cfg"] != asdict(cfg):
            return None
        resumed = cls.__new__(cls)
        resumed.__dict__.update({**state, "cfg": cfg})
        return resumed

    def next_chunk(self) -> list[Problem]:
        """cfg.chunk new puzzles from the stream, none seen before (evaluation problems included)."""
        cfg, seen = self.cfg, {p.identity for p in self.eval_set} | {p.identity for p in self.candidates}
        chunk: list[Problem] = []
        stale = 0
        while len(chunk) < cfg.chunk:
            p = random_problem(self.rng, n_numbers=cfg.numbers)
            self.draws += 1
            if p.identity not in seen:
                seen.add(p.identity)
                chunk.append(p)
                stale = 0
            elif (stale := stale + 1) >= cfg.max_stale_draws:
                raise ValueError(
                    f"countdown5_large: {stale} draws in a row gave no new puzzle after {len(self.kept)} of "
                    f"{cfg.n_train} training puzzles; ask for fewer (n_train)"
                )
        return chunk


def _pool_info(state: _PoolState, kept: list[tuple[Problem, float]], seconds: float) -> dict:
    """build.json's figures."""
    cfg, rates, counts = state.cfg, state.rates, state.counts
    return {
        "config": asdict(cfg),
        "train": len(kept),
        "eval": len(state.eval_set),
        "candidates": len(rates),
        "chunks": state.chunks,
        "draws": state.draws,
        "identity": "sorted numbers and target (Problem.identity)",
        "overlaps": split_overlaps([p for p, _ in kept], state.eval_set),
        "command": (
            f"entropy-rft pretrain-toy --split countdown5_large --seed {cfg.seed} --train-problems "
            f"{cfg.n_train} --eval-problems {cfg.n_eval} --out DIR"
        ),
        "candidate_mean_pass_rate": sum(rates) / len(rates),
        "dropped_low": sum(r <= 1 / 16 for r in rates),
        "dropped_high": sum(r >= 15 / 16 for r in rates),
        "strata": {name: sum(stratum(c, cfg.strata_samples) == name for c in counts) for name in STRATA},
        "eval_initial_avg": sum(counts) / (len(counts) * cfg.strata_samples),
        "eval_seconds": round(state.eval_seconds, 1),
        "seconds": round(seconds, 1),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
    }


def build_pool(engine, out: Path, cfg: PoolConfig, *, progress: bool = False) -> dict:
    """Write out/train.jsonl (cfg.n_train problems of cfg.numbers numbers whose pass rate under the policy behind
    `engine`, at cfg.filter_samples samples and the rollout temperature, passes evaluate.filter_by_pass_rate, the
    paper's Section 5.1 rule that build_split applies to countdown5: 1/16 < rate < 15/16), out/eval.jsonl (cfg.n_eval
    held-out problems, none among the training candidates, each with the policy's correct count out of
    cfg.strata_samples at the evaluation temperature and its `stratum`) and out/build.json; returns build.json's
    figures. Puzzles are distinct by identity (sorted numbers and target) across both files. A stopped build
    resumes from its last finished chunk (out/.pool-partial.pkl) and writes the files the unstopped one would."""
    from .evaluate import filter_by_pass_rate, sample_correctness

    t0 = time.time()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    task = CountdownTask(name="countdown5_large")
    state = _PoolState.load(out, cfg)
    if state is None:
        eval_set = make_problems(cfg.n_eval, seed=cfg.seed * 1000 + 31, n_numbers=cfg.numbers)
        correct, _ = sample_correctness(
            engine,
            task,
            eval_set,
            n=cfg.strata_samples,
            temperature=cfg.strata_temperature,
            max_new_tokens=cfg.max_new_tokens,
            seed=cfg.seed * 1000 + 32,
        )
        state = _PoolState(cfg, eval_set, [sum(c) for c in correct], time.time() - t0)
        state.save(out, time.time() - t0)
    done = min(len(state.kept), cfg.n_train)
    bar = tqdm(total=cfg.n_train, initial=done, desc="countdown5_large pool", disable=not progress)
    while len(state.kept) < cfg.n_train:
        candidates = state.next_chunk()
        got, _ = sample_correctness(
            engine,
            task,
            candidates,
            n=cfg.filter_samples,
            temperature=cfg.filter_temperature,
            max_new_tokens=cfg.max_new_tokens,
            seed=cfg.seed * 10**6 + 1000 + state.chunks,
        )
        chunk_rates = [sum(c) / cfg.filter_samples for c in got]
        passed = filter_by_pass_rate(candidates, chunk_rates)
        state.candidates += candidates
        state.rates += chunk_rates
        state.kept += passed
        state.chunks += 1
        state.save(out, time.time() - t0)
        bar.update(min(len(passed), cfg.n_train - bar.n))
    bar.close()
    kept = state.kept[: cfg.n_train]
    check_clean([p for p, _ in kept], state.eval_set, name="the countdown5_large split")  # five numbers: not in warm-up
    with open(out / "train.jsonl", "w") as f:
        for p, r in kept:
            f.write(json.dumps({**p.to_json(), "pass_rate": r}) + "\n")
    with open(out / "eval.jsonl", "w") as f:
        for p, c in zip(state.eval_set, state.counts):
            f.write(json.dumps({**p.to_json(), "initial_correct": c, "stratum": stratum(c, cfg.strata_samples)}) + "\n")
    info = _pool_info(state, kept, state.elapsed + time.time() - t0)
    (out / "build.json").write_text(json.dumps(info, indent=2) + "\n")
    (out / PARTIAL).unlink()
    return info


# ---------------------------------------------------------------------------------------------------------------
# A stand-in for a real chat model: random weights, a character tokenizer over printable ASCII, a chat template.
# `entropy-rft train --config RECIPE --dry-run` runs a recipe's pipeline on it (prompt template, chat template,
# math reward, losses) in seconds on a CPU; it learns nothing.

STAND_IN_CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def build_stand_in(out: Path, *, seed: int = 0, hidden_size: int = 32, layers: int = 2) -> Path:
    """Write a random tiny Qwen2 chat model (save_pretrained format) to out and return out."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tokenizer = build_tokenizer([chr(c) for c in range(32, 127)] + ["\n"])
    tokenizer.chat_template = STAND_IN_CHAT_TEMPLATE
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )
    model = Qwen2ForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    out = Path(out)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out


def build_pool_split(cfg, model, tokenizer, out: Path, *, progress: bool = True) -> dict:
    """The countdown5_large split (build_pool) with an existing policy, sampled with one thread (the build is
    deterministic for a given torch version and thread count; one thread is what every machine has)."""
    from .rollout import HFEngine

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return build_pool(HFEngine(model, tokenizer), out, cfg, progress=progress)
    finally:
        torch.set_num_threads(threads)
