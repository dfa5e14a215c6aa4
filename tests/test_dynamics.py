"""entropy_rft.core.dynamics against float64 brute force, autograd and verl's reference values."""

import math

import pytest
import torch
from conftest import f32, load_fixture

from entropy_rft.core.dynamics import (
    REGIONS,
    batch_covariance,
    batch_mean_entropy_change,
    corollary4_entropy_change,
    entropy_change_by_region,
    region_masks,
    theorem1_entropy_change,
    theorem2_entropy_change,
    token_stats,
    token_stats_from_hidden,
)


def brute(z: torch.Tensor, t: torch.Tensor):
    """The definitions, term by term, in float64: H, S_i = p_i (H + log p_i), S* = S_k, E_p[S] = sum_i p_i S_i."""
    z = z.double()
    lp = z.log_softmax(-1)
    p = lp.exp()
    h = -(p * lp).sum(-1)
    s = p * (h.unsqueeze(-1) + lp)
    return lp.gather(-1, t.unsqueeze(-1)).squeeze(-1), h, s.gather(-1, t.unsqueeze(-1)).squeeze(-1), (p * s).sum(-1)


def entropy64(z: torch.Tensor) -> torch.Tensor:
    lp = z.double().log_softmax(-1)
    return -(lp.exp() * lp).sum(-1)


@pytest.mark.parametrize("chunk_rows", [None, 1, 7])
def test_token_stats_matches_definitions_in_float64(chunk_rows):
    """All four statistics equal the term-by-term float64 definitions, for any row chunking."""
    z = torch.randn(5, 9, 301) * 4
    t = torch.randint(0, 301, (5, 9))
    st = token_stats(z, t, chunk_rows=chunk_rows)
    for got, want in zip((st.logp, st.entropy, st.s_star, st.s_expect), brute(z, t)):
        assert got.dtype == torch.float32 and got.shape == t.shape
        torch.testing.assert_close(got.double(), want, atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(st.s_centered, st.s_star - st.s_expect)


def test_temperature_divides_logits():
    """temperature T gives the statistics of softmax(z / T)."""
    z, t = torch.randn(4, 50) * 3, torch.randint(0, 50, (4,))
    a, b = token_stats(z, t, temperature=0.7), token_stats(z / 0.7, t)
    torch.testing.assert_close(a.entropy, b.entropy)
    torch.testing.assert_close(a.s_expect, b.s_expect)


def test_against_verl_entropy_and_logprobs():
    """Entropy and log p agree with verl's entropy_from_logits / logprobs_from_logits (fp64 reference for the
    large-offset cases, whose verl float32 values carry ~2.5e-3 cancellation error); E_p[S] agrees with necs."""
    for case in load_fixture("verl_entropy.json")["cases"]:
        z, t, out = f32(case["inputs"]["logits"]), torch.tensor(case["inputs"]["labels"]), case["outputs"]
        st = token_stats(z, t)
        torch.testing.assert_close(
            st.entropy.double(), torch.tensor(out["entropy_fp64_reference"], dtype=torch.float64), atol=2e-4, rtol=1e-5
        )
        torch.testing.assert_close(
            st.logp.double(), torch.tensor(out["logprobs_fp64_reference"], dtype=torch.float64), atol=2e-4, rtol=1e-5
        )
        if "offset" not in case["name"]:
            torch.testing.assert_close(st.entropy, f32(out["entropy"]), atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(st.s_expect, f32(out["necs"]), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_finite_for_masked_and_extreme_logits(dtype):
    """-inf-masked vocabulary entries, one-hot rows and huge magnitudes give finite statistics in every dtype."""
    z = torch.randn(6, 40) * 5
    z[0, 10:] = -math.inf  # masked vocabulary
    z[1] = -1e4
    z[1, 3] = 1e4  # one-hot
    z[2] *= 1e3  # extreme spread
    z[3] = 6e4 if dtype != torch.float16 else 6e4  # huge constant row (fp16 max ~6.5e4)
    z = z.to(dtype)
    t = torch.tensor([2, 3, 5, 0, 39, 11])
    st = token_stats(z, t)
    for v in (st.logp, st.entropy, st.s_star, st.s_expect):
        assert torch.isfinite(v).all(), v
    assert st.entropy[1].abs() < 1e-6 and st.s_star[1].abs() < 1e-6
    torch.testing.assert_close(st.entropy[3], torch.tensor(math.log(40.0)), atol=1e-4, rtol=0)
    ref = brute(z[0:1, :10].float(), t[0:1])
    torch.testing.assert_close(st.entropy[0].double(), ref[1][0], atol=1e-5, rtol=0)


def test_corollary1_centred_score_averages_to_zero_per_position():
    """Corollary 1, eq. 11: sum_k p_k (S_k - E_p[S]) = 0 at every position (all k enumerated)."""
    z = torch.randn(8, 30) * 3
    p = z.double().softmax(-1)
    for row in range(8):
        st = token_stats(z[row].expand(30, 30), torch.arange(30))
        assert abs(float((p[row] * st.s_centered.double()).sum())) < 1e-7


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("v_chunk,r_chunk", [(1, 3), (7, 1000), (64, 5), (4096, 1024)])
def test_streaming_equals_direct(dtype, v_chunk, r_chunk):
    """token_stats_from_hidden equals token_stats of the materialised logits for any tile sizes and dtypes."""
    h = (torch.randn(2, 11, 24)).to(dtype)
    w = (torch.randn(200, 24) / 3).to(dtype)
    t = torch.randint(0, 200, (2, 11))
    direct = token_stats((h @ w.T), t, temperature=0.9)
    stream = token_stats_from_hidden(h, w, t, temperature=0.9, vocab_chunk=v_chunk, row_chunk=r_chunk)
    tol = {torch.float32: 2e-5, torch.bfloat16: 2e-2, torch.float16: 2e-3}[dtype]
    for name in ("logp", "entropy", "s_star", "s_expect"):
        torch.testing.assert_close(getattr(stream, name), getattr(direct, name), atol=tol, rtol=tol)


def test_streaming_under_autocast_keeps_float32_arithmetic():
    """Under bf16 autocast only the logits' matmul runs in bf16: the tile arithmetic (exp, the row sums) stays
    float32, so the statistics equal float32 statistics of the bf16 logits. (On an H100 the row sums once ran in
    bf16 through autocast's bmm: an entropy error of 1e-3.)"""
    torch.manual_seed(0)
    h, w = torch.randn(64, 32), torch.randn(3000, 32) / 2
    t = torch.randint(0, 3000, (64,))
    logits = (h.bfloat16() @ w.bfloat16().T).float()
    direct = token_stats(logits, t)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        stream = token_stats_from_hidden(h, w, t, vocab_chunk=1024, row_chunk=16)
    for name in ("logp", "entropy", "s_star", "s_expect"):
        torch.testing.assert_close(getattr(stream, name), getattr(direct, name), atol=2e-5, rtol=2e-5)


def test_streaming_gradients_match_autograd_float64():
    """Gradients of log p and H through the streaming path equal autograd of the float64 definitions."""
    h = torch.randn(13, 8, dtype=torch.float64)
    w = torch.randn(50, 8, dtype=torch.float64)
    t = torch.randint(0, 50, (13,))
    g1, g2 = torch.randn(13, dtype=torch.float64), torch.randn(13, dtype=torch.float64)
    h1, w1 = h.float().requires_grad_(), w.float().requires_grad_()
    st = token_stats_from_hidden(h1, w1, t, temperature=1.3, vocab_chunk=16, row_chunk=4)
    (st.logp * g1.float() + st.entropy * g2.float()).sum().backward()
    h2, w2 = h.clone().requires_grad_(), w.clone().requires_grad_()
    lp, ent, _, _ = brute((h2 @ w2.T) / 1.3, t)
    (lp * g1 + ent * g2).sum().backward()
    torch.testing.assert_close(h1.grad.double(), h2.grad, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(w1.grad.double(), w2.grad, atol=1e-4, rtol=1e-4)


def test_entropy_gradient_is_minus_discriminator():
    """dH/dz_i = -S_i (the note's one-line Theorem 1): autograd through token_stats reproduces it."""
    z = (torch.randn(40) * 2).requires_grad_()
    st = token_stats(z.unsqueeze(0), torch.tensor([0]))
    st.entropy.sum().backward()
    lp = z.detach().double().log_softmax(-1)
    s = lp.exp() * (-(lp.exp() * lp).sum() + lp)
    torch.testing.assert_close(z.grad.double(), -s, atol=1e-6, rtol=1e-5)


def _errors(predict, exact, steps):
    return [abs(float(predict(a)) - float(exact(a))) for a in steps]


def test_theorem1_first_order_error_shrinks_quadratically():
    """Theorem 1: H(z + eps e_k) - H(z) = -eps S* + O(eps^2); halving eps quarters the error."""
    z = torch.randn(64, dtype=torch.float64) * 2
    for k in (0, int(z.argmax()), int(z.argmin())):
        st = token_stats(z.float().unsqueeze(0), torch.tensor([k]))
        s_star = brute(z.unsqueeze(0), torch.tensor([k]))[2][0]
        torch.testing.assert_close(st.s_star[0].double(), s_star, atol=1e-6, rtol=1e-5)
        eps = [0.1 / 2**i for i in range(5)]
        dz = torch.zeros_like(z)
        dz[k] = 1.0
        err = _errors(
            lambda e, s_star=s_star: theorem1_entropy_change(s_star, e),
            lambda e, z=z, dz=dz: entropy64(z + e * dz) - entropy64(z),
            eps,
        )
        ratios = [err[i] / err[i + 1] for i in range(4)]
        assert all(3.5 < r < 4.5 for r in ratios), ratios


def test_theorem2_grpo_step_first_order():
    """Theorem 2: one gradient step of r A log p_k moves the logits by alpha (e_k - p), and the entropy change
    is -alpha S_c + O(alpha^2), for positive and negative alpha."""
    z = torch.randn(128, dtype=torch.float64) * 1.5
    k = 7
    lp, h, s_star, s_exp = brute(z.unsqueeze(0), torch.tensor([k]))
    p = z.softmax(-1)
    e_k = torch.zeros_like(z)
    e_k[k] = 1
    zr = z.clone().requires_grad_()
    zr.log_softmax(-1)[k].backward()
    torch.testing.assert_close(zr.grad, e_k - p)  # eq. 9
    for sign in (1.0, -1.0):
        alphas = [sign * 0.2 / 2**i for i in range(5)]
        err = _errors(
            lambda a: theorem2_entropy_change(s_star[0] - s_exp[0], a),
            lambda a: entropy64(z + a * (e_k - p)) - entropy64(z),
            alphas,
        )
        assert all(3.5 < err[i] / err[i + 1] < 4.5 for i in range(4)), err


def test_corollary4_batch_covariance_form():
    """Corollary 4/4.1: -lr Cov_B(A, r S_c) equals -lr (E_B[A r S_c] - E_B[A] E_B[r S_c]) over valid tokens,
    and masked positions never change it."""
    adv = torch.randn(6)
    sc = torch.randn(6, 10)
    r = torch.rand(6, 10) + 0.5
    mask = torch.rand(6, 10) > 0.3
    a = adv.unsqueeze(-1).expand(6, 10)[mask].double()
    x = (r * sc)[mask].double()
    want = -0.01 * ((a * x).mean() - a.mean() * x.mean())
    got = corollary4_entropy_change(adv, sc, mask, lr=0.01, ratio=r)
    torch.testing.assert_close(got.double(), want, atol=1e-7, rtol=1e-5)
    torch.testing.assert_close(
        batch_mean_entropy_change(adv, sc, mask, lr=0.01, ratio=r).double(),
        -0.01 * (a * x).mean(),
        atol=1e-7,
        rtol=1e-5,
    )
    sc2 = sc.clone()
    sc2[~mask] = 1e6
    torch.testing.assert_close(corollary4_entropy_change(adv, sc2, mask, lr=0.01, ratio=r), got)
    assert batch_covariance(torch.ones(3), torch.randn(3), torch.ones(3, dtype=torch.bool)).abs() < 1e-7


def test_corollary2_on_policy_batch_mean_near_zero():
    """Corollary 2: with tokens sampled from p, the batch mean of S_c is about 0 while the mean of S* is not."""
    g = torch.Generator().manual_seed(1)
    z = torch.randn(20000, 50, generator=g) * 2
    t = torch.multinomial(z.softmax(-1), 1, generator=g).squeeze(-1)
    st = token_stats(z, t)
    assert abs(float(st.s_centered.mean())) < 5 * float(st.s_centered.std()) / math.sqrt(20000)
    assert float(st.s_star.mean()) > 10 * abs(float(st.s_centered.mean()))


def test_bad_inputs_name_the_problem():
    """Shape mismatches and out-of-vocabulary ids raise with the cause in the message."""
    with pytest.raises(ValueError, match="do not match"):
        token_stats(torch.randn(2, 3, 10), torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        token_stats(torch.randn(2, 10), torch.tensor([3, 10]))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        token_stats_from_hidden(torch.randn(2, 4), torch.randn(10, 4), torch.tensor([-1, 2]))
    with pytest.raises(TypeError, match="integer"):
        token_stats(torch.randn(2, 10), torch.tensor([1.0, 2.0]))


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.extra.numpy import arrays  # noqa: E402


@settings(max_examples=60, deadline=None)
@given(
    arrays(
        dtype=float,
        shape=st.tuples(st.integers(1, 4), st.integers(2, 40)),
        elements=st.floats(-1e4, 1e4, allow_nan=False, width=32),
    ),
    st.integers(0, 10**6),
)
def test_any_finite_logits_give_valid_statistics(z, seed):
    """For any finite logits: statistics are finite, 0 <= H <= log V, log p <= 0, and Corollary 1 holds (the
    p-weighted mean of S_c over every possible token is 0, up to float32 rounding)."""
    logits = torch.tensor(z, dtype=torch.float32)
    rows, vocab = logits.shape
    tokens = torch.randint(0, vocab, (rows,), generator=torch.Generator().manual_seed(seed))
    s = token_stats(logits, tokens)
    for v in (s.logp, s.entropy, s.s_star, s.s_expect):
        assert torch.isfinite(v).all()
    assert (s.entropy >= -1e-5).all() and (s.entropy <= math.log(vocab) + 1e-4).all() and (s.logp <= 1e-6).all()
    every = token_stats(logits.repeat_interleave(vocab, 0), torch.arange(vocab).repeat(rows))
    p = logits.double().softmax(-1).flatten()
    per_row = (p * every.s_centered.double()).view(rows, vocab).sum(-1)
    assert per_row.abs().max() < 1e-5


def _regions_by_loop(adv, s_star, sc, mask, step):
    """Corollary 4's terms token by token in float64 (-step_t A_t (S_c,t - mean S_c over the mask) / |T|), each
    added to its region by a Python if-chain on the signs of A and S*."""
    toks = [(b, t) for b in range(mask.shape[0]) for t in range(mask.shape[1]) if mask[b, t]]
    n = len(toks)
    mean_sc = sum(float(sc[b, t]) for b, t in toks) / n
    out = dict.fromkeys(REGIONS, 0.0)
    for b, t in toks:
        a = float(adv[b])
        size = float(step[b, t]) if isinstance(step, torch.Tensor) else step
        if a == 0:
            continue
        region = ("pos" if a > 0 else "neg") + ("_likely" if float(s_star[b, t]) > 0 else "_unlikely")
        out[region] += -size * a * (float(sc[b, t]) - mean_sc) / n
    return out


@pytest.mark.parametrize("tensor_step", [False, True])
def test_entropy_change_by_region_splits_corollary4(tensor_step):
    """The four regions equal a token-by-token float64 loop and sum to corollary4_entropy_change with the same step:
    to float64 rounding for a per-token step (both float64), and, for a constant step (Corollary 4 then runs in
    float32 through batch_covariance), within 8 n u32 step E_T[(|A| + |E A|)(|S_c| + |E S_c|)] (the float32 sums'
    rounding bound, u32 = 2^-24); tokens with A = 0 and masked positions add nothing."""
    g = torch.Generator().manual_seed(3)
    adv = torch.randn(8, generator=g)
    adv[2] = 0.0  # a zero-advantage row: in no region
    s_star, sc = torch.randn(8, 12, generator=g), torch.randn(8, 12, generator=g)
    mask = torch.rand(8, 12, generator=g) > 0.25
    step = torch.rand(8, 12, generator=g, dtype=torch.float64) * 1e-3 * mask if tensor_step else 1e-3 / 7
    got = entropy_change_by_region(adv, s_star, sc, mask, step=step)
    want = _regions_by_loop(adv, s_star, sc, mask, step)
    assert set(got) == set(REGIONS)
    for name in REGIONS:
        assert float(got[name]) == pytest.approx(want[name], rel=1e-12, abs=1e-18)
    total = float(sum(got.values()))
    predicted = float(corollary4_entropy_change(adv, sc, mask, lr=0.0 if tensor_step else 1.0, step=step))
    a = adv.unsqueeze(-1).expand(8, 12)[mask].double()
    s = sc[mask].double()
    n = a.numel()
    if tensor_step:
        tol = 4 * n * 2.0**-53 * float((step[mask] * a.abs() * (s - s.mean()).abs()).sum() / n)
    else:
        tol = 8 * n * 2.0**-24 * step * float(((a.abs() + a.mean().abs()) * (s.abs() + s.mean().abs())).mean())
    assert abs(total - predicted) <= tol
    sc2, s_star2 = sc.clone(), s_star.clone()
    sc2[~mask], s_star2[~mask] = 1e6, -1e6
    again = entropy_change_by_region(adv, s_star2, sc2, mask, step=step)
    assert all(float(again[k]) == float(got[k]) for k in REGIONS)
    masks = region_masks(adv, s_star, mask)
    assert not any(bool(m[2].any()) for m in masks.values())  # A = 0: in no region
    assert int(sum(m.long() for m in masks.values()).max()) <= 1
