"""A run directory is one run's record: who may write it, when a run may start there, resume checks, checkpoint
retention and the signals that stop a run cleanly.

Rules (entropy_rft/trainer.py's train() calls them; the CLI maps refusals to exit code 2):
1. Ownership. A process writing a run directory holds an exclusive fcntl.flock on RUN/.lock, which holds its pid,
   host and start time. A second process is refused at once, naming the holder. The OS releases the lock when the
   holder dies, SIGKILL included, so a killed run never leaves a stale lock.
2. Refusal. A directory holding a run's record (RECORD: config.yaml, metrics.jsonl, checkpoints, ...) is refused to
   a new run unless it is resumed (resume=True), resumed when it can be else started (resume="auto"), or replaced
   (overwrite=True). The default directory is new per run: runs/<method>-<YYYYmmdd-HHMMSS>.
3. Transaction. Nothing in the directory changes before the run is committed to start (after its model, data and
   metric sinks are ready): Claim.start() moves a replaced record aside, opens the sinks (cutting metrics back on
   resume), writes config.yaml, and only then deletes the record it replaced. A start that fails puts the old
   record back. A process killed half-way is repaired by the next claim (the record comes back unless the new run
   had committed).
4. Resume is exact or refused. The stored config.yaml must equal the new settings in every field except RESUME_SAFE
   (config.py: where and how the run is recorded, and steps); each other difference is named. No checkpoint to
   resume from is an error (resume=True) or a fresh start (resume="auto"). A finished run is returned as it is
   (resume="auto") or refused unless steps grows (resume=True).
5. Retention. After each checkpoint, all but the newest keep_checkpoints complete ones and the final one
   (checkpoint-<steps>) are deleted (renamed to a hidden name first, so a kill mid-delete never leaves a
   half-deleted checkpoint that looks complete).
6. Signals. SIGINT, SIGTERM (what SLURM and Kubernetes send before SIGKILL) and SIGHUP raise Interrupted (a
   KeyboardInterrupt) in the main thread, so the trainer saves where the run stands and exits; repeats while it
   saves are ignored. A signal whose handler was SIG_IGN when the run started (nohup's SIGHUP) stays ignored.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

from .config import RESUME_SAFE, TrainConfig, setting_differences

LOCK = ".lock"
STAGED = ".replaced-"  # a replaced record, moved aside until the new run commits
# what a run writes into its directory (anything else there, e.g. a dry run's data/, is left alone)
RECORD = ("config.yaml", "metrics.jsonl", "eval.json", "latest_checkpoint", "checkpoint-*", "tensorboard", "wandb",
          "wandb_run_id", "samples", ".checkpoint-*", ".deleting-*", ".latest_checkpoint.tmp", ".metrics.jsonl.tmp")


class RunDirError(Exception):
    """A run directory that may not be used as asked; the message names the directory and the fix."""


def new_run_dir(method: str, name: str | None = None, root: str | Path = "runs") -> Path:
    """runs/NAME, or runs/<method>-<YYYYmmdd-HHMMSS> (with -2, -3, ... if a run started in the same second)."""
    if name is not None:
        if not name or "/" in name or name in (".", ".."):
            raise RunDirError(f"--name {name!r}: a run name is one path component (no '/'); use --out for a path")
        return Path(root) / name
    base = Path(root) / f"{method.replace(':', '_')}-{time.strftime('%Y%m%d-%H%M%S')}"
    path, n = base, 1
    while path.exists():
        n += 1
        path = base.with_name(f"{base.name}-{n}")
    return path


def record_entries(run_dir: Path) -> list[Path]:
    """The entries of a run's record present in run_dir."""
    if not run_dir.is_dir():
        return []
    return sorted({p for pattern in RECORD for p in run_dir.glob(pattern)})


def find_checkpoint(run_dir: Path) -> Path | None:
    """The checkpoint to resume from: the one latest_checkpoint names if it is complete, else the complete
    checkpoint-N of highest N (a kill between two renames of save_checkpoint), else None."""
    latest = run_dir / "latest_checkpoint"
    if latest.exists():
        named = run_dir / latest.read_text().strip()
        if (named / "trainer_state.pt").exists():
            return named
    return max(_checkpoints(run_dir, complete=True), key=_step, default=None)


def _step(ckpt: Path) -> int:
    return int(ckpt.name[11:])


def _checkpoints(run_dir: Path, *, complete: bool) -> list[Path]:
    return [p for p in run_dir.glob("checkpoint-*") if p.name[11:].isdigit()
            and (not complete or (p / "trainer_state.pt").exists())]


def stored_settings(run_dir: Path) -> dict | None:
    """The run's config.yaml as a dict, or None when there is none."""
    path = Path(run_dir) / "config.yaml"
    if not path.exists():
        return None
    data = yaml.safe_load(path.read_text())
    if not isinstance(data, dict):
        raise RunDirError(f"{path} is not a mapping of settings; the record is damaged (restore it, or replace the "
                          "run with --overwrite)")
    return data


def is_finished(run_dir: Path, steps: int) -> bool:
    """Whether a run reached `steps` and wrote its final evaluation (eval.json is written last)."""
    path = Path(run_dir) / "eval.json"
    return path.exists() and str(steps) in json.loads(path.read_text())


def finished_summary(run_dir: Path, cfg: TrainConfig) -> dict:
    """train()'s summary of a finished run, read back from its record."""
    from .logging import read_metrics

    evals = {int(k): v for k, v in json.loads((run_dir / "eval.json").read_text()).items()}
    return {"config": cfg.to_dict(), "evals": evals, "checkpoint": str(run_dir / f"checkpoint-{cfg.steps}"),
            "history": read_metrics(run_dir), "finished_before": True}


# ---------------------------------------------------------------------------------------------------------------
# Ownership


class RunLock:
    """An exclusive flock on DIR/.lock held for the life of a run; acquire() refuses at once when another process
    (or another RunLock in this one) holds it, naming the holder."""

    def __init__(self, directory: Path | str):
        self.directory = Path(directory)
        self.fd: int | None = None

    def acquire(self) -> "RunLock":
        self.directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.directory / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.pread(fd, 400, 0).decode(errors="replace").split()
            os.close(fd)
            who = (f"pid {holder[0]} on host {holder[1]}, since {holder[2]}" if len(holder) >= 3
                   else "a process that has not yet written its pid")
            raise RunDirError(f"{self.directory} is in use by another run ({who}); two processes never write one run "
                              "directory. Wait for it to finish or stop it, or choose another --out/--name") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} {socket.gethostname()} {time.strftime('%Y-%m-%dT%H:%M:%S')}\n".encode(), 0)
        self.fd = fd
        return self

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing the descriptor releases the flock
            self.fd = None

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


# ---------------------------------------------------------------------------------------------------------------
# Claiming a directory for one run


class Claim:
    """A run directory held by this process for one run: `checkpoint` to resume from (or None), `replacing` (a
    record that start() replaces), `finished` (resume="auto" on a finished run: nothing to train)."""

    def __init__(self, run_dir: Path, lock: RunLock, checkpoint: Path | None, *, replacing: bool, fresh: bool,
                 finished: bool):
        self.run_dir, self.lock, self.checkpoint = run_dir, lock, checkpoint
        self.replacing, self.fresh, self.finished = replacing, fresh, finished
        self.committed = False
        self._staged: Path | None = None

    def start(self, cfg: TrainConfig, open_sinks):
        """Commit the run: move a replaced record aside, open the sinks (open_sinks() returns the logger), write
        config.yaml, then delete the replaced record. If anything fails first, the old record is put back."""
        if self.replacing:
            self._staged = Path(tempfile.mkdtemp(prefix=STAGED, dir=self.run_dir))
            for entry in record_entries(self.run_dir):
                os.replace(entry, self._staged / entry.name)
        try:
            logger = open_sinks()
            try:
                tmp = self.run_dir / ".config.yaml.tmp"
                tmp.write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
                os.replace(tmp, self.run_dir / "config.yaml")
            except BaseException:
                logger.close()
                raise
        except BaseException:
            if self.fresh:  # what the failed start wrote (a sink's files) would read as a record next time
                for entry in record_entries(self.run_dir):
                    _remove(entry)
            self._restore()
            raise
        self.committed = True
        if self._staged is not None:
            shutil.rmtree(self._staged, ignore_errors=True)
            self._staged = None
        return logger

    def _restore(self) -> None:
        if self._staged is None:
            return
        for entry in record_entries(self.run_dir):  # what the failed start wrote
            _remove(entry)
        for entry in self._staged.iterdir():
            os.replace(entry, self.run_dir / entry.name)
        self._staged.rmdir()
        self._staged = None

    def release(self) -> None:
        self.lock.release()

    def __enter__(self) -> "Claim":
        return self

    def __exit__(self, *exc) -> None:
        try:
            if not self.committed:
                self._restore()
        finally:
            self.release()


def claim(cfg: TrainConfig, *, resume: bool | str = False, overwrite: bool = False) -> Claim:
    """Take cfg.out for one run under the rules of the module docstring; raises RunDirError with the fix."""
    if resume not in (False, True, "auto"):
        raise ValueError(f"resume must be False, True or 'auto', got {resume!r}")
    if resume and overwrite:
        raise RunDirError("--resume and --overwrite contradict each other: continue the run, or replace it")
    run_dir = Path(cfg.out)
    if run_dir.exists() and not run_dir.is_dir():
        raise RunDirError(f"--out {run_dir} is a file, not a directory; choose another --out/--name")
    if resume is True and not run_dir.is_dir():  # refused before the lock would create the directory
        raise RunDirError(f"nothing to resume in {run_dir}: it does not exist. Check the path; to start the run "
                          "there instead, use --resume-or-start (or drop --resume)")
    lock = RunLock(run_dir).acquire()
    try:
        _repair(run_dir)
        for stale in [*run_dir.glob(".checkpoint-*"), *run_dir.glob(".deleting-*")]:  # writes a kill cut short
            shutil.rmtree(stale, ignore_errors=True)
        record = record_entries(run_dir)
        checkpoint = find_checkpoint(run_dir) if resume else None
        finished = replacing = False
        if checkpoint is not None:
            _check_resume(run_dir, cfg, checkpoint)
            finished = is_finished(run_dir, cfg.steps) and _step(checkpoint) == cfg.steps
            if finished and resume is True:
                raise RunDirError(f"{run_dir} already finished its {cfg.steps} steps (eval.json is written); nothing "
                                  f"to resume. To train it further, resume with more steps (--steps N > {cfg.steps})")
        elif resume is True:
            what = ("it holds no run" if not record else
                    "its run stopped before its first checkpoint (a kill before any save)")
            raise RunDirError(f"nothing to resume in {run_dir}: {what}. Check the path; to start the run there "
                              "instead, use --resume-or-start (or drop --resume"
                              + (", with --overwrite to replace what is there)" if record else ")"))
        elif record:
            if resume == "auto":  # no checkpoint: start again, but only over a record of this same run
                _check_same_run(run_dir, cfg)
            elif not overwrite:
                names = ", ".join(p.name for p in record[:4]) + (", ..." if len(record) > 4 else "")
                raise RunDirError(f"{run_dir} holds another run's record ({names}); a run directory is one run's "
                                  "record. Continue that run with --resume, replace it with --overwrite, or choose a "
                                  "new directory (--name NAME, or no --out for a new one)")
            replacing = True
        return Claim(run_dir, lock, checkpoint, replacing=replacing, fresh=not record, finished=finished)
    except BaseException:
        lock.release()
        raise


def _repair(run_dir: Path) -> None:
    """A process killed inside Claim.start(): if its run had committed (config.yaml written), the record it replaced
    is garbage; otherwise that record is put back over what the dead start wrote."""
    for staged in run_dir.glob(STAGED + "*"):
        if not (run_dir / "config.yaml").exists():  # staging moved the old config.yaml; the new one marks the commit
            for entry in record_entries(run_dir):
                _remove(entry)
            for entry in staged.iterdir():
                os.replace(entry, run_dir / entry.name)
        shutil.rmtree(staged, ignore_errors=True)


def _check_resume(run_dir: Path, cfg: TrainConfig, checkpoint: Path) -> None:
    stored = stored_settings(run_dir)
    if stored is None:
        raise RunDirError(f"{run_dir} has checkpoints but no config.yaml, so its settings cannot be checked; resume "
                          "is refused. Restore config.yaml, or start anew with --overwrite")
    diff = setting_differences(stored, cfg)
    if diff:
        raise RunDirError(f"--resume of {run_dir} with other settings than the run's own would not continue that run: "
                          + "; ".join(diff) + f". Only {', '.join(RESUME_SAFE)} may change on resume; drop the "
                          "other changes, or start a new run (--name NAME) for them")
    if _step(checkpoint) > cfg.steps:
        raise RunDirError(f"{run_dir}'s newest checkpoint is at step {_step(checkpoint)}, beyond steps={cfg.steps}; "
                          f"resume with --steps {_step(checkpoint)} or more")


def _check_same_run(run_dir: Path, cfg: TrainConfig) -> None:
    stored = stored_settings(run_dir)
    diff = setting_differences(stored, cfg) if stored is not None else ["(no config.yaml)"]
    if diff:
        raise RunDirError(f"{run_dir} holds a run with other settings and no checkpoint ({'; '.join(diff)}); "
                          "--resume-or-start only restarts the same run. Replace it with --overwrite, or choose a new "
                          "directory (--name NAME)")


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


# ---------------------------------------------------------------------------------------------------------------
# Checkpoint retention


def prune_checkpoints(run_dir: Path, keep: int, final_step: int) -> list[str]:
    """Delete all checkpoints but the newest `keep` and checkpoint-<final_step> (keep 0: delete none); the one
    latest_checkpoint names is never deleted. Each is renamed to a hidden name before its files go. Returns the
    names deleted."""
    if keep <= 0:
        return []
    ckpts = sorted(_checkpoints(run_dir, complete=False), key=_step)
    spared = set(ckpts[-keep:]) | {run_dir / f"checkpoint-{final_step}", find_checkpoint(run_dir)}
    gone = []
    for ckpt in ckpts:
        if ckpt not in spared:
            doomed = run_dir / f".deleting-{ckpt.name}"
            os.replace(ckpt, doomed)
            shutil.rmtree(doomed, ignore_errors=True)
            gone.append(ckpt.name)
    return gone


# ---------------------------------------------------------------------------------------------------------------
# Signals


class Interrupted(KeyboardInterrupt):
    """A stop signal (SIGINT, SIGTERM, SIGHUP) received during a run; `signum` says which."""

    def __init__(self, signum: int):
        self.signum = signum
        self.name = signal.Signals(signum).name
        super().__init__(self.name)


STOP_SIGNALS = tuple(getattr(signal, s) for s in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, s))


class StopSignals:
    """The stop signals of a run in progress. Outside `defer()` a stop raises Interrupted at once; from `defer()`
    until `release()` (a step whose first optimizer step has changed the weights, until its metrics line is
    written) it is held, and `release()` raises it, so a stop never leaves half an update behind."""

    def __init__(self):
        self.fired: list[int] = []
        self.held: int | None = None
        self.deferring = False

    def handler(self, signum, frame):
        if self.fired or self.held is not None:
            print(f"entropy-rft: {signal.Signals(signum).name} again while stopping; the save goes on (SIGKILL stops "
                  "at once, losing the steps since the last checkpoint)", file=sys.stderr)
            return
        if self.deferring:
            self.held = signum
            print(f"entropy-rft: {signal.Signals(signum).name}: finishing the step under way, then saving",
                  file=sys.stderr)
            return
        self.fired.append(signum)
        raise Interrupted(signum)

    def defer(self) -> None:
        self.deferring = True

    def release(self) -> None:
        self.deferring = False
        if self.held is not None:
            signum, self.held = self.held, None
            self.fired.append(signum)
            raise Interrupted(signum)


@contextlib.contextmanager
def stop_signals_interrupt():
    """While inside: SIGINT, SIGTERM and SIGHUP raise Interrupted in the main thread (once; repeats are ignored so
    the save they trigger completes), or are held while the yielded StopSignals defers them. Signals ignored when
    entering stay ignored; handlers are restored on exit. Outside the main thread (where Python cannot install
    handlers) nothing changes."""
    stops = StopSignals()
    if threading.current_thread() is not threading.main_thread():
        yield stops
        return
    previous = {}
    for sig in STOP_SIGNALS:
        if signal.getsignal(sig) is not signal.SIG_IGN:
            previous[sig] = signal.signal(sig, stops.handler)
    try:
        yield stops
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
