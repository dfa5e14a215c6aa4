"""TRE (arXiv 2602.03635) as method "tre_k": core.tre.top_entropy against the authors' entropy_from_logits run on fixed
logits (tests/fixtures/tre_oracle.json: values and gradients), the streamed form from hidden states against it,
brute-force definitions in float64, and the method by name in the trainer (its bonus is the top-K entropy)."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import f32, load_fixture
from tiny import tiny_config

from entropy_rft.config import load_config
from entropy_rft.core.methods import METHODS
from entropy_rft.core.tre import top_entropy, top_entropy_from_hidden

ORACLE = load_fixture("tre_oracle.json")


@pytest.mark.parametrize("case", ORACLE["cases"], ids=lambda c: c["name"])
def test_equals_the_authors_code(case):
    """TRE-K (K 1, 2, 3, 8), TRE-P (p 0.5, 0.9, 0.99, a vocabulary past the 256 cap, positions whose set is one token,
    a batch where every set is one token): values and the gradient of a weighted sum with respect to the logits equal
    the authors' to float32 rounding."""
    z = f32(case["inputs"]["logits"]).requires_grad_()
    ours = top_entropy(z, **case["params"])
    torch.testing.assert_close(ours.detach(), f32(case["outputs"]["entropy"]), rtol=1e-5, atol=1e-5)
    w = f32(case["inputs"]["weights"])
    grad = torch.autograd.grad((w * ours).sum(), z, allow_unused=True)[0]
    grad = torch.zeros_like(z) if grad is None else grad
    torch.testing.assert_close(grad, f32(case["outputs"]["grad_logits"]), rtol=1e-5, atol=1e-5)


def _brute(z: torch.Tensor, k: int | None, p: float | None) -> torch.Tensor:
    """The definition in float64, position by position: the top set, its renormalised entropy, times log V / log n."""
    out = torch.zeros(z.shape[:-1], dtype=torch.float64)
    v = z.shape[-1]
    for i, row in enumerate(z.double().reshape(-1, v)):
        order = torch.argsort(row, descending=True)
        if k is not None:
            n = k
        else:
            probs = torch.softmax(row, 0)[order]
            n = 1 + sum(1 for j in range(1, min(256, v)) if float(probs[:j].sum()) < p)
        q = torch.softmax(row[order[:n]], 0)
        h = float(-(q * q.log()).sum())
        out.view(-1)[i] = 0.0 if n == 1 else h * math.log(v) / math.log(n)
    return out


@pytest.mark.parametrize(("k", "p"), [(2, None), (4, None), (None, 0.7), (None, 0.95)])
def test_matches_its_definition(k, p):
    """Against the float64 loop: the entropy of the renormalised top set, scaled to [0, log V]."""
    z = torch.randn(5, 7, 30, generator=torch.Generator().manual_seed(3)) * 2
    torch.testing.assert_close(top_entropy(z, top_k=k, top_p=p).double(), _brute(z, k, p), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("k", "p"), [(1, None), (2, None), (5, None), (None, 0.9), (None, 0.99)])
def test_streamed_from_hidden_equals_the_logits_form(k, p):
    """top_entropy_from_hidden over vocabulary tiles (smaller than K's or p's set) gives top_entropy of the
    materialised logits at a temperature, and the same gradients with respect to the hidden states and the head."""
    gen = torch.Generator().manual_seed(5)
    h = torch.randn(9, 16, generator=gen).requires_grad_()
    w = torch.randn(70, 16, generator=gen).requires_grad_()
    a = top_entropy(h @ w.T / 0.8, top_k=k, top_p=p)
    b = top_entropy_from_hidden(h, w, top_k=k, top_p=p, temperature=0.8, vocab_chunk=16)
    torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4)
    for x, y in zip(torch.autograd.grad(a.sum(), (h, w)), torch.autograd.grad(b.sum(), (h, w))):
        torch.testing.assert_close(y, x, rtol=1e-4, atol=1e-4)


def test_options_are_checked(tmp_path):
    """K >= 1 and p in (0, 1), one of them; the options belong to tre_k; its defaults are the scripts' (K 2, 0.001)."""
    z = torch.zeros(2, 5)
    for kw, match in (({"top_k": 0}, "top_k"), ({"top_p": 1.0}, "top_p"), ({"top_k": 2, "top_p": 0.9}, "one of")):
        with pytest.raises(ValueError, match=match):
            top_entropy(z, **kw)
    assert METHODS.get("tre_k").option_names() == ["tre_top_k", "tre_top_p"]
    cfg = load_config(None, method="tre_k", out=str(tmp_path / "a"))
    assert cfg.entropy_coef == 0.001 and cfg.top_entropy() == (2, None)
    assert load_config(None, method="tre_k", tre_top_p=0.99, out=str(tmp_path / "b")).top_entropy() == (None, 0.99)
    with pytest.raises(ValueError, match="tre_top_k is an option of method 'tre_k'"):
        load_config(None, method="grpo", tre_top_k=2, out=str(tmp_path / "c"))
    with pytest.raises(ValueError, match="not both"):
        load_config(None, method="tre_k", tre_top_k=2, tre_top_p=0.9, out=str(tmp_path / "d"))
    with pytest.raises(ValueError, match="tre_top_p"):
        load_config(None, method="tre_k", tre_top_p=1.0, out=str(tmp_path / "e"))


@pytest.mark.slow
@pytest.mark.parametrize("method", ["tre_k", "tre_k+clip_b"])
def test_the_bonus_is_the_top_entropy_in_training(tmp_path, monkeypatch, method):
    """`--method tre_k` (and composed with Clip_B) trains by name; the bonus term reads the forward's top-2 entropy
    (not H), which equals top_entropy of the policy's materialised logits on the same tokens; loss/entropy_bonus is
    its aggregate."""
    from entropy_rft.core import objective
    from entropy_rft.logging import read_metrics
    from entropy_rft.rollout.hf import sequence_forward
    from entropy_rft.train.forward import policy_forward
    from entropy_rft.train.trainer import train

    seen = []
    real = objective._entropy_bonus

    def spy(mb, agg, mask):
        seen.append((mb.stats.entropy_top.detach().clone(), mb.stats.entropy.detach().clone(), mask.clone()))
        return real(mb, agg, mask)

    monkeypatch.setattr(objective, "_entropy_bonus", spy)
    rollouts = []
    real_forward = policy_forward

    def keep_rollout(model, rollout, *args, **kwargs):
        if kwargs.get("top") is not None:
            rollouts.append((model, rollout, args[0]))
        return real_forward(model, rollout, *args, **kwargs)

    monkeypatch.setattr("entropy_rft.train.forward.policy_forward", keep_rollout)
    monkeypatch.setattr("entropy_rft.train.step.policy_forward", keep_rollout)
    cfg = tiny_config(tmp_path, method=method, steps=1, prompts_per_step=2, lr=1e-9)
    train(cfg)
    assert seen and rollouts
    top, h, mask = seen[0]
    assert not torch.allclose(top[mask], h[mask])
    model, rollout, temperature = rollouts[0]
    with torch.no_grad():
        logits, _ = sequence_forward(model, rollout)
        want = top_entropy(logits.float() / temperature, top_k=2)
    torch.testing.assert_close(top[mask], want[mask.to(want.device)], rtol=1e-4, atol=1e-4)
    row = read_metrics(cfg.out)[-1]
    assert row["loss/entropy_bonus"] == pytest.approx(float(top[mask].mean()), rel=1e-4)
