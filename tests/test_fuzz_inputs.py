"""Fuzzing what a user hands over: config values, dataset rows, model directories, run directories for `report`.

The property everywhere: a bad input raises the project's own error (ConfigError, ValueError, FileNotFoundError,
OSError, or a registry KeyError) whose message names the input, never a raw error from torch, transformers,
pydantic or json; and an input that is accepted means exactly what it says (no 2.5 read as 2, no None read as
"None", no invented or repeated metrics rows)."""

import json
import math
import shutil
import warnings
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from entropy_rft.commands.report import load_run
from entropy_rft.config import ConfigError, TrainConfig, load_config
from entropy_rft.tasks.countdown import Problem
from entropy_rft.tasks.data import to_problems
from entropy_rft.train.policy import BUILTIN_MODELS, load_policy, resolve_model_path

FIELDS = {f: TrainConfig.__dataclass_fields__[f] for f in TrainConfig.__dataclass_fields__}
JSON_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
)
ODD_VALUES = st.one_of(
    JSON_SCALARS,
    st.lists(JSON_SCALARS, max_size=3),
    st.dictionaries(st.text(max_size=4), JSON_SCALARS, max_size=2),
    st.sampled_from(["1e-5", "3", "-1", "nan", "inf", "true", "None", "", "2.5", "1e400"]),
)
FAST = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _holds_type(kind: str, value) -> bool:
    """Whether an accepted value has the field's declared type (and is finite where it is a number)."""
    import ast

    options = [k.strip() for k in kind.split("|")]
    for k in options:  # a choice: one of the literal values
        if k.startswith(("Literal[", "typing.Literal[")) and value in ast.literal_eval(
            "[" + k.split("[", 1)[1][:-1] + "]"
        ):
            return True
    if value is None:
        return "None" in options
    for k in options:
        if k == "float" and isinstance(value, float) and math.isfinite(value):
            return True
        if k == "int" and isinstance(value, int) and not isinstance(value, bool):
            return True
        if k in ("str", "bool", "dict") and type(value).__name__ == k:
            return True
        if k.startswith("tuple[float") and isinstance(value, tuple) and all(isinstance(v, float) for v in value):
            return True
        if k.startswith("tuple[str") and isinstance(value, tuple) and all(isinstance(v, str) for v in value):
            return True
    return False


@FAST
@given(name=st.sampled_from(sorted(FIELDS)), value=ODD_VALUES)
@example(name="gamma", value=-9_007_199_254_740_993)  # no float equals this int (found by this test)
def test_config_values_are_coerced_exactly_or_rejected_by_name(name, value):
    """Any value for any field: either ConfigError naming the field (or a registry's KeyError naming the value),
    or a config whose field has the declared type; a number given as text is read as that number."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            cfg = load_config(None, **{name: value}) if value is not None else load_config(None)
        except ConfigError as err:
            assert name in str(err) or name == "method", str(err)
            return
        except KeyError as err:  # a registry: unknown method, task, sink, ...
            assert "known" in str(err)
            return
    got = getattr(cfg, name)
    assert _holds_type(str(FIELDS[name].type), got), (name, value, got)
    if isinstance(value, str) and isinstance(got, float):
        assert got == float(value)
    if isinstance(value, (int, float)) and not isinstance(value, bool) and isinstance(got, (int, float)):
        # a float field holds the float nearest an int (an int beyond 2**53 has no exact float)
        assert got == (float(value) if isinstance(got, float) else value)


@pytest.mark.parametrize(
    "key, text, expected",
    [
        ("lr", "1e-5", 1e-5),
        ("lr", "1e-6", 1e-6),
        ("mu", "1.5", 1.5),
        ("steps", "3", 3),
        ("progress", "false", False),
        ("betas", "[0.9, 0.99]", (0.9, 0.99)),
    ],
)
def test_recipe_and_set_values_that_yaml_reads_as_text_are_coerced(tmp_path, key, text, expected):
    """The issue's example: YAML reads 1e-5 as a string; from a recipe and from --set it becomes the float."""
    from entropy_rft.commands.options import set_item

    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"method: clip_b\n{key}: {text}\n")
    assert getattr(load_config(recipe), key) == expected
    assert getattr(load_config(None, method="clip_b", **dict([set_item(f"{key}={text}")])), key) == expected
    assert type(getattr(load_config(recipe), key)) is type(expected)


def test_config_errors_name_field_value_and_expectation():
    """The message of a bad value names the field, the value given and the type or range expected."""
    with pytest.raises(ConfigError, match=r"config field lr: got 'fast' \(str\); expected float"):
        load_config(None, lr="fast")
    with pytest.raises(ConfigError, match=r"config field steps: got -3 .*steps must be >= 1"):
        load_config(None, steps=-3)
    with pytest.raises(ConfigError, match=r"temperature: got nan .*finite"):
        TrainConfig(temperature=float("nan"))
    with pytest.raises(ConfigError, match=r"unknown config keys \['learnin_rate'\]"):
        load_config(None, learnin_rate=1)
    with pytest.raises(ConfigError, match="not valid YAML"):
        bad = Path(pytest.importorskip("tempfile").mkdtemp()) / "bad.yaml"
        bad.write_text("lr: [1, 2\n")
        load_config(bad)


# ---------------------------------------------------------------------------------------------------------------
# dataset rows

ROW_VALUES = st.one_of(
    JSON_SCALARS, st.lists(JSON_SCALARS, max_size=4), st.lists(st.integers(0, 99), min_size=1, max_size=4)
)


@FAST
@given(
    row=st.one_of(
        st.dictionaries(st.sampled_from(["numbers", "target", "solution", "other"]), ROW_VALUES, max_size=4),
        JSON_SCALARS,
        st.lists(JSON_SCALARS, max_size=2),
    )
)
def test_countdown_rows_are_taken_exactly_or_rejected(row):
    """A countdown row is either read exactly as written (ints stay the same ints) or rejected with a ValueError
    that names the row and what a row needs."""
    try:
        problem = Problem.from_json(row)
    except ValueError as err:
        assert "countdown row" in str(err) and "'numbers'" in str(err)
        return
    assert list(problem.numbers) == row["numbers"] and all(type(n) is int for n in problem.numbers)
    assert problem.target == row["target"] and type(problem.target) is int


@FAST
@given(
    row=st.one_of(
        st.dictionaries(
            st.sampled_from(["question", "answer", "problem", "prompt", "solution", "reward_model", "id"]),
            ROW_VALUES,
            max_size=4,
        ),
        JSON_SCALARS,
    )
)
def test_math_rows_are_taken_exactly_or_rejected(row):
    """A math dataset row (any schema) is either read into a problem whose question and answer are the row's own
    text, or rejected with a ValueError that names the dataset."""
    good = {"question": "What is 1+1?", "answer": "2"}
    for rows in ([row], [good, row]):
        try:
            problems = to_problems(rows, "mydata")
        except ValueError as err:
            assert "mydata" in str(err) or "schema" in str(err)
            continue
        own = {v.strip() for r in rows if isinstance(r, dict) for v in r.values() if isinstance(v, str)}
        for p in problems:  # "None" or "nan" only where the row holds that very text, never a missing value's str()
            assert p.question.strip() and p.answer.strip()
            assert {p.question, p.answer} & {"None", "nan"} <= own


def test_problem_file_with_a_bad_line_names_file_and_line(tmp_path):
    """load_problems names the file and the line of a bad row."""
    from entropy_rft.tasks import TASKS
    from entropy_rft.train.problems import load_problems

    path = tmp_path / "train.jsonl"
    path.write_text('{"numbers": [1, 2], "target": 3}\n{"numbers": [1, 2.5], "target": 3}\n')
    with pytest.raises(ValueError, match=r"train.jsonl:2: .*numbers must be a non-empty list of non-negative ints"):
        load_problems(path, TASKS.get("countdown"))


# ---------------------------------------------------------------------------------------------------------------
# model directories

SRC = BUILTIN_MODELS["countdown-tiny"]
DAMAGE = {
    "empty config.json": lambda d: (d / "config.json").write_text(""),
    "config.json not JSON": lambda d: (d / "config.json").write_text("{not json"),
    "config.json a list": lambda d: (d / "config.json").write_text("[1, 2]"),
    "config.json without model_type": lambda d: (d / "config.json").write_text("{}"),
    "unknown model_type": lambda d: (d / "config.json").write_text('{"model_type": "nope"}'),
    "no weights": lambda d: (d / "model.safetensors").unlink(),
    "corrupt weights": lambda d: (d / "model.safetensors").write_bytes(b"\x00garbage" * 10),
    "truncated weights": lambda d: (d / "model.safetensors").write_bytes(
        (SRC / "model.safetensors").read_bytes()[:5000]
    ),
    "no tokenizer": lambda d: [(d / f).unlink() for f in ("tokenizer.json", "tokenizer_config.json")],
    "tokenizer.json not JSON": lambda d: (d / "tokenizer.json").write_text("{{{"),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_damaged_model_directory_is_named_with_the_fix(tmp_path, damage):
    """Each way a model directory can be damaged gives an OSError naming the directory and what it must hold."""
    model_dir = tmp_path / "my-model"
    shutil.copytree(SRC, model_dir)
    DAMAGE[damage](model_dir)
    with pytest.raises(OSError, match=r"(?s)model directory .*my-model.*(save_pretrained|tokenizer)"):
        load_policy(str(model_dir), torch.device("cpu"))


def test_missing_and_empty_model_directories(tmp_path):
    """A missing path and an empty directory are named, with the forms a model may take."""
    with pytest.raises(FileNotFoundError, match="does not exist"):
        resolve_model_path(str(tmp_path / "nowhere"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="empty has no config.json"):
        resolve_model_path(str(tmp_path / "empty"))


# ---------------------------------------------------------------------------------------------------------------
# run directories for `report`

ROWS = [{"step": s, "entropy_all_tokens": 1.0 / s, "clip_frac": 0.01 * s, "reward_mean": -0.5} for s in range(1, 6)]


@FAST
@given(
    cut=st.integers(0, 400),
    garbage=st.one_of(
        st.none(),
        st.text(max_size=20),
        st.sampled_from(['{"step": "3"}', "[1, 2]", '{"step": 6, "clip_frac": "x"}', "{", "null"]),
    ),
    at_end=st.booleans(),
)
def test_run_directory_metrics_are_read_exactly_or_rejected(tmp_path_factory, cut, garbage, at_end):
    """metrics.jsonl truncated anywhere (a killed run) and/or holding a garbage line: load_run returns exactly the
    whole rows written (never a half row, never an invented one) or raises naming the run directory."""
    run = tmp_path_factory.mktemp("run")
    text = "".join(json.dumps(r) + "\n" for r in ROWS)[:cut]
    if garbage is not None:
        text = text + garbage + "\n" if at_end else garbage + "\n" + text
    (run / "metrics.jsonl").write_text(text)
    try:
        loaded = load_run(run)["metrics"]
    except (ValueError, FileNotFoundError) as err:
        assert str(run) in str(err)
        return
    assert loaded == ROWS[: len(loaded)] and loaded


@pytest.mark.parametrize(
    "name, content",
    [
        ("config.yaml", "a: [1"),
        ("config.yaml", "- 1\n- 2\n"),
        ("eval.json", "{"),
        ("eval.json", '{"x": 1}'),
        ("eval.json", '{"0": {"avg_at_k": "high"}}'),
        ("metrics.jsonl", ""),
    ],
)
def test_damaged_run_directory_files_are_named(tmp_path, name, content):
    """A damaged config.yaml or eval.json, or an empty metrics.jsonl, raises ValueError naming the run directory."""
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    (tmp_path / name).write_text(content)
    with pytest.raises(ValueError, match=str(tmp_path)):
        load_run(tmp_path)


def test_report_of_missing_directory_and_of_a_sparse_run(tmp_path, capsys):
    """`report` on a missing directory is a one-line CLI error; a run whose rows lack the entropy keys still gets
    its report (with 'not logged' in their place) instead of an IndexError."""
    from entropy_rft.commands.cli import main
    from entropy_rft.commands.report import build_report

    with pytest.raises(SystemExit):
        main(["report", str(tmp_path / "nowhere"), "--out", str(tmp_path / "rep")])
    assert "nowhere" in capsys.readouterr().err
    run = tmp_path / "sparse"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 1, "reward_mean": 0.5}\n{"step": 2, "reward_mean": 0.7}\n')
    (run / "config.yaml").write_text("method: clip_b\nmu: 2.0\n")
    page = build_report([run], tmp_path / "rep").read_text()
    assert "| sparse | clip_b | 2.0 | 2 | not logged | not logged | not evaluated |" in page
