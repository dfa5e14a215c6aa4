"""The command line speaks one grammar and fails well (issue 22 items 4-6), run in-process through cli.main(argv):

- a fuzz suite over every subcommand: a bad value exits with code 2 and one line naming the option (or setting)
  and the fix, never a traceback, and before any model loads (model loading and training fail the test here);
- --set is repeatable and merged; demo, compare and sweep take it and a flat recipe; --help shows defaults;
- compare and sweep key each cell by its settings: a changed setting trains new cells, the same settings reuse them.
Two cases also run as real subprocesses, to show the in-process path is the one a user meets."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import entropy_rft.commands.demo as demo
import entropy_rft.commands.pipeline as pipeline
import entropy_rft.config as config
import entropy_rft.train.policy as policy
import entropy_rft.train.trainer as trainer
from entropy_rft.commands.cli import build_parser, main
from entropy_rft.config import FLOAT32_MAX, FLOAT32_TINY

ROOT = Path(__file__).resolve().parents[1]


def _model_work(*args, **kwargs):
    raise AssertionError("bad input reached model loading or training: it must be refused before")


@pytest.fixture(autouse=True)
def no_model_work(monkeypatch):
    """Any case that gets as far as loading a model or training fails; torch looks like a CPU-only build and vLLM
    like a package that is not installed, whatever this machine has."""
    for module, name in ((policy, "load_policy"), (trainer, "_Run"), (pipeline, "build_engine")):
        monkeypatch.setattr(module, name, _model_work)
    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setitem(
        config.OPTIONAL_PACKAGES, "vllm", ("no_such_module_vllm_stand_in", config.OPTIONAL_PACKAGES["vllm"][1])
    )


def fails(argv, capsys) -> str:
    """Run the CLI; it must exit with code 2 and print exactly one line on stderr (notes about renamed options
    aside) and nothing that looks like a traceback. Returns that line."""
    with pytest.raises(SystemExit) as exc:
        main([str(a) for a in argv])
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if line.strip() and ": note: " not in line]
    assert exc.value.code == 2, (argv, captured.err)
    assert len(lines) == 1, (argv, captured.err)
    assert "Traceback" not in captured.err + captured.out
    return lines[0]


@pytest.fixture
def record(tmp_path) -> Path:
    """A finished run's record (config.yaml of lr 1e-4 and its digest, metrics, a final checkpoint, eval.json)."""
    from entropy_rft.run.record import write_digest

    run = tmp_path / "done"
    cfg = config.load_config(None, lr=1e-4, steps=2, out=str(run))
    run.mkdir()
    (run / "config.yaml").write_text(yaml.safe_dump(cfg.to_dict()))
    write_digest(run, cfg)
    (run / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2}\n')
    (run / "checkpoint-2").mkdir()
    torch.save({"step": 2}, run / "checkpoint-2" / "trainer_state.pt")
    (run / "latest_checkpoint").write_text("checkpoint-2")
    (run / "eval.json").write_text('{"0": {}, "2": {}}')
    return run


def files(tmp_path) -> dict:
    """Recipes for the cases: a duplicate key, a demo-style file, a flat one, a directory."""
    (tmp_path / "dup.yaml").write_text("lr: 1.0e-5\nsteps: 3\nlr: 2.0e-5\n")
    (tmp_path / "demo.yaml").write_text("common: {steps: 2}\nmethods: {grpo: {method: grpo}}\n")
    (tmp_path / "flat.yaml").write_text("steps: 2\nlr: 1.0e-4\n")
    return {k: tmp_path / f"{k}.yaml" for k in ("dup", "demo", "flat")}


# (argv, what the line must name, what fix it must state); the cases first
CASES = [
    (["eval", "--k", "0"], "--eval-k", "must be >= 1"),
    (["eval", "--k", "-3"], "--eval-k", "must be >= 1"),
    (["eval", "--data", "x@0"], "--data 'x@0'", "must be >= 1"),
    (["theory", "--batches", "0"], "--batches", "must be >= 1"),
    (["compare", "--seeds", "0"], "--seeds", "must be >= 1"),
    (["train", "--set", "device=cuda", "--steps", "1"], "device 'cuda'", "use device cpu"),
    (["eval", "--device", "cuda"], "device 'cuda'", "use device cpu"),
    (["theory", "--device", "cuda:1"], "device 'cuda:1'", "use device cpu"),
    (["eval", "--max-new-tokens", "0"], "--max-new-tokens", "must be >= 1"),
    (["eval", "--batch-size", "0"], "--batch-size", "must be >= 1"),
    (["eval", "--limit", "-1"], "--eval-problems/--limit", "must be >= 0"),
    (["filter", "--model", "m", "--n", "0"], "--n", "must be >= 1"),
    (["train", "--set", "entropy_target=-1"], "entropy_target", "must be >= 0"),
    (["train", "--set", "lr="], "lr=", "write lr=VALUE"),
    (["train", "--config", "{dup}"], "'lr' appears twice", "delete one of them"),
    (["train", "--out", "{record}"], "another run's record", "--resume"),
    (["train", "--out", "{record}", "--resume", "--set", "lr=1e-3"], "lr: 0.0001 -> 0.001", "may change on resume"),
    (["train", "--out", "{tmp}/empty", "--resume"], "nothing to resume", "--resume-or-start"),
    (["train", "--name", "no-such-run-xyz", "--resume"], "nothing to resume", "Check the path"),
    (["train", "--config", "{demo}"], "demo-style", "`entropy-rft demo`, `compare` and `sweep` take it"),
    # the rest of the grammar
    (["train", "--resume"], "--resume", "--out DIR or --name NAME"),
    (["train", "--out", "{record}", "--resume"], "already finished", "--steps N > 2"),
    (["train", "--out", "x", "--name", "y"], "--name", "not allowed with argument --out"),
    (["train", "--resume", "--overwrite", "--out", "x"], "--overwrite", "not allowed with argument --resume"),
    (["train", "--name", "a/b"], "--name 'a/b'", "use --out"),
    (["train", "--steps", "0"], "--steps", "must be >= 1"),
    (["train", "--set", "lrr=1"], "lrr", "did you mean 'lr'"),
    (["train", "--set", "lr"], "--set", "KEY=VALUE"),
    (["train", "--set", "betas=[0.9"], "betas", "quote text"),
    (["train", "--set", "steps=2.5"], "steps", "valid integer"),
    (["train", "--set", "lr=nan"], "lr", "finite"),
    (["train", "--set", "method=clip_x"], "clip_x", "known methods"),
    (["train", "--set", "engine=vllm"], "vllm", "pip install"),
    (["train", "--config", "{tmp}/missing.yaml"], "missing.yaml", "does not exist"),
    (["train", "--config", "{tmp}"], "is a directory", "pass a YAML file"),
    (["plan", "--config", "{demo}"], "demo-style", "flat recipe"),
    (["plan", "--device-memory", "0"], "--device-memory", "> 0"),
    (["plan", "--prompt-tokens", "0"], "--prompt-tokens", "must be >= 1"),
    (["eval", "--eval-k", "8", "--n", "4"], "--n 4", "raise --n"),
    (["eval", "--top-p", "1.5"], "--top-p", "<= 1"),
    (["eval", "--eval-temperature", "0"], "--eval-temperature", "> 0"),
    (["eval", "--seed", "-1"], "--seed", "must be >= 0"),
    (["eval", "--engine", "vllm"], "vllm", "pip install"),
    (["eval", "--engine", "sglang"], "--engine", "choose from"),
    (["eval", "--data", "x@-2"], "--data 'x@-2'", "must be >= 1"),
    (["eval", "--vllm-memory", "1.5"], "--vllm-gpu-memory", "<= 1"),
    (["filter", "--model", "m", "--temperature", "nan"], "--temperature", "finite"),
    (["filter", "--model", "m", "--limit", "-1"], "--limit", "must be >= 0"),
    (["filter", "--n", "4"], "--model", "required"),
    (["theory", "--lr", "0"], "--lr", "> 0"),
    (["theory", "--data", "{tmp}/none.jsonl"], "--data", "pass a problem JSONL"),
    (["compare", "--methods", ","], "--methods", "e.g. grpo"),
    (["compare", "--methods", "grpo,clip_x"], "--methods", "known:"),
    (["compare", "--steps", "0"], "--steps", "must be >= 1"),
    (["compare", "--set", "method=clip_b"], "--set method", "use --methods"),
    (["compare", "--config", "{dup}"], "'lr' appears twice", "delete one of them"),
    (["sweep", "--mu", "a,b"], "--mu", "valid number"),
    (["sweep", "--mu", "1,-1"], "--mu", "mu must be >= 0"),
    (["sweep", "--max-frac", "0"], "--max-frac", "> 0"),
    (["sweep", "--set", "mu=2"], "--set mu", "use --mu"),
    (["demo", "--steps", "0"], "--steps", "must be >= 1"),
    (["demo", "--methods", "grpo,nope"], "'nope'", "known:"),
    (["demo", "--set", "out=x"], "--set out", "use --out"),
    (["demo", "--resume"], "--resume", "--out DIR or --name NAME"),
    (["pretrain-toy", "--sft-steps", "0"], "--sft-steps", "must be >= 1"),
    (["report", "{tmp}/nowhere"], "nowhere does not exist", "pass directories written by"),
    # close matches (issue 43): a mistyped option, method, subcommand or choice names the one meant
    (["train", "--metod", "clip_b"], "--metod", "did you mean '--method'?"),
    (["train", "--metod", "clip_b"], "--metod", "`entropy-rft train --help`"),
    (["train", "--method", "clipb"], "clipb", "did you mean 'clip_b'?"),
    (["compare", "--methods", "grpo,clipv"], "'clipv'", "did you mean 'clip_v'?"),
    (["eval", "--engine", "vlm"], "--engine", "did you mean 'vllm'?"),
]


@pytest.mark.parametrize("argv, names, fix", CASES, ids=[" ".join(c[0])[:60] for c in CASES])
def test_bad_input_exits_2_with_one_line_naming_option_and_fix(argv, names, fix, tmp_path, record, capsys, monkeypatch):
    """Each case: exit code 2, one line on stderr that names the option or setting and states the fix, no
    traceback, no model loaded; a record it touches is left as it was."""
    monkeypatch.chdir(tmp_path)  # --name and default directories land here
    paths = {k: str(v) for k, v in files(tmp_path).items()}
    argv = [a.format(tmp=tmp_path, record=record, **paths) for a in argv]
    before = {p: p.read_bytes() for p in record.rglob("*") if p.is_file() and p.name != ".lock"}
    line = fails(argv, capsys)
    assert line.startswith(f"entropy-rft {argv[0]}: error: ")
    assert names in line and fix in line, line
    assert {p: p.read_bytes() for p in record.rglob("*") if p.is_file() and p.name != ".lock"} == before


# options whose values argparse checks: (argv prefix, option, whole number?, lowest, highest, lowest allowed?)
NUMERIC = [
    (["eval"], "--eval-k", True, 1, None, True),
    (["eval"], "--n", True, 1, None, True),
    (["eval"], "--eval-temperature", False, 0, None, False),
    (["eval"], "--top-p", False, 0, 1, False),
    (["eval"], "--max-new-tokens", True, 1, None, True),
    (["eval"], "--vllm-gpu-memory", False, 0, 1, False),
    (["eval"], "--eval-problems", True, 0, None, True),
    (["eval"], "--batch-size", True, 1, None, True),
    (["eval"], "--seed", True, 0, 2**32 - 1, True),
    (["filter", "--model", "m"], "--n", True, 1, None, True),
    (["filter", "--model", "m"], "--temperature", False, 0, None, False),
    (["filter", "--model", "m"], "--limit", True, 0, None, True),
    (["theory"], "--batches", True, 1, None, True),
    (["theory"], "--lr", False, 0, None, False),
    (["compare"], "--seeds", True, 1, None, True),
    (["compare"], "--steps", True, 1, None, True),
    (["sweep"], "--max-frac", False, 0, None, False),
    (["sweep"], "--steps", True, 1, None, True),
    (["demo"], "--steps", True, 1, None, True),
    (["train"], "--steps", True, 1, None, True),
    (["plan"], "--device-memory", False, 0, None, False),
    (["plan"], "--prompt-tokens", True, 1, None, True),
    (["pretrain-toy"], "--sft-steps", True, 1, None, True),
    (["pretrain-toy"], "--train-problems", True, 1, None, True),
    (["pretrain-toy"], "--eval-problems", True, 1, None, True),
]
FLOAT32_FIELDS = {"--eval-temperature", "--top-p", "--vllm-gpu-memory", "--temperature", "--max-frac"}  # setting(...)
TEXTS = st.one_of(
    st.integers(-5, 5).map(str),
    st.integers(-(2**40), 2**40).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.floats(-2, 2).map(str),
    st.sampled_from(
        [
            "",
            "x",
            "1e400",
            "-0",
            "0.0",
            "1.0",
            "2.5",
            "1,2",
            "nan",
            "inf",
            "1_0",
            " 3",
            "0x10",
            "1.",
            "\u00b2",
            "4294967296",
            "4294967295",
            "1e3",
        ]
    ),
)


def _number(text: str):
    """The number a text denotes (Decimal, exact), or None."""
    from decimal import Decimal, InvalidOperation

    try:
        return Decimal(text.strip())
    except (InvalidOperation, ValueError):
        return None


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=st.sampled_from(NUMERIC), text=TEXTS)
def test_any_value_of_a_numeric_option_is_taken_exactly_or_refused_in_one_line(case, text, capsys):
    """Any text for any numeric option is either refused (exit 2, one line naming the option and what the value must
    be) or taken as exactly the number it denotes, inside the option's range; a plainly written valid value (the
    oracle: digits, or a finite decimal for real-valued options, in range) is always taken."""
    prefix, option, integer, low, high, low_ok = case
    argv = [*prefix, f"{option}={text}"]
    number = _number(text)
    finite = number is not None and number.is_finite() and (integer or math.isfinite(float(number)))
    in_range = finite and (number >= low if low_ok else number > low) and (high is None or number <= high)
    if in_range and option in FLOAT32_FIELDS and number != 0:  # a setting's float32 range (config.py)
        in_range = FLOAT32_TINY <= abs(float(text)) <= FLOAT32_MAX
    plain = in_range and (text.strip().lstrip("+-").isdigit() if integer else True) and text.isascii()
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:
        err = capsys.readouterr().err.strip()
        assert exc.code == 2 and "\n" not in err and "Traceback" not in err
        assert option in err and any(w in err for w in ("must be", "expected", "valid", "finite")), err
        assert not plain, (argv, err)
        return
    value = getattr(args, option.lstrip("-").replace("-", "_"))
    assert in_range and (value == number if integer else value == float(text)), (argv, value)
    assert isinstance(value, int) if integer else isinstance(value, float)


@pytest.mark.slow
def test_the_in_process_path_is_the_one_users_meet(record, capsys):
    """Two cases as real processes (`python -m entropy_rft.commands.cli`): one refused by argparse, one refused deep
    inside
        train(); each gives the same exit code and the same one line on stderr as in-process."""
    cases = [["eval", "--batch-size", "0"], ["train", "--out", str(record), "--steps", "2"]]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "entropy_rft.commands.cli", *case],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for case in cases
    ]
    for case, proc in zip(cases, procs):
        _, err = proc.communicate(timeout=300)
        line = fails(case, capsys)
        assert proc.returncode == 2 and err.decode() == line + "\n"


# ---------------------------------------------------------------------------------------------------------------
# the grammar


def test_help_lists_every_option_with_a_line_and_its_default(capsys):
    """Every option of every subcommand has a help line, and each one with a default shows it in --help."""
    from entropy_rft.commands.cli import HelpFormatter

    parser = build_parser()
    subparsers = next(a for a in parser._actions if a.dest == "command").choices
    fmt = HelpFormatter("x")
    for name, sub in subparsers.items():
        for action in sub._actions:
            if action.dest == "help":
                continue
            assert action.help, (name, action.option_strings)
            if action.option_strings and action.nargs != 0 and action.default not in (None, False, []):
                assert "default" in fmt._get_help_string(action), (name, action.option_strings)
    with pytest.raises(SystemExit):
        main(["eval", "--help"])
    assert "(default: 32)" in capsys.readouterr().out


def fake_train(calls):
    """A stand-in trainer: records each config and writes the record train() would (config.yaml, metrics,
    eval.json), so compare, sweep and demo can be driven without training."""

    def train(cfg, *, resume=False, overwrite=False):
        calls.append((cfg, resume, overwrite))
        run = Path(cfg.out)
        run.mkdir(parents=True, exist_ok=True)
        (run / "config.yaml").write_text(yaml.safe_dump(cfg.to_dict()))
        rows = [{"step": s, "entropy": 0.5, "clip_frac": 0.0, "reward_mean": 0.1} for s in range(1, cfg.steps + 1)]
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        evals = {
            0: {"k": cfg.eval_k, "avg_at_k": 0.2, "pass_at_k": 0.4, "pass_rates": [0.0, 0.25, 0.375]},
            cfg.steps: {"k": cfg.eval_k, "avg_at_k": 0.3, "pass_at_k": 0.5, "pass_rates": [0.125, 0.25, 0.5]},
        }
        (run / "eval.json").write_text(json.dumps(evals))
        return {
            "config": cfg.to_dict(),
            "evals": evals,
            "history": rows,
            "checkpoint": str(run / f"checkpoint-{cfg.steps}"),
        }

    return train


@pytest.mark.parametrize("command", ["demo", "train", "eval", "filter", "compare", "sweep", "pretrain-toy"])
def test_every_subcommand_with_progress_bars_takes_quiet(command):
    """Property: the same --quiet on every subcommand that draws a progress bar (training steps, generation
    batches, pass-rate chunks, the toy's warm-up and pool build), parsed to a flag."""
    from entropy_rft.commands.cli import build_parser

    parser = build_parser()
    base = {"filter": ["--model", "m"]}.get(command, [])
    assert parser.parse_args([command, *base, "--quiet"]).quiet is True
    assert parser.parse_args([command, *base]).quiet is False


def test_train_quiet_turns_the_step_bar_off_and_leaves_the_recipe_alone(tmp_path, monkeypatch):
    """`train --quiet` runs with progress False; without it the recipe's own setting stands (true by default,
    false when the recipe says so): --quiet only ever removes bars."""
    calls = []
    monkeypatch.setattr(trainer, "train", fake_train(calls))
    recipe = tmp_path / "r.yaml"
    recipe.write_text("progress: false\nsteps: 1\n")
    main(["train", "--out", str(tmp_path / "a"), "--steps", "1", "--quiet"])
    main(["train", "--out", str(tmp_path / "b"), "--steps", "1"])
    main(["train", "--out", str(tmp_path / "c"), "--config", str(recipe)])
    assert [cfg.progress for cfg, _, _ in calls] == [False, True, False]


def test_set_is_repeatable_merged_and_later_wins(tmp_path, monkeypatch, capsys):
    """`--set lr=1e-3 --set method=clip_b mu=2.0` applies all three (the issue's run got the defaults); a key set
    twice takes the later value; `null` sets None over a recipe's value; the command's own options come last."""
    calls = []
    monkeypatch.setattr(trainer, "train", fake_train(calls))
    recipe = tmp_path / "r.yaml"
    recipe.write_text("method: clip_b\nmu: 1.5\nsteps: 4\n")
    main(["train", "--out", str(tmp_path / "a"), "--set", "lr=1e-3", "--set", "method=clip_v", "mu=2.0"])
    main(
        [
            "train",
            "--out",
            str(tmp_path / "b"),
            "--config",
            str(recipe),
            "--set",
            "lr=1e-3",
            "lr=2e-3",
            "--set",
            "mu=null",
            "steps=7",
            "--steps",
            "5",
        ]
    )
    (a, *_), (b, *_) = calls
    assert (a.lr, a.method, a.mu) == (1e-3, "clip_v", 2.0)
    assert (b.lr, b.method, b.mu, b.steps) == (2e-3, "clip_b", None, 5)


def test_eval_old_spellings_still_work_with_a_note(monkeypatch, capsys):
    """eval --k/--limit/--temperature/--vllm-memory parse to the same values as the TrainConfig names, with a note."""
    parser = build_parser()
    old = parser.parse_args(["eval", "--k", "4", "--limit", "3", "--temperature", "0.5", "--vllm-memory", "0.4"])
    new = parser.parse_args(
        ["eval", "--eval-k", "4", "--eval-problems", "3", "--eval-temperature", "0.5", "--vllm-gpu-memory", "0.4"]
    )
    assert vars(old) == vars(new)
    from entropy_rft.commands.cli import _note_renamed

    _note_renamed("eval", ["--k", "4", "--limit=3"])
    assert capsys.readouterr().err.count("note:") == 2


def test_compare_keys_cells_by_settings(tmp_path, monkeypatch, capsys):
    """compare: the same settings again train nothing ("done, skipped"); another lr or another steps trains new
    cells in new directories (never reusing a cell of other settings); every cell's directory ends with the key of
    the settings it was trained with; the table states the settings it rests on."""
    calls = []
    monkeypatch.setattr(trainer, "train", fake_train(calls))
    args = ["compare", "--methods", "grpo,clip_b", "--seeds", "2", "--steps", "1", "--out", str(tmp_path), "--quiet"]
    main(args)
    main(args)
    assert len(calls) == 4 and capsys.readouterr().out.count("done, skipped") == 4
    main([*args, "--set", "lr=2e-4"])
    main([*args, "--steps", "2"])  # the later --steps wins
    assert len(calls) == 12 and all(resume == "auto" for _, resume, _ in calls)
    outs = [cfg.out for cfg, *_ in calls]
    assert len(set(outs)) == 12
    assert all(out.endswith(config.settings_key(cfg)) for (cfg, *_), out in zip(calls, outs))
    table = (tmp_path / "results.md").read_text()
    assert "steps=2" in table and "- clip_b: mu=1.5" in table and "Seeds 0, 1" in table
    settings_json = json.loads((tmp_path / "results.json").read_text())["settings"]
    assert settings_json["shared"]["steps"] == 2 and len(settings_json["cells"]["grpo"]) == 2
    # the intervals rest on every cell's per-problem counts: 2 seeds x 3 problems, and clip_b's paired difference
    # against GRPO is exactly 0 here (the stand-in evaluates both alike)
    evidence = json.loads((tmp_path / "results.json").read_text())["evidence"]
    assert evidence["clip_b"]["vs_grpo"]["avg"]["value"] == 0 and "2 training seeds x 3 evaluation problems" in table


def test_sweep_keys_cells_by_settings_and_takes_set(tmp_path, monkeypatch, capsys):
    """sweep: one cell per mu keyed by its settings; --set reaches every cell; a changed setting trains anew."""
    calls = []
    monkeypatch.setattr(trainer, "train", fake_train(calls))
    monkeypatch.setattr("entropy_rft.commands.report.build_report", lambda runs, out: _page(tmp_path))
    args = ["sweep", "--mu", "1,2", "--steps", "1", "--out", str(tmp_path), "--quiet"]
    main(args)
    main(args)
    main([*args, "--set", "group_size=4"])
    assert [(c.mu, c.group_size) for c, *_ in calls] == [(1.0, 8), (2.0, 8), (1.0, 4), (2.0, 4)]
    assert len({c.out for c, *_ in calls}) == 4


def _page(tmp_path):
    page = tmp_path / "report.md"
    page.write_text("# report\n")
    return page


def test_demo_takes_a_flat_recipe_and_set_and_refuses_an_earlier_demo(tmp_path, monkeypatch, capsys):
    """demo: a flat recipe gives its settings to grpo, clip_b and clip_v; --set reaches each; running again into
    the same directory is refused (exit 2) unless --resume (each method resumed or kept) or --overwrite."""
    calls = []
    monkeypatch.setattr(demo, "train", fake_train(calls))
    monkeypatch.setattr(demo, "plot_curves", lambda *a, **k: None)
    monkeypatch.setattr(demo, "build_page", lambda runs, out, **k: out)  # the fake runs wrote no token samples
    flat = tmp_path / "flat.yaml"
    flat.write_text("steps: 2\nprompts_per_step: 4\n")
    out = tmp_path / "d"
    main(["demo", "--config", str(flat), "--set", "lr=1e-3", "--out", str(out), "--quiet"])
    assert [(c.method, c.steps, c.prompts_per_step, c.lr) for c, *_ in calls] == [
        ("grpo", 2, 4, 1e-3),
        ("clip_b", 2, 4, 1e-3),
        ("clip_v", 2, 4, 1e-3),
    ]
    line = fails(["demo", "--config", flat, "--set", "lr=1e-3", "--out", out], capsys)
    assert "holds an earlier demo" in line and "--resume" in line and "--overwrite" in line
    main(["demo", "--config", str(flat), "--set", "lr=1e-3", "--out", str(out), "--resume", "--quiet"])
    main(["demo", "--config", str(flat), "--out", str(out), "--overwrite", "--quiet"])
    assert [(r, o) for _, r, o in calls[3:]] == [("auto", False)] * 3 + [(False, True)] * 3


def test_dry_run_writes_its_scratch_directory_never_the_recipes_out(tmp_path, monkeypatch):
    """`train --config R --dry-run` with R naming its real run directory (out:) runs in runs/dry-run/<R>, replaced
    each time; with --out DIR it runs there under the usual rules (no replacing unless --overwrite)."""
    calls = []
    monkeypatch.setattr(pipeline, "dry_run", lambda cfg, out, **kw: calls.append((str(out), kw)) or {"ok": True})
    monkeypatch.setattr("entropy_rft.commands.cli.train._print_plan", lambda cfg: None)
    monkeypatch.chdir(tmp_path)
    recipe = tmp_path / "paper.yaml"
    recipe.write_text(f"out: {tmp_path / 'real-run'}\nsteps: 500\n")
    main(["train", "--config", str(recipe), "--dry-run"])
    main(["train", "--config", str(recipe), "--dry-run", "--out", str(tmp_path / "mine")])
    assert calls == [("runs/dry-run/paper", {"overwrite": True}), (str(tmp_path / "mine"), {"overwrite": False})]


def test_a_bare_command_prints_help_and_exits_0(capsys):
    """Property: `entropy-rft` alone lists the subcommands on stdout and is not an error."""
    with pytest.raises(SystemExit) as exc:
        main([])
    out = capsys.readouterr().out
    assert exc.value.code == 0 and "usage: entropy-rft" in out
    assert all(name in out for name in ("demo", "train", "inspect", "report"))


def test_a_mistyped_subcommand_names_the_one_meant(capsys):
    """Property: an unknown subcommand close to a real one is refused with that one suggested."""
    line = fails(["trian"], capsys)
    assert line.startswith("entropy-rft: error: ") and "did you mean 'train'?" in line


def test_a_far_typo_gets_no_suggestion(capsys):
    """Property: a suggestion is made only for a close match (an unrelated option is not guessed at)."""
    line = fails(["train", "--colour"], capsys)
    assert "--colour" in line and "did you mean" not in line


def test_inspect_on_a_folder_of_runs_lists_the_runs_inside(tmp_path, capsys):
    """Property: a directory holding runs (not a run) is refused with the runs that have token samples listed,
    nested ones included (a demo's runs/<method>), and no run without samples named."""
    for run in ("a", "demo/runs/clip_b", "empty"):
        (tmp_path / run / "samples").mkdir(parents=True)
    for run in ("a", "demo/runs/clip_b"):
        (tmp_path / run / "samples" / "step-000001.json.gz").write_bytes(b"")
    line = fails(["inspect", str(tmp_path)], capsys)
    assert "folder of runs" in line and "it holds 2" in line
    assert str(tmp_path / "a") in line and str(tmp_path / "demo/runs/clip_b") in line and "empty" not in line
