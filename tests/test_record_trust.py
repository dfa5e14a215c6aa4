"""A record that cannot contradict itself (issue 40), each case reproduced from the command line as a user meets it
(subprocesses of `python -m entropy_rft.commands.cli`, real files, real signals), in tests/test_records.py's style:

1. resume trusts only what it can check: a metrics line cut off, or a samples file that does not read whole, is
   trained again from the checkpoint before it (or refused naming the file and line when there is none): never a
   silent gap; a config.yaml edited by hand since the run wrote it (config.digest) is refused naming the fields, and
   a change that may happen on resume (steps) is accepted when the command line says it too;
2. settings that cannot run (lr 1e30, max_new_tokens 1e9) are one line before the run directory is taken; a step
   whose gradient or sampled logits are not finite is not committed: one line, the newest checkpoint stays the last
   good one, and a new run leaves nothing;
3. the minor items: a full disk before any checkpoint advises --resume-or-start, which works; an --overwrite killed
   while it holds the old record aside resumes with the old run's settings and `report` says where the record is;
   eval --n below an entry's @K; clip_b's frac_clipped on an empty mask; betas=[0.9]; a trainer_state.pt without its
   optimizer.

Test hooks are loaded by the subprocesses that need them (PYTHONPATH=HOOKS, sitecustomize.py): a NaN gradient norm
at the Nth optimizer step, NaN logits while step N samples, a full disk on the Nth safetensors write."""

import gzip
import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from test_records import SITECUSTOMIZE, SMALL, cli, env, ok, one_line, snapshot

from entropy_rft.core.masks import clip_b, clip_v

HOOKS = (
    SITECUSTOMIZE
    + """
if os.environ.get("TEST_NAN_GRAD_AT"):  # the gradient norm of the Nth optimizer step is NaN
    import torch
    real_clip, clip_calls = torch.nn.utils.clip_grad_norm_, [0]
    def clip_grad_norm_(*args, **kwargs):
        clip_calls[0] += 1
        norm = real_clip(*args, **kwargs)
        return norm * float("nan") if clip_calls[0] == int(os.environ["TEST_NAN_GRAD_AT"]) else norm
    torch.nn.utils.clip_grad_norm_ = clip_grad_norm_
if os.environ.get("TEST_NAN_LOGITS_AT_STEP"):  # the logits step N samples from are NaN
    import entropy_rft.train.problems as problems
    import entropy_rft.rollout.sampling as sampling
    real_batch, real_logits, poisoned = problems.sample_batch, sampling.nucleus_logits, [False]
    def sample_batch(engine, task, sampler, cfg, step):
        poisoned[0] = step + 1 == int(os.environ["TEST_NAN_LOGITS_AT_STEP"])
        try:
            return real_batch(engine, task, sampler, cfg, step)
        finally:
            poisoned[0] = False
    def nucleus_logits(z, top_p):
        out = real_logits(z, top_p)
        return out * float("nan") if poisoned[0] else out
    problems.sample_batch, sampling.nucleus_logits = sample_batch, nucleus_logits
"""
)
RUN3 = ["--steps", 3, *SMALL, "save_every=1"]  # checkpoints 2 and 3 kept (keep_checkpoints 2), samples at 1 and 3


@pytest.fixture(scope="module")
def hooks(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("hooks")
    (d / "sitecustomize.py").write_text(HOOKS)
    return d


@pytest.fixture(scope="module")
def trained3(tmp_path_factory) -> Path:
    """A finished SMALL run of 3 steps with checkpoints 2 and 3 (copied by the tests that change it)."""
    work = tmp_path_factory.mktemp("trained3")
    ok(cli(["train", "--out", "r", *RUN3], work))
    return work / "r"


def copy_run(trained: Path, tmp_path: Path, name: str = "r") -> Path:
    run = tmp_path / name
    shutil.copytree(trained, run, ignore=shutil.ignore_patterns(".lock"))
    return run


def rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def computed(row: dict) -> dict:
    """A metrics line without its wall times (the only values a retrained step may change)."""
    return {k: v for k, v in row.items() if not k.startswith("time/") and k != "seconds"}


# ---------------------------------------------------------------------------------------------------------------
# 1. Resume trusts only what it can check


@pytest.mark.slow
def test_a_cut_metrics_line_is_trained_again_never_a_gap(trained3, tmp_path):
    """The issue's case: the last line of metrics.jsonl cut short after checkpoint-3 was written. --resume --steps 5
    warns naming metrics.jsonl:3 and goes back to checkpoint-2: the file then holds steps 1-5, step 3's line as the
    first time (every value but wall times). With no checkpoint before step 3 left, resume is refused naming the
    file and line, and the record is byte-identical."""
    run = copy_run(trained3, tmp_path)
    text = (run / "metrics.jsonl").read_text()
    (run / "metrics.jsonl").write_text(text[:-40])
    proc = ok(cli(["train", "--out", "r", "--resume", "--steps", 4], tmp_path))
    assert "r/metrics.jsonl:3 is cut off" in proc.stderr and "resuming from checkpoint-2" in proc.stderr, proc.stderr
    assert [r["step"] for r in rows(run)] == [1, 2, 3, 4]
    assert computed(rows(run)[2]) == computed(rows(trained3)[2])

    run = copy_run(trained3, tmp_path, "only3")
    shutil.rmtree(run / "checkpoint-2")
    (run / "metrics.jsonl").write_text(text[:-40])
    before = snapshot(run)
    one_line(
        cli(["train", "--out", "only3", "--resume", "--steps", 4], tmp_path),
        "only3/metrics.jsonl:3 is cut off",
        "no checkpoint before step 3",
        "Restore the file",
    )
    assert snapshot(run) == before


@pytest.mark.slow
def test_a_damaged_samples_file_is_written_again(trained3, tmp_path):
    """samples/step-000003.json.gz cut in half (the finished run's last step): --resume-or-start warns naming it and
    goes back to checkpoint-2, so step 3 is trained again and its samples file is the first one again, byte for
    byte but the step's wall times."""
    run = copy_run(trained3, tmp_path)
    path = run / "samples" / "step-000003.json.gz"
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    proc = ok(cli(["train", "--out", "r", "--resume-or-start"], tmp_path))
    assert "r/samples/step-000003.json.gz does not read whole" in proc.stderr and "checkpoint-2" in proc.stderr

    def record(p: Path) -> dict:
        data = json.loads(gzip.decompress(p.read_bytes()))
        data["metrics"] = computed(data.get("metrics", {}))
        return data

    assert record(path) == record(trained3 / "samples" / "step-000003.json.gz")
    assert [r["step"] for r in rows(run)] == [1, 2, 3]


@pytest.mark.slow
def test_damaged_weights_are_named_and_resume_goes_back(trained3, tmp_path):
    """The issue's case: 4 KiB of random bytes in the middle of checkpoint-3's model.safetensors, its header intact
    (it loads, holding non-finite values). --resume warns naming that file as damaged (its checksum, written with
    the checkpoint, differs) and resumes from checkpoint-2, so step 3 is trained again as the first time; with no
    checkpoint before it left, resume is refused in one line naming the file, and the record is unchanged."""
    run = copy_run(trained3, tmp_path)

    def damage(weights: Path) -> None:
        data = bytearray(weights.read_bytes())
        middle = len(data) // 2
        data[middle : middle + 4096] = torch.randint(
            0, 256, (4096,), generator=torch.Generator().manual_seed(0)
        ).tolist()
        weights.write_bytes(bytes(data))

    damage(run / "checkpoint-3" / "model.safetensors")
    proc = ok(cli(["train", "--out", "r", "--resume", "--steps", 4], tmp_path))
    assert "r/checkpoint-3/model.safetensors is damaged" in proc.stderr, proc.stderr
    assert "resuming from checkpoint-2" in proc.stderr
    assert [r["step"] for r in rows(run)] == [1, 2, 3, 4]
    assert computed(rows(run)[2]) == computed(rows(trained3)[2])

    run = copy_run(trained3, tmp_path, "only3")
    shutil.rmtree(run / "checkpoint-2")
    damage(run / "checkpoint-3" / "model.safetensors")
    before = snapshot(run)
    one_line(
        cli(["train", "--out", "only3", "--resume", "--steps", 4], tmp_path),
        "only3/checkpoint-3/model.safetensors is damaged",
        "no earlier complete checkpoint",
    )
    assert snapshot(run) == before


@pytest.mark.slow
def test_a_hand_edit_of_config_yaml_is_refused_naming_the_fields(trained3, tmp_path):
    """config.yaml edited between a stop and --resume: group_size 4 -> 8, or lr deleted, is refused (exit 2, one
    line naming the field and its new value) and the record is unchanged; steps edited is refused too, with the way
    to accept it (give it on the command line), and accepted that way; --set of the run's own value over a hand
    edit trains on."""
    run = copy_run(trained3, tmp_path)
    config = (run / "config.yaml").read_text()
    for edit, shown in (
        (config.replace("group_size: 4\n", "group_size: 8\n"), "group_size=8"),
        (
            "".join(line + "\n" for line in config.splitlines() if not line.startswith("lr:")),
            "lr=4.0e-07 (deleted: its default)",
        ),
    ):
        (run / "config.yaml").write_text(edit)
        before = snapshot(run)
        one_line(
            cli(["train", "--out", "r", "--resume", "--steps", 4], tmp_path),
            "r/config.yaml was edited by hand since the run wrote it",
            shown,
            "differs from the settings the run trained with (config.digest)",
        )
        assert snapshot(run) == before

    (run / "config.yaml").write_text(config.replace("steps: 3\n", "steps: 4\n"))
    one_line(
        cli(["train", "--out", "r", "--resume"], tmp_path),
        "edited by hand",
        "(steps=4)",
        "to accept, give it on the command line too (--set steps=4)",
    )
    (run / "config.yaml").write_text(config.replace("steps: 3\n", "steps: 4\n").replace("eval_k: 2\n", "eval_k: 8\n"))
    ok(cli(["train", "--out", "r", "--resume", "--steps", 4, "--set", "eval_k=2"], tmp_path))
    assert [r["step"] for r in rows(run)] == [1, 2, 3, 4] and "eval_k: 2\n" in (run / "config.yaml").read_text()


# ---------------------------------------------------------------------------------------------------------------
# 2. Settings that cannot run; steps that are not finite


@pytest.mark.slow
def test_settings_that_cannot_run_are_one_line_before_the_directory_is_taken(tmp_path):
    """lr 1e30 (the issue: a committed step of weights near 1e30, then a traceback), a learning rate below float32's
    range, max_new_tokens 1e9 (the issue: a 2 TB allocation) and a batch of 1e8 prompts: exit 2, one line naming the
    field, and no run directory."""
    for setting, fragments in (
        ("lr=1e30", ("lr=1e+30 must be at most 1", "float32")),
        ("lr=1e-45", ("lr=1e-45 must be 0 or within float32's range",)),
        ("max_new_tokens=1000000000", ("max_new_tokens=1000000000 cannot be allocated", "lower max_new_tokens")),
        ("prompts_per_step=100000000", ("prompts_per_step=100000000 cannot be allocated",)),
    ):
        one_line(cli(["train", "--out", "r", "--set", setting], tmp_path), *fragments)
        assert not (tmp_path / "r").exists()
        one_line(cli(["train", "--set", setting], tmp_path), *fragments)
        assert not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_a_step_that_is_not_finite_is_not_committed(hooks, tmp_path):
    """A NaN gradient norm at step 3: exit 2, one line naming step 3 and checkpoint-2; metrics.jsonl ends at step 2,
    checkpoint-2 is the newest (latest_checkpoint names it), no eval.json; --resume (the cause gone) finishes the
    run. NaN logits while step 2 samples (torch's own error before): the same, at step 2. At step 1 of a new run:
    the directory is left as it was (nothing)."""
    proc = cli(["train", "--out", "r", *RUN3], tmp_path, hooks=hooks, TEST_NAN_GRAD_AT="3")
    one_line(
        proc,
        "step 3: the gradient norm is nan; it is not committed",
        "newest checkpoint stays r/checkpoint-2",
        "metrics.jsonl ends at step 2",
        after_training=True,
    )
    run = tmp_path / "r"
    assert [r["step"] for r in rows(run)] == [1, 2] and (run / "latest_checkpoint").read_text() == "checkpoint-2"
    assert not (run / "checkpoint-3").exists() and not (run / "eval.json").exists()
    ok(cli(["train", "--out", "r", "--resume"], tmp_path))
    assert [r["step"] for r in rows(run)] == [1, 2, 3] and (run / "eval.json").exists()

    proc = cli(["train", "--out", "s", *RUN3], tmp_path, hooks=hooks, TEST_NAN_LOGITS_AT_STEP="2")
    one_line(
        proc, "step 2: the sampled logits are not finite", "newest checkpoint stays s/checkpoint-1", after_training=True
    )
    assert [r["step"] for r in rows(tmp_path / "s")] == [1]

    proc = cli(["train", "--out", "t", *RUN3], tmp_path, hooks=hooks, TEST_NAN_GRAD_AT="1")
    one_line(proc, "step 1: the gradient norm is nan", "t is left as it was before the run", after_training=True)
    assert not (tmp_path / "t").exists()  # nor its lock file (issue 54)


# ---------------------------------------------------------------------------------------------------------------
# 3. The minor items


@pytest.mark.slow
def test_a_full_disk_before_any_checkpoint_advises_what_works(hooks, tmp_path):
    """The disk fills at a new run's first checkpoint: the one line advises --resume-or-start (plain --resume would
    be refused: no checkpoint), and that command finishes the run."""
    line = one_line(
        cli(
            ["train", "--out", "r", "--steps", 1, *SMALL, "save_every=1"],
            tmp_path,
            hooks=hooks,
            TEST_ENOSPC_ON_WRITE="1",
        ),
        "no space left on the device while writing r/checkpoint-1",
        "--resume-or-start",
        after_training=True,
    )
    assert "--resume --out" not in line
    ok(cli(["train", "--out", "r", "--resume-or-start", "--steps", 1, *SMALL, "save_every=1"], tmp_path))
    assert [r["step"] for r in rows(tmp_path / "r")] == [1]


@pytest.mark.slow
def test_an_overwrite_killed_while_the_old_record_is_aside_resumes_the_old_run(trained3, tmp_path):
    """`train --overwrite` (other settings: eval_k 32) SIGKILLed while it holds the old record aside: `report` says
    where the record is; a plain --resume continues the old run with its own settings (eval_k 2), not the dead
    start's."""
    run = copy_run(trained3, tmp_path)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "entropy_rft.commands.cli",
            "train",
            "--out",
            "r",
            "--overwrite",
            "--steps",
            "3",
            "--set",
            "prompts_per_step=4",
            "group_size=4",
            "progress=false",
            "eval_k=32",
        ],
        cwd=tmp_path,
        env=env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 120
    while time.time() < deadline and not list(run.glob(".replaced-*")):
        time.sleep(0.02)
    time.sleep(0.3)  # the new start writes its config.yaml: the initial evaluation of eval_k 32 takes longer
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert list(run.glob(".replaced-*")), "the kill came too late"
    report = cli(["report", "r", "--out", "rep"], tmp_path)
    assert "r/.replaced-" in report.stderr and "--resume continues it" in report.stderr, report.stderr
    ok(cli(["train", "--out", "r", "--resume", "--steps", 4], tmp_path))
    assert [r["step"] for r in rows(run)] == [1, 2, 3, 4] and "eval_k: 2\n" in (run / "config.yaml").read_text()


@pytest.mark.slow
def test_minor_messages(trained3, tmp_path):
    """eval --data countdown@16 --n 4 is refused as --eval-k 16 --n 4 is; betas=[0.9] says betas takes 2 numbers;
    a trainer_state.pt without its optimizer is one line naming the file and the part."""
    one_line(
        cli(["eval", "--data", "countdown@16", "--n", 4, "--out", "ev"], tmp_path), "--n 4 is below --data countdown@16"
    )
    one_line(cli(["train", "--out", "b", "--set", "betas=[0.9]"], tmp_path), "betas takes 2 numbers", "[0.9]")
    run = copy_run(trained3, tmp_path)
    path = run / "checkpoint-3" / "trainer_state.pt"
    state = torch.load(path, weights_only=False)
    del state["optimizer"]
    torch.save(state, path)
    # as a checkpoint written before checksums.json (with it, the edit is a changed file and resume goes back to
    # checkpoint-2: test_damaged_weights_are_named_and_resume_goes_back)
    (run / "checkpoint-3" / "checksums.json").unlink()
    one_line(
        cli(["train", "--out", "r", "--resume", "--steps", 4], tmp_path),
        "r/checkpoint-3/trainer_state.pt lacks optimizer of the run state",
    )


def test_clip_frac_clipped_is_zero_on_an_empty_mask():
    """A mask with no valid token: clip_b's and clip_v's frac_clipped is 0.0 (none was clipped), as the trainer's
    clipped_fractions says; on a non-empty mask they are unchanged (the oracle tests pin those)."""
    empty = torch.zeros(2, 3, dtype=torch.bool)
    adv = torch.tensor([1.0, -1.0])
    assert clip_b(torch.randn(2, 3), adv, empty)[1]["frac_clipped"] == 0.0
    assert clip_v(torch.randn(2, 3), adv, empty)[1]["frac_clipped"] == 0.0
    s = torch.tensor([[0.0, 0.0, -10.0], [0.0, 0.0, 0.0]])
    keep, metrics = clip_b(s, torch.tensor([-1.0, -1.0]), torch.ones(2, 3, dtype=torch.bool), mu=1.0)
    assert metrics["frac_clipped"] == pytest.approx(1 / 6) and not keep[0, 2]


def test_the_python_api_checks_the_digest_not_the_edited_file(tmp_path):
    """train(cfg, resume=True) from Python: after a hand edit of config.yaml (group_size 4 -> 8) the run's own
    settings still resume (the digest is the run's record; start() writes config.yaml back), and settings equal to
    the edited file are refused naming group_size and the hand edit. With config.digest deleted beside the
    checkpoint, the edit can no longer be told: the resume is refused naming the file (issue 54)."""
    import yaml

    from entropy_rft.config import load_config
    from entropy_rft.run.checkpoint import RunDirError
    from entropy_rft.run.record import write_digest
    from entropy_rft.run.rundir import claim

    run = tmp_path / "r"
    cfg = load_config(None, out=str(run), progress=False, group_size=4, steps=3)
    run.mkdir()
    (run / "config.yaml").write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
    write_digest(run, cfg)
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s}) + "\n" for s in (1, 2)))
    (run / "checkpoint-2").mkdir()
    torch.save({"step": 2}, run / "checkpoint-2" / "trainer_state.pt")
    (run / "config.yaml").write_text((run / "config.yaml").read_text().replace("group_size: 4\n", "group_size: 8\n"))
    with claim(cfg, resume=True) as c:
        assert c.checkpoint == run / "checkpoint-2"
    edited = load_config(None, out=str(run), progress=False, group_size=8, steps=3)
    with pytest.raises(RunDirError, match="group_size: 8, but config.yaml was edited by hand there"):
        claim(edited, resume=True)
    (run / "config.digest").unlink()
    with pytest.raises(RunDirError, match="config.digest is missing beside checkpoint-2"):
        claim(edited, resume=True)
