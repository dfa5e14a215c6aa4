"""A run's problems: the task's training and evaluation problems (shipped splits, math datasets, JSONL files),
their seeded order, and each step's batch of scored responses (DAPO's dynamic sampling included)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor

from ..config import TrainConfig
from ..packaged import BUILTIN_MODELS
from ..rollout import Rollout
from ..run.stops import NonFiniteReward
from ..tasks import MathTask
from ..tasks.data import load_math


@dataclass
class Scored:
    """A step's batch: prompts_per_step groups of group_size responses and their rewards, (B,) each."""

    problems: list
    rollout: Rollout
    rewards: Tensor  # (B,) the task's
    correct: Tensor  # (B,) bool
    info: dict = field(default_factory=dict)  # sampling/* metrics

    @property
    def group_ids(self) -> Tensor:
        return torch.arange(len(self.problems)).repeat_interleave(len(self.rewards) // max(len(self.problems), 1))


SHIPPED_DATA = {
    "countdown": BUILTIN_MODELS["countdown-tiny"] / "data",  # task -> directory of train/eval.jsonl
    "countdown_chat": BUILTIN_MODELS["countdown-tiny"] / "data",  # the same problems, in words
    "countdown5": BUILTIN_MODELS["countdown-tiny"] / "data" / "countdown5",
    "countdown5_large": BUILTIN_MODELS["countdown-tiny"] / "data" / "countdown5_large",
}


def task_problems(cfg: TrainConfig, task, split: str) -> list:
    """Training or evaluation problems: math dataset specs through entropy_rft.tasks.data, else task JSONL."""
    if isinstance(task, MathTask):
        spec = cfg.train_data if split == "train" else cfg.eval_data
        if not spec:
            raise ValueError(
                f"task {cfg.task!r} needs {split}_data: a dataset name (dapo_train, dapo500, aime24), "
                "name=path or a path"
            )
        return load_math(spec, data_dir=cfg.data_dir)[1]
    return load_problems(default_data(cfg, split), task)


def default_data(cfg: TrainConfig, split: str) -> Path:
    given = cfg.train_data if split == "train" else cfg.eval_data
    if given:
        return Path(given)
    if cfg.task in SHIPPED_DATA:  # the shipped splits, filtered with the shipped policy
        return SHIPPED_DATA[cfg.task] / f"{split}.jsonl"
    raise ValueError(f"no {split}_data given: task {cfg.task!r} has no shipped data; set train_data and eval_data")


def check_prompts(engine, task, problems: list, *, source: str, max_new_tokens: int, limit: int, option: str) -> None:
    """Every problem's prompt fits the model's context and `limit` tokens (rollout.hf.check_prompt_lengths), each
    named as row i of `source` (1-based, in the order read) with the start of its prompt."""
    from ..rollout.hf import check_prompt_lengths

    prompts = [task.prompt(p) for p in problems]
    rows = [f"{source} row {i + 1} ({' '.join(p[:40].split())!r}...)" for i, p in enumerate(prompts)]
    check_prompt_lengths(engine, prompts, rows, max_new_tokens=max_new_tokens, limit=limit, option=option)


def load_problems(path: Path, task) -> list:
    if not path.exists():
        raise FileNotFoundError(f"no problem file at {path}")
    problems = []
    for n, line in enumerate(path.read_text(encoding="utf-8-sig").splitlines(), 1):  # a leading BOM is dropped
        if line.strip():
            try:
                problems.append(task.parse_row(json.loads(line)))
            except ValueError as err:
                raise ValueError(f"{path}:{n}: {err}") from None
    if not problems:
        raise ValueError(f"{path} holds no problems")
    return problems


class ProblemSampler:
    """Epochs over the training problems in a seeded random order."""

    def __init__(self, problems: list, seed: int):
        self.problems = problems
        self.gen = torch.Generator().manual_seed(seed)
        self.order: list[int] = []

    def next(self, n: int) -> list:
        out = []
        while len(out) < n:
            if not self.order:
                self.order = torch.randperm(len(self.problems), generator=self.gen).tolist()
            out.append(self.problems[self.order.pop()])
        return out

    def state(self) -> dict:
        return {"gen": self.gen.get_state(), "order": list(self.order)}

    def load(self, state: dict) -> None:
        self.gen.set_state(state["gen"])
        self.order = list(state["order"])


def check_rewards(task, rewards: list, texts: list[str], problems: list, group_size: int) -> None:
    """Raise NonFiniteReward naming the task's reward, the first response whose reward is not a finite number, its
    problem and the value (a NaN reward would otherwise surface as a NaN loss, blamed on the learning rate)."""
    for i, value in enumerate(rewards):
        try:
            finite = math.isfinite(value)
        except TypeError:
            finite = False
        if not finite:
            name = getattr(task, "name", type(task).__name__)
            prompt = " ".join(task.prompt(problems[i // group_size])[:60].split())
            raise NonFiniteReward(
                f"the reward of task {name!r} is {value!r}, not a finite number, for response {i % group_size + 1} "
                f"({texts[i][:40]!r}) to the prompt {prompt!r}...; a reward must be a finite float"
            )


def sample_batch(engine, task, sampler: ProblemSampler, cfg: TrainConfig, step: int) -> Scored:
    """prompts_per_step groups of group_size responses with their rewards. With dynamic sampling (DAPO), groups
    whose responses are all correct or all wrong are dropped and more prompts are sampled, for at most
    max_sampling_rounds rounds; the batch may then hold fewer groups (never none: an all-uniform last round is
    kept as it is, and its zero advantages make the update a no-op)."""
    G = cfg.group_size
    kept_problems, parts, rewards, correct = [], [], [], []
    rounds = cfg.max_sampling_rounds if cfg.dynamic_sampling else 1
    for rnd in range(rounds):
        problems = sampler.next(cfg.prompts_per_step)
        ro = engine.generate(
            [task.prompt(p) for p in problems],
            n=G,
            temperature=cfg.temperature,
            top_p=cfg.top_p,
            max_new_tokens=cfg.max_new_tokens,
            seed=cfg.seed * 100003 + step + 7919 * rnd,
        )
        scored = task.score_batch(ro.texts, ro.finished.tolist(), [problems[j // G] for j in range(len(ro.texts))])
        check_rewards(task, [x for x, _ in scored], ro.texts, problems, G)
        r = torch.tensor([x for x, _ in scored], dtype=torch.float32)
        c = torch.tensor([y for _, y in scored])
        for i, problem in enumerate(problems):
            rows = slice(i * G, (i + 1) * G)
            n_correct = int(c[rows].sum())
            if cfg.dynamic_sampling and n_correct in (0, G):
                continue
            if len(kept_problems) < cfg.prompts_per_step:
                kept_problems.append(problem)
                parts.append(ro.select(rows))
                rewards.append(r[rows])
                correct.append(c[rows])
        if len(kept_problems) >= cfg.prompts_per_step:
            break
    info = {"sampling/rounds": rnd + 1, "sampling/groups": len(kept_problems)}
    if not kept_problems:
        return Scored(problems, ro, r, c, info)
    return Scored(
        kept_problems,
        Rollout.concat(parts, engine.tokenizer.pad_token_id),
        torch.cat(rewards),
        torch.cat(correct),
        info,
    )
