"""A run's record as a resume reads it: the run's settings and what a resume checks before it trusts them and the
checkpoint (rundir.py's rules, rule 4 above all, say what follows from each):

1. Checkpoints: finding the one to resume from, checking and loading it is checkpoint.py's; whether the rest of the
   record holds every step up to it is 3 below.
2. The settings digest, RUN/config.digest: beside config.yaml the run keeps a digest of each of its settings
   (config.settings_digests), written with config.yaml whenever a run starts or resumes there. A field whose value
   differs from its digest was edited by hand since (`edited_fields`); resume compares the new settings with the
   digest rather than with the file, so a hand edit of config.yaml is refused as `--set` is, naming the field
   (`check_hand_edits`, `differences`). A record with a checkpoint but no digest was damaged (the digest is written
   before the first step): its resume is refused naming the file (`check_digest_kept`), since a hand edit could no
   longer be told. A record with no checkpoint and no digest (a run killed before its first step) is checked
   against config.yaml.
3. Completeness: metrics.jsonl holds a line for every step up to the checkpoint's (less a step the checkpoint holds
   pending, checkpoint.py), and every samples file of those steps reads whole (`first_gap`). A line cut off by a crash
   while it was written, or a lost or damaged file, is a gap that a resume from that checkpoint would never fill:
   the resume goes back to the newest checkpoint before it (`trusted_checkpoint`), or is refused naming the file.
4. A record an --overwrite set aside (RUN/.replaced-*) and a kill left there is the run's (the next claim puts it
   back): its settings are read from there (`record_dir`).

Departures, numbered:
1. config.yaml and config.digest are two files, each replaced atomically but not together; a kill between the two
   renames (microseconds, while a resume rewrites both) can leave a setting that may change on resume (steps,
   bookkeeping) looking hand-edited, which is refused with its way out (give it on the command line), never trained.
2. Every samples file up to the checkpoint is read whole on each resume (gzip and JSON: milliseconds per file), not
   only the newest; a damaged old one with no checkpoint before it refuses the resume, naming the file (delete it to
   resume without that step's samples).
"""

from __future__ import annotations

import gzip
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

import yaml

from ..config import RESUME_SAFE, TrainConfig, setting_differences, settings_digests
from .checkpoint import RunDirError, checkpoint_dirs, damaged_file, holds_pending, step_of

DIGEST = "config.digest"
FORMAT = "entropy-rft/settings-digest"
STAGED = ".replaced-"  # a replaced record, moved aside until the new run commits (rundir.py rule 3)


def trusted_checkpoint(run_dir: Path, first: Path | None) -> Path | None:
    """`first` when the record holds every step up to it (record.first_gap); else the newest complete checkpoint
    before the first step it lacks, after a warning naming the file and line (those steps are trained again); with
    none, RunDirError naming them (rule 4)."""
    if first is None:
        return None
    try:
        gap = first_gap(run_dir, step_of(first), lambda: holds_pending(first))
    except ValueError as err:  # a damaged line before the last: logging names it
        raise RunDirError(str(err)) from None
    if gap is None:
        return first
    step, kind, what = gap
    earlier = sorted(
        (c for c in checkpoint_dirs(run_dir, complete=True) if step_of(c) < step and damaged_file(c) is None),
        key=step_of,
    )
    if earlier:
        ckpt = earlier[-1]
        print(
            f"entropy-rft: warning: {what}; resuming from {ckpt.name}, the newest checkpoint before step {step}: "
            f"steps {step_of(ckpt) + 1}-{step_of(first)} are trained again, exactly as the first time",
            file=sys.stderr,
        )
        return ckpt
    raise RunDirError(
        f"{what}, and {run_dir} has no checkpoint before step {step} to train it again from; a resume "
        f"from {first.name} would leave step {step} out of the record. "
        + (
            "Delete that file to resume without the step's samples, or restore it"
            if kind == "samples"
            else "Restore the file, or start the run again with --overwrite"
        )
    )


def record_dir(run_dir: Path) -> Path:
    """Where the run's record lies: run_dir, or the record an --overwrite set aside there before it was killed (the
    next claim puts it back, rule 3)."""
    staged = sorted(Path(run_dir).glob(STAGED + "*"))
    return staged[0] if staged else Path(run_dir)


def set_aside_note(run_dir: Path) -> str | None:
    """A line saying that run_dir holds a record an interrupted --overwrite set aside, or None."""
    staged = sorted(Path(run_dir).glob(STAGED + "*"))
    if not staged:
        return None
    return (
        f"{staged[0]} holds the run record an --overwrite of {run_dir} set aside and did not replace (it was "
        "killed before its first step); the next `entropy-rft train` there puts that record back, and --resume "
        "continues it"
    )


def stored_settings(run_dir: Path) -> dict | None:
    """The run's config.yaml as a dict (from record_dir), or None when there is none; one that is not YAML raises
    RunDirError."""
    path = record_dir(run_dir) / "config.yaml"
    if not path.exists():
        return None
    try:
        data = yaml.safe_load(path.read_text())
    except (yaml.YAMLError, UnicodeDecodeError) as err:
        where = getattr(err, "problem_mark", None)
        at = f" (line {where.line + 1})" if where is not None else ""
        raise RunDirError(
            f"{path} is not valid YAML{at}, so the run's settings cannot be read; the record is damaged. "
            "Restore or fix the file (`entropy-rft train --help-config` lists the fields), or replace "
            "the run with --overwrite"
        ) from None
    if not isinstance(data, dict):
        raise RunDirError(
            f"{path} is not a mapping of settings; the record is damaged (restore it, or replace the "
            "run with --overwrite)"
        )
    return data


def differences(run_dir: Path, stored: dict, cfg: TrainConfig) -> list[str]:
    """setting_differences against the run's own settings: those its digest recorded (record.py), where config.yaml
    was edited by hand since; config.yaml itself in a record without a digest."""
    digests = read_digest(run_dir)
    if digests is None:
        check_digest_kept(run_dir)
        return setting_differences(stored, cfg)
    edited, _ = edited_fields(run_dir, stored)
    new = cfg.to_dict()
    return [
        f"{k}: {stored.get(k)!r} -> {new[k]!r}"
        if k not in edited
        else f"{k}: {new[k]!r}, but config.yaml was edited by hand there since the run wrote it (the run trained with "
        "another value)"
        for k in differing_fields(digests, cfg)
        if k not in RESUME_SAFE
    ]


def check_hand_edits(run_dir: Path, given: set[str] | frozenset[str] = frozenset()) -> None:
    """Refuse (RunDirError) a resume from a config.yaml edited by hand since the run wrote it (rundir.py rule 4),
    naming the fields and their values, unless the command line gives them too (`given`: the keys of the recipe,
    --set and the options): a field that may change on resume (RESUME_SAFE: steps and bookkeeping) is then accepted,
    and any other is checked as a --set of it is (`differences`: refused unless it is the run's own value)."""
    folder = record_dir(run_dir)
    stored = stored_settings(run_dir)
    if stored is None:
        return
    check_digest_kept(folder)
    edited, now = edited_fields(folder, stored)
    path = folder / "config.yaml"
    shown = {
        k: f"{k}={_yaml_value(getattr(now, k))}" + ("" if k in stored else " (deleted: its default)") for k in edited
    }
    unsafe = [k for k in edited if k not in RESUME_SAFE and k not in given]
    if unsafe:
        it, verb = ("it", "differs") if len(unsafe) == 1 else ("them", "differ")
        raise RunDirError(
            f"{path} was edited by hand since the run wrote it: {', '.join(shown[k] for k in unsafe)} "
            f"{verb} from the settings the run trained with ({DIGEST}); a resumed run would train its "
            f"later steps with {it} while its record claims {it} for every step. Put the file back as it "
            f"was, or train {it} as a new run (--name NAME --config {path})"
        )
    unconfirmed = [k for k in edited if k not in given]
    if unconfirmed:
        it, this = ("it", "this") if len(unconfirmed) == 1 else ("them", "these")
        listed = " ".join(shown[k] for k in unconfirmed)
        raise RunDirError(
            f"{path} was edited by hand since the run wrote it ({listed}); {this} may change on resume: "
            f"to accept, give {it} on the command line too (--set {listed}), or put the file back as it "
            "was"
        )


def check_digest_kept(folder: Path) -> None:
    """Refuse (RunDirError) a record with a checkpoint but no config.digest (rule 2): every entropy-rft that writes
    checkpoints writes the digest with config.yaml before its first step, so one missing beside a checkpoint was
    deleted or left behind by a copy, and a hand edit of config.yaml since could no longer be told (a resume would
    train with the edited value while the record claims it for every step). Records of source trees from before the
    digest (unreleased, before 2026-11-26) are refused the same way: the message says how to go on."""
    folder = Path(folder)
    ckpts = sorted(checkpoint_dirs(folder, complete=True), key=step_of)
    if (folder / DIGEST).exists() or not ckpts:
        return
    raise RunDirError(
        f"{folder / DIGEST} is missing beside {ckpts[-1].name}: entropy-rft writes it with config.yaml before a "
        "run's first step, so the record was damaged (the file deleted, or the directory copied without it), and a "
        f"hand edit of config.yaml since can no longer be told from the settings the run trained with. Put {DIGEST} "
        f"back, or train config.yaml's settings as a new run (--name NAME --config {folder / 'config.yaml'})"
    )


def _yaml_value(value) -> str:
    return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()


def write_digest(run_dir: Path, cfg: TrainConfig) -> None:
    """RUN/config.digest for cfg, replaced atomically."""
    tmp = Path(run_dir) / f".{DIGEST}.tmp"
    tmp.write_text(json.dumps({"format": FORMAT, "fields": settings_digests(cfg.to_dict())}, indent=0) + "\n")
    os.replace(tmp, Path(run_dir) / DIGEST)


def read_digest(folder: Path) -> dict[str, str] | None:
    """The per-field digests of FOLDER/config.digest, or None when there is none; a damaged file raises ValueError
    naming it."""
    path = Path(folder) / DIGEST
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
        fields = data["fields"] if data.get("format") == FORMAT else None
    except (ValueError, TypeError, KeyError, AttributeError, UnicodeDecodeError):
        fields = None
    if not isinstance(fields, dict):
        raise ValueError(
            f"{path} is not a settings digest (damaged?); it guards config.yaml against hand edits. "
            "Delete it to trust config.yaml as it is, or replace the run with --overwrite"
        )
    return fields


def differing_fields(digests: dict[str, str], cfg: TrainConfig) -> list[str]:
    """The fields of cfg whose value is not the one the digest recorded (a field the digest lacks, added to
    TrainConfig since, counts as unchanged)."""
    now = settings_digests(cfg.to_dict())
    return sorted(k for k, d in now.items() if k in digests and digests[k] != d)


def edited_fields(folder: Path, stored: dict) -> tuple[list[str], TrainConfig | None]:
    """(fields of FOLDER/config.yaml edited by hand since the run wrote it, the settings the file now gives): a
    field deleted from the file counts at the value it now resolves to (its default). No digest: ([], None)."""
    digests = read_digest(folder)
    if digests is None:
        return [], None
    import warnings

    from ..config import resolve_config

    with warnings.catch_warnings():  # the run's own settings: their warnings came when it started
        warnings.simplefilter("ignore")
        now = resolve_config(stored)
    return differing_fields(digests, now), now


def _readable(path: Path) -> bool:
    try:
        json.loads(gzip.decompress(path.read_bytes()))
        return True
    except (OSError, EOFError, ValueError):
        return False


def first_gap(run_dir: Path, step: int, pending: Callable[[], bool]) -> tuple[int, str, str] | None:
    """(the first step <= `step` the record lacks, "metrics" or "samples", what is wrong), or None when it holds
    every step: a step with no complete line in metrics.jsonl (the line of `step` itself may be missing when
    `pending()`: the checkpoint holds that step unlogged), or a samples file that does not read whole. A damaged line
    before the last raises ValueError naming it (logging.read_metrics_file, the one reader)."""
    from ..logging import read_metrics_file
    from ..samples import SAMPLES_DIR, file_name, steps_written

    run_dir = Path(run_dir)
    path = run_dir / "metrics.jsonl"
    metrics = read_metrics_file(run_dir) if path.exists() else None
    logged = {row["step"] for row in metrics.rows} if metrics else set()
    gaps = []
    missing = next((s for s in range(1, step + 1) if s not in logged), None)
    if missing is not None and not (missing == step and pending()):
        what = (metrics.cut_off(missing) if metrics else None) or (
            f"{path} holds no line for step {missing}" + ("" if path.exists() else " (it is missing)")
        )
        gaps.append((missing, "metrics", what))
    for s in steps_written(run_dir):
        if s <= step and not _readable(run_dir / SAMPLES_DIR / file_name(s)):
            gaps.append(
                (s, "samples", f"{run_dir / SAMPLES_DIR / file_name(s)} does not read whole (cut off or damaged)")
            )
            break
    return min(gaps, default=None)
