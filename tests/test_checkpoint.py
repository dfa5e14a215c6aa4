"""checkpoint.py: a checkpoint's file names, what its trainer_state.pt records, and finding and loading checkpoints.

Properties: RunState.capture then restore into a fresh run's objects (through torch.save / torch.load, as a
checkpoint does) continues every source of randomness and every learnt state exactly: the problem order, the update's
generator, torch's global generator, the entropy control, the evaluations (keys back to ints) and a pending step; a
capture is a copy (later steps do not change it); checkpoints written before update_gen / torch_rng / evals were
saved resume without them, and a control state under its old key is read; a damaged trainer_state.pt is skipped for
the newest earlier intact checkpoint, and an unreadable one raises RunDirError naming the file. The names are the
format old run directories were written in, and no other module spells them."""

import ast
import errno
import json
import os
import stat
from pathlib import Path

import pytest
import torch

from entropy_rft.config import load_config
from entropy_rft.core.control import control_name, make_control
from entropy_rft.run.checkpoint import (
    CHECKSUMS,
    LATEST,
    STATE,
    RunDirError,
    RunState,
    checkpoint_dir,
    checkpoint_dirs,
    checkpoint_space,
    damaged_file,
    find_checkpoint,
    load_trainer_state,
    out_of_space,
    resume_checkpoint,
    save_checkpoint,
    step_of,
    write_checksums,
)
from entropy_rft.train.problems import ProblemSampler

ROOT = Path(__file__).resolve().parents[1]

CFG = load_config(None, entropy_target=0.4, entropy_control="pi")


def fresh() -> RunState:
    control = make_control(CFG)
    return RunState(
        ProblemSampler(list(range(10)), seed=3), torch.Generator().manual_seed(CFG.seed + 1), control, control_name(CFG)
    )


def advance(state: RunState) -> None:
    """What steps do to the state: draw problems, permutations, global random numbers, steer the control."""
    state.sampler.next(4)
    torch.randperm(8, generator=state.update_gen)
    torch.rand(3)
    state.control.knobs(0.7, torch.zeros(2, 3), torch.ones(2, 3, dtype=torch.bool))


def future(state: RunState) -> tuple:
    """What the next step would draw and set."""
    knobs = state.control.knobs(0.5, torch.zeros(2, 3), torch.ones(2, 3, dtype=torch.bool))
    return (
        state.sampler.next(6),
        torch.randperm(8, generator=state.update_gen).tolist(),
        torch.rand(3).tolist(),
        knobs.alpha,
    )


def test_capture_restore_continues_exactly(tmp_path):
    """A restored state draws and steers exactly as the captured one would have, after a round trip through a file."""
    torch.manual_seed(0)
    a = fresh()
    advance(a)
    a.evals = {0: {"avg_at_k": 0.1}, 2: {"avg_at_k": 0.3}}
    a.pending = {"step": 3, "metrics": {"step": 3}}
    torch.save({"step": 3, **a.capture()}, tmp_path / "trainer_state.pt")
    want = future(a)
    torch.manual_seed(123)  # the resumed process starts elsewhere
    b = fresh()
    assert b.restore(torch.load(tmp_path / "trainer_state.pt", weights_only=False)) == 3
    assert b.evals == {0: {"avg_at_k": 0.1}, 2: {"avg_at_k": 0.3}} and b.pending == {"step": 3, "metrics": {"step": 3}}
    assert future(b) == want


def test_capture_is_a_copy():
    """Steps after a capture do not change it (the stop-time checkpoint saves the state the step began from)."""
    a = fresh()
    before = a.capture()
    evals = dict(before["evals"])
    advance(a)
    a.evals[1] = {"avg_at_k": 0.2}
    assert before["evals"] == evals and torch.equal(before["update_gen"], fresh().update_gen.get_state())


def test_older_checkpoints_resume():
    """Without update_gen, torch_rng and evals those stay as a fresh run has them; the control's state under its
    old key (EntroPIC's `pi`) is read."""
    a = fresh()
    a.control.inner.load_state({"integral": 1.5, "alpha": 0.25})
    old = {"step": 4, "sampler": a.sampler.state(), "pi": a.control.state()}
    b = fresh()
    gen_before = b.update_gen.get_state()
    assert b.restore(old) == 4
    assert torch.equal(b.update_gen.get_state(), gen_before) and b.evals == {} and b.pending is None
    assert b.control.state() == {"integral": 1.5, "alpha": 0.25}


def make_checkpoints(run, steps, *, damaged=()):
    for s in steps:
        checkpoint_dir(run, s).mkdir(parents=True)
        path = checkpoint_dir(run, s) / STATE
        if s in damaged:
            path.write_bytes(b"PK\x03\x04 cut short")
        else:
            torch.save({"step": s}, path)
    (run / LATEST).write_text(checkpoint_dir(run, max(steps)).name)


def test_a_damaged_state_falls_back_to_the_newest_intact_checkpoint(tmp_path, capsys):
    """find_checkpoint names the newest; resume_checkpoint skips it when its trainer_state.pt is not a complete
    archive, warning with the file and the steps trained again; with no intact one left it raises."""
    make_checkpoints(tmp_path / "a", [1, 2, 3], damaged=[3])
    assert find_checkpoint(tmp_path / "a") == tmp_path / "a" / "checkpoint-3"
    ckpt = resume_checkpoint(tmp_path / "a")
    assert ckpt == tmp_path / "a" / "checkpoint-2" and step_of(ckpt) == 2
    assert "checkpoint-3/trainer_state.pt is damaged" in capsys.readouterr().err
    make_checkpoints(tmp_path / "b", [1, 2], damaged=[1, 2])
    with pytest.raises(RunDirError, match="no earlier complete checkpoint"):
        resume_checkpoint(tmp_path / "b")


def test_checksums_name_the_damaged_file(tmp_path, capsys):
    """damaged_file names a file whose bytes changed after write_checksums (one byte flipped), a file gone, and a
    checksums.json that is not the list written; an untouched checkpoint, and one without checksums.json (older
    runs), have none; resume_checkpoint passes a damaged one over for the newest intact one, naming the file."""
    run = tmp_path / "run"
    make_checkpoints(run, [1, 2])
    for s in (1, 2):
        (checkpoint_dir(run, s) / "model.safetensors").write_bytes(bytes(range(256)) * 8)
        write_checksums(checkpoint_dir(run, s))
    ckpt = checkpoint_dir(run, 2)
    assert damaged_file(ckpt) is None
    weights = ckpt / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[1000] ^= 1
    weights.write_bytes(bytes(data))
    path, why = damaged_file(ckpt)
    assert path == weights and "SHA-256 differs" in why
    assert resume_checkpoint(run) == checkpoint_dir(run, 1)
    assert "checkpoint-2/model.safetensors is damaged" in capsys.readouterr().err
    weights.unlink()
    assert damaged_file(ckpt) == (weights, "missing (it was written with the checkpoint, checksums.json lists it)")
    (ckpt / CHECKSUMS).write_text("{not json")
    assert damaged_file(ckpt)[0] == ckpt / CHECKSUMS
    (ckpt / CHECKSUMS).unlink()
    assert damaged_file(ckpt) is None


def test_an_unreadable_state_names_the_file(tmp_path):
    """load_trainer_state on a file torch cannot read: RunDirError naming it and the way out."""
    make_checkpoints(tmp_path, [5], damaged=[5])
    with pytest.raises(RunDirError, match=r"checkpoint-5/trainer_state.pt cannot be read"):
        load_trainer_state(tmp_path / "checkpoint-5")


@pytest.mark.parametrize(
    "err, full",
    [
        (OSError(errno.ENOSPC, "No space left on device"), True),
        (OSError(errno.EDQUOT, "Disk quota exceeded"), True),
        (RuntimeError('IoError(Os { code: 28, kind: StorageFull, message: "No space left on device" })'), True),
        (OSError(errno.EACCES, "Permission denied"), False),
        (ValueError("bad value"), False),
    ],
)
def test_out_of_space_is_recognised_and_named(tmp_path, err, full):
    """out_of_space recognises ENOSPC and EDQUOT and safetensors' wrapped StorageFull, and nothing else; inside
    checkpoint_space a full disk becomes one RunDirError naming the checkpoint being written and the way out (--resume
    from the newest complete checkpoint, or --resume-or-start when none is complete), any other error passes
    unchanged."""
    assert out_of_space(err) is full
    make_checkpoints(tmp_path / "some", [2])
    (tmp_path / "none").mkdir()
    for run, way in (
        (tmp_path / "some", "it resumes exactly from checkpoint-2"),
        (tmp_path / "none", "--resume-or-start"),
    ):
        with pytest.raises(RunDirError if full else type(err)) as raised:
            with checkpoint_space(run, 4):
                raise err
        if full:
            assert f"while writing {run / 'checkpoint-4'}" in str(raised.value) and way in str(raised.value)
        else:
            assert raised.value is err


def test_the_names_are_the_format_old_run_directories_have(tmp_path):
    """RUN/checkpoint-N/trainer_state.pt and RUN/latest_checkpoint, as every run directory written so far has them
    (tests/fixtures/old_run); step_of reads N back from a path or a name; checkpoint_dirs lists checkpoint-N
    directories only (complete: with a trainer_state.pt), not checkpoint-final or .checkpoint-3.tmp."""
    assert checkpoint_dir(tmp_path, 12) == tmp_path / "checkpoint-12" and step_of(tmp_path / "checkpoint-12") == 12
    assert (STATE, LATEST) == ("trainer_state.pt", "latest_checkpoint")
    make_checkpoints(tmp_path, [3, 10])
    for other in ("checkpoint-final", ".checkpoint-3.tmp", "checkpoint-4"):
        (tmp_path / other).mkdir()
    assert sorted(map(step_of, checkpoint_dirs(tmp_path, complete=True))) == [3, 10]
    assert sorted(map(step_of, checkpoint_dirs(tmp_path, complete=False))) == [3, 4, 10]
    assert sorted(p.name for p in (ROOT / "tests" / "fixtures" / "old_run" / "run").glob("*checkpoint*")) == [
        "checkpoint-1",
        "checkpoint-2",
        "latest_checkpoint",
    ]


FORMAT_NAMES = ("trainer_state.pt", "latest_checkpoint", "value_head.pt", "checkpoint-")


def _code_strings(tree: ast.AST):
    """Every string constant of a module's code, docstrings left out (an f-string's literal parts included)."""
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            yield node


def test_only_the_checkpoint_module_spells_the_file_names():
    """No module of the package or the benchmarks writes a checkpoint's file names as a literal in its code
    (docstrings aside): they name them through checkpoint.py's constants, checkpoint_dir and step_of. A message that
    tells the user the name (`the checkpoint's trainer_state.pt ...`) counts too: it takes the constant."""
    found = []
    for path in sorted([*(ROOT / "entropy_rft").rglob("*.py"), *(ROOT / "benchmarks").rglob("*.py")]):
        if path.name == "checkpoint.py":
            continue
        for node in _code_strings(ast.parse(path.read_text())):
            if any(name in node.value for name in FORMAT_NAMES):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.value[:60]!r}")
    assert not found, "checkpoint file names spelt outside checkpoint.py:\n" + "\n".join(found)


class _Saves:
    """A model or tokenizer that saves one file (save_pretrained), an optimizer with a state dict."""

    def save_pretrained(self, path, **_):
        (Path(path) / f"{type(self).__name__}.bin").write_bytes(b"weights")

    def state_dict(self):
        return {"lr": 0.1}


def test_a_checkpoint_folder_takes_the_users_umask(tmp_path):
    """A checkpoint folder has the permissions mkdir gives under the user's umask, as the run's other folders do
    (0755 under umask 022, 0750 under 027), not tempfile's 0700; it lists its files in checksums.json."""
    for umask in (0o022, 0o027):
        old = os.umask(umask)
        try:
            run = tmp_path / f"run-{umask:o}"
            run.mkdir()
            ckpt = save_checkpoint(run, 1, _Saves(), _Saves(), _Saves())
        finally:
            os.umask(old)
        assert stat.S_IMODE(ckpt.stat().st_mode) == 0o777 & ~umask == stat.S_IMODE(run.stat().st_mode)
        assert damaged_file(ckpt) is None
        assert set(json.loads((ckpt / CHECKSUMS).read_text())["sha256"]) == {"_Saves.bin", STATE}
