"""The GPU checks that CI (a CPU machine) cannot run: `make test-gpu` runs this file with the kernels' tests and the
recipe-shape guarantees on CUDA (ENTROPY_RFT_TEST_DEVICE=cuda). Every test here skips with one line where no CUDA
device is visible.

- a 3-step `entropy-rft train` of Clip_B and of PPO (GAE, value head) on CUDA in bf16 autocast: every step logged,
  every metric finite, the strict on-policy ratio exactly 1 (loss/ratio_mean 1, loss/ppo_kl 0);
- TRL's GRPOTrainer watched by the monitor (method "none") on CUDA: the entropy_rft/* metrics in TRL's log."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
import torch

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU (make test-gpu on a GPU machine)"
)

SMALL = [
    "prompts_per_step=8",
    "group_size=4",
    "max_new_tokens=16",
    "eval_problems=8",
    "eval_k=2",
    "progress=false",
    "device=cuda",
    "precision=bf16",
]


@pytest.mark.parametrize("method", ["clip_b", "ppo"])
def test_three_steps_train_on_cuda(method, tmp_path):
    """`entropy-rft train --method M --steps 3` on CUDA in bf16: 3 metrics lines, all finite, ratio exactly 1."""
    out = tmp_path / method
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "entropy_rft.commands.cli",
            "train",
            "--method",
            method,
            "--steps",
            "3",
            "--out",
            str(out),
            "--set",
            *SMALL,
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    for r in rows:
        assert all(math.isfinite(v) for v in r.values() if isinstance(v, float)), r
        assert r["loss/ratio_mean"] == 1.0 and r["loss/ppo_kl"] == 0.0
    assert (out / "eval.json").exists()


def test_trl_monitor_on_cuda(tmp_path):
    """TRL's GRPOTrainer on the shipped countdown policy on CUDA, watched (method "none"): two steps, the monitor's
    entropy and predicted change in TRL's log."""
    pytest.importorskip("trl")
    from entropy_rft.integrations.trl_countdown import countdown_trainer

    trainer = countdown_trainer(tmp_path / "trl", method="none", steps=2, use_cpu=False)
    trainer.train()
    logged = [h for h in trainer.state.log_history if "entropy_rft/entropy" in h]
    assert logged and all(math.isfinite(h["entropy_rft/entropy"]) for h in logged)
