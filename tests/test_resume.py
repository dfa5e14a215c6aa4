"""Run state survives SIGKILL at any moment and SIGTERM saves it: atomic checkpoints, metrics cut back to the
checkpoint on resume, and a killed-then-resumed run ends with the same weights as one never interrupted."""

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from entropy_rft.config import load_config
from entropy_rft.logging import MetricLogger, read_metrics
from entropy_rft.run.checkpoint import find_checkpoint, save_checkpoint
from entropy_rft.train.policy import load_policy
from entropy_rft.train.problems import ProblemSampler
from entropy_rft.train.trainer import train

ROOT = Path(__file__).resolve().parents[1]
# the smallest run that exercises every piece of state: the entropy controller (mu chosen each step from its
# fitted kappa), Adam, the problem sampler; a checkpoint every 2 steps
SETTINGS = dict(
    method="clip_b",
    entropy_target=1.0,
    steps=6,
    save_every=2,
    prompts_per_step=2,
    group_size=4,
    max_new_tokens=8,
    eval_problems=2,
    eval_k=1,
    lr=1e-4,
    progress=False,
    samples_every=1,
)


def _policy_parts(tmp_path):
    model, tok = load_policy("countdown-tiny", torch.device("cpu"), trainable=True)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    return model, tok, opt, ProblemSampler(list(range(10)), seed=0)


def test_kill_during_checkpoint_write_leaves_the_previous_one(tmp_path, monkeypatch):
    """A checkpoint write that dies half-way (here: the trainer state's torch.save raises after the weights were
    written) leaves no partial checkpoint directory, latest_checkpoint still names the previous checkpoint, and that
    checkpoint is the one resume picks and it loads."""
    model, tok, opt, sampler = _policy_parts(tmp_path)
    save_checkpoint(tmp_path, 2, model, tok, opt, sampler)
    real_save = torch.save

    def dying_save(obj, path, *a, **kw):
        if str(path).endswith("trainer_state.pt"):
            raise KeyboardInterrupt("killed mid-write")
        return real_save(obj, path, *a, **kw)

    monkeypatch.setattr(torch, "save", dying_save)
    with torch.no_grad():
        next(model.parameters()).add_(1.0)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(tmp_path, 4, model, tok, opt, sampler)
    monkeypatch.undo()
    assert not (tmp_path / "checkpoint-4").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-2", "latest_checkpoint"]
    assert (tmp_path / "latest_checkpoint").read_text() == "checkpoint-2"
    assert find_checkpoint(tmp_path) == tmp_path / "checkpoint-2"
    assert torch.load(tmp_path / "checkpoint-2" / "trainer_state.pt", weights_only=False)["step"] == 2
    load_policy(str(tmp_path / "checkpoint-2"), torch.device("cpu"))


def test_resume_falls_back_to_the_newest_complete_checkpoint(tmp_path):
    """latest_checkpoint naming a directory that is gone or incomplete (a kill between the renames of a same-step
    re-save) does not stop a resume: the newest complete checkpoint is taken."""
    model, tok, opt, sampler = _policy_parts(tmp_path)
    save_checkpoint(tmp_path, 2, model, tok, opt, sampler)
    save_checkpoint(tmp_path, 4, model, tok, opt, sampler)
    (tmp_path / "checkpoint-6").mkdir()  # a directory without trainer_state.pt is not a checkpoint
    (tmp_path / "latest_checkpoint").write_text("checkpoint-6")
    assert find_checkpoint(tmp_path) == tmp_path / "checkpoint-4"
    assert find_checkpoint(tmp_path / "checkpoint-6") is None


def test_metrics_are_cut_back_to_the_resumed_step(tmp_path):
    """Starting the logger at step 3 keeps metrics rows 1..3, drops 4..5 and a torn last line, and appends after."""
    rows = "".join(json.dumps({"step": s, "x": s}) + "\n" for s in range(1, 6))
    (tmp_path / "metrics.jsonl").write_text(rows + '{"step": 6, "x"')
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2, 3, 4, 5]  # the torn line is skipped
    logger = MetricLogger(tmp_path, {}, start_step=3)
    logger.log({"step": 4, "x": 40})
    logger.close()
    assert [(r["step"], r["x"]) for r in read_metrics(tmp_path)] == [(1, 1), (2, 2), (3, 3), (4, 40)]
    MetricLogger(tmp_path, {}, start_step=0).close()  # a fresh run in the same directory starts an empty file
    assert read_metrics(tmp_path) == []


def _cli(out: Path, *extra: str) -> list[str]:
    sets = [f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in {**SETTINGS, "out": out}.items()]
    return [sys.executable, "-m", "entropy_rft.commands.cli", "train", *extra, "--set", *sets]


def _steps(out: Path) -> list[int]:
    path = out / "metrics.jsonl"
    return [r["step"] for r in read_metrics(out)] if path.exists() else []


@pytest.fixture(scope="module")
def whole_run(tmp_path_factory) -> Path:
    """The uninterrupted run the interrupted ones are compared with (trained once for this module)."""
    out = tmp_path_factory.mktemp("whole") / "run"
    train(load_config(None, **SETTINGS, out=str(out)))
    return out


def _same_run(a: Path, b: Path) -> None:
    """Final weights bit for bit, and the controller-chosen mu and the rewards of every step, equal."""
    from safetensors.torch import load_file

    final = f"checkpoint-{SETTINGS['steps']}/model.safetensors"
    wa, wb = load_file(a / final), load_file(b / final)
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    pick = lambda rows: [(r["step"], r["filter/mu"], r["reward_mean"]) for r in rows]  # noqa: E731
    assert pick(read_metrics(a)) == pick(read_metrics(b))


@pytest.mark.slow
def test_sigterm_saves_where_the_run_stands_and_resume_matches_an_uninterrupted_run(tmp_path, whole_run, monkeypatch):
    """SIGTERM (what SLURM and Kubernetes send before SIGKILL) right after step 3 is logged: the run saves
    checkpoint-3 and exits naming --resume. `entropy-rft train --out DIR --resume` (no recipe: the run's own settings
    come back from its config.yaml) finishes it: each step logged once, and final weights, mu and rewards equal the
    uninterrupted run's. keep_checkpoints=2 leaves the newest two, as in the uninterrupted run."""
    from entropy_rft.commands.cli import main
    from entropy_rft.logging import JsonlSink

    real_log = JsonlSink.log

    def log_then_sigterm(self, metrics):
        real_log(self, metrics)
        if metrics["step"] == 3:
            os.kill(os.getpid(), signal.SIGTERM)

    def unhandled(signum, frame):  # what a run that ignored SIGTERM would meet (instead of pytest dying)
        raise AssertionError("SIGTERM reached the test: the run installed no handler")

    monkeypatch.setattr(JsonlSink, "log", log_then_sigterm)
    outer = signal.signal(signal.SIGTERM, unhandled)
    run = tmp_path / "run"
    try:
        with pytest.raises(
            SystemExit, match="SIGTERM: stopped after 3 steps; saved .*checkpoint-3. Continue with --resume"
        ):
            train(load_config(None, **SETTINGS, out=str(run)))
        assert signal.getsignal(signal.SIGTERM) is unhandled  # the run's handler is gone with the run
    finally:
        signal.signal(signal.SIGTERM, outer)
    monkeypatch.undo()
    assert _steps(run) == [1, 2, 3] and find_checkpoint(run) == run / "checkpoint-3"
    main(["train", "--out", str(run), "--resume"])
    assert _steps(run) == list(range(1, SETTINGS["steps"] + 1))
    _same_run(whole_run, run)
    assert sorted(p.name for p in run.glob("checkpoint-*")) == ["checkpoint-4", "checkpoint-6"]
    assert sorted(p.name for p in whole_run.glob("checkpoint-*")) == ["checkpoint-4", "checkpoint-6"]


@pytest.mark.slow
def test_sigkill_mid_run_then_resume_matches_an_uninterrupted_run(tmp_path, whole_run):
    """SIGKILL a real training run (a subprocess) after step 3 is logged, between checkpoints 2 and 4; --resume
    finishes it. metrics.jsonl then holds each step once, in order, and the final weights, the controller-chosen mu
    of every step and the rewards equal those of an uninterrupted run bit for bit; so do the token samples files,
    one per step."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    killed = tmp_path / "killed"
    proc = subprocess.Popen(_cli(killed), cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 300
    while max(_steps(killed), default=0) < 3 and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, proc.stderr.read().decode()[-2000:]
    logged = _steps(killed)
    assert 3 <= max(logged) < SETTINGS["steps"]
    assert not (killed / f"checkpoint-{SETTINGS['steps']}").exists()
    subprocess.run(_cli(killed, "--resume"), cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL)
    assert _steps(killed) == list(range(1, SETTINGS["steps"] + 1))
    assert not list(killed.glob(".checkpoint-*"))  # a write the kill cut short is cleared away
    _same_run(whole_run, killed)
    # token samples (samples_every 1): one file per step, none left over, each holding the whole run's record: the
    # same tokens, kept flags and rows exactly; numbers to 1e-4 (the two runs are different processes, and the probe's
    # gradient dot product, a metric copied into the record, may sum in another order under other thread counts)
    from entropy_rft.samples import read_samples

    got, want = read_samples(killed), read_samples(whole_run)
    assert sorted(got) == sorted(want) == list(range(1, SETTINGS["steps"] + 1))
    assert [p.name for p in (killed / "samples").iterdir() if p.name.startswith(".")] == []
    for step in got:
        assert _same(got[step], want[step]), step


def _same(a, b) -> bool:
    """Equal JSON structures, floats to a relative 1e-4."""
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-4, abs_tol=1e-30)
    return a == b
