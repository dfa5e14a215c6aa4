"""Optional metric sinks: TensorBoard event files and Weights & Biases in offline mode."""

import pytest

from entropy_rft.config import load_config
from entropy_rft.train.trainer import train


def run(tmp_path, sinks):
    cfg = load_config(
        None,
        steps=2,
        prompts_per_step=2,
        group_size=2,
        eval_problems=2,
        eval_k=1,
        progress=False,
        out=str(tmp_path),
        sinks=sinks,
    )
    train(cfg)


@pytest.mark.slow
def test_tensorboard_sink_writes_event_files(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run(tmp_path, ["tensorboard"])
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    assert [e.step for e in acc.Scalars("entropy")] == [1, 2]


@pytest.mark.slow
def test_wandb_sink_offline(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    run(tmp_path, ["wandb"])
    assert list((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))


def test_tensorboard_steps_after_the_resumed_checkpoint_are_purged(tmp_path):
    """A logger restarted at step 3 (a resume from checkpoint-3 after a kill at step 5) hides the killed run's
    events of steps 4 and 5: TensorBoard then shows each step once, the later value where a step was redone."""
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from entropy_rft.logging import MetricLogger

    first = MetricLogger(tmp_path, {}, ("tensorboard",))
    for step in range(1, 6):
        first.log({"step": step, "x": float(step)})
    first.close()
    again = MetricLogger(tmp_path, {}, ("tensorboard",), start_step=3)
    for step in range(4, 7):
        again.log({"step": step, "x": 10.0 * step})
    again.close()
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("x")] == [
        (1, 1.0),
        (2, 2.0),
        (3, 3.0),
        (4, 40.0),
        (5, 50.0),
        (6, 60.0),
    ]
