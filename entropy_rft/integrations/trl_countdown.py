"""The embedded countdown task in TRL's GRPOTrainer, set up as the built-in trainer's demo is (`configs/demo.yaml`),
so the TRL adapter can be run, tested and compared on a CPU: the shipped 0.8M-parameter policy, the countdown
reward, the demo's batch, sampling and optimiser settings.

    from entropy_rft.integrations.trl_countdown import countdown_trainer
    trainer = countdown_trainer("runs/trl-clip_b", method="clip_b", steps=150)   # Clip_B, mu 1.5 (the demo's)
    trainer.train()

The packaged real model (`make real-lm`) runs the same way with its own recipe (configs/smollm2-135m.yaml: countdown
in words, prompts as chat turns, the CPU-sized batch):

    trainer = countdown_trainer("runs/trl-smollm2", model="smollm2-135m", method="none", steps=2)   # monitor mode

Several processes: `accelerate launch --multi_gpu --num_processes 2 script.py` (on a machine without GPUs
accelerate's torchrun launcher starts CPU processes that share the batch through gloo; its `--cpu` flag alone
starts one process, and its multi-CPU mode needs MPI). `per_device` rows per process then make one generation batch
of per_device x processes rows.

How the settings map, numbered (TrainConfig -> GRPOConfig):
1. prompts_per_step x group_size rows per step -> per_device_train_batch_size x processes with num_generations
   group_size, steps_per_generation 1, gradient_accumulation_steps 1, num_iterations 1 (strict on-policy).
2. The token-mean loss over the kept tokens (loss_agg token-mean, denominator kept) -> loss_type "dapo", whose
   normaliser the adapter recounts over the kept tokens (integrations/trl.py, departure 3); eps 0.2 both sides.
3. Adam (0.9, 0.999), constant learning rate, no weight decay, gradient clipping at 1.0, no KL (beta 0), no dropout.
4. Sampling at temperature 1.0, top_p 1.0 and no top-k, at most max_new_tokens tokens.
5. chat_template true -> conversational prompts (one user turn), which TRL renders with the tokenizer's template;
   a response is finished when TRL's completion ids hold the EOS token (the shipped policy's reward, as before,
   counts every response as finished).
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..config import TrainConfig, load_config, load_demo_config, resolve_config, run_config
from ..packaged import PACKAGED
from ..tasks import TASKS
from ..train.policy import BUILTIN_MODELS, resolve_model_path
from ..train.problems import default_data, load_problems


def run_settings(model: str = "countdown-tiny") -> TrainConfig:
    """The settings TRL is given: the demo's GRPO for the shipped policy, a packaged model's own recipe for it."""
    if model in PACKAGED:
        return resolve_config({"model": model})
    return run_config(load_demo_config(), "grpo")


def countdown_dataset(split: str = "train", cfg: TrainConfig | None = None):
    """(datasets.Dataset of {"prompt", "idx"}, problems): the run's countdown split as TRL reads it (departure 5:
    a chat turn when cfg.chat_template)."""
    from datasets import Dataset

    cfg = cfg or load_config(None)
    task = TASKS.get(cfg.task)
    problems = load_problems(default_data(cfg, split), task)
    turn = (lambda text: [{"role": "user", "content": text}]) if cfg.chat_template else (lambda text: text)
    return Dataset.from_list([{"prompt": turn(task.prompt(p)), "idx": i} for i, p in enumerate(problems)]), problems


def countdown_reward(problems: list, task_name: str = "countdown", eos_id: int | None = None):
    """TRL reward function: the task's reward of each completion, its problem found by the `idx` column; with eos_id,
    finished means the completion's ids hold it (departure 5), else every completion counts as finished."""
    task = TASKS.get(task_name)

    def reward(completions, idx, completion_ids=None, **_):
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]  # chat: the assistant turn
        finished = [True] * len(texts) if eos_id is None else [eos_id in ids for ids in completion_ids]
        scored = task.score_batch(texts, finished, [problems[i] for i in idx])
        return [r for r, _ in scored]

    reward.__name__ = task_name
    return reward


def countdown_args(
    out: str | Path,
    *,
    seed: int = 0,
    steps: int | None = None,
    processes: int = 1,
    cfg: TrainConfig | None = None,
    **overrides,
):
    """GRPOConfig with the run's settings (the demo's unless `cfg` is given; module docstring); `overrides` are
    GRPOConfig fields."""
    from trl import GRPOConfig

    cfg = cfg or run_config(load_demo_config(), "grpo", out=str(out))
    rows = cfg.prompts_per_step * cfg.group_size
    if rows % processes:
        raise ValueError(f"{rows} rows per step do not split over {processes} processes")
    base = dict(
        output_dir=str(out),
        per_device_train_batch_size=rows // processes,
        num_generations=cfg.group_size,
        max_completion_length=cfg.max_new_tokens,
        temperature=cfg.temperature,
        top_p=cfg.top_p,
        top_k=0,
        learning_rate=cfg.lr,
        adam_beta1=cfg.betas[0],
        adam_beta2=cfg.betas[1],
        weight_decay=cfg.weight_decay,
        lr_scheduler_type="constant",
        warmup_steps=0,
        max_grad_norm=cfg.grad_clip,
        beta=0.0,
        epsilon=cfg.eps_low,
        epsilon_high=cfg.eps_high,
        num_iterations=1,
        steps_per_generation=1,
        gradient_accumulation_steps=1,
        loss_type="dapo",
        max_steps=steps or cfg.steps,
        use_cpu=True,
        report_to=[],
        save_strategy="no",
        logging_steps=1,
        disable_tqdm=True,
        seed=seed,
        bf16=False,
        disable_dropout=True,
        log_completions=False,
    )
    return GRPOConfig(**{**base, **overrides})


def countdown_trainer(
    out: str | Path,
    *,
    method: str | None = "clip_b",
    method_options: dict | None = None,
    seed: int = 0,
    steps: int | None = None,
    processes: int = 1,
    cls=None,
    model: str = "countdown-tiny",
    **overrides,
):
    """EntropyGRPOTrainer (or GRPOTrainer when method is None, or `cls`) on the shipped countdown policy and task, or
    on a packaged model (`model`, packaged.py) with its recipe. method_options default to the demo's for the method
    (Clip_B mu 1.5; Clip_V mu 3.0, max_frac 0.05; a packaged model: the filter's defaults); method "none" watches
    TRL's own loss (no options)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOTrainer

    from .trl import EntropyGRPOTrainer

    packaged = model in PACKAGED
    cfg = run_settings(model) if packaged else None
    path = resolve_model_path(model) if packaged else str(BUILTIN_MODELS["countdown-tiny"])
    data, problems = countdown_dataset("train", cfg)
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.padding_side = "left"
    policy = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    args = countdown_args(out, seed=seed, steps=steps, processes=processes, cfg=cfg, **overrides)
    reward = countdown_reward(problems, cfg.task, tokenizer.eos_token_id) if packaged else countdown_reward(problems)
    extra = {}
    if method == "none":
        extra = {"method": method}
    elif method is not None and packaged:
        extra = {"method": method, "method_options": method_options or {}}
    elif method is not None:  # the demo's options where the demo runs the method (None values: the filter's defaults)
        options = (
            method_options if method_options is not None else run_config(load_demo_config(), method).method_overrides()
        )
        extra = {"method": method, "method_options": options}
    trainer_cls = cls or (EntropyGRPOTrainer if method is not None else GRPOTrainer)
    return trainer_cls(
        model=policy, reward_funcs=reward, args=args, train_dataset=data, processing_class=tokenizer, **extra
    )
