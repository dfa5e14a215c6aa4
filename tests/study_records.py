"""Checks shared by the real-model studies' committed-cell tests (test_real_lm_study.py, test_real_lm_warm.py): a
committed cell is its arm's registered settings, run whole, and a committed analysis is today's."""

from pathlib import Path

import pytest


def checkout_free(settings: dict) -> dict:
    """A cell's settings with its checkout's absolute data paths cut to the path inside the repository, and without
    its run directory (the cells ran in a worktree of the registered commit; the tests run wherever the repository
    is)."""
    out = dict(settings)
    for key in ("train_data", "eval_data"):
        name, path = out[key].split("=", 1)
        out[key] = f"{name}={path[path.index('benchmarks/') :]}"
    out.pop("out")
    return out


def assert_registered_settings(recorded: dict, registered: dict, key: str, where: Path | str) -> None:
    """A cell record's settings are the registered ones (today's config for its arm and seed), but for fields added
    to TrainConfig since the cells' code, which must sit at their defaults; its folder's key is their settings_key."""
    from entropy_rft.config import TrainConfig, settings_dict_key

    registered = checkout_free(registered)
    added = {k: registered.pop(k) for k in set(registered) - set(recorded)}  # fields newer than the cells
    assert added == {k: getattr(TrainConfig(), k) for k in added}, (where, added)  # at defaults: nothing changed
    assert checkout_free(recorded) == registered, where
    assert settings_dict_key(recorded) == key, where


def assert_steps_once(record: dict, rows: list[dict], curves, where: Path | str) -> None:
    """metrics.jsonl logs steps 1 to record["steps"] once each, in order (a resume lost or repeated none), and the
    record's curves are exactly those rows."""
    assert [r["step"] for r in rows] == list(range(1, record["steps"] + 1)), where
    for name in curves:
        assert record["curves"][name] == [r.get(name) for r in rows], (where, name)


def assert_close_json(a, b, path: str = "") -> None:
    """Two JSON values equal (a committed analysis and today's run of it), floats to 1e-12 relative (the summation
    order of another platform's kernels)."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), path
        for k in a:
            assert_close_json(a[k], b[k], f"{path}/{k}")
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            assert_close_json(x, y, f"{path}/{i}")
    elif isinstance(a, float) or isinstance(b, float):
        assert b == pytest.approx(a, rel=1e-12, abs=1e-15), path
    else:
        assert a == b, path
