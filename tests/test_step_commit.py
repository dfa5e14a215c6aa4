"""A step commits whole: a stop at any moment of a step resumes to the run that was never stopped.

- a stop between two optimizer steps of one update (mini_batches 2) waits for the step's metrics line, then saves
  the step as done (rundir.StopSignals);
- a stop during a mid-run evaluation leaves the step pending in the checkpoint (checkpoint.py), and resume evaluates
  and logs it;
- a real SIGTERM to a `train` subprocess, whenever it lands.
Each ends with final weights bit-identical to the uninterrupted run's, every step logged once, every evaluation
recorded (eval.json and the metrics lines)."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from entropy_rft.config import load_config
from entropy_rft.logging import read_metrics
from entropy_rft.run.checkpoint import find_checkpoint
from entropy_rft.train.trainer import train

ROOT = Path(__file__).resolve().parents[1]
# two optimizer steps per update, an evaluation every 2 steps, no periodic checkpoint: only the stop saves
SETTINGS = dict(
    method="clip_b",
    mu=1.0,
    steps=4,
    mini_batches=2,
    eval_every=2,
    save_every=0,
    prompts_per_step=4,
    group_size=4,
    max_new_tokens=8,
    eval_problems=2,
    eval_k=2,
    lr=1e-3,
    progress=False,
    samples_every=2,
)


@pytest.fixture(scope="module")
def whole_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("whole") / "run"
    train(load_config(None, **SETTINGS, out=str(out)))
    return out


def _assert_same_run(a: Path, b: Path) -> None:
    """Final weights bit for bit; each step logged once, in order, with the same rewards and evaluations."""
    from safetensors.torch import load_file

    final = f"checkpoint-{SETTINGS['steps']}/model.safetensors"
    wa, wb = load_file(a / final), load_file(b / final)
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    pick = lambda rows: [(r["step"], r["reward_mean"], r.get("eval/avg_at_k"), r["grad_norm"]) for r in rows]  # noqa: E731
    assert pick(read_metrics(a)) == pick(read_metrics(b))
    assert [r["step"] for r in read_metrics(b)] == list(range(1, SETTINGS["steps"] + 1))
    assert (a / "eval.json").read_text() == (b / "eval.json").read_text()
    assert "2" in __import__("json").loads((b / "eval.json").read_text())


class _Signals:
    """Send this process SIGTERM from inside the run, with a fallback handler that fails the test if the run had
    none."""

    def __enter__(self):
        def unhandled(signum, frame):
            raise AssertionError("SIGTERM reached the test: the run installed no handler")

        self.outer = signal.signal(signal.SIGTERM, unhandled)
        return self

    def __exit__(self, *exc):
        signal.signal(signal.SIGTERM, self.outer)


@pytest.mark.slow
def test_a_stop_between_two_optimizer_steps_waits_for_the_step(tmp_path, whole_run, monkeypatch):
    """SIGTERM after step 3's first optimizer step, before its second: the run finishes the update, writes step 3's
    line, saves checkpoint-3 as step 3 done; resume ends as the uninterrupted run. (Step 2's, whose evaluation is
    due, is the pending case of the next test.)"""
    real = torch.nn.utils.clip_grad_norm_
    calls = []

    def clip_then_stop(*args, **kwargs):
        calls.append(1)
        if len(calls) == 6:  # step 3's second optimizer step (two per step)
            os.kill(os.getpid(), signal.SIGTERM)
        return real(*args, **kwargs)

    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", clip_then_stop)  # called once per optimizer step
    run = tmp_path / "run"
    with _Signals(), pytest.raises(SystemExit, match="SIGTERM: stopped after 3 steps"):
        train(load_config(None, **SETTINGS, out=str(run)))
    monkeypatch.undo()
    assert [r["step"] for r in read_metrics(run)] == [1, 2, 3] and find_checkpoint(run) == run / "checkpoint-3"
    assert torch.load(run / "checkpoint-3" / "trainer_state.pt", weights_only=False)["pending"] is None
    train(load_config(None, **SETTINGS, out=str(run)), resume=True)
    _assert_same_run(whole_run, run)


@pytest.mark.slow
def test_a_stop_during_a_mid_run_evaluation_keeps_the_step(tmp_path, whole_run, monkeypatch):
    """SIGTERM inside step 2's evaluation: checkpoint-2 holds step 2 as pending (its line is not written yet);
    resume evaluates it, writes the line, and goes on: steps [1, 2, 3, 4] each once, evaluations {0, 2, 4}."""
    import entropy_rft.train.trainer as trainer

    real = trainer.run_eval
    calls = []

    def eval_then_stop(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:  # step 0's evaluation, then step 2's
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.01)
        return real(*args, **kwargs)

    monkeypatch.setattr(trainer, "run_eval", eval_then_stop)
    run = tmp_path / "run"
    with _Signals(), pytest.raises(SystemExit, match="SIGTERM: stopped after 2 steps"):
        train(load_config(None, **SETTINGS, out=str(run)))
    monkeypatch.undo()
    assert [r["step"] for r in read_metrics(run)] == [1]
    saved = torch.load(run / "checkpoint-2" / "trainer_state.pt", weights_only=False)
    assert saved["pending"]["step"] == 2 and set(saved["evals"]) == {0}
    train(load_config(None, **SETTINGS, out=str(run)), resume=True)
    _assert_same_run(whole_run, run)


@pytest.mark.slow
def test_a_real_sigterm_to_a_train_process_resumes_to_the_same_run(tmp_path, whole_run):
    """A real SIGTERM to `entropy-rft train` once step 1 is logged (wherever in step 2 it lands), then --resume:
    the same final weights, each step logged once, every evaluation recorded."""
    sets = [
        f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in {**SETTINGS, "out": tmp_path / "r"}.items()
    ]
    cmd = [sys.executable, "-m", "entropy_rft.commands.cli", "train", "--set", *sets]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = tmp_path / "r"
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 300
    while not (run / "metrics.jsonl").exists() or not read_metrics(run):
        assert proc.poll() is None and time.time() < deadline, proc.stderr.read().decode()[-2000:]
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    err = proc.communicate(timeout=300)[1].decode()
    assert proc.returncode != 0 and "SIGTERM" in err and "Traceback" not in err, err[-2000:]
    subprocess.run(cmd + ["--resume"], cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL)
    _assert_same_run(whole_run, run)
