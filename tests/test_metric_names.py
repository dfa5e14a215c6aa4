"""The metrics reference (entropy_rft/metric_names.py, published as docs/reference/metrics.md) against the keys real
runs write: every key a run of the built-in trainer puts in metrics.jsonl is in the list, and every key the list
gives the trainer is written by one of the runs here (so the list neither misses a key nor names one nobody logs).
The TRL monitor's keys are checked in tests/test_trl.py::test_monitor_writes_what_inspect_and_report_read and the
verl monitor's in tests/test_verl.py (their own environments)."""

from __future__ import annotations

import json

import pytest
import torch

from entropy_rft.config import load_config
from entropy_rft.metric_names import BY_NAME, METRICS, undocumented
from entropy_rft.train.trainer import train

# one run per family of keys: a filter of each score, a gated filter, token weights (STARE), a loss of its own
# (KL-Cov), the critic, an entropy bonus, the
# two entropy controls, and evaluation during training; every run probes every step
CASES = {
    "clip_b": {"method": "clip_b"},
    "clip_v": {"method": "clip_v"},
    "gated_clip_b": {"method": "clip_b", "entropy_gate": 0.3},
    "stare": {"method": "stare"},  # token weights: STARE's metrics and the reweighted share by region
    "rsi": {"method": "rsi", "rsi_upper_bound": 1.5},  # a filter reading log p and H
    "entrocraft": {"method": "entrocraft"},  # an advantage rule: its regime and band
    "grpo_dropout": {"method": "grpo_dropout"},  # a rollout rule: kept rollouts and pushes
    "tre_k": {"method": "tre_k"},  # TRE's bonus: loss/entropy_bonus
    "kl_cov": {"method": "kl_cov"},
    "ppo": {"method": "ppo"},
    "entropy_bonus": {"method": "entropy_bonus"},
    "mu_control": {"method": "clip_b", "entropy_target": 0.4},
    "pi_control": {"method": "grpo", "entropy_target": 0.4, "entropy_control": "pi"},
    "eval_every": {"method": "grpo", "eval_every": 1, "steps": 2},  # the last step's evaluation is the final one
}


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> dict[str, set[str]]:
    """case -> the keys its one-step run wrote to metrics.jsonl (the shipped policy, a batch of 2 x 4 responses)."""
    root, threads, out = tmp_path_factory.mktemp("metric-runs"), torch.get_num_threads(), {}
    torch.set_num_threads(1)  # the 0.8M-parameter policy: one thread is as fast and spares a shared machine
    try:
        for name, settings in CASES.items():
            base = dict(
                steps=1,
                prompts_per_step=2,
                group_size=4,
                lr=1e-4,
                eval_problems=2,
                eval_k=2,
                progress=False,
                probe_every=1,
                samples_every=0,
                out=str(root / name),
            )
            train(load_config(None, **{**base, **settings}))
            lines = (root / name / "metrics.jsonl").read_text().splitlines()
            out[name] = set().union(*(json.loads(line) for line in lines))
    finally:
        torch.set_num_threads(threads)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_every_key_a_run_writes_is_in_the_reference(written, case):
    """Property: no key of a real run's metrics.jsonl is missing from the list the reference is generated from."""
    assert undocumented(written[case], "trainer") == []


@pytest.mark.slow
def test_every_trainer_key_of_the_reference_is_written_by_some_run(written):
    """Property: the list names no trainer key that the runs above do not write (no stale or invented entry)."""
    seen = set().union(*written.values())
    assert [m.name for m in METRICS if "trainer" in m.writers and m.name not in seen] == []


def test_each_entry_is_complete_and_named_once():
    """Property: every entry has a meaning, a unit, when it is logged and a known writer; no name repeats."""
    assert len(BY_NAME) == len(METRICS)
    for m in METRICS:
        assert m.meaning and m.unit and m.when, m.name
        assert m.writers and set(m.writers) <= {"trainer", "trl", "verl"}, m.name


def test_undocumented_is_not_vacuous():
    """Property: a key outside the list, or one the list gives another writer only, is reported."""
    assert undocumented({"step", "entropy", "no_such/key"}) == ["no_such/key"]
    assert undocumented({"would_clip_b/frac"}, "trainer") == ["would_clip_b/frac"]
    assert undocumented({"would_clip_b/frac"}, "trl") == []
