"""A run directory is one run's record: who may write it, when a run may start there, resume checks, when checkpoints
are kept, and which outputs other subcommands may write. The checkpoint itself (its files, finding, loading and
pruning them) is checkpoint.py's; the signals that stop a run cleanly are stops.py's.

Rules (entropy_rft/train/trainer.py's train() calls them; the CLI maps refusals to exit code 2):
1. Ownership. A process writing a run directory holds an exclusive fcntl.flock on RUN/.lock, which holds its pid,
   host and start time. A second process is refused at once, naming the holder. The OS releases the lock when the
   holder dies, SIGKILL included, so a killed run never leaves a stale lock.
2. Refusal. A directory holding a run's record (RECORD: config.yaml, metrics.jsonl, checkpoints, ...) is refused to
   a new run unless it is resumed (resume=True), resumed when it can be else started (resume="auto"), or replaced
   (overwrite=True). The default directory is new per run: runs/<method>-<YYYYmmdd-HHMMSS>.
3. Transaction. Nothing in the directory changes before the run starts (after its model, data and metric sinks
   are ready): Claim.start() moves a replaced record aside, opens the sinks (cutting metrics back on resume) and
   writes config.yaml with its settings digest, config.digest (record.py). A new run (in a new directory or over a
   replaced record) commits when it logs its first step: only then is the replaced record deleted. A run that fails
   or is stopped before that puts the directory back as it was (the old record, or nothing that reads as a record),
   so the same command works again, and a run refused or undone before its first step removes the lock file and the
   directories it created (Claim.release); a resumed run commits at start (its record is its own). A process killed
   before committing is repaired by the next claim: a replaced record comes back, and what a new run wrote before
   its first step goes.
4. Resume is exact or refused. The run's settings must equal the new settings in every field except RESUME_SAFE
   (config.py: where and how the run is recorded, and steps); each other difference is named; a config.yaml that is
   not YAML is named with the way out. The run's settings are those its digest recorded (record.py), so a hand edit
   of config.yaml is refused as --set is, naming the fields (check_hand_edits: a field that may change on resume is
   accepted when the command line gives it too); a record with a checkpoint but no digest was damaged and is
   refused naming the file (record.check_digest_kept), one with neither is checked against config.yaml.
   The record must hold every step up to the checkpoint (record.first_gap): a metrics line cut off by a crash, or a
   samples file that does not read whole, sends the resume back to the newest checkpoint before that step, whose
   later steps are trained again (with a warning naming the file and line), or, with none, refuses it naming them:
   never a silent gap. No checkpoint to resume from is an error (resume=True) or a fresh start (resume="auto"). A
   finished run is returned as it is (resume="auto") or refused unless steps grows (resume=True).
   A checkpoint whose trainer_state.pt is damaged (truncated: not a complete torch archive) is skipped: the run
   resumes from the newest earlier complete checkpoint, with a warning naming the damaged file (the steps after it
   are trained again, exactly as the first time); with none left, resume is refused naming the file. A checkpoint
   write that runs out of disk space is one line naming the checkpoint and the way out (free space, then --resume,
   or --resume-or-start when no checkpoint was complete). A trainer_state.pt that lacks a part of the run state
   (written by something else) is one line naming the file and the parts.
   A record an --overwrite set aside and a kill left there (rule 3) is the run's: its settings are read from there
   (stored_settings), as the next claim puts it back.
5. Retention (checkpoint.prune_checkpoints). After each checkpoint, all but the newest keep_checkpoints complete ones
   and the final one (checkpoint-<steps>) are deleted (renamed to a hidden name first, so a kill mid-delete never leaves
   a half-deleted checkpoint that looks complete).
6. Other subcommands' outputs (check_output): eval, report, inspect, compare, sweep, filter, demo, theory and
   pretrain-toy never write a record entry of a run directory, nor into a directory a live run holds, nor into a
   run's directory at all unless the user named the path; refused with the reason and the fix.
7. Signals (stops.py). SIGINT, SIGTERM (what SLURM and Kubernetes send before SIGKILL) and SIGHUP raise Interrupted
   (a KeyboardInterrupt) in the main thread, so the trainer saves where the run stands and exits; repeats while it
   saves are ignored. A signal whose handler was SIG_IGN when the run started (nohup's SIGHUP) stays ignored.
"""

from __future__ import annotations

import fcntl
import fnmatch
import json
import os
import shutil
import socket
import tempfile
import time
from pathlib import Path

import yaml

from ..config import RESUME_SAFE, TrainConfig
from .checkpoint import (
    DELETING,
    LATEST,
    LATEST_TMP,
    PREFIX,
    WRITING,
    RunDirError,
    checkpoint_dir,
    resume_checkpoint,
    step_of,
)
from .record import DIGEST, STAGED, differences, stored_settings, trusted_checkpoint, write_digest

LOCK = ".lock"
# what a run writes into its directory (anything else there, e.g. a dry run's data/, is left alone)
RECORD = (
    "config.yaml",
    DIGEST,
    "metrics.jsonl",
    "eval.json",
    LATEST,
    f"{PREFIX}*",
    "tensorboard",
    "wandb",
    "wandb_run_id",
    "samples",
    f"{WRITING}*",
    f"{DELETING}*",
    LATEST_TMP,
    ".metrics.jsonl.tmp",
    f".{DIGEST}.tmp",
)


def new_run_dir(method: str, name: str | None = None, root: str | Path = "runs") -> Path:
    """runs/NAME, or a new runs/<method>-<YYYYmmdd-HHMMSS> (-2, -3, ... when a run started in the same second),
    created here with an exclusive mkdir so that two processes starting at once never pick the same one."""
    if name is not None:
        if not name or "/" in name or name in (".", ".."):
            raise RunDirError(f"--name {name!r}: a run name is one path component (no '/'); use --out for a path")
        return Path(root) / name
    base = Path(root) / f"{method.replace(':', '_')}-{time.strftime('%Y%m%d-%H%M%S')}"
    if not Path(root).exists():
        _MADE_ROOTS.add(Path(root))
    Path(root).mkdir(parents=True, exist_ok=True)
    path, n = base, 1
    while True:
        try:
            path.mkdir()
            return path
        except FileExistsError:
            n += 1
            path = base.with_name(f"{base.name}-{n}")


_MADE_ROOTS: set[Path] = set()  # the roots (runs/) new_run_dir created in this process


def remove_if_empty(path: Path | str) -> None:
    """Remove a directory new_run_dir made for a run that never started (nothing written there), and the root it
    made for it when that is empty too; else keep them."""
    try:
        Path(path).rmdir()
        if Path(path).parent in _MADE_ROOTS:
            Path(path).parent.rmdir()
    except OSError:
        pass


def record_entries(run_dir: Path) -> list[Path]:
    """The entries of a run's record present in run_dir."""
    if not run_dir.is_dir():
        return []
    return sorted({p for pattern in RECORD for p in run_dir.glob(pattern)})


def is_finished(run_dir: Path, steps: int) -> bool:
    """Whether a run reached `steps` and wrote its final evaluation (eval.json is written last)."""
    path = Path(run_dir) / "eval.json"
    return path.exists() and str(steps) in json.loads(path.read_text())


def finished_summary(run_dir: Path, cfg: TrainConfig) -> dict:
    """train()'s summary of a finished run, read back from its record."""
    from ..logging import read_metrics

    evals = {int(k): v for k, v in json.loads((run_dir / "eval.json").read_text()).items()}
    return {
        "config": cfg.to_dict(),
        "evals": evals,
        "checkpoint": str(checkpoint_dir(run_dir, cfg.steps)),
        "history": read_metrics(run_dir),
        "finished_before": True,
    }


# ---------------------------------------------------------------------------------------------------------------
# Ownership


class RunLock:
    """An exclusive flock on DIR/.lock held for the life of a run; acquire() refuses at once when another process
    (or another RunLock in this one) holds it, naming the holder."""

    def __init__(self, directory: Path | str):
        self.directory = Path(directory)
        self.fd: int | None = None
        self.made: list[Path] = []  # what acquire() created: the directories (outermost first), then the lock file

    def acquire(self) -> RunLock:
        made = [p for p in (*reversed(self.directory.parents), self.directory) if not p.exists()]
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / LOCK
        while True:
            try:
                fd, created = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644), True
            except FileExistsError:
                try:
                    fd, created = os.open(path, os.O_RDWR), False
                except FileNotFoundError:  # its holder removed it just now (release(tidy=True)): create it
                    continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                holder = os.pread(fd, 400, 0).decode(errors="replace").split()
                os.close(fd)
                who = (
                    f"pid {holder[0]} on host {holder[1]}, since {holder[2]}"
                    if len(holder) >= 3
                    else "a process that has not yet written its pid"
                )
                raise RunDirError(
                    f"{self.directory} is in use by another run ({who}); two processes never write one run "
                    "directory. Wait for it to finish or stop it, or choose another --out/--name"
                ) from None
            try:  # a holder that tidied up removed the file between our open and flock: lock the one the path names
                if os.stat(path).st_ino == os.fstat(fd).st_ino:
                    break
            except FileNotFoundError:
                pass
            os.close(fd)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} {socket.gethostname()} {time.strftime('%Y-%m-%dT%H:%M:%S')}\n".encode(), 0)
        self.fd, self.made = fd, made + ([path] if created else [])
        return self

    def release(self, *, tidy: bool = False) -> None:
        """Let the directory go. tidy: first remove what acquire() created, the lock file and the directories, where
        nothing else was written there since (a run refused or undone before its first step leaves nothing)."""
        if self.fd is None:
            return
        if tidy:
            for made in reversed(self.made):
                try:
                    if made.name == LOCK:
                        made.unlink()
                    else:
                        made.rmdir()
                except OSError:  # written to since (not empty): kept, and so are the directories above it
                    break
        os.close(self.fd)  # closing the descriptor releases the flock
        self.fd = None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release(tidy=exc[0] is not None)  # a command that failed leaves no lock file it made


# ---------------------------------------------------------------------------------------------------------------
# Claiming a directory for one run


class Claim:
    """A run directory held by this process for one run: `checkpoint` to resume from (or None), `replacing` (a
    record that start() replaces), `finished` (resume="auto" on a finished run: nothing to train)."""

    def __init__(
        self, run_dir: Path, lock: RunLock, checkpoint: Path | None, *, replacing: bool, fresh: bool, finished: bool
    ):
        self.run_dir, self.lock, self.checkpoint = run_dir, lock, checkpoint
        self.replacing, self.fresh, self.finished = replacing, fresh, finished
        self.started = self.committed = False
        self._staged: Path | None = None

    def start(self, cfg: TrainConfig, open_sinks):
        """Start the run: move a replaced record aside, open the sinks (open_sinks() returns the logger) and write
        config.yaml. Returns the logger; a new run commits when it logs its first step (rule 3), a resumed one now.
        If anything fails first, the directory is put back as it was."""
        if self.replacing:
            self._staged = Path(tempfile.mkdtemp(prefix=STAGED, dir=self.run_dir))
            for entry in record_entries(self.run_dir):
                os.replace(entry, self._staged / entry.name)
        self.started = True
        try:
            logger = open_sinks()
            try:
                tmp = self.run_dir / ".config.yaml.tmp"
                tmp.write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
                os.replace(tmp, self.run_dir / "config.yaml")
                write_digest(self.run_dir, cfg)
            except BaseException:
                logger.close()
                raise
        except BaseException:
            self._undo()
            raise
        if not (self.fresh or self._staged):  # a resume: the record is this run's own
            self.committed = True
            return logger
        return _CommitOnFirstLog(logger, self.commit)

    def commit(self) -> None:
        """The new run has logged its first step: the record it replaced goes (renamed first, so a kill mid-delete
        never leaves it to be put back)."""
        self.committed = True
        if self._staged is not None:
            doomed = self.run_dir / f"{DELETING}{self._staged.name}"
            os.replace(self._staged, doomed)
            self._staged = None
            shutil.rmtree(doomed, ignore_errors=True)

    def _undo(self) -> None:
        """Back to the directory as it was before start(): what the new run wrote goes (a new directory's, or all of
        it when a record was moved aside), then the moved-aside record comes back."""
        if self.fresh or self._staged is not None:
            for entry in record_entries(self.run_dir):
                _remove(entry)
        if self._staged is not None:
            for entry in self._staged.iterdir():
                os.replace(entry, self.run_dir / entry.name)
            self._staged.rmdir()
            self._staged = None
        self.started = False

    def release(self) -> None:
        """Let the directory go; a run that never committed (refused, failed or stopped before its first step, and
        undone) leaves nothing that this claim created: no lock file, no new directory (rule 3)."""
        self.lock.release(tidy=not self.committed)

    def __enter__(self) -> Claim:
        return self

    def __exit__(self, *exc) -> None:
        try:
            if self.started and not self.committed:
                self._undo()
        finally:
            self.release()


class _CommitOnFirstLog:
    """A metric logger whose first log() (the new run's first step) commits the claim."""

    def __init__(self, logger, commit):
        self._logger, self._commit = logger, commit

    def log(self, metrics: dict) -> None:
        self._logger.log(metrics)
        if self._commit is not None:
            commit, self._commit = self._commit, None
            commit()

    def __getattr__(self, name):
        return getattr(self._logger, name)


def claim(cfg: TrainConfig, *, resume: bool | str = False, overwrite: bool = False) -> Claim:
    """Take cfg.out for one run under the rules of the module docstring; raises RunDirError with the fix."""
    if resume not in (False, True, "auto"):
        raise ValueError(f"resume must be False, True or 'auto', got {resume!r}")
    if resume and overwrite:
        raise RunDirError("--resume and --overwrite contradict each other: continue the run, or replace it")
    run_dir = Path(cfg.out)
    if run_dir.is_symlink() and not run_dir.exists():
        raise RunDirError(
            f"--out {run_dir} is a symlink to {os.readlink(run_dir)}, which does not exist; remove the "
            "link, or choose another --out/--name"
        )
    if run_dir.exists() and not run_dir.is_dir():
        raise RunDirError(
            f"--out {run_dir} is not a directory ({'a file' if run_dir.is_file() else 'a device'}); "
            "choose another --out/--name"
        )
    check_output(run_dir, option="--out", command="train")  # never inside another run's record
    if resume is True and not run_dir.is_dir():  # refused before the lock would create the directory
        raise RunDirError(
            f"nothing to resume in {run_dir}: it does not exist. Check the path; to start the run "
            "there instead, use --resume-or-start (or drop --resume)"
        )
    lock = RunLock(run_dir).acquire()
    try:
        _repair(run_dir)
        for stale in [*run_dir.glob(f"{WRITING}*"), *run_dir.glob(f"{DELETING}*")]:  # writes a kill cut short
            shutil.rmtree(stale, ignore_errors=True)
        record = record_entries(run_dir)
        if _never_stepped(run_dir, record):  # a new run killed (SIGKILL) before its first step: nothing to keep
            for entry in record:
                _remove(entry)
            record = []
        checkpoint = trusted_checkpoint(run_dir, resume_checkpoint(run_dir)) if resume else None
        finished = replacing = False
        if checkpoint is not None:
            _check_resume(run_dir, cfg, checkpoint)
            finished = is_finished(run_dir, cfg.steps) and step_of(checkpoint) == cfg.steps
            if finished and resume is True:
                raise RunDirError(
                    f"{run_dir} already finished its {cfg.steps} steps (eval.json is written); nothing "
                    f"to resume. To train it further, resume with more steps (--steps N > {cfg.steps})"
                )
        elif resume is True:
            what = (
                "it holds no run"
                if not record
                else "its run stopped before its first checkpoint (a kill before any save)"
            )
            raise RunDirError(
                f"nothing to resume in {run_dir}: {what}. Check the path; to start the run there "
                "instead, use --resume-or-start (or drop --resume"
                + (", with --overwrite to replace what is there)" if record else ")")
            )
        elif record:
            if resume == "auto":  # no checkpoint: start again, but only over a record of this same run
                _check_same_run(run_dir, cfg)
            elif not overwrite:
                names = ", ".join(p.name for p in record[:4]) + (", ..." if len(record) > 4 else "")
                raise RunDirError(
                    f"{run_dir} holds another run's record ({names}); a run directory is one run's "
                    "record. Continue that run with --resume, replace it with --overwrite, or choose a "
                    "new directory (--name NAME, or no --out for a new one)"
                )
            replacing = True
        return Claim(run_dir, lock, checkpoint, replacing=replacing, fresh=not record, finished=finished)
    except BaseException:
        lock.release(tidy=True)
        raise


def _never_stepped(run_dir: Path, record: list[Path]) -> bool:
    """A record a new run left when killed before its first step (a stop is undone by Claim itself): its start's
    config.yaml and sinks, and no metrics row, evaluation or checkpoint."""
    metrics = run_dir / "metrics.jsonl"
    return (
        bool(record)
        and all(
            p.name in ("config.yaml", DIGEST, "metrics.jsonl", "tensorboard", "wandb", "wandb_run_id") for p in record
        )
        and (not metrics.exists() or not metrics.read_text().strip())
    )


def _repair(run_dir: Path) -> None:
    """A process killed after Claim.start() moved a record aside and before its run committed (Claim.commit renames
    the moved-aside record away first): that record is put back over what the dead start wrote."""
    for staged in run_dir.glob(STAGED + "*"):
        for entry in record_entries(run_dir):
            _remove(entry)
        for entry in staged.iterdir():
            os.replace(entry, run_dir / entry.name)
        shutil.rmtree(staged, ignore_errors=True)


def _check_resume(run_dir: Path, cfg: TrainConfig, checkpoint: Path) -> None:
    stored = stored_settings(run_dir)
    if stored is None:
        raise RunDirError(
            f"{run_dir} has checkpoints but no config.yaml, so its settings cannot be checked; resume "
            "is refused. Restore config.yaml, or start anew with --overwrite"
        )
    diff = differences(run_dir, stored, cfg)
    if diff:
        raise RunDirError(
            f"--resume of {run_dir} with other settings than the run's own would not continue that run: "
            + "; ".join(diff)
            + f". Only {', '.join(RESUME_SAFE)} may change on resume; drop the "
            "other changes, or start a new run (--name NAME) for them"
        )
    if step_of(checkpoint) > cfg.steps:
        raise RunDirError(
            f"{run_dir}'s newest checkpoint is at step {step_of(checkpoint)}, beyond steps={cfg.steps}; "
            f"resume with --steps {step_of(checkpoint)} or more"
        )


def _check_same_run(run_dir: Path, cfg: TrainConfig) -> None:
    stored = stored_settings(run_dir)
    diff = differences(run_dir, stored, cfg) if stored is not None else ["(no config.yaml)"]
    if diff:
        raise RunDirError(
            f"{run_dir} holds a run with other settings and no checkpoint ({'; '.join(diff)}); "
            "--resume-or-start only restarts the same run. Replace it with --overwrite, or choose a new "
            "directory (--name NAME)"
        )


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


# ---------------------------------------------------------------------------------------------------------------
# Outputs of other subcommands (rule 6)


def is_run_dir(path: Path) -> bool:
    """Whether `path` holds a run's record: config.yaml with metrics.jsonl (what a run writes as it starts), or a
    checkpoint pointer."""
    return path.is_dir() and (
        (path / "config.yaml").is_file() and (path / "metrics.jsonl").is_file() or (path / LATEST).is_file()
    )


def held_by_a_run(path: Path) -> bool:
    """Whether a live process holds path/.lock (RunLock); probed with a shared lock, never created."""
    try:
        fd = os.open(path / LOCK, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except OSError:
        return True
    finally:
        os.close(fd)


def _shown(path: Path) -> str:
    """A path as the user would write it: relative to the working directory when it lies below it."""
    rel = os.path.relpath(path)
    return str(path) if rel.startswith("..") else rel


def _is_record_name(name: str) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in RECORD)


def check_output(
    path: str | Path,
    *,
    option: str = "--out",
    command: str = "",
    writes: tuple[str, ...] = (),
    named: bool = True,
    directory: bool = True,
) -> Path:
    """Refuse (RunDirError) an output path of a subcommand that would write over a run's record (rule 6). `path` is
    a directory the command writes `writes` into (directory=True; each name a file or folder of it) or a file. A
    path is refused when it, or what the command writes there, is or lies inside a record entry (config.yaml,
    metrics.jsonl, eval.json, checkpoint-N, samples, ...) of a run directory or of a directory a live run holds;
    and, unless the user named the path (named=False: the command's default), when it lies in such a directory at
    all. With no `writes`, the directory itself is checked (a run directory: train's own). A dangling symlink, or a
    file where a directory is due (or the reverse), is refused too. Returns path."""
    path = Path(path)
    where = f"{option} {path}"
    if path.is_symlink() and not path.exists():
        raise RunDirError(
            f"{where} is a symlink to {os.readlink(path)}, which does not exist; remove the link or "
            f"point {option} at a real path"
        )
    if path.exists() and directory and not path.is_dir():
        raise RunDirError(
            f"{where} is not a directory ({'a device' if not path.is_file() else 'a file'}); "
            f"{option} takes a directory to write into"
        )
    if path.is_dir() and not directory:
        raise RunDirError(f"{where} is a directory; {option} takes the file to write")
    targets = [path / name for name in writes] if directory and writes else [path]
    for target in targets:
        absolute = Path(os.path.abspath(target))
        for parent in [absolute, *absolute.parents]:
            resolved = parent.resolve()
            if resolved == absolute.resolve() or not (is_run_dir(resolved) or held_by_a_run(resolved)):
                continue
            inside = absolute.relative_to(parent)
            live = " (a live run holds it)" if held_by_a_run(resolved) else ""
            run = _shown(parent)
            if _is_record_name(inside.parts[0]):
                raise RunDirError(
                    f"{where}: {_shown(parent / inside.parts[0])} belongs to the run record in {run}"
                    f"{live}; {command or 'this command'} never writes there. Choose another {option}"
                )
            if not named:
                raise RunDirError(
                    f"{where}: the default {option} lies in the run directory {run}{live}; name "
                    f"another {option} (or this one explicitly to write beside the run's record)"
                )
    return path
