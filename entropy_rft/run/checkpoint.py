"""A run's checkpoint: its file names, what it holds, writing it whole or not at all, finding the one to resume from,
checking and loading it, and pruning the old ones. Every other module names a checkpoint's files through the
constants and `checkpoint_dir` / `step_of` here.

    RUN/checkpoint-N/         the checkpoint after N optimizer updates (`checkpoint_dir(run, N)`, `step_of(path)`)
        model.safetensors ... the policy's weights and tokenizer (save_pretrained)
        value_head.pt         the critic's value head (PPO)
        checksums.json        the SHA-256 of every other file of the checkpoint, written with it (`CHECKSUMS`)
        trainer_state.pt      the rest of the run state, one record (`RunState.capture`):
            step        the optimizer updates applied (the checkpoint's N)
            optimizer   Adam's state
            sampler     the problem order's generator and the rest of its epoch (problems.ProblemSampler)
            update_gen  the generator of mini-batch orders and Clip-Cov's selection
            torch_rng   torch's global generator
            evals       the evaluations so far, {step: EvalResult.to_json()}
            control     the entropy control's state (control.CONTROLS)
            pending     a step whose metrics line waits for its evaluation: {"step": N, "metrics": {...}} (a stop cut
                        the evaluation short; resume runs it, then logs the line), or None
    RUN/latest_checkpoint     the name of the newest complete checkpoint, replaced atomically after it is written

A checkpoint is complete when its trainer_state.pt exists (it is written last, and the directory is renamed into
place whole); `resume_checkpoint` also checks that the file is a whole torch archive and that every file matches the
checksum written with it (`damaged_file`: bytes changed on disk or in a copy, which loading would not notice: a
safetensors file with its header intact loads whatever its data holds), `load_trainer_state` that it holds every
part. A checkpoint written before checksums.json existed is checked as before, without them. What a resume checks
about the rest of the record (the settings, metrics and samples up to the checkpoint) is record.py's; when each of
these is used, rundir.py's rules 4 and 5.

trainer_state.pt pickles plain values only (dicts, lists, numbers and tensors: no class of this package), so moving a
module never breaks an old checkpoint (tests/test_old_run.py). Older checkpoints still resume: without update_gen /
torch_rng / evals (written before they were saved) those are left as a fresh run has them; the control's state under
its old key (controller, bonus, pi) is read as `control`.

Departures, numbered:
1. Each checkpoint's files are read back once after they are written, to checksum them, and each is read once more
   when a run resumes from it: at disk speed, about a second per 2 GB (SHA-256 over the page cache), small beside
   writing them. Checkpoints before the one a resume takes are checksummed only when it is passed over.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import pickle
import secrets
import shutil
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch loads only where a checkpoint is read or written: rundir.py and the CLI's checks import
    import torch  # this module without it

    from ..core.control import EntropyControl

PREFIX = "checkpoint-"  # RUN/checkpoint-N
STATE = "trainer_state.pt"  # the run state besides the weights; written last: its presence makes a checkpoint complete
VALUE_HEAD = "value_head.pt"  # the critic's value head (PPO)
LATEST = "latest_checkpoint"  # names the newest complete checkpoint
LATEST_TMP = f".{LATEST}.tmp"  # the pointer being replaced
WRITING = f".{PREFIX}"  # .checkpoint-N.*: a checkpoint being written, or an old one being swapped out
DELETING = ".deleting-"  # .deleting-NAME: an entry renamed before its files go (pruning, a replaced record)
STATE_PARTS = ("step", "optimizer", "sampler")  # what every trainer_state.pt holds
CHECKSUMS = "checksums.json"  # {"format": CHECKSUMS_FORMAT, "sha256": {file: hex digest}} of the checkpoint's files
CHECKSUMS_FORMAT = "entropy-rft/checkpoint-checksums"


class RunDirError(Exception):
    """A run directory that may not be used as asked; the message names the directory and the fix."""


def checkpoint_dir(run_dir: Path | str, step: int) -> Path:
    """RUN_DIR/checkpoint-STEP."""
    return Path(run_dir) / f"{PREFIX}{step}"


def step_of(ckpt: Path | str) -> int:
    """The N of a checkpoint-N directory."""
    return int(Path(ckpt).name.removeprefix(PREFIX))


def is_checkpoint_name(name: str) -> bool:
    """Whether a directory name is checkpoint-N."""
    return name.startswith(PREFIX) and name.removeprefix(PREFIX).isdigit()


def checkpoint_dirs(run_dir: Path, *, complete: bool) -> list[Path]:
    """The checkpoint-N directories of run_dir, in no order; complete: only those holding a trainer_state.pt."""
    return [
        p
        for p in Path(run_dir).glob(f"{PREFIX}*")
        if is_checkpoint_name(p.name) and (not complete or (p / STATE).exists())
    ]


# ---------------------------------------------------------------------------------------------------------------
# What trainer_state.pt holds


class RunState:
    """The live objects a checkpoint's trainer_state.pt records (module docstring), besides weights and Adam."""

    def __init__(self, sampler, update_gen: torch.Generator, control: EntropyControl, control_name: str):
        self.sampler, self.update_gen, self.control, self.control_name = sampler, update_gen, control, control_name
        self.evals: dict[int, dict] = {}
        self.pending: dict | None = None

    def capture(self) -> dict:
        """The record as it stands now (copies: later steps do not change it)."""
        import torch

        return {
            "sampler": self.sampler.state(),
            "update_gen": self.update_gen.get_state(),
            "torch_rng": torch.get_rng_state(),
            "evals": dict(self.evals),
            "control": self.control.state(),
            "pending": self.pending,
        }

    def restore(self, saved: dict) -> int:
        """Continue from a checkpoint's trainer_state.pt (Adam's state is loaded by the caller); returns its step."""
        import torch

        from ..core.control import LEGACY_STATE_KEYS

        self.sampler.load(saved["sampler"])
        if "update_gen" in saved:  # checkpoints written before these were saved resume without them
            self.update_gen.set_state(saved["update_gen"])
            torch.set_rng_state(saved["torch_rng"])
            self.evals = {int(k): v for k, v in saved["evals"].items()}
        control = saved.get("control", saved.get(LEGACY_STATE_KEYS.get(self.control_name, "control")))
        if control is not None:
            self.control.load_state(control)
        self.pending = saved.get("pending")
        return saved["step"]


# ---------------------------------------------------------------------------------------------------------------
# Writing


def save_checkpoint(
    run_dir: Path, step: int, model, tokenizer, optimizer, sampler=None, value_head=None, extra: dict | None = None
) -> Path:
    """RUN_DIR/checkpoint-STEP, written whole or not at all: into a hidden temporary directory, then renamed into
    place, and only then named in latest_checkpoint (itself replaced atomically). A kill at any moment leaves the
    previous checkpoint and its pointer intact. `extra` holds the rest of the run state (trainer_state.pt)."""
    import torch

    ckpt = checkpoint_dir(run_dir, step)
    tmp = _new_dir(Path(run_dir), f"{WRITING}{step}.")
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        if value_head is not None:
            torch.save(value_head.state_dict(), tmp / VALUE_HEAD)
        state = {"step": step, "optimizer": optimizer.state_dict(), **(extra or {})}
        if sampler is not None:
            state["sampler"] = sampler.state()
        torch.save(state, tmp / STATE)
        write_checksums(tmp)
        if ckpt.exists():  # the same step saved twice (save_every and the final save): swap the old one out
            old = Path(tempfile.mkdtemp(prefix=f".{ckpt.name}.old.", dir=run_dir))
            os.replace(ckpt, old / ckpt.name)
            os.replace(tmp, ckpt)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, ckpt)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    pointer = Path(run_dir) / LATEST_TMP
    pointer.write_text(ckpt.name)
    os.replace(pointer, Path(run_dir) / LATEST)
    return ckpt


def _new_dir(parent: Path, prefix: str) -> Path:
    """A new directory parent/prefix<random> with the permissions the user's umask gives (tempfile.mkdtemp's are
    0700, which a checkpoint kept them after its rename: unreadable to the user's group, unlike the rest of the
    run)."""
    while True:
        path = parent / f"{prefix}{secrets.token_hex(4)}"
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 24):
            digest.update(block)
    return digest.hexdigest()


def write_checksums(ckpt: Path) -> None:
    """ckpt/checksums.json: the SHA-256 of every file of the checkpoint (its folders' included), itself aside."""
    files = sorted(p for p in Path(ckpt).rglob("*") if p.is_file() and p.name != CHECKSUMS)
    sums = {p.relative_to(ckpt).as_posix(): sha256_of(p) for p in files}
    (Path(ckpt) / CHECKSUMS).write_text(json.dumps({"format": CHECKSUMS_FORMAT, "sha256": sums}, indent=1) + "\n")


def out_of_space(err: BaseException) -> bool:
    """An error that says the disk (or the user's quota) is full: OSError ENOSPC / EDQUOT, or safetensors' own
    SafetensorError wrapping it (`IoError(Os { code: 28, kind: StorageFull, ...`)."""
    if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    text = str(err)
    return "No space left on device" in text or "StorageFull" in text or "QuotaExceeded" in text


@contextlib.contextmanager
def checkpoint_space(run_dir: Path, step: int):
    """Around a checkpoint write: running out of disk space becomes RunDirError naming the checkpoint, the newest
    complete one left and the way out (free space, --resume: resuming from a complete checkpoint is exact)."""
    try:
        yield
    except Exception as err:
        if not out_of_space(err):
            raise
        left = find_checkpoint(Path(run_dir))
        how = (
            f"continue with `entropy-rft train --resume --out {run_dir}`: it resumes exactly from {left.name}"
            if left
            else f"run the same command with --resume-or-start (`entropy-rft train --resume-or-start --out "
            f"{run_dir}` and its settings): no checkpoint was complete, so the run starts again"
        )
        raise RunDirError(
            f"no space left on the device while writing {checkpoint_dir(run_dir, step)} (the "
            f"partial write was removed); free space on that disk, then {how}"
        ) from None


# ---------------------------------------------------------------------------------------------------------------
# Finding, checking and loading


def find_checkpoint(run_dir: Path) -> Path | None:
    """The checkpoint to resume from: the one latest_checkpoint names if it is complete, else the complete
    checkpoint-N of highest N (a kill between two renames of save_checkpoint), else None."""
    latest = Path(run_dir) / LATEST
    if latest.exists():
        named = Path(run_dir) / latest.read_text().strip()
        if (named / STATE).exists():
            return named
    return max(checkpoint_dirs(run_dir, complete=True), key=step_of, default=None)


def intact_state(ckpt: Path) -> bool:
    """Whether ckpt/trainer_state.pt is a complete torch archive (torch.save writes a zip, whose directory is at
    its end: a file cut short by a full disk or a kill mid-copy has none)."""
    return zipfile.is_zipfile(Path(ckpt) / STATE)


def damaged_file(ckpt: Path) -> tuple[Path, str] | None:
    """(file, how it is damaged) for the first damaged file of the checkpoint, or None: trainer_state.pt that is not
    a complete torch archive, then any file whose SHA-256 differs from the one checksums.json holds for it, or that
    is gone (a checksums.json that cannot be read is itself the damaged file). A checkpoint without checksums.json
    (written before it existed) is checked for its trainer_state.pt alone."""
    ckpt = Path(ckpt)
    if not intact_state(ckpt):
        return ckpt / STATE, "not a complete torch archive: cut short by a full disk or a copy?"
    listing = ckpt / CHECKSUMS
    if not listing.exists():
        return None
    try:
        record = json.loads(listing.read_text())
    except (ValueError, UnicodeDecodeError):
        record = None
    sums = record.get("sha256") if isinstance(record, dict) and record.get("format") == CHECKSUMS_FORMAT else None
    if not isinstance(sums, dict):
        return listing, "not the checksum list entropy-rft writes"
    for name, want in sums.items():
        path = ckpt / name
        if not path.is_file():
            return path, f"missing (it was written with the checkpoint, {CHECKSUMS} lists it)"
        if sha256_of(path) != want:
            return path, f"its SHA-256 differs from the one {CHECKSUMS} holds: its bytes changed after it was written"
    return None


def resume_checkpoint(run_dir: Path) -> Path | None:
    """find_checkpoint's choice, or, when a file of it is damaged (`damaged_file`), the newest earlier complete
    checkpoint with none damaged, after a warning naming the damaged file (rundir.py rule 4); with none left,
    RunDirError naming it."""
    first = find_checkpoint(run_dir)
    if first is None:
        return None
    damage = damaged_file(first)
    if damage is None:
        return first
    damaged, why = damage
    earlier = sorted((c for c in checkpoint_dirs(run_dir, complete=True) if step_of(c) < step_of(first)), key=step_of)
    for ckpt in reversed(earlier):
        if damaged_file(ckpt) is None:
            print(
                f"entropy-rft: warning: {damaged} is damaged ({why}); resuming from {ckpt.name}, the newest complete "
                f"checkpoint before it: steps {step_of(ckpt) + 1}-{step_of(first)} are trained again",
                file=sys.stderr,
            )
            return ckpt
    raise RunDirError(
        f"{damaged} is damaged ({why}) and {run_dir} has no earlier complete checkpoint to resume from; "
        "restore the file, or start the run again with --overwrite"
    )


_UNREADABLE = (RuntimeError, EOFError, OSError, ValueError, pickle.UnpicklingError, zipfile.BadZipFile)


def load_trainer_state(ckpt: Path) -> dict:
    """ckpt/trainer_state.pt (the run state besides the weights); a file torch cannot read raises RunDirError naming
    it and the way out, and so does one that lacks a part of the run state (STATE_PARTS)."""
    import torch

    path = Path(ckpt) / STATE
    try:
        state = torch.load(path, weights_only=False)
    except _UNREADABLE as err:
        raise RunDirError(
            f"{path} cannot be read ({type(err).__name__}: {' '.join(str(err).split())[:120]}); the "
            f"checkpoint is damaged. Move {Path(ckpt).name} out of the run directory and --resume goes "
            "on from the checkpoint before it, or restore the file"
        ) from None
    lacks = [k for k in STATE_PARTS if not isinstance(state, dict) or k not in state]
    if lacks:
        raise RunDirError(
            f"{path} lacks {', '.join(lacks)} of the run state (checkpoint.py), so the run cannot continue "
            f"from it exactly; it was not written by entropy-rft train. Move {Path(ckpt).name} out of "
            "the run directory and --resume goes on from the checkpoint before it, or restore the file"
        )
    return state


def holds_pending(ckpt: Path) -> bool:
    """Whether the checkpoint holds a step pending (its metrics line not yet written); read lazily, and False for a
    file torch cannot read (load_trainer_state names the damage when the run loads it)."""
    import torch

    try:
        state = torch.load(Path(ckpt) / STATE, weights_only=False, mmap=True, map_location="cpu")
    except _UNREADABLE:
        return False
    return isinstance(state, dict) and state.get("pending") is not None


# ---------------------------------------------------------------------------------------------------------------
# Pruning (rundir.py rule 5)


def prune_checkpoints(run_dir: Path, keep: int, final_step: int) -> list[str]:
    """Delete all checkpoints but the newest `keep` and checkpoint-<final_step> (keep 0: delete none); the one
    latest_checkpoint names is never deleted. Each is renamed to a hidden name before its files go. Returns the
    names deleted."""
    if keep <= 0:
        return []
    ckpts = sorted(checkpoint_dirs(run_dir, complete=False), key=step_of)
    spared = set(ckpts[-keep:]) | {checkpoint_dir(run_dir, final_step), find_checkpoint(run_dir)}
    gone = []
    for ckpt in ckpts:
        if ckpt not in spared:
            doomed = Path(run_dir) / f"{DELETING}{ckpt.name}"
            os.replace(ckpt, doomed)
            shutil.rmtree(doomed, ignore_errors=True)
            gone.append(ckpt.name)
    return gone
