"""The countdown5_large split (issue 31; toy.build_pool): an 8,000-problem training pool filtered with the shipped
policy as countdown5 is filtered, and 1,000 held-out problems with an initial-difficulty stratum. Checked: the
stratum rule against its definition, a small build against itself (bytes), a larger build (prefix) and independent
re-sampling (the filter's and the strata's counts), and the shipped files (sizes, the filter rule, strata, no
overlap, no duplicates, the first rows regenerated from the seed)."""

import json
from pathlib import Path

import pytest
import torch

from entropy_rft.evaluate import sample_correctness
from entropy_rft.tasks import TASKS
from entropy_rft.tasks.countdown import Problem, random_problem
from entropy_rft.toy import PARTIAL, STRATA, PoolConfig, _PoolState, build_pool, stratum
from entropy_rft.train.policy import load_policy
from entropy_rft.train.problems import SHIPPED_DATA, default_data

SHIPPED = SHIPPED_DATA["countdown5_large"]


@pytest.fixture(scope="module")
def engine():
    from entropy_rft.rollout import HFEngine

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the shipped split was sampled with one thread (build.json "threads")
    model, tok = load_policy("countdown-tiny", torch.device("cpu"))
    yield HFEngine(model, tok)
    torch.set_num_threads(threads)


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def test_stratum_follows_its_definition():
    """stratum(c, n): 'unsolved' iff c = 0, 'hard' iff 0 < c / n < 1/4, else 'easier'; checked for every c of n = 64
    and n = 7 against the rule written with integer arithmetic (4 c < n), and bad counts are refused."""
    for n in (64, 7):
        for c in range(n + 1):
            want = "unsolved" if c == 0 else "hard" if 4 * c < n else "easier"
            assert stratum(c, n) == want
    assert STRATA == ("unsolved", "hard", "easier")
    for c, n in ((-1, 64), (65, 64), (0, 0)):
        with pytest.raises(ValueError, match="0 <= correct <= n"):
            stratum(c, n)


@pytest.mark.slow
def test_small_build_is_deterministic_a_prefix_and_resamples_to_the_same_counts(engine, tmp_path):
    """Two builds with the same settings write the same bytes; a build keeping more training problems starts with
    the smaller one's rows; every kept problem's pass rate, sampled again with its chunk's seed, is the recorded one
    and lies strictly between 1/16 and 15/16, and every dropped candidate of that chunk lies outside; each evaluation
    problem's stratum comes from its correct count at 64 samples, sampled again; train and eval share no problem and
    neither repeats one (puzzles told apart by identity: sorted numbers and target)."""
    cfg = PoolConfig(n_train=12, n_eval=10, chunk=24)
    build_pool(engine, tmp_path / "a", cfg)
    build_pool(engine, tmp_path / "b", cfg)
    for name in ("train.jsonl", "eval.jsonl"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    more = PoolConfig(n_train=30, n_eval=10, chunk=24)
    info = build_pool(engine, tmp_path / "c", more)
    train, bigger = rows(tmp_path / "a" / "train.jsonl"), rows(tmp_path / "c" / "train.jsonl")
    assert len(train) == 12 and len(bigger) == 30 and bigger[:12] == train
    assert rows(tmp_path / "c" / "eval.jsonl") == rows(tmp_path / "a" / "eval.jsonl")

    # the filter, re-sampled: chunk 0 is the first 24 candidates of the stream, which skips the eval problems
    import random

    evals = rows(tmp_path / "c" / "eval.jsonl")
    seen, rng, candidates = {Problem.from_json(r).identity for r in evals}, random.Random(cfg.seed * 1000 + 33), []
    while len(candidates) < cfg.chunk:
        p = random_problem(rng, n_numbers=5)
        if p.identity not in seen:
            seen.add(p.identity)
            candidates.append(p)
    task = TASKS.get("countdown5_large")
    got, _ = sample_correctness(
        engine, task, candidates, n=16, temperature=1.0, max_new_tokens=16, seed=cfg.seed * 10**6 + 1000
    )
    kept = {Problem.from_json(r).identity: r["pass_rate"] for r in bigger}
    for p, c in zip(candidates, got):
        if 1 < sum(c) < 15:
            assert kept.get(p.identity) == sum(c) / 16
        else:
            assert p.identity not in kept
    assert all(1 / 16 < r["pass_rate"] < 15 / 16 and (16 * r["pass_rate"]).is_integer() for r in bigger)

    counts, _ = sample_correctness(
        engine,
        task,
        [Problem.from_json(r) for r in evals],
        n=64,
        temperature=0.7,
        max_new_tokens=16,
        seed=cfg.seed * 1000 + 32,
    )
    assert [r["initial_correct"] for r in evals] == [sum(c) for c in counts]
    assert [r["stratum"] for r in evals] == [stratum(sum(c), 64) for c in counts]
    keys_t = [Problem.from_json(r).identity for r in bigger]
    keys_e = [Problem.from_json(r).identity for r in evals]
    assert len(set(keys_t)) == len(keys_t) and len(set(keys_e)) == len(keys_e) and not set(keys_t) & set(keys_e)
    assert info["train"] == 30 and info["candidates"] == 24 * info["chunks"]
    assert sum(info["strata"].values()) == 10


@pytest.mark.slow
def test_a_stopped_build_resumes_to_the_unstopped_files(engine, tmp_path, monkeypatch):
    """A build stopped after its second chunk (the sampling call of the third raises, as a kill there would) resumes
    from the state it saved and writes the same train.jsonl and eval.jsonl bytes and build.json counts as a build
    never stopped; the saved state is removed when the build ends, and a state saved by other settings is not used."""
    import entropy_rft.evaluate as evaluate

    cfg = PoolConfig(n_train=30, n_eval=10, chunk=24)
    full = build_pool(engine, tmp_path / "full", cfg)
    assert not (tmp_path / "full" / PARTIAL).exists()

    real, calls = evaluate.sample_correctness, []

    def stop_at_third_chunk(*args, **kwargs):
        calls.append(kwargs["seed"])
        if len(calls) == 4:  # the evaluation set's call, then chunks 0, 1: stopped at chunk 2
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(evaluate, "sample_correctness", stop_at_third_chunk)
    with pytest.raises(KeyboardInterrupt):
        build_pool(engine, tmp_path / "stopped", cfg)
    assert (tmp_path / "stopped" / PARTIAL).exists() and not (tmp_path / "stopped" / "train.jsonl").exists()
    monkeypatch.setattr(evaluate, "sample_correctness", real)
    other = PoolConfig(n_train=30, n_eval=10, chunk=24, filter_samples=8)
    assert _PoolState.load(tmp_path / "stopped", other) is None  # other settings: started afresh
    assert _PoolState.load(tmp_path / "stopped", cfg).chunks == 2
    resumed = build_pool(engine, tmp_path / "stopped", cfg)
    for name in ("train.jsonl", "eval.jsonl"):
        assert (tmp_path / "stopped" / name).read_bytes() == (tmp_path / "full" / name).read_bytes()
    timings = ("seconds", "eval_seconds")
    assert {k: v for k, v in resumed.items() if k not in timings} == {k: v for k, v in full.items() if k not in timings}
    assert full["chunks"] >= 3 and not (tmp_path / "stopped" / PARTIAL).exists()


def test_shipped_split_sizes_filter_strata_and_disjointness():
    """The shipped countdown5_large: 8,000 training problems of five numbers, each with a pass rate strictly between
    1/16 and 15/16 in sixteenths; 1,000 evaluation problems whose stratum follows their count of 64; no puzzle twice
    and none in both (by identity: 8,000 and 1,000 distinct puzzles); each known solution scores correct; build.json's
    counts match the files; it is the task's default data."""
    from entropy_rft.config import load_config

    cfg = load_config(None, task="countdown5_large")
    assert default_data(cfg, "train") == SHIPPED / "train.jsonl" and default_data(cfg, "eval") == SHIPPED / "eval.jsonl"
    train, evals = rows(SHIPPED / "train.jsonl"), rows(SHIPPED / "eval.jsonl")
    assert len(train) == 8_000 and len(evals) == 1_000
    assert all(1 / 16 < r["pass_rate"] < 15 / 16 and (16 * r["pass_rate"]).is_integer() for r in train)
    assert all(r["stratum"] == stratum(r["initial_correct"], 64) for r in evals)
    task = TASKS.get("countdown5_large")
    problems = [Problem.from_json(r) for r in train + evals]
    assert all(len(p.numbers) == 5 for p in problems)
    keys_t, keys_e = {p.identity for p in problems[:8_000]}, {p.identity for p in problems[8_000:]}
    assert len(keys_t) == 8_000 and len(keys_e) == 1_000 and not keys_t & keys_e
    for p in problems[::50]:
        assert task.score(p.solution.split("=")[0] + f"={p.target}", True, p) == (1.0, True)
    build = json.loads((SHIPPED / "build.json").read_text())
    assert (build["train"], build["eval"]) == (8_000, 1_000)
    assert build["strata"] == {s: sum(r["stratum"] == s for r in evals) for s in STRATA}
    assert build["config"] == {**PoolConfig().__dict__}


@pytest.mark.slow
def test_shipped_split_regenerates_from_its_seed(engine, tmp_path):
    """The shipped files come from PoolConfig's defaults: a build keeping the first 40 training problems (one chunk
    of the stream; the 1,000 evaluation problems at 64 samples each, about 20 s on one thread) reproduces the shipped
    eval.jsonl and the first 40 rows of train.jsonl exactly, with the torch version and thread count the shipped
    build recorded."""
    build = json.loads((SHIPPED / "build.json").read_text())
    if build["torch"] != torch.__version__:
        pytest.skip(
            f"sampling is reproducible for one torch version: shipped {build['torch']}, here {torch.__version__}"
        )
    build_pool(engine, tmp_path, PoolConfig(n_train=40))
    assert (tmp_path / "eval.jsonl").read_bytes() == (SHIPPED / "eval.jsonl").read_bytes()
    assert rows(tmp_path / "train.jsonl") == rows(SHIPPED / "train.jsonl")[:40]
