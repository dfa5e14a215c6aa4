"""The training step's characterisation: 3 seeded CPU steps per method and entropy control, bit for bit.

Property: the metrics of every step (timings aside), the evaluations and the final weights of each case in
tests/golden.py equal the recorded ones exactly. Only a commit that says which values it moves and why may
rewrite tests/fixtures/golden_steps.json (`python tests/golden.py --write CASE`)."""

import json

import pytest

from golden import CASES, FIXTURE, platform, run_case

RECORD = json.loads(FIXTURE.read_text())


@pytest.mark.skipif(RECORD["platform"] != platform(),
                    reason=f"golden values are bit-exact on the platform that recorded them ({RECORD['platform']}); "
                           "rewrite them here with `python tests/golden.py --write`")
@pytest.mark.parametrize("name", list(CASES))
def test_golden_case(name, tmp_path):
    """The case's metrics lines, evaluations and final weights equal the recorded ones bit for bit."""
    want = RECORD["cases"][name]
    got = run_case(name, tmp_path)
    assert [row["step"] for row in got["metrics"]] == [1, 2, 3]
    for row, expected in zip(got["metrics"], want["metrics"]):
        moved = {k: (expected.get(k), row.get(k)) for k in set(row) | set(expected) if row.get(k) != expected.get(k)}
        assert not moved, f"step {row['step']}: {moved}"
    assert got["evals"] == want["evals"]
    assert got["weights"] == want["weights"]
