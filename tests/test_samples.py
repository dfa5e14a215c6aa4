"""Token-level samples (entropy_rft/samples.py): each token's term of the step's entropy change against a float64
loop, the group choice, token texts of byte-level tokenizers, the size bound, atomic files and the cut on resume."""

import gzip
import json
import math

import pytest
import torch

from entropy_rft import samples
from entropy_rft.core.dynamics import TokenStats, batch_mean_entropy_change, corollary4_entropy_change


class ListTokenizer:
    """A tokenizer whose token i decodes to vocab[i] (any text: markup, control characters, long runs)."""

    def __init__(self, vocab):
        self.vocab = list(vocab)

    def decode(self, ids, **kw):
        return "".join(self.vocab[i] for i in ids)

    def batch_decode(self, seqs, **kw):
        return [self.decode(ids) for ids in seqs]


def random_batch(groups=3, group_size=4, width=6, seed=0, token_level=False):
    """A batch of random statistics, right-padded responses of random lengths, a random keep mask."""
    g = torch.Generator().manual_seed(seed)
    b = groups * group_size
    lengths = torch.randint(1, width + 1, (b,), generator=g)
    mask = torch.arange(width)[None, :] < lengths[:, None]
    stats = TokenStats(
        -torch.rand(b, width, generator=g) * 3,
        torch.rand(b, width, generator=g) * 2,
        torch.randn(b, width, generator=g) * 0.3,
        torch.randn(b, width, generator=g) * 0.1,
    )
    rewards = torch.randint(0, 2, (b,), generator=g).float()
    rewards[:group_size] = 1.0  # group 0 has equal rewards: it goes last in the choice
    adv = torch.randn(b, width, generator=g) if token_level else torch.randn(b, generator=g)
    keep = torch.rand(b, width, generator=g) > 0.25
    return dict(
        prompt_ids=torch.randint(0, 5, (b, 3), generator=g),
        prompt_mask=torch.ones(b, 3, dtype=torch.bool),
        response_ids=torch.randint(0, 5, (b, width), generator=g),
        response_mask=mask,
        finished=lengths < width,
        stats=stats,
        advantages=adv,
        keep=keep,
        rewards=rewards,
        group_size=group_size,
    )


def test_due_steps():
    """Step 1, every N-th step and the last one are sampled; samples_every 0 samples none."""
    assert [s for s in range(1, 26) if samples.due(s, 10, last=25)] == [1, 10, 20, 25]
    assert not any(samples.due(s, 0, last=5) for s in range(1, 6))


def test_groups_with_mixed_rewards_come_first():
    """choose_groups lists groups whose rewards differ before uniform ones, each in batch order; 0 takes all."""
    rewards = torch.tensor([1, 1, 0, 1, 0, 0, 1, 0.5])  # groups of 2: uniform, mixed, uniform, mixed
    assert samples.choose_groups(rewards, 2, 0) == [1, 3, 0, 2]
    assert samples.choose_groups(rewards, 2, 3) == [1, 3, 0]


@pytest.mark.parametrize("token_level", [False, True])
def test_terms_equal_a_float64_loop_and_sum_to_eq23(token_level):
    """Every group written: each token's term is -step A S_c / |T| (a float64 loop over the tokens) on kept
    tokens and 0 on clipped ones; their sum is eq. 23 (dynamics.batch_mean_entropy_change), and eq. 23 plus the
    recorded dropped term is Corollary 4 (dynamics.corollary4_entropy_change). Numbers are stored to 7 significant
    digits, so each term is within 1e-6 of the loop relative to its size, and sums within 1e-6 of sum |term|."""
    batch = random_batch(token_level=token_level)
    step = 1e-3 / 37.0
    rec = samples.build_record(
        samples.SampleBatch(tokenizer=ListTokenizer("abcde"), step_size=step, **batch), step=4, groups=0
    )
    stats, adv, keep, mask = batch["stats"], batch["advantages"], batch["keep"], batch["response_mask"]
    loss_mask = mask & keep
    n = int(loss_mask.sum())
    total, size = 0.0, 0.0
    written = 0
    for grp in rec["groups"]:
        for resp in grp["responses"]:
            i = resp["row"]
            assert resp["length"] == int(mask[i].sum()) == len(resp["term"])
            for t in range(resp["length"]):
                a = float(adv[i, t]) if token_level else float(adv[i])
                want = (
                    -step * a * (float(stats.s_star[i, t]) - float(stats.s_expect[i, t])) / n
                    if loss_mask[i, t]
                    else 0.0
                )
                assert resp["term"][t] == pytest.approx(want, rel=1e-6, abs=1e-30)
                assert resp["kept"][t] == int(loss_mask[i, t])
                total += resp["term"][t]
                size += abs(resp["term"][t])
                written += 1
    assert written == int(mask.sum())
    eq23 = float(batch_mean_entropy_change(adv, stats.s_centered.double(), loss_mask, lr=step))
    cor4 = float(corollary4_entropy_change(adv.double(), stats.s_centered.double(), loss_mask, lr=step))
    ec = rec["entropy_change"]
    assert total == pytest.approx(eq23, abs=1e-6 * size)
    assert ec["eq23"] == pytest.approx(eq23, abs=1e-6 * size)
    assert ec["eq23"] + ec["dropped_term"] == pytest.approx(cor4, abs=1e-6 * size)
    assert ec["corollary4"] == pytest.approx(cor4, abs=1e-6 * size)
    assert ec["dropped_term"] != pytest.approx(0.0, abs=1e-3 * size)  # the two forms differ here: the check can tell


def test_per_row_step_sizes_and_would_be_terms():
    """A step size per row (TRL's grpo loss: each row's token mean) gives term_t = -step_row A S_c / |T|; a clipped
    token's would-be term -term_scale A S_c is what it adds when kept (same step, same |T| otherwise)."""
    batch = random_batch(seed=1)
    rows = batch["rewards"].numel()
    step = torch.linspace(1e-4, 5e-4, rows, dtype=torch.float64)
    rec = samples.build_record(
        samples.SampleBatch(tokenizer=ListTokenizer("abcde"), step_size=step, **batch), step=1, groups=0
    )
    n = rec["entropy_change"]["tokens_in_mean"]
    sc = batch["stats"].s_centered
    # Corollary 4 with a step per row: -E_T[step A (S_c - E_T[S_c])], by a loop over the kept tokens
    kept_mask = batch["response_mask"] & batch["keep"]
    cells = [(i, t) for i in range(rows) for t in range(sc.shape[1]) if kept_mask[i, t]]
    mean_s = sum(float(sc[i, t]) for i, t in cells) / len(cells)
    cor4 = -sum(float(step[i]) * float(batch["advantages"][i]) * (float(sc[i, t]) - mean_s) for i, t in cells) / len(
        cells
    )
    assert rec["entropy_change"]["corollary4"] == pytest.approx(cor4, rel=1e-5)
    assert "step_size" not in rec["entropy_change"]  # no single step size
    for grp in rec["groups"]:
        for resp in grp["responses"]:
            i = resp["row"]
            assert resp["term_scale"] == pytest.approx(float(step[i]) / n, rel=1e-6)
            for t, kept in enumerate(resp["kept"]):
                would = -resp["term_scale"] * resp["advantage"] * resp["s_centered"][t]
                assert would == pytest.approx(
                    -float(step[i]) * float(batch["advantages"][i]) * float(sc[i, t]) / n, rel=1e-5
                )
                assert resp["term"][t] == (pytest.approx(would, rel=1e-5) if kept else 0.0)


def test_top_lists_are_the_extreme_terms_of_the_whole_batch():
    """`raise` holds the k largest positive terms of the batch in order, `lower` the k most negative, `removed` the
    clipped tokens with the largest |would-be term|: brute force over every (row, position)."""
    batch = random_batch(groups=4, width=8, seed=2)
    rec = samples.build_record(
        samples.SampleBatch(tokenizer=ListTokenizer("abcde"), step_size=1e-2, **batch), step=1, groups=1
    )
    full = samples.build_record(
        samples.SampleBatch(tokenizer=ListTokenizer("abcde"), step_size=1e-2, **batch), step=1, groups=0
    )
    terms = [
        (r["term"][t], r["row"], t, r["kept"][t], -r["term_scale"] * r["advantage"] * r["s_centered"][t])
        for g in full["groups"]
        for r in g["responses"]
        for t in range(r["length"])
    ]
    k = samples.TOP_TOKENS
    want_raise = sorted([x for x in terms if x[3] and x[0] > 0], key=lambda x: -x[0])[:k]
    want_lower = sorted([x for x in terms if x[3] and x[0] < 0], key=lambda x: x[0])[:k]
    want_removed = sorted([x for x in terms if not x[3]], key=lambda x: -abs(x[4]))[:k]
    for name, want in (("raise", want_raise), ("lower", want_lower), ("removed", want_removed)):
        got = rec["top"][name]
        assert [(e["row"], e["position"]) for e in got] == [(x[1], x[2]) for x in want], name
        assert [e["written"] for e in got] == [x[1] in {r["row"] for r in rec["groups"][0]["responses"]} for x in want]
    assert [g["index"] for g in rec["groups"]] == samples.choose_groups(batch["rewards"], 4, 1) != [0]  # not uniform


def test_byte_level_tokens_get_whole_characters():
    """A byte-level BPE with no merges splits 'é' and '€' into 2 and 3 byte tokens: the first token of each
    character shows it, the continuation tokens show "" (module departure 3); ASCII tokens are themselves."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    core = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(tokenizer_object=core)
    ids = tok.encode("aé€b", add_special_tokens=False)
    assert len(ids) == 1 + 2 + 3 + 1
    assert samples.token_texts(tok, ids) == ["a", "é", "", "€", "", "", "b"]


def test_files_stay_under_the_size_bound():
    """A worst case for the bound: every token and the prompt decode to control characters (6 JSON bytes each), cut at
    MAX_TEXT_CHARS and MAX_PROMPT_CHARS, responses of max_tokens, token-level advantages. The record's JSON stays
    under size_bound and fills at least half of it (the bound is not vacuous)."""
    groups, g, width = 2, 3, 40
    batch = random_batch(groups=groups, group_size=g, width=width, seed=3, token_level=True)
    batch["response_mask"][:] = True
    batch["rewards"] = torch.arange(groups * g, dtype=torch.float32)
    tok = ListTokenizer(["\x01" * 5000] * 5)
    rec = samples.build_record(
        samples.SampleBatch(tokenizer=tok, step_size=-1.234567e-300, **batch),
        step=1,
        groups=groups,
        max_tokens=width,
        info={"method": "s_sign:retain:pos_s:neg_samples"},
    )
    size = len(json.dumps(rec, ensure_ascii=False, separators=(",", ":")).encode())
    bound = samples.size_bound(groups, g, width)
    assert bound / 2 < size <= bound


def test_write_is_atomic_and_resume_cuts_later_steps(tmp_path):
    """write_record leaves only the named file (no temporary), gives the same bytes for the same record and reads
    back equal; cut_after(S) removes the files of steps after S and a temporary a kill left, nothing else; a
    damaged file is refused with its path."""
    batch = random_batch()
    for step in (1, 2, 3, 10):
        samples.write_record(
            tmp_path,
            samples.build_record(
                samples.SampleBatch(tokenizer=ListTokenizer("abcde"), step_size=1e-3, **batch), step=step, groups=2
            ),
        )
    folder = tmp_path / "samples"
    assert sorted(p.name for p in folder.iterdir()) == [samples.file_name(s) for s in (1, 2, 3, 10)]
    first = (folder / samples.file_name(1)).read_bytes()
    rec = samples.read_record(folder / samples.file_name(1))
    samples.write_record(tmp_path, rec)
    assert (folder / samples.file_name(1)).read_bytes() == first
    assert json.loads(gzip.decompress(first)) == rec
    (folder / ".step-000011.json.gz.123.tmp").write_bytes(b"half")
    assert samples.cut_after(tmp_path, 2) == [3, 10]
    assert samples.steps_written(tmp_path) == [1, 2] and len(list(folder.iterdir())) == 2
    (folder / samples.file_name(2)).write_bytes(b"not gzip")
    with pytest.raises(ValueError, match="step-000002.json.gz is not a readable samples file"):
        samples.read_samples(tmp_path)
    assert samples.cut_after(tmp_path, 0) == [1, 2] and samples.steps_written(tmp_path) == []


def test_numbers_are_rounded_and_finite():
    """Stored numbers carry 7 significant digits, -0.0 is stored as 0.0 and NaN as null (JSON has no NaN)."""
    assert samples._num(1.2345678901) == 1.234568
    assert math.copysign(1, samples._num(-0.0)) == 1
    assert samples._num(float("nan")) is None


def test_write_step_writes_the_record_with_clean_metrics_and_marks(tmp_path):
    """write_step writes the step's record with the host's info, the step's METRIC_KEYS only, a NaN metric as null (a
    JSON file cannot hold NaN, and a run must not stop on it), the step size it is given, and each mark (listed in
    `marks`, a 0/1 flag per written token from its row of the mask)."""
    batch = samples.SampleBatch(tokenizer=ListTokenizer("abcde"), step_size=1e-3 / 50.0, **random_batch())
    metrics = {"entropy": 0.5, "entropy_change/realised": float("nan"), "loss/policy": 1.0}
    marked = torch.zeros_like(batch.keep)
    marked[:, 0] = True
    info = {"source": "trainer", "method": "clip_b", "lr": 1e-3, "loss_agg": "token-mean"}
    for step in (1, 10):
        samples.write_step(tmp_path, step, batch, groups=2, info=info, metrics=metrics, marks=[("m", marked, "x")])
    assert samples.steps_written(tmp_path) == [1, 10]
    rec = samples.read_samples(tmp_path)[10]
    assert rec["metrics"] == {"entropy": 0.5, "entropy_change/realised": None}
    assert rec["entropy_change"]["step_size"] == pytest.approx(1e-3 / 50.0) and rec["method"] == "clip_b"
    assert list(rec)[:7] == ["format", "version", "step", "source", "method", "lr", "loss_agg"]
    assert rec["marks"] == [{"key": "m", "label": "x"}]
    assert all(r["m"] == [1] + [0] * (len(r["text"]) - 1) for g in rec["groups"] for r in g["responses"])
