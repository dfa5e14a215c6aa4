"""diagnostics.watch_metrics, the monitor of an engine's own loss (TRL and verl adapters, method "none"): each metric
against a loop over the tokens in float64, on batches where Clip_B and Clip_V at their default mu drop tokens;
padding never changes a result."""

import pytest
import torch

from entropy_rft.core import masks
from entropy_rft.core.dynamics import TokenStats
from entropy_rft.core.losses import step_sizes
from entropy_rft.train.diagnostics import watch_metrics


def batch(seed=0, b=16, t=12):
    """Statistics with a few far outliers of S* and S_c on negative-advantage rows, so both filters act."""
    gen = torch.Generator().manual_seed(seed)
    mask = torch.rand(b, t, generator=gen) < 0.8
    mask[:, 0] = True
    logp = -torch.rand(b, t, generator=gen)
    entropy = torch.rand(b, t, generator=gen)
    s_star = 0.01 * torch.randn(b, t, generator=gen)
    s_expect = 0.01 * torch.randn(b, t, generator=gen)
    adv = torch.randn(b, generator=gen)
    adv[:2] = -1.0
    s_star[0, 0] = -5.0  # far below the batch mean: Clip_B (mu 2.5) drops it on a negative row
    s_expect[1, 0] = 5.0  # S_c = S* - E_p[S] far below: Clip_V (mu 8.5) drops it
    return TokenStats(logp, entropy, s_star, s_expect), adv, mask


def by_loop(stats, adv, mask, step):
    """The metrics written out token by token in float64 (diagnostics.watch_metrics' docstring)."""
    toks = [(b, t) for b in range(mask.shape[0]) for t in range(mask.shape[1]) if mask[b, t]]
    n = len(toks)
    sc = {k: float(stats.s_centered[k]) for k in toks}
    a = {k: float(adv[k[0]]) for k in toks}
    size = {k: float(step) if not torch.is_tensor(step) else float(step[k]) for k in toks}
    mean_sc, mean_a = sum(sc.values()) / n, sum(a.values()) / n
    out = {
        "entropy": sum(float(stats.entropy[k]) for k in toks) / n,
        "s_centered_mean": mean_sc,
        "cov_a_sc": sum((a[k] - mean_a) * (sc[k] - mean_sc) for k in toks) / n,
        "entropy_change/predicted": -sum(size[k] * a[k] * (sc[k] - mean_sc) for k in toks) / n,
    }
    for sign in ("pos", "neg"):  # the same sum over each region's tokens: A's sign x S* > 0 (likely) or <= 0
        for kind in ("likely", "unlikely"):
            region = [
                k
                for k in toks
                if (a[k] > 0 if sign == "pos" else a[k] < 0)
                and (float(stats.s_star[k]) > 0 if kind == "likely" else float(stats.s_star[k]) <= 0)
            ]
            out[f"entropy_change/by_region/{sign}_{kind}"] = (
                -sum(size[k] * a[k] * (sc[k] - mean_sc) for k in region) / n
            )
            out[f"clip_frac_by_region/{sign}_{kind}"] = 0.0  # the monitor's loss keeps every valid token here
    for name, keep in (
        ("clip_b", masks.clip_b(stats.s_star, adv, mask)[0]),
        ("clip_v", masks.clip_v(stats.s_centered, adv, mask)[0]),
    ):
        dropped = [k for k in toks if not keep[k]]
        out[f"would_{name}/frac"] = len(dropped) / n
        out[f"would_{name}/entropy_change"] = -sum(size[k] * a[k] * sc[k] for k in dropped) / n
    return out


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_metrics_by_loop(mode):
    """Every metric equals its loop (rel 1e-5: float32 statistics summed in another order), for a constant step
    (token-mean) and a per-token one (each row's token mean); both filters drop at least one token."""
    stats, adv, mask = batch()
    step = step_sizes(mask, mode, lr=0.1)
    got = watch_metrics(stats, adv, mask, mask, step)
    want = by_loop(stats, adv, mask, step)
    for key, value in want.items():
        assert got[key] == pytest.approx(value, rel=1e-5, abs=1e-12), key
    assert got["would_clip_b/frac"] > 0 and got["would_clip_v/frac"] > 0
    assert got["would_clip_b/entropy_change"] != 0 and got["would_clip_v/entropy_change"] != 0


def test_padding_never_changes_a_result():
    """Values at masked positions (and extra padded columns) leave every metric as it was."""
    stats, adv, mask = batch(1)
    step = step_sizes(mask, "seq-mean-token-mean", lr=0.1)
    base = watch_metrics(stats, adv, mask, mask, step)
    noisy = TokenStats(
        *(
            torch.where(mask, x, torch.full_like(x, 1e3))
            for x in (stats.logp, stats.entropy, stats.s_star, stats.s_expect)
        )
    )
    pad = lambda x, v=0: torch.nn.functional.pad(x, (0, 3), value=v)  # noqa: E731
    wide = TokenStats(*(pad(x, 7.0) for x in (noisy.logp, noisy.entropy, noisy.s_star, noisy.s_expect)))
    got = watch_metrics(wide, adv, pad(mask), pad(mask), pad(step))
    for key, value in base.items():
        assert got[key] == pytest.approx(value, rel=1e-6, abs=1e-15), key


def test_unknown_step_gives_no_prediction():
    """step None (a loss whose weights the adapter cannot know): the predictions are None, the rest still there."""
    stats, adv, mask = batch()
    got = watch_metrics(stats, adv, mask, mask, None)
    assert got["entropy_change/predicted"] is None and got["would_clip_b/entropy_change"] is None
    assert got["would_clip_b/frac"] > 0 and got["entropy"] > 0
