"""No command loses a run's record, and every bad input or damaged file gets one clear line (issue 34), each case
reproduced from the command line as a new user meets it (subprocesses of `python -m entropy_rft.commands.cli`, real
signals
where a signal is involved):

- eval, report, inspect, compare, sweep, filter, demo, theory, pretrain-toy and train --dry-run never write over a
  run's record or into a live run's directory (rundir.check_output): a fuzz over every subcommand's output path
  pointed into a record finds the record byte-identical afterwards;
- an --overwrite (or a new run) stopped before its first step leaves the directory as it was;
- no space left while a checkpoint is written, a truncated trainer_state.pt and a config.yaml that is not YAML are
  one line (or a warning and a fallback) naming the file and the way out;
- eval infers each --data entry's task; runs started in the same second get two directories; study.py refuses
  unknown names and --jobs 0 and summarises only its own cells; --set reaches eval, theory, filter and
  pretrain-toy; misleading messages say what is wrong; the Python API refuses NaN temperatures, zero counts and a
  numeric out; shipped recipes are found by name; --version; inspect --out NAME writes NAME.html.

SMALL is the issue's `--set prompts_per_step=4 group_size=4 eval_problems=4 eval_k=2 lr=1e-4 progress=false`.
A user error exits 2 with exactly one line on stderr and no traceback (`one_line`); set ENTROPY_RFT_ERROR_LOG to a
file to collect every such output (for `grep -c Traceback`)."""

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from itertools import product
from pathlib import Path

import pytest
import torch
import yaml

import entropy_rft.commands.pipeline as pipeline
import entropy_rft.commands.theory as theory
import entropy_rft.config as config
import entropy_rft.toy as toy
import entropy_rft.train.policy as policy
import entropy_rft.train.trainer as trainer
from entropy_rft.commands.cli import main
from entropy_rft.run.rundir import RunLock, claim, record_entries

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["--set", "prompts_per_step=4", "group_size=4", "eval_problems=4", "eval_k=2", "lr=1e-4", "progress=false"]

# test hooks loaded at interpreter start by the subprocesses that need them (PYTHONPATH=HOOKS): a full disk on the
# Nth safetensors write (what safetensors raises: SafetensorError wrapping the OS error 28), and a frozen clock
SITECUSTOMIZE = """
import os
if os.environ.get("TEST_ENOSPC_ON_WRITE"):
    import safetensors.torch as st
    from safetensors import SafetensorError
    real, calls = st.save_file, [0]
    def save_file(*args, **kwargs):
        calls[0] += 1
        if calls[0] >= int(os.environ["TEST_ENOSPC_ON_WRITE"]):
            raise SafetensorError('Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: '
                                  '"No space left on device" })')
        return real(*args, **kwargs)
    st.save_file = save_file
if os.environ.get("TEST_FROZEN_CLOCK"):
    import time
    real_strftime = time.strftime
    time.strftime = lambda fmt, *t: ("20260101-000000" if fmt == "%Y%m%d-%H%M%S" and not t else real_strftime(fmt, *t))
"""


def env(hooks: Path | None = None, **extra) -> dict:
    paths = [str(hooks)] if hooks else []
    return {**os.environ, "PYTHONPATH": os.pathsep.join([*paths, str(ROOT)]), "OMP_NUM_THREADS": "1", **extra}


def cli(args, cwd: Path, *, hooks: Path | None = None, timeout: float = 240, **extra) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "entropy_rft.commands.cli", *map(str, args)],
        cwd=cwd,
        env=env(hooks, **extra),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def one_line(proc: subprocess.CompletedProcess, *fragments: str, after_training: bool = False) -> str:
    """A user error: exit code 2, one line on stderr holding every fragment, no traceback. after_training: the
    error came once training ran, so the libraries' own warnings may come before it; the error is the last line."""
    log = os.environ.get("ENTROPY_RFT_ERROR_LOG")
    if log:
        with open(log, "a") as f:
            f.write(proc.stderr)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    if after_training:
        lines = lines[-1:]
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-3000:])
    assert len(lines) == 1 and "Traceback" not in proc.stderr + proc.stdout, proc.stderr[-3000:]
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


def ok(proc: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def snapshot(run: Path) -> dict:
    """Every file of the run's record (RECORD entries, recursively) with its bytes, and no others."""
    out = {}
    for entry in record_entries(run):
        for p in [entry, *sorted(entry.rglob("*"))] if entry.is_dir() else [entry]:
            if p.is_file():
                out[str(p.relative_to(run))] = p.read_bytes()
    return out


@pytest.fixture(scope="module")
def hooks(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("hooks")
    (d / "sitecustomize.py").write_text(SITECUSTOMIZE)
    return d


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A finished SMALL run of 2 steps with a checkpoint at each step (copied by the tests that change it)."""
    work = tmp_path_factory.mktemp("trained")
    ok(cli(["train", "--out", "r", "--steps", 2, *SMALL, "save_every=1", "keep_checkpoints=0"], work))
    return work / "r"


def copy_run(trained: Path, tmp_path: Path) -> Path:
    run = tmp_path / "r"
    shutil.copytree(trained, run, ignore=shutil.ignore_patterns(".lock"))
    return run


# ---------------------------------------------------------------------------------------------------------------
# Records lost or corrupted (items 1-3)


@pytest.mark.slow
def test_eval_into_a_run_is_refused_and_the_run_still_reports(trained, tmp_path):
    """Item 1: `eval --out r` over a finished run exits 2 naming r/eval.json and leaves the record byte-identical,
    so `report r` still reads it; a directory a live run holds is refused too."""
    run = copy_run(trained, tmp_path)
    before = snapshot(run)
    one_line(
        cli(["eval", "--eval-k", 2, "--eval-problems", 2, "--out", "r"], tmp_path),
        "r/eval.json belongs to the run record in r",
        "Choose another --out",
    )
    assert snapshot(run) == before
    ok(cli(["report", "r", "--out", "rep"], tmp_path))
    with RunLock(tmp_path / "live"):  # a run that has just started: only its lock is there yet
        one_line(cli(["eval", "--out", "live"], tmp_path), "a live run holds it")
    assert not (tmp_path / "live" / "eval.json").exists()


def _stop_when_started(
    cmd: list, cwd: Path, config_yaml: Path, steps: int, sig: int = signal.SIGTERM
) -> subprocess.CompletedProcess:
    """Start the CLI, wait until the run has started (its config.yaml says `steps`), then send it `sig`."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "entropy_rft.commands.cli", *map(str, cmd)],
        cwd=cwd,
        env=env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if config_yaml.exists() and f"steps: {steps}\n" in config_yaml.read_text():
            break
        time.sleep(0.1)
    assert proc.poll() is None, proc.communicate()
    time.sleep(0.5)  # inside the initial evaluation (32 samples of every eval problem: minutes)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.mark.slow
def test_a_run_stopped_before_its_first_step_changes_nothing(trained, tmp_path):
    """Item 2: `train --overwrite` SIGTERMed before its first step exits 128+15 saying no record changed, and the old
    record is byte-identical; a new run stopped so leaves nothing that reads as a record, so the same command is
    not refused afterwards; one SIGKILLed there leaves its start's files, which the same command clears."""
    run = copy_run(trained, tmp_path)
    before = snapshot(run)
    slow = ["--steps", 3, *SMALL, "eval_k=32", "eval_problems=0"]
    proc = _stop_when_started(["train", "--out", "r", "--overwrite", *slow], tmp_path, run / "config.yaml", 3)
    assert proc.returncode == 128 + signal.SIGTERM, proc.stderr[-2000:]
    assert "SIGTERM before any step; no run record was changed" in proc.stderr
    assert snapshot(run) == before and not list(run.glob(".replaced-*"))

    proc = _stop_when_started(["train", "--out", "s", *slow], tmp_path, tmp_path / "s" / "config.yaml", 3)
    assert proc.returncode == 128 + signal.SIGTERM, proc.stderr[-2000:]
    assert record_entries(tmp_path / "s") == []
    cfg = config.load_config(None, out=str(tmp_path / "s"), steps=3)
    claim(cfg).release()  # what the same command's start does: no refusal

    proc = _stop_when_started(
        ["train", "--out", "k", *slow], tmp_path, tmp_path / "k" / "config.yaml", 3, signal.SIGKILL
    )
    assert proc.returncode == -signal.SIGKILL
    names = {p.name for p in record_entries(tmp_path / "k")}  # config.digest too, unless killed just before it
    assert {"config.yaml", "metrics.jsonl"} <= names <= {"config.yaml", "config.digest", "metrics.jsonl"}
    claim(config.load_config(None, out=str(tmp_path / "k"), steps=3)).release()
    assert record_entries(tmp_path / "k") == []


class Work(Exception):
    """The subcommand got past its output checks to real work (a model, training, the theory checks)."""


def _work(*args, **kwargs):
    raise Work()


def _fake_run(run: Path) -> None:
    cfg = config.load_config(None, lr=1e-4, steps=2, out=str(run))
    (run / "checkpoint-2").mkdir(parents=True)
    (run / "config.yaml").write_text(yaml.safe_dump(cfg.to_dict()))
    (run / "metrics.jsonl").write_text('{"step": 1, "entropy": 0.5}\n{"step": 2, "entropy": 0.4}\n')
    torch.save({"step": 2}, run / "checkpoint-2" / "trainer_state.pt")
    (run / "checkpoint-2" / "model.safetensors").write_bytes(b"weights")
    (run / "latest_checkpoint").write_text("checkpoint-2")
    (run / "eval.json").write_text(
        '{"0": {"avg_at_k": 0.1, "pass_at_k": 0.2}, "2": {"avg_at_k": 0.3, "pass_at_k": 0.4}}'
    )
    (run / "samples").mkdir()
    (run / "samples" / "step-000001.json.gz").write_bytes(b"not really")


# every subcommand with an output path: argv with {out} and {run}
WRITERS = {
    "eval": ["eval", "--out", "{out}"],
    "filter": ["filter", "--model", "m", "--out", "{out}"],
    "report": ["report", "{run}", "--out", "{out}"],
    "inspect": ["inspect", "{run}", "--out", "{out}"],
    "compare": ["compare", "--methods", "grpo", "--seeds", "1", "--steps", "1", "--out", "{out}"],
    "sweep": ["sweep", "--mu", "1", "--steps", "1", "--out", "{out}"],
    "demo": ["demo", "--methods", "grpo", "--steps", "1", "--out", "{out}"],
    "theory": ["theory", "--no-model", "--out", "{out}"],
    "pretrain-toy": ["pretrain-toy", "--out", "{out}"],
    "dry-run": ["train", "--dry-run", "--out", "{out}"],
}
TARGETS = [
    "",
    "eval.json",
    "config.yaml",
    "metrics.jsonl",
    "latest_checkpoint",
    "checkpoint-2",
    "checkpoint-2/trainer_state.pt",
    "checkpoint-2/sub",
    "samples",
    "samples/x.html",
]


@pytest.mark.parametrize(
    "command,target,live", [(c, t, live) for c, t in product(WRITERS, TARGETS) for live in (False, True)]
)
def test_no_output_path_changes_a_run_record(command, target, live, tmp_path, monkeypatch, capsys):
    """Item 3 (fuzz): every subcommand's output path pointed at a run directory or into its record (each entry, a
    file in a checkpoint, a new name inside one), with the run idle or held by a live run: the command is refused
    (exit 2, one line, no traceback) or goes on to write only beside the record; the record is byte-identical
    afterwards and holds no new entry."""
    for module, name in (
        (trainer, "_Run"),
        (policy, "load_policy"),
        (pipeline, "build_engine"),
        (toy, "pretrain"),
        (theory, "tabular_checks"),
    ):
        monkeypatch.setattr(module, name, _work)
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "r"
    _fake_run(run)
    before, entries = snapshot(run), record_entries(run)
    out = run / target if target else run
    argv = [a.format(out=out, run=run) for a in WRITERS[command]]
    lock = RunLock(run).acquire() if live else None
    try:
        main(argv)
    except Work:
        pass
    except SystemExit as exc:
        err = capsys.readouterr().err
        if os.environ.get("ENTROPY_RFT_ERROR_LOG"):
            with open(os.environ["ENTROPY_RFT_ERROR_LOG"], "a") as f:
                f.write(err)
        lines = [line for line in err.splitlines() if line.strip()]
        assert exc.code == 2 and len(lines) == 1 and "Traceback" not in err, (argv, exc.code, err)
    finally:
        if lock:
            lock.release()
    assert snapshot(run) == before, argv
    assert record_entries(run) == entries, argv


# ---------------------------------------------------------------------------------------------------------------
# One line owed (items 5-8)


@pytest.mark.slow
def test_no_space_while_checkpointing_is_one_line_and_resume_recovers(trained, hooks, tmp_path):
    """Item 5: the disk fills while checkpoint-2 is written (safetensors' SafetensorError, OS error 28): exit 2,
    one line naming checkpoint-2, the checkpoint left (checkpoint-1) and --resume; no partial checkpoint remains.
    After freeing space, --resume finishes the run with the weights of the run that never failed."""
    one_line(
        cli(
            ["train", "--out", "r", "--steps", 2, *SMALL, "save_every=1", "keep_checkpoints=0"],
            tmp_path,
            hooks=hooks,
            TEST_ENOSPC_ON_WRITE="2",
        ),
        "no space left on the device while writing r/checkpoint-2",
        "--resume --out r",
        "from checkpoint-1",
        after_training=True,
    )
    run = tmp_path / "r"
    assert sorted(p.name for p in run.glob("*checkpoint-*")) == ["checkpoint-1"]
    ok(cli(["train", "--out", "r", "--resume"], tmp_path))
    assert (run / "checkpoint-2" / "model.safetensors").read_bytes() == (
        trained / "checkpoint-2" / "model.safetensors"
    ).read_bytes()


@pytest.mark.slow
def test_a_truncated_trainer_state_falls_back_to_the_previous_checkpoint(trained, tmp_path):
    """Item 6: checkpoint-2/trainer_state.pt cut in half: --resume warns naming the file and continues from
    checkpoint-1 (step 2 trained again), ending at step 3; with every checkpoint damaged, exit 2 naming the file."""
    run = copy_run(trained, tmp_path)
    state = run / "checkpoint-2" / "trainer_state.pt"
    state.write_bytes(state.read_bytes()[: state.stat().st_size // 2])
    proc = ok(cli(["train", "--out", "r", "--resume", "--steps", 3], tmp_path))
    assert "r/checkpoint-2/trainer_state.pt is damaged" in proc.stderr and "resuming from checkpoint-1" in proc.stderr
    assert [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3]

    run = tmp_path / "both"
    shutil.copytree(trained, run, ignore=shutil.ignore_patterns(".lock"))
    for ckpt in ("checkpoint-1", "checkpoint-2"):
        (run / ckpt / "trainer_state.pt").write_bytes(b"PK\x03\x04 cut")
    one_line(
        cli(["train", "--out", "both", "--resume", "--steps", 3], tmp_path),
        "both/checkpoint-2/trainer_state.pt is damaged",
        "no earlier complete checkpoint",
    )


@pytest.mark.slow
def test_a_config_yaml_that_is_not_yaml_is_one_line(trained, tmp_path):
    """Item 7: --resume of a run whose config.yaml is not YAML names the file, the line and the way out."""
    run = copy_run(trained, tmp_path)
    (run / "config.yaml").write_text("lr: [0.0001\nsteps: 2\n")
    one_line(cli(["train", "--out", "r", "--resume"], tmp_path), "r/config.yaml is not valid YAML", "--overwrite")


def study(args, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "study.py"), *map(str, args)],
        cwd=cwd,
        env=env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_study_refuses_unknown_names_and_zero_jobs(tmp_path):
    """Item 8: an unknown method or task and --jobs 0 (which hung) are one line, exit 2, before any work."""
    one_line(study(["run", "--out", "s", "--methods", "grpo,nope"], tmp_path), "unknown method 'nope'", "clip_b")
    one_line(study(["run", "--out", "s", "--tasks", "countdown7"], tmp_path), "unknown task 'countdown7'")
    one_line(study(["run", "--out", "s", "--jobs", "0"], tmp_path, timeout=60), "--jobs", "must be >= 1")
    assert not (tmp_path / "s").exists()


# ---------------------------------------------------------------------------------------------------------------
# Wrong answers (items 9-15)


@pytest.mark.slow
def test_eval_infers_each_data_entrys_task(tmp_path):
    """Item 9: `--data countdown@4,countdown5` evaluates countdown at K 4 and countdown5 at --eval-k, each scored by
    its own task; countdown mixed with a math dataset is refused before any model loads."""
    ok(cli(["eval", "--data", "countdown@4,countdown5", "--eval-k", 2, "--eval-problems", 2, "--out", "e"], tmp_path))
    report = json.loads((tmp_path / "e" / "eval.json").read_text())
    assert report["meta"]["task"] == "countdown,countdown5"
    assert {name: r["k"] for name, r in report["results"].items()} == {"countdown": 4, "countdown5": 2}
    one_line(cli(["eval", "--data", "countdown,aime24", "--out", "m"], tmp_path), "mixes countdown and math")


@pytest.mark.slow
def test_runs_started_in_the_same_second_get_two_directories(hooks, tmp_path):
    """Item 10: two `train` runs without --out, started at once with the clock frozen at one second, both finish,
    in runs/grpo-20260101-000000 and runs/grpo-20260101-000000-2."""
    args = [sys.executable, "-m", "entropy_rft.commands.cli", "train", "--steps", "1", *SMALL]
    procs = [
        subprocess.Popen(
            args,
            cwd=tmp_path,
            env=env(hooks, TEST_FROZEN_CLOCK="1"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    results = [p.communicate(timeout=240) + (p.returncode,) for p in procs]
    assert [rc for *_, rc in results] == [0, 0], [err[-2000:] for _, err, _ in results]
    dirs = sorted(json.loads(out[out.index("{") :])["run_dir"] for out, _, _ in results)
    assert dirs == ["runs/grpo-20260101-000000", "runs/grpo-20260101-000000-2"]


def test_study_cell_stopped_between_its_record_and_its_clean_up_keeps_its_record(tmp_path, monkeypatch):
    """benchmarks/study.py run_cell writes cell.json before it drops the checkpoints: a stop between the two leaves
    the finished record (nothing to train again), and the next run_cell returns that record, trains nothing, and drops
    the checkpoints the stop left. (Training here is a stand-in that writes a checkpoint: the order is what is
    tested.)"""
    import importlib.util

    import entropy_rft.logging as logging_

    spec = importlib.util.spec_from_file_location("study_runner", ROOT / "benchmarks" / "study.py")
    study_mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(study_mod)
    monkeypatch.setattr(study_mod, "one_thread", lambda: None)  # the test process keeps its threads
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)
    steps = 3
    trained = []

    def fake_train(cfg, resume):
        trained.append(cfg.seed)
        (Path(cfg.out) / "checkpoint-3").mkdir(parents=True)
        (Path(cfg.out) / "checkpoint-3" / "trainer_state.pt").write_bytes(b"")
        rates = {"pass_rates": [0.5, 0.25]}
        return {"evals": {"0": rates, str(steps): rates}}

    monkeypatch.setattr(trainer, "train", fake_train)
    monkeypatch.setattr(logging_, "read_metrics", lambda run: [{"seconds": 1.0, "entropy": 0.5, "clip_frac": 0.0}])
    drop = study_mod.drop_checkpoints

    def stopped(run):
        raise KeyboardInterrupt  # Ctrl-C right after the record was written

    monkeypatch.setattr(study_mod, "drop_checkpoints", stopped)
    with pytest.raises(KeyboardInterrupt):
        study_mod.run_cell("countdown", "grpo", 0, tmp_path, steps=steps)
    cell = study_mod.cell_dir(tmp_path, "countdown", "grpo", 0, steps)
    record = json.loads((cell / "cell.json").read_text())
    assert record["final_correct"] == [16, 8] and (cell / "run" / "checkpoint-3").is_dir() and trained == [0]
    monkeypatch.setattr(study_mod, "drop_checkpoints", drop)
    assert study_mod.run_cell("countdown", "grpo", 0, tmp_path, steps=steps) == record
    assert trained == [0] and not (cell / "run" / "checkpoint-3").exists()


def _cell(task: str, method: str, seed: int, steps: int, value: int) -> dict:
    """A finished study cell whose numbers all come from `value` (so mixing cells would show)."""
    return {
        "task": task,
        "method": method,
        "seed": seed,
        "key": "k",
        "settings": {},
        "resumed": False,
        "wall_seconds_this_process": 1.0,
        "eval_n": 32,
        "steps": steps,
        "initial_correct": [value] * 5,
        "final_correct": [value] * 5,
        "step_seconds": [0.1] * steps,
        "entropy": [value / 100] * steps,
        "clip_frac": [0.0] * steps,
        "control": [0.0] * steps,
    }


@pytest.mark.slow
def test_study_summarise_uses_its_own_cells_and_writes_the_committed_results_only_when_asked(tmp_path):
    """Item 11: a trial's cells (3 steps) beside the study's (150) do not mix in: the summary is headed 150 steps
    and holds only the study's cells; without --dest it goes to OUT/summary and benchmarks/study is untouched; a
    mistyped --out is one line, exit 2."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from study import cell_dir
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    committed = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in (ROOT / "benchmarks" / "study").iterdir()}
    out = tmp_path / "study"
    for method, steps, value in (("grpo", 150, 10), ("clip_b", 150, 12), ("grpo", 3, 30), ("clip_b", 3, 31)):
        d = cell_dir(out, "countdown", method, 0, None if steps == 150 else steps)
        d.mkdir(parents=True)
        (d / "cell.json").write_text(json.dumps(_cell("countdown", method, 0, steps, value)))
    args = ["summarise", "--out", out, "--tasks", "countdown", "--methods", "grpo,clip_b", "--seeds", 1]
    assert study(args, tmp_path).returncode == 0
    summary = json.loads((out / "summary" / "study.json").read_text())["tasks"]["countdown"]
    assert summary["steps"] == 150 and len(summary["entropy_curves"]["grpo"]) == 150
    assert summary["entropy_curves"]["grpo"][0] == pytest.approx(0.10)
    assert "## countdown: 150 steps" in (out / "summary" / "study.md").read_text()
    cells = [json.loads(line) for line in (out / "summary" / "cells.jsonl").read_text().splitlines()]
    assert sorted(c["steps"] for c in cells) == [150, 150]
    assert study([*args, "--steps", 3, "--dest", tmp_path / "trial"], tmp_path).returncode == 0
    assert json.loads((tmp_path / "trial" / "study.json").read_text())["tasks"]["countdown"]["steps"] == 3
    one_line(study(["summarise", "--out", tmp_path / "stduy"], tmp_path), "holds no study cells")
    assert {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in (ROOT / "benchmarks" / "study").iterdir()
    } == committed


@pytest.mark.slow
def test_set_reaches_eval_theory_filter_and_pretrain_toy(tmp_path, monkeypatch, capsys):
    """Item 12: --set KEY=VALUE is taken by eval, theory, filter and pretrain-toy under TrainConfig's rules: a bad
    value or a field the subcommand does not use is one line; a good one sets the option mirroring it, and the
    option itself wins over --set."""
    one_line(cli(["eval", "--set", "eval_k=0"], tmp_path), "eval_k", "must be >= 1")
    one_line(cli(["theory", "--set", "lr=1e-3"], tmp_path), "theory does not use lr", "model, task, seed")
    one_line(cli(["filter", "--model", "m", "--set", "engine=sglang"], tmp_path), "engine=sglang", "hf or vllm")
    one_line(cli(["pretrain-toy", "--set", "seed=-1"], tmp_path), "seed", "must be >= 0")
    seen = {}
    monkeypatch.setattr(pipeline, "evaluate_to_dir", lambda request, **kw: seen.update(kw, request=request) or _work())
    monkeypatch.chdir(tmp_path)
    with pytest.raises(Work):
        main(["eval", "--set", "eval_k=4", "seed=7", "eval_temperature=1.0", "--eval-k", "2"])
    assert (seen["request"].temperature, seen["request"].seed, seen["specs"]) == (1.0, 7, [("countdown", 2)])


@pytest.mark.slow
def test_messages_say_what_is_wrong(trained, tmp_path):
    """Item 13: /dev/null is not called a directory; a YAML file passed as a run is called a file; a dangling
    symlink is named as one; a bad metrics.jsonl line is named by file and line (report and --resume); a bad
    ENTROPY_RFT_CACHE is named; a run given twice is reported once; --help shows the defaults of eval --seed,
    --eval-problems, --data-dir, filter --limit, --seed, --data-dir and theory --seed."""
    one_line(cli(["train", "--config", "/dev/null"], tmp_path), "/dev/null is not a regular file")
    one_line(cli(["eval", "--out", "/dev/null"], tmp_path), "/dev/null is not a directory")
    (tmp_path / "x.yaml").write_text("lr: 1.0e-4\n")
    one_line(cli(["report", "x.yaml"], tmp_path), "x.yaml is a file, not a run directory")
    (tmp_path / "gone").symlink_to(tmp_path / "nowhere")
    one_line(cli(["train", "--out", "gone", "--steps", 1], tmp_path), "gone is a symlink to", "does not exist")
    one_line(cli(["eval", "--out", "gone"], tmp_path), "gone is a symlink to", "does not exist")
    run = copy_run(trained, tmp_path)
    rows = (run / "metrics.jsonl").read_text().splitlines()
    (run / "metrics.jsonl").write_text(f"{rows[0]}\n{{not json\n{rows[1]}\n")
    one_line(cli(["report", "r"], tmp_path), "r/metrics.jsonl:2 is not a JSON line")
    one_line(cli(["train", "--out", "r", "--resume", "--steps", 3], tmp_path), "r/metrics.jsonl:2 is not a JSON line")
    one_line(
        cli(["train", "--dry-run", "--out", "d"], tmp_path, ENTROPY_RFT_CACHE="/dev/null/cache"),
        "cache /dev/null/cache cannot be created",
        "ENTROPY_RFT_CACHE",
    )
    ok(cli(["report", str(trained), f"{trained}/", "--out", "rep"], tmp_path))
    assert list(json.loads((tmp_path / "rep" / "report.json").read_text())) == ["r"]
    assert (tmp_path / "rep" / "report.md").read_text().count(f"| {trained.name} |") == 1
    for command, options in (
        ("eval", ("--seed", "--eval-problems", "--data-dir")),
        ("filter", ("--limit", "--seed", "--data-dir")),
        ("theory", ("--seed",)),
    ):
        entries = {}  # option -> its help entry (from its line `  --option ...` to the next option's)
        for line in ok(cli([command, "--help"], tmp_path)).stdout.splitlines():
            if line.startswith("  -"):
                key = line.split()[0].rstrip(",")
                entries[key] = ""
            if entries:
                entries[key] += " " + line.strip()
        for option in options:
            assert "(default:" in entries[option], (command, option, entries[option])


@pytest.mark.slow
def test_python_api_refuses_what_it_cannot_compute(tmp_path):
    """Item 14, through `python -c`: token_stats with temperature NaN raises naming it (it gave NaN entropy); an
    empty mask reports frac_clipped 0.0 (it said 1.0); num_tokens=0 raises ValueError naming it (it was a bare
    ZeroDivisionError, or inf in the loss); TrainConfig(out=5) is refused naming out."""
    code = """
import math, torch
from entropy_rft.core.dynamics import token_stats, corollary4_entropy_change
from entropy_rft.core.masks import clipped_fractions
from entropy_rft.core.losses import aggregate
from entropy_rft.config import TrainConfig
def err(f):
    try:
        f()
    except Exception as e:
        return type(e).__name__ + ': ' + str(e)
    return 'accepted'
m = torch.zeros(2, 3, dtype=torch.bool)
print(err(lambda: token_stats(torch.randn(2, 3, 5), torch.zeros(2, 3, dtype=torch.long), temperature=math.nan)))
print(clipped_fractions(m, m, torch.ones(2))['frac_clipped'])
print(err(lambda: corollary4_entropy_change(torch.ones(2), torch.ones(2, 3), ~m, lr=1.0, num_tokens=0)))
print(err(lambda: aggregate(torch.ones(2, 3), ~m, 'token-mean', num_tokens=0)))
print(err(lambda: TrainConfig(out=5)))
"""
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env(), capture_output=True, text=True, timeout=120
    )
    lines = proc.stdout.splitlines()
    assert proc.returncode == 0 and len(lines) == 5, proc.stderr
    assert lines[0].startswith("ValueError: temperature must be a finite number > 0, got nan")
    assert lines[1] == "0.0"
    assert lines[2].startswith("ValueError: num_tokens is |T_B|") and "got 0" in lines[2]
    assert lines[3].startswith("ValueError: num_tokens is a loss denominator") and "got 0" in lines[3]
    assert lines[4].startswith("ConfigError:") and "out is a run directory path" in lines[4]


@pytest.mark.slow
def test_shipped_recipes_by_name_version_and_inspect_html_suffix(trained, tmp_path):
    """Item 15 and issue 33's two items: from a directory without the clone's configs/, `--config
    paper/qwen2.5-7b-instruct_clip_b` reads the shipped recipe and `recipes` lists it, and the README's
    `entropy_rft/configs/paper/....yaml` works there too; an unknown name points at
    `entropy-rft recipes`. `--version` prints the package's version. `inspect --out NAME` writes NAME.html and says
    so."""
    listed = ok(cli(["recipes"], tmp_path)).stdout
    assert "paper/qwen2.5-7b-instruct_clip_b " in listed and "demo " in listed
    plan = cli(["plan", "--config", "paper/qwen2.5-7b-instruct_clip_b", "--json"], tmp_path)
    assert plan.returncode in (0, 1), plan.stderr  # 1: it does not fit the default 80 GiB device
    assert json.loads(plan.stdout)["model"] == "Qwen/Qwen2.5-7B-Instruct"
    readme = cli(["plan", "--config", "entropy_rft/configs/paper/qwen3-4b-base_grpo.yaml", "--json"], tmp_path)
    assert json.loads(readme.stdout)["model"] == "Qwen/Qwen3-4B-Base", readme.stderr  # the README's clone path
    one_line(cli(["train", "--config", "paper/no-such-recipe"], tmp_path), "entropy-rft recipes")
    version = next(
        line.split('"')[1] for line in (ROOT / "pyproject.toml").read_text().splitlines() if line.startswith("version")
    )
    assert ok(cli(["--version"], tmp_path)).stdout.strip() == f"entropy-rft {version}"
    proc = ok(cli(["inspect", trained, "--out", "page"], tmp_path))
    assert (tmp_path / "page.html").is_file() and not (tmp_path / "page").exists()
    assert "wrote page.html" in proc.stdout
