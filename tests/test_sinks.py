"""Optional metric sinks: TensorBoard event files and Weights & Biases in offline mode."""

import pytest

from entropy_rft.config import load_config
from entropy_rft.trainer import train


def run(tmp_path, sinks):
    cfg = load_config(None, steps=2, prompts_per_step=2, group_size=2, eval_problems=2, eval_k=1, progress=False,
                      out=str(tmp_path), sinks=sinks)
    train(cfg)


def test_tensorboard_sink_writes_event_files(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run(tmp_path, ["tensorboard"])
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    assert [e.step for e in acc.Scalars("entropy")] == [1, 2]


def test_wandb_sink_offline(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    run(tmp_path, ["wandb"])
    assert list((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))
