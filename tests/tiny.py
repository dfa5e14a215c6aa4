"""Tiny runs of the shipped countdown policy (0.8M parameters): the settings several test files train with, in one
place (issue 65). `tiny_config(tmp_path, name, **settings)` is a TrainConfig writing to tmp_path/name, the shape's
settings first and the test's own over them."""

from __future__ import annotations

from pathlib import Path

from entropy_rft.config import TrainConfig, load_config

# Two updates at lr 1e-3, no evaluation, no token samples: a method's training steps, watched through the step's
# calls (Step.decide, step_metrics) or its metrics lines.
TWO_STEPS = dict(steps=2, prompts_per_step=4, group_size=4, lr=1e-3, eval_problems=0, progress=False, samples_every=0)
# Three steps at lr 1e-4 with evaluations of 8 problems at k = 2: a run's whole record (metrics, checkpoints, evals)
# and what reads it (report, resume).
THREE_STEPS = dict(steps=3, prompts_per_step=4, group_size=4, lr=1e-4, eval_problems=8, eval_k=2, progress=False)


def tiny_config(tmp_path: Path, name: str = "run", *, shape: dict = TWO_STEPS, **settings) -> TrainConfig:
    return load_config(None, **{**shape, "out": str(tmp_path / name), **settings})
