"""Math dataset loaders: every published schema reads to the same problems, the DAPO500 split is deterministic,
and nothing reaches for the network."""

import json

import pytest
from conftest import FIXTURES

from entropy_rft.tasks.data import dapo_split, detect_schema, load_math, read_rows, to_problems, write_jsonl
from entropy_rft.tasks.math import MathProblem

MATH = FIXTURES / "math"
pytest.importorskip("pyarrow")


def test_dapo_original_and_openr1_schemas_agree():
    """The original DAPO parquet (repeated rows, templated messages) and open-r1's processed copy give the same
    deduplicated problems with the template stripped."""
    _, original = load_math(f"dapo17k={MATH / 'dapo17k.parquet'}")
    _, openr1 = load_math(f"dapo17k={MATH / 'dapo_openr1.parquet'}")
    assert len(read_rows(MATH / "dapo17k.parquet")) == 36 and len(original) == 12
    assert [(p.question, p.answer, p.id) for p in original] == [(p.question, p.answer, p.id) for p in openr1]
    assert original[0].question == "What is $1 + 2$?" and original[0].answer == "3"
    assert not any("Answer:" in p.question for p in original)


def test_aime_and_amc_schemas():
    """AIME24 (H4), AIME25 (math-ai) and AMC23 rows; AMC's float answers read as integers."""
    name, aime24 = load_math(str(MATH / "aime24.parquet"))
    assert name == "aime24" and len(aime24) == 4 and aime24[0].id == "60" and aime24[0].answer == "3"
    _, aime25 = load_math(f"aime25={MATH / 'aime25.jsonl'}")
    assert [p.answer for p in aime25] == ["19", "23", "\\frac{1}{2}", "2\\sqrt{3}"]
    _, amc = load_math(f"amc23={MATH / 'amc23.parquet'}")
    assert [p.answer for p in amc] == ["3", "7", "11", "15", "19", "23"]


def test_schema_detection_names_the_columns_on_failure():
    """An unknown layout fails with its columns listed."""
    assert detect_schema({"question": "q", "answer": "1"}) == "entropy_rft"
    with pytest.raises(ValueError, match=r"columns \['text'\]"):
        detect_schema({"text": "hello"})


def test_dapo500_split_is_deterministic_and_order_free():
    """The held-out split depends only on the question texts and the seed: a shuffled copy gives the same split,
    the two parts are disjoint and cover everything, and another seed gives another split."""
    _, problems = load_math(f"dapo17k={MATH / 'dapo17k.parquet'}")
    held, train = dapo_split(problems, size=4, seed=0)
    held2, train2 = dapo_split(list(reversed(problems)), size=4, seed=0)
    assert {p.question for p in held} == {p.question for p in held2}
    assert len(held) == 4 and len(train) == 8
    assert {p.question for p in held} | {p.question for p in train} == {p.question for p in problems}
    assert not {p.question for p in held} & {p.question for p in train}
    assert {p.question for p in dapo_split(problems, size=4, seed=1)[0]} != {p.question for p in held}


def test_named_datasets_from_a_local_directory(tmp_path):
    """Named datasets resolve to copies under data_dir; dapo500 and dapo_train are cut from a dapo17k copy."""
    (tmp_path / "dapo17k.parquet").write_bytes((MATH / "dapo17k.parquet").read_bytes())
    (tmp_path / "aime25.jsonl").write_text((MATH / "aime25.jsonl").read_text())
    _, held = load_math("dapo500", data_dir=tmp_path, dapo500_size=4)
    _, train = load_math("dapo_train", data_dir=tmp_path, dapo500_size=4)
    assert len(held) == 4 and len(train) == 8
    assert len(load_math("aime25", data_dir=tmp_path)[1]) == 4
    # a saved split is read as it is, not split again
    write_jsonl(held, tmp_path / "dapo500.jsonl")
    assert [p.question for p in load_math("dapo500", data_dir=tmp_path)[1]] == [p.question for p in held]


def test_missing_dataset_offline_fails_with_the_fix(monkeypatch, tmp_path):
    """With no local copy and no network the error says how to pass a local copy (the hub is never reached in
    tests: HF_HUB_OFFLINE is set)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(FileNotFoundError, match="--data NAME=/data/copy"):
        load_math("aime24", data_dir=tmp_path)
    with pytest.raises(FileNotFoundError, match="neither a known dataset"):
        load_math("no_such_thing")


def test_jsonl_round_trip_keeps_extra_fields(tmp_path):
    """Problems written with extra keys (pass rates) read back equal, extras included."""
    problems = [MathProblem("q", "1", "a", "src", {"pass_rate": 0.5})]
    path = write_jsonl(problems, tmp_path / "x.jsonl")
    back = to_problems(read_rows(path), "x")
    assert back == problems and back[0].extra == {"pass_rate": 0.5}
    assert json.loads(path.read_text())["pass_rate"] == 0.5


def test_a_byte_order_mark_is_read_as_nothing(tmp_path):
    """A data file saved with a UTF-8 byte-order mark (Windows editors write one) reads as the same file without
    it: math .jsonl and .json files and countdown JSONL alike."""
    from entropy_rft.tasks import TASKS
    from entropy_rft.train.problems import load_problems

    rows = [{"question": "What is 1+1?", "answer": "2"}, {"question": "What is 2+2?", "answer": "4"}]
    lines = "".join(json.dumps(r) + "\n" for r in rows)
    for name, text in (("m.jsonl", lines), ("m.json", json.dumps(rows))):
        (tmp_path / name).write_text(text, encoding="utf-8")
        (tmp_path / f"bom-{name}").write_text(text, encoding="utf-8-sig")
        assert (tmp_path / f"bom-{name}").read_bytes()[:3] == b"\xef\xbb\xbf"
        assert read_rows(tmp_path / f"bom-{name}") == read_rows(tmp_path / name) == rows
    (tmp_path / "c.jsonl").write_text('{"numbers": [3, 7, 7], "target": 11}\n', encoding="utf-8-sig")
    assert [p.numbers for p in load_problems(tmp_path / "c.jsonl", TASKS.get("countdown"))] == [(3, 7, 7)]
