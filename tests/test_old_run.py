"""A run directory written before the package was split into folders (issue 55) still resumes: the checkpoint's
pickles name no class of entropy_rft, and the resumed step is the one the old code computed.

tests/fixtures/old_run/ was written by commit 128ca35 (tests/fixtures/make_old_run.py says how)."""

import io
import json
import pickletools
import shutil
import zipfile
from pathlib import Path

import pytest

OLD = Path(__file__).parent / "fixtures" / "old_run"
# the modules a checkpoint's pickles may name: none of entropy_rft's, so that moving a module never breaks one
PICKLED_MODULES = {"collections", "torch", "torch._utils"}
# metrics that are decisions (sampled tokens, a filter's choice, counts): equal on any platform (tests/test_golden.py)
DECISIONS = ("reward_mean", "accuracy", "clip_frac", "response_length", "truncation_rate", "frac_zero_advantage")


def pickled_modules(path: Path) -> set[str]:
    """The modules whose classes or functions the pickle of a torch.save archive names."""
    with zipfile.ZipFile(path) as archive:
        data = archive.read(next(n for n in archive.namelist() if n.endswith("data.pkl")))
    ops = list(pickletools.genops(io.BytesIO(data)))
    found = set()
    for i, (op, arg, _) in enumerate(ops):
        if op.name == "GLOBAL":
            found.add(arg.split(" ")[0])
        elif op.name == "STACK_GLOBAL":
            found.add(ops[i - 2][1])
    return found


@pytest.mark.slow
def test_a_run_written_before_the_folders_resumes_as_the_old_code_did(tmp_path, monkeypatch):
    """The old run's checkpoints pickle only torch and collections objects; `entropy-rft train --resume` continues
    it to step 3, and that step's decisions equal those the old code logged when it resumed the same run, its other
    metrics within the golden runs' float32 bound (RTOL 1.5e-3: only summation orders may differ between platforms);
    the new checkpoint pickles no entropy_rft class either."""
    from entropy_rft.commands.cli import main
    from entropy_rft.logging import read_metrics

    shutil.copytree(OLD, tmp_path / "old")
    monkeypatch.chdir(tmp_path / "old")  # config.yaml names the model `base`, relative
    for ckpt in ("checkpoint-1", "checkpoint-2"):
        assert pickled_modules(Path("run") / ckpt / "trainer_state.pt") <= PICKLED_MODULES
    main(["train", "--out", "run", "--resume", "--set", "steps=3"])
    row = next(r for r in read_metrics(Path("run")) if r["step"] == 3)
    want = json.loads((OLD / "expected.json").read_text())["step3"]
    assert set(want) <= set(row)
    for key, value in want.items():
        if key in DECISIONS or not isinstance(value, float):
            assert row[key] == value, key
        else:
            assert row[key] == pytest.approx(value, rel=1.5e-3, abs=1e-7), key
    assert pickled_modules(Path("run") / "checkpoint-3" / "trainer_state.pt") <= PICKLED_MODULES
