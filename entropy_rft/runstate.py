"""A run's state and its checkpoint format: what `RUN/checkpoint-N` holds, written whole or not at all.

A checkpoint is the policy's weights and tokenizer (save_pretrained), the critic's value head (value_head.pt, PPO)
and trainer_state.pt, one record (`RunState.capture`):

    step        the optimizer updates applied (the checkpoint's N)
    optimizer   Adam's state
    sampler     the problem order's generator and the rest of its epoch (problems.ProblemSampler)
    update_gen  the generator of mini-batch orders and Clip-Cov's selection
    torch_rng   torch's global generator
    evals       the evaluations so far, {step: EvalResult.to_json()}
    control     the entropy control's state (control.CONTROLS)
    pending     a step whose metrics line waits for its evaluation: {"step": N, "metrics": {...}} (a stop cut the
                evaluation short; resume runs it, then logs the line), or None

Writing a checkpoint lives here with what happens when the disk is full (checkpoint_space) and which checkpoints
are kept (prune_checkpoints); finding the one to resume from and loading it, with what a resume checks before it
trusts them, is record.py's. rundir.py's rules 4 and 5 say when each is used.

Older checkpoints still resume: without update_gen / torch_rng / evals (written before they were saved) those are
left as a fresh run has them; the control's state under its old key (controller, bonus, pi) is read as `control`.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from .record import RunDirError, checkpoint_dirs, find_checkpoint, step_of

if TYPE_CHECKING:  # torch loads only where a checkpoint is read or written: rundir.py and the CLI's checks import
    import torch  # this module without it

    from .control import EntropyControl


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

        from .control import LEGACY_STATE_KEYS

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


def save_checkpoint(
    run_dir: Path, step: int, model, tokenizer, optimizer, sampler=None, value_head=None, extra: dict | None = None
) -> Path:
    """RUN_DIR/checkpoint-STEP, written whole or not at all: into a hidden temporary directory, then renamed into
    place, and only then named in latest_checkpoint (itself replaced atomically). A kill at any moment leaves the
    previous checkpoint and its pointer intact. `extra` holds the rest of the run state (trainer_state.pt)."""
    import torch

    ckpt = run_dir / f"checkpoint-{step}"
    tmp = Path(tempfile.mkdtemp(prefix=f".{ckpt.name}.", dir=run_dir))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        if value_head is not None:
            torch.save(value_head.state_dict(), tmp / "value_head.pt")
        state = {"step": step, "optimizer": optimizer.state_dict(), **(extra or {})}
        if sampler is not None:
            state["sampler"] = sampler.state()
        torch.save(state, tmp / "trainer_state.pt")
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
    pointer = run_dir / ".latest_checkpoint.tmp"
    pointer.write_text(ckpt.name)
    os.replace(pointer, run_dir / "latest_checkpoint")
    return ckpt


# ---------------------------------------------------------------------------------------------------------------
# Writing out of space, and retention (rundir.py rules 4 and 5); finding and loading a checkpoint is record.py's


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
            f"no space left on the device while writing {Path(run_dir) / f'checkpoint-{step}'} (the "
            f"partial write was removed); free space on that disk, then {how}"
        ) from None


def prune_checkpoints(run_dir: Path, keep: int, final_step: int) -> list[str]:
    """Delete all checkpoints but the newest `keep` and checkpoint-<final_step> (keep 0: delete none); the one
    latest_checkpoint names is never deleted. Each is renamed to a hidden name before its files go. Returns the
    names deleted."""
    if keep <= 0:
        return []
    ckpts = sorted(checkpoint_dirs(run_dir, complete=False), key=step_of)
    spared = set(ckpts[-keep:]) | {run_dir / f"checkpoint-{final_step}", find_checkpoint(run_dir)}
    gone = []
    for ckpt in ckpts:
        if ckpt not in spared:
            doomed = run_dir / f".deleting-{ckpt.name}"
            os.replace(ckpt, doomed)
            shutil.rmtree(doomed, ignore_errors=True)
            gone.append(ckpt.name)
    return gone
