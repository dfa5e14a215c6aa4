"""A run directory is one run's record (entropy_rft/run/rundir.py): one process at a time, no run over another's record
without --resume or --overwrite, a start that fails leaves the old record as it was, resume exact or refused,
checkpoint retention, and the stop signals."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from entropy_rft.config import load_config, setting_differences, settings_key
from entropy_rft.run.checkpoint import RunDirError, checkpoint_dirs, find_checkpoint, prune_checkpoints, step_of
from entropy_rft.run.rundir import RunLock, claim, new_run_dir, record_entries
from entropy_rft.run.stops import Interrupted, stop_signals_interrupt

ROOT = Path(__file__).resolve().parents[1]


def cfg_at(out, **kw):
    return load_config(None, **{"out": str(out), "progress": False, **kw})


def fake_record(run_dir: Path, cfg, steps=(2,), metrics=3) -> dict:
    """A run's record as train() leaves it (config.yaml and its digest, metrics, complete checkpoints); returns
    {name: bytes}."""
    import yaml

    from entropy_rft.run.record import write_digest

    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
    write_digest(run_dir, cfg)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps({"step": s}) + "\n" for s in range(1, metrics + 1)))
    for s in steps:
        (run_dir / f"checkpoint-{s}").mkdir()
        torch.save({"step": s}, run_dir / f"checkpoint-{s}" / "trainer_state.pt")  # a complete torch archive
    if steps:
        (run_dir / "latest_checkpoint").write_text(f"checkpoint-{max(steps)}")
    return snapshot(run_dir)


def snapshot(run_dir: Path) -> dict:
    return {
        str(p.relative_to(run_dir)): p.read_bytes()
        for p in sorted(run_dir.rglob("*"))
        if p.is_file() and p.name != ".lock"
    }


# ---------------------------------------------------------------------------------------------------------------
# ownership


def test_a_second_holder_is_refused_at_once_naming_the_first(tmp_path):
    """While one RunLock holds a directory, another (even in the same process) is refused at once, with the holder's
    pid and host in the message; once released, the directory can be taken again."""
    first = RunLock(tmp_path).acquire()
    t0 = time.time()
    with pytest.raises(RunDirError, match=rf"in use by another run \(pid {os.getpid()} on host {os.uname().nodename}"):
        RunLock(tmp_path).acquire()
    assert time.time() - t0 < 1.0
    first.release()
    RunLock(tmp_path).acquire().release()


def test_a_sigkilled_holder_leaves_no_stale_lock(tmp_path):
    """A process holding the lock and killed with SIGKILL (no clean-up runs) releases it: the OS drops the flock
    with the process, so the next run takes the directory without any manual step."""
    code = (
        "import sys, time; from entropy_rft.run.rundir import RunLock; RunLock(sys.argv[1]).acquire(); "
        "print('held', flush=True); time.sleep(60)"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(tmp_path)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.stdout.readline().strip() == b"held"
    with pytest.raises(RunDirError, match=f"pid {proc.pid} "):
        RunLock(tmp_path).acquire()
    proc.kill()
    proc.wait()
    RunLock(tmp_path).acquire().release()


# ---------------------------------------------------------------------------------------------------------------
# claiming a directory


def test_another_runs_record_is_refused_and_left_untouched(tmp_path):
    """A new run where a record is: refused, naming --resume and --overwrite; the record is byte for byte intact."""
    before = fake_record(tmp_path / "run", cfg_at(tmp_path / "run"))
    with pytest.raises(RunDirError, match="another run's record.*--resume.*--overwrite"):
        claim(cfg_at(tmp_path / "run"))
    assert snapshot(tmp_path / "run") == before
    with pytest.raises(RunDirError, match="contradict"):
        claim(cfg_at(tmp_path / "run"), resume=True, overwrite=True)


def test_nothing_to_resume_is_an_error_unless_asked_to_start(tmp_path):
    """--resume of an empty or mistyped directory, or of a run killed before its first checkpoint, says so and
    stops; resume='auto' starts fresh instead (over a record of the same settings only)."""
    with pytest.raises(RunDirError, match="nothing to resume .* does not exist"):
        claim(cfg_at(tmp_path / "typo"), resume=True)
    assert not (tmp_path / "typo").exists()  # a mistyped path is not created
    (tmp_path / "empty").mkdir()
    with pytest.raises(RunDirError, match="nothing to resume .* holds no run"):
        claim(cfg_at(tmp_path / "empty"), resume=True)
    run = tmp_path / "run"
    fake_record(run, cfg_at(run), steps=())
    with pytest.raises(RunDirError, match="stopped before its first checkpoint"):
        claim(cfg_at(run), resume=True)
    with claim(cfg_at(tmp_path / "new"), resume="auto") as c:
        assert c.checkpoint is None and c.fresh and not c.replacing
    with claim(cfg_at(run), resume="auto") as c:  # the same run, restarted from step 0
        assert c.checkpoint is None and c.replacing
    with pytest.raises(RunDirError, match=r"other settings.*lr: 4e-07 -> 0.001"):
        claim(cfg_at(run, lr=1e-3), resume="auto")


def test_resume_with_other_settings_names_each_difference(tmp_path):
    """--resume refuses any change outside RESUME_SAFE, naming key, old and new value; steps, sinks, save_every,
    keep_checkpoints, eval_every, progress and out may change; a checkpoint beyond the new steps is refused."""
    run = tmp_path / "run"
    fake_record(run, cfg_at(run, method="clip_b", lr=1e-4, steps=4), steps=(2,))
    with pytest.raises(RunDirError) as err:
        claim(cfg_at(run, method="clip_b", lr=1e-3, mu=2.0, steps=9), resume=True)
    msg = str(err.value)
    assert "lr: 0.0001 -> 0.001" in msg and "mu: None -> 2.0" in msg and "steps:" not in msg
    safe = cfg_at(
        tmp_path / "moved",
        method="clip_b",
        lr=1e-4,
        steps=9,
        save_every=3,
        keep_checkpoints=5,
        eval_every=2,
        sinks=("tensorboard",),
    )
    assert setting_differences(json.loads(json.dumps(cfg_at(run, method="clip_b", lr=1e-4).to_dict())), safe) == []
    with claim(cfg_at(run, method="clip_b", lr=1e-4, steps=9, save_every=3), resume=True) as c:
        assert c.checkpoint == run / "checkpoint-2"
    with pytest.raises(RunDirError, match="beyond steps=1"):
        claim(cfg_at(run, method="clip_b", lr=1e-4, steps=1), resume=True)


def test_settings_key_ignores_bookkeeping_only(tmp_path):
    """settings_key changes with any field that changes what a run computes, never with where or how it is
    recorded (out, sinks, progress, save_every, keep_checkpoints, eval_every)."""
    base = cfg_at(tmp_path / "a", method="clip_b")
    same = cfg_at(
        tmp_path / "b",
        method="clip_b",
        sinks=("tensorboard",),
        progress=True,
        save_every=7,
        keep_checkpoints=0,
        eval_every=3,
    )
    assert settings_key(base) == settings_key(same)
    for change in (
        {"lr": 1e-6},
        {"seed": 1},
        {"mu": 1.5},
        {"steps": 7},
        {"group_size": 8},
        {"eval_k": 4},
        {"method": "clip_v"},
        {"device": "cpu"},
        {"betas": (0.9, 0.99)},
    ):
        assert settings_key(cfg_at(tmp_path / "a", **{"method": "clip_b", **change})) != settings_key(base), change


# ---------------------------------------------------------------------------------------------------------------
# the start transaction


def test_a_failed_start_puts_the_replaced_record_back(tmp_path):
    """overwrite: when opening the sinks fails, the old record is back byte for byte and nothing the failed start
    wrote remains; when it succeeds, the old record (its checkpoints too) is gone and config.yaml is the new one.
    In a new directory, a failed start leaves nothing that reads as a record."""
    run = tmp_path / "run"
    before = fake_record(run, cfg_at(run, lr=1e-4), steps=(2, 4))

    def failing_sinks():
        (run / "metrics.jsonl").write_text("")  # what a sink writes before it fails
        (run / "wandb").mkdir()
        raise ValueError("no API key")

    new = cfg_at(run, lr=1e-3)
    with claim(new, overwrite=True) as c:
        with pytest.raises(ValueError, match="no API key"):
            c.start(new, failing_sinks)
    assert snapshot(run) == before and not list(run.glob(".replaced-*"))

    class Logger:
        def log(self, metrics):
            pass

        def close(self):
            pass

    with claim(new, overwrite=True) as c:  # started, but stopped before its first step: the old record is back
        c.start(new, Logger)
    assert snapshot(run) == before and not list(run.glob(".replaced-*"))
    with claim(new, overwrite=True) as c:
        c.start(new, Logger).log({"step": 1})  # the first step commits: the old record goes
    assert sorted(p.name for p in run.iterdir()) == [".lock", "config.digest", "config.yaml"]
    assert "lr: 0.001" in (run / "config.yaml").read_text()

    run = tmp_path / "fresh"  # a new directory: what the failed start wrote is cleared, so it is not a record
    with claim(cfg_at(run)) as c:
        with pytest.raises(ValueError, match="no API key"):
            c.start(cfg_at(run), failing_sinks)
    assert record_entries(run) == []
    claim(cfg_at(run)).release()


def test_a_sink_that_fails_to_open_leaves_metrics_uncut(tmp_path, monkeypatch):
    """On resume from step 1, a metric sink that cannot start (opened before metrics.jsonl) stops the logger
    before metrics.jsonl is cut back: its rows after step 1 are still there."""
    from entropy_rft.logging import SINKS, MetricLogger

    class Broken:
        def __init__(self, *args):
            raise ValueError("cannot start")

    monkeypatch.setitem(SINKS._items, "tensorboard", Broken)
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2}\n{"step": 3}\n')
    with pytest.raises(ValueError, match="cannot start"):
        MetricLogger(tmp_path, {}, ("tensorboard",), start_step=1)
    assert (tmp_path / "metrics.jsonl").read_text().count("step") == 3


def test_a_start_killed_midway_is_repaired_by_the_next_claim(tmp_path):
    """A process killed after moving the old record aside but before committing (its first step): the next claim
    puts the old record back, whatever the dead start wrote (config.yaml too). Killed while deleting the replaced
    record after committing (renamed to .deleting-...): the rest of it is deleted."""
    run = tmp_path / "run"
    before = fake_record(run, cfg_at(run), steps=(2,))
    staged = run / ".replaced-x"
    staged.mkdir()
    for entry in record_entries(run):
        os.replace(entry, staged / entry.name)
    (run / "metrics.jsonl").write_text("")  # the dead start's sink and config
    (run / "config.yaml").write_text("lr: 1.0\n")
    with pytest.raises(RunDirError, match="another run's record"):
        claim(cfg_at(run))
    assert snapshot(run) == before
    doomed = run / ".deleting-.replaced-x"
    doomed.mkdir()
    os.replace(run / "checkpoint-2", doomed / "checkpoint-2")  # committed: the replaced record is being deleted
    with pytest.raises(RunDirError):
        claim(cfg_at(run))
    assert not doomed.exists() and not (run / "checkpoint-2").exists()


# ---------------------------------------------------------------------------------------------------------------
# retention


@settings(max_examples=60, deadline=None)
@given(
    steps=st.sets(st.integers(1, 30), min_size=1, max_size=8),
    keep=st.integers(0, 4),
    final=st.integers(1, 30),
    latest_index=st.integers(0, 7),
)
def test_prune_keeps_the_newest_n_the_final_and_the_latest(tmp_path_factory, steps, keep, final, latest_index):
    """After pruning, the checkpoints left are exactly the newest `keep` (all when keep is 0), checkpoint-<final> if
    it existed, and the one latest_checkpoint names; the rest are gone, with no hidden leftovers."""
    run = tmp_path_factory.mktemp("prune")
    for s in steps:
        (run / f"checkpoint-{s}").mkdir()
        (run / f"checkpoint-{s}" / "trainer_state.pt").write_bytes(b"x")
    latest = sorted(steps)[latest_index % len(steps)]
    (run / "latest_checkpoint").write_text(f"checkpoint-{latest}")
    prune_checkpoints(run, keep, final)
    expected = set(steps) if keep == 0 else set(sorted(steps)[-keep:]) | ({final} & steps) | {latest}
    assert {step_of(p) for p in checkpoint_dirs(run, complete=False)} == expected
    assert not list(run.glob(".deleting-*"))
    assert find_checkpoint(run) == run / f"checkpoint-{latest}"


# ---------------------------------------------------------------------------------------------------------------
# signals


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_stop_signals_raise_once_and_handlers_come_back(sig):
    """Inside stop_signals_interrupt a stop signal raises Interrupted (a KeyboardInterrupt naming the signal); a
    repeat while the save runs is ignored; on exit the previous handlers are back. The signal gets a handler of its
    own first: a test process started under nohup or in the background inherits SIGHUP / SIGINT ignored, and an
    ignored signal stays ignored (the next test)."""
    inherited = signal.signal(sig, lambda signum, frame: None)
    try:
        before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)}
        saved = []
        with pytest.raises(Interrupted) as err:
            with stop_signals_interrupt():
                try:
                    os.kill(os.getpid(), sig)
                    time.sleep(1)  # the handler runs before this returns
                except KeyboardInterrupt:
                    os.kill(os.getpid(), sig)  # the save: a second signal must not interrupt it
                    time.sleep(0.05)
                    saved.append(True)
                    raise
        assert saved == [True]
        assert err.value.signum == sig and err.value.name == signal.Signals(sig).name
        assert {s: signal.getsignal(s) for s in before} == before
    finally:
        signal.signal(sig, inherited)


def test_an_ignored_signal_stays_ignored():
    """A run started under nohup (SIGHUP ignored) is not stopped by SIGHUP."""
    old = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        with stop_signals_interrupt():
            try:
                os.kill(os.getpid(), signal.SIGHUP)
                time.sleep(0.05)
            except KeyboardInterrupt:
                pytest.fail("SIGHUP stopped a run started with SIGHUP ignored")
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, old)


def test_new_run_dirs_are_unique_and_names_are_one_component(tmp_path):
    """The default directory is new per run (a same-second clash gets a suffix); --name is one path component."""
    a = new_run_dir("clip_b", root=tmp_path)
    b = new_run_dir("clip_b", root=tmp_path)
    assert a.is_dir() and b.is_dir()  # created at once: a second process never picks the same one
    assert a != b and a.name.startswith("clip_b-") and b.name.startswith(a.name)
    assert new_run_dir("x", "mine", root=tmp_path) == tmp_path / "mine"
    with pytest.raises(RunDirError, match="one path component"):
        new_run_dir("x", "a/b", root=tmp_path)


# ---------------------------------------------------------------------------------------------------------------
# through train()


def test_a_held_directory_refuses_train_before_any_model_loads(tmp_path, monkeypatch):
    """train() into a directory another run holds is refused at once naming the holder; no model is loaded."""
    import entropy_rft.train.policy as policy
    import entropy_rft.train.trainer as trainer

    monkeypatch.setattr(policy, "load_policy", lambda *a, **k: pytest.fail("a model was loaded"))
    with RunLock(tmp_path / "run"):
        with pytest.raises(RunDirError, match=f"pid {os.getpid()}"):
            trainer.train(cfg_at(tmp_path / "run", steps=1))


def test_a_run_that_fails_at_start_leaves_the_record_untouched(tmp_path, monkeypatch):
    """--overwrite of a run's record by a run whose W&B sink cannot start (no API key): the error names the fix,
    and config.yaml, metrics.jsonl and the checkpoints are byte for byte as they were (the issue's run had already
    emptied metrics.jsonl)."""
    wandb = pytest.importorskip("wandb")

    def no_key(*args, **kwargs):
        raise wandb.errors.UsageError("No API key configured. Use `wandb login` to log in.")

    monkeypatch.setattr(wandb, "init", no_key)
    run = tmp_path / "run"
    before = fake_record(run, cfg_at(run, steps=5), steps=(2, 4), metrics=5)
    from entropy_rft.train.trainer import train

    cfg = cfg_at(run, steps=1, prompts_per_step=2, group_size=2, eval_problems=2, eval_k=1, sinks=("wandb",))
    with pytest.raises(ValueError, match="wandb sink could not start.*wandb login.*WANDB_MODE=offline"):
        train(cfg, overwrite=True)
    assert snapshot(run) == before
