"""`entropy-rft theory`: Theorems 1-2 and Corollaries 1-4 checked numerically.

Tabular softmax policy (each position owns its logits, so a logit update is exactly the paper's model; all in
float64): predicted first-order entropy changes against exact ones, for
- Theorem 1 (eq. 4): dz = eps e_k, predicted -eps S*;
- Theorem 2 (eq. 10): dz = alpha (e_k - p), predicted -alpha S_c;
- Corollary 1 (eq. 11): sum_k p_k S_c,k, exactly 0;
- Corollary 2 (eq. 12): batch mean of S_c under on-policy sampling, against the batch mean of S*;
- Corollary 3 (eq. 13): E_{k~p}[dH] with a latent advantage per vocabulary item, predicted -eta Cov_{k~p}(A, S_c);
- Corollary 4 (eq. 14) and 4.1 (eq. 28): one GRPO step on a batch of positions, predicted -eta Cov_B(A, r S_c);
  and with advantages of non-zero batch mean, where Corollary 4's dropped term -eta E_B[A] E_B[S_c] is not zero:
  Corollary 4 then carries an error that does not shrink with the step, while eq. 23, -eta E_B[A S_c], stays exact.

A real model (the shipped policy by default): its parameters, not its logits, move, so each token's logits change
by eta J J^T grad_z rather than by the logit-space step; the theory then predicts the sign of the change (and
its scale up to the kernel). Reported: sign agreement and correlation of predicted against realised changes for
single-token updates (one SGD step on one token's -A log p_k) and for full GRPO steps (one SGD step on a batch's
token-mean loss), predicted by Corollary 4 in logit space (-lr / |T_B| Cov_B(A, S_c), dynamics departure 3) and by
the exact first-order change through the network (-lr grad(mean H) . grad(loss)).
"""

from __future__ import annotations

import math

import torch

from ..core.dynamics import batch_covariance, corollary4_entropy_change

__all__ = ["tabular_checks", "Probe", "model_checks", "format_table"]


def _entropy(z: torch.Tensor) -> torch.Tensor:
    lp = z.log_softmax(-1)
    return -(lp.exp() * lp).sum(-1)


def _s_parts(z: torch.Tensor, k: torch.Tensor):
    lp = z.log_softmax(-1)
    p = lp.exp()
    h = -(p * lp).sum(-1)
    s = p * (h.unsqueeze(-1) + lp)
    s_star = s.gather(-1, k.unsqueeze(-1)).squeeze(-1)
    return p, h, s, s_star, (p * s).sum(-1)


def _agreement(pred: torch.Tensor, real: torch.Tensor) -> dict:
    pred, real = pred.double().flatten(), real.double().flatten()
    nz = (pred != 0) & (real != 0)
    sign = float(((pred > 0) == (real > 0))[nz].float().mean()) if nz.any() else math.nan
    rel = float(((pred - real).abs() / real.abs().clamp_min(1e-300)).median())
    corr = float(torch.corrcoef(torch.stack([pred, real]))[0, 1]) if pred.numel() > 2 else math.nan
    return {"sign_agreement": sign, "median_rel_error": rel, "corr": corr, "n": int(pred.numel())}


def _corollary3_row(z: torch.Tensor, p: torch.Tensor, step: float, g: torch.Generator) -> dict:
    """Corollary 3: a latent advantage per vocabulary item (drawn from g); the exact expectation over k ~ p of
    the step's entropy change against -eta Cov_k~p(A, S_c), on the first 32 positions."""
    vocab = z.shape[-1]
    latent = torch.randn(vocab, generator=g, dtype=torch.float64)
    pos = 32
    exact, pred = [], []
    for t in range(pos):
        zt, pt = z[t], p[t]
        _, ht, st, _, et = _s_parts(zt.unsqueeze(0).expand(vocab, vocab), torch.arange(vocab))
        sc_all = st[0] - et[0]  # S_c of every candidate k
        moves = torch.stack(
            [
                _entropy(zt + step * latent[j] * (torch.nn.functional.one_hot(torch.tensor(j), vocab) - pt)) - ht[0]
                for j in range(vocab)
            ]
        )
        exact.append((pt * moves).sum())
        mean_a, mean_sc = (pt * latent).sum(), (pt * sc_all).sum()
        pred.append(-step * (pt * (latent - mean_a) * (sc_all - mean_sc)).sum())
    return {
        "check": "Corollary 3: E_k~p[dH], latent A(k)",
        "predicted": "-eta Cov_k~p(A, S_c)",
        **_agreement(torch.stack(pred), torch.stack(exact)),
    }


def _corollary4_rows(
    z: torch.Tensor,
    p: torch.Tensor,
    h: torch.Tensor,
    step: float,
    g: torch.Generator,
    *,
    seed: int,
    advantage_mean: float,
) -> list[dict]:
    """Corollary 4 / 4.1: one GRPO step on a batch of positions, on-policy and off-policy (logits drawn from g),
    and the on-policy step with advantages shifted by advantage_mean (the corollary's approximation and eq. 23)."""
    positions, vocab = z.shape
    rows = []
    # Corollary 4 / 4.1: one GRPO step on a batch of positions; grouped rewards give the advantages. Each position
    # owns its logits and is stepped by eta r A (the per-token form of eq. 7-8; dynamics, departure 3).
    for off_policy in (False, True):
        zs = z + (torch.randn(positions, vocab, generator=g, dtype=torch.float64) * 0.3 if off_policy else 0.0)
        cov_pred, eq23_pred, real, shifted_cov, shifted_eq23, shifted_real = [], [], [], [], [], []
        for trial in range(64):
            gg = torch.Generator().manual_seed(seed * 1000 + trial)
            kk = torch.multinomial(zs.softmax(-1), 1, generator=gg).squeeze(-1)
            ekk = torch.nn.functional.one_hot(kk, vocab).double()
            ratio = (z.log_softmax(-1) - zs.log_softmax(-1)).gather(-1, kk.unsqueeze(-1)).squeeze(-1).exp()
            _, _, _, s_star_b, s_exp_b = _s_parts(z, kk)
            score = ratio * (s_star_b - s_exp_b)
            # advantages that depend on the sampled token's probability, as in GRPO (Appendix C.2)
            adv = (
                p.gather(-1, kk.unsqueeze(-1)).squeeze(-1)
                - 0.5
                + 0.5 * torch.randn(positions, generator=gg, dtype=torch.float64)
            )
            adv = (adv - adv.mean()) / adv.std()
            mask = torch.ones(positions, dtype=torch.bool)
            for a, cp, ep, rl in (
                (adv, cov_pred, eq23_pred, real),
                (adv + advantage_mean, shifted_cov, shifted_eq23, shifted_real),
            ):
                rl.append((_entropy(z + (step * ratio * a).unsqueeze(-1) * (ekk - p)) - h).mean())
                cp.append(-step * batch_covariance(a, score, mask).double())
                ep.append(-step * (a * score).mean())
        name = "Corollary 4.1 (off-policy, ratios r)" if off_policy else "Corollary 4: batch GRPO step"
        rows.append(
            {
                "check": name,
                "predicted": "-eta Cov_B(A, r S_c)" if off_policy else "-eta Cov_B(A, S_c)",
                **_agreement(torch.stack(cov_pred), torch.stack(real)),
            }
        )
        if off_policy:
            continue
        # The corollary drops -eta E_B[A] E_B[S_c] from eq. 23 (Corollary 2 says E_B[S_c] ~ 0 on-policy). With
        # standardised advantages E_B[A] = 0 and that step is exact; with a non-zero mean (a filtered token set,
        # unnormalised rewards) it is not, and its error does not shrink with the step. Eq. 23 itself is exact.
        rows.append(
            {
                "check": f"Corollary 4, E_B[A] = {advantage_mean:g}",
                "predicted": "-eta Cov_B(A, S_c)",
                **_agreement(torch.stack(shifted_cov), torch.stack(shifted_real)),
            }
        )
        rows.append(
            {
                "check": f"Eq. 23, E_B[A] = {advantage_mean:g}",
                "predicted": "-eta E_B[A S_c]",
                **_agreement(torch.stack(shifted_eq23), torch.stack(shifted_real)),
            }
        )
    return rows


def tabular_checks(
    *, vocab: int = 64, positions: int = 512, step: float = 1e-3, seed: int = 0, advantage_mean: float = 1.0
) -> list[dict]:
    """Rows of (check, statistics) on random tabular softmax policies in float64. advantage_mean shifts the
    advantages of the extra Corollary 4 rows, which test the corollary's own approximation (E_B[A] E_B[S_c] ~ 0)."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(positions, vocab, generator=g, dtype=torch.float64) * 2.0
    p = z.softmax(-1)
    k = torch.multinomial(p, 1, generator=g).squeeze(-1)
    e_k = torch.nn.functional.one_hot(k, vocab).double()
    _, h, s, s_star, s_exp = _s_parts(z, k)
    s_c = s_star - s_exp
    sign = torch.where(torch.rand(positions, generator=g) < 0.5, -1.0, 1.0).double()
    rows = []

    eps = step * sign  # Theorem 1
    rows.append(
        {
            "check": "Theorem 1: dz = eps e_k",
            "predicted": "-eps S*",
            **_agreement(-eps * s_star, _entropy(z + eps.unsqueeze(-1) * e_k) - h),
        }
    )
    alpha = step * sign  # Theorem 2
    rows.append(
        {
            "check": "Theorem 2: dz = alpha (e_k - p)",
            "predicted": "-alpha S_c",
            **_agreement(-alpha * s_c, _entropy(z + alpha.unsqueeze(-1) * (e_k - p)) - h),
        }
    )
    cor1 = (p * (s - s_exp.unsqueeze(-1))).sum(-1).abs().max()
    rows.append({"check": "Corollary 1: sum_k p_k S_c,k = 0", "predicted": "0", "max_abs": float(cor1)})
    rows.append(
        {
            "check": "Corollary 2: batch mean S_c ~ 0 (on-policy)",
            "predicted": "0",
            "mean_s_c": float(s_c.mean()),
            "mean_s_star": float(s_star.mean()),
            "stderr_s_c": float(s_c.std() / math.sqrt(positions)),
        }
    )
    rows.append(_corollary3_row(z, p, step, g))
    rows += _corollary4_rows(z, p, h, step, g, seed=seed, advantage_mean=advantage_mean)
    return rows


class Probe:
    """A real causal LM under test (`model_checks`): plain SGD steps of learning rate lr on it, its parameters
    restored after each, and GRPO batches sampled from it (group_size responses to each of 8 of the task's problems,
    at temperature, up to max_new_tokens tokens; batch i seeded seed + i)."""

    def __init__(
        self,
        model,
        tokenizer,
        task,
        problems,
        *,
        group_size: int = 8,
        lr: float = 1e-3,
        temperature: float = 1.0,
        max_new_tokens: int = 16,
        seed: int = 0,
    ):
        from ..rollout import HFEngine

        self.model, self.task, self.problems, self.lr = model, task, problems, lr
        self.engine = HFEngine(model, tokenizer)
        self.group_size, self.temperature, self.max_new_tokens, self.seed = (
            group_size,
            temperature,
            max_new_tokens,
            seed,
        )
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.saved = [p.detach().clone() for p in self.params]

    def restore(self) -> None:
        with torch.no_grad():
            for p, s in zip(self.params, self.saved):
                p.copy_(s)

    def sgd(self, loss: torch.Tensor) -> None:
        self.model.zero_grad(set_to_none=True)
        loss.backward()
        with torch.no_grad():
            for p in self.params:
                if p.grad is not None:
                    p.add_(p.grad, alpha=-self.lr)

    def sample(self, i: int):
        """Batch i: 8 problems x group_size responses, and their GRPO advantages."""
        from ..core.advantages import grpo

        batch = self.problems[(i * 8) % len(self.problems) :][:8] or self.problems[:8]
        n = self.group_size
        ro = self.engine.generate(
            [self.task.prompt(q) for q in batch],
            n=n,
            temperature=self.temperature,
            max_new_tokens=self.max_new_tokens,
            seed=self.seed + i,
        )
        scores = [self.task.score(t, bool(f), batch[j // n])[0] for j, (t, f) in enumerate(zip(ro.texts, ro.finished))]
        return ro, grpo(torch.tensor(scores), torch.arange(len(batch)).repeat_interleave(n))


def _single_token_row(probe: Probe, n_tokens: int) -> dict:
    """Theorem 2 token by token: one SGD step on -sign * log p_k of one token, its entropy change against
    -sign S_c."""
    from ..train.forward import batch_stats, policy_stats

    model, temperature = probe.model, probe.temperature
    ro, _ = probe.sample(0)
    stats = batch_stats(model, ro, temperature, 10**6)
    positions = ro.response_mask.nonzero()
    g = torch.Generator().manual_seed(probe.seed)
    picks = positions[torch.randperm(len(positions), generator=g)[:n_tokens]]
    pred, real = [], []
    for b, t in picks.tolist():
        sub = ro.select(slice(b, b + 1))
        direction = 1.0 if torch.rand(1, generator=g).item() < 0.5 else -1.0
        st = policy_stats(model, sub, temperature)
        probe.sgd(-direction * st.logp[0, t])
        with torch.no_grad():
            after = policy_stats(model, sub, temperature).entropy[0, t]
        probe.restore()
        pred.append(-direction * stats.s_centered[b, t])  # Theorem 2 with alpha of sign `direction`
        real.append(after - stats.entropy[b, t])
    return {
        "check": "model: single-token step on -A log p_k",
        "predicted": "-sign(A) S_c",
        **_agreement(torch.stack(pred), torch.stack(real)),
    }


def _batch_rows(probe: Probe, n_batches: int) -> list[dict]:
    """Full GRPO steps: one SGD step on the token-mean loss of a batch; predicted in logit space by Corollary 4
    (a step of lr / |T_B| per token: dynamics, departure 3) and through the network to first order
    (grad of the mean entropy . the SGD step = -lr grad(mean H) . grad(loss))."""
    from ..train.forward import batch_stats, policy_stats

    model, temperature, lr, params = probe.model, probe.temperature, probe.lr, probe.params
    pred, first, real = [], [], []
    for i in range(n_batches):
        ro, adv = probe.sample(i + 1)
        stats = batch_stats(model, ro, temperature, 10**6)
        mask = ro.response_mask
        st = policy_stats(model, ro, temperature)
        m = mask.float()
        grad_h = torch.autograd.grad((st.entropy * m).sum() / m.sum(), params, retain_graph=True, allow_unused=True)
        probe.sgd(-(adv.unsqueeze(-1) * st.logp * m).sum() / m.sum())
        pairs = [(gh, p.grad) for gh, p in zip(grad_h, params) if gh is not None and p.grad is not None]
        first.append(-lr * sum((gh.double() * gp.double()).sum() for gh, gp in pairs))
        after = batch_stats(model, ro, temperature, 10**6)
        probe.restore()
        pred.append(corollary4_entropy_change(adv, stats.s_centered, mask, lr=lr, num_tokens=m.sum()).double())
        real.append((after.entropy - stats.entropy)[mask].mean().double())
    return [
        {
            "check": "model: GRPO step on a batch",
            "predicted": "-lr/|T_B| Cov_B(A, S_c)",
            **_agreement(torch.stack(pred), torch.stack(real)),
        },
        {
            "check": "model: GRPO step, first order through the network",
            "predicted": "-lr grad H . grad L",
            **_agreement(torch.stack(first), torch.stack(real)),
        },
    ]


def model_checks(probe: Probe, *, n_tokens: int = 48, n_batches: int = 8) -> list[dict]:
    """Single-token and full-step checks on the probe's causal LM (plain SGD steps, parameters restored after each):
    n_tokens single-token steps, then n_batches GRPO steps."""
    probe.model.eval()  # no dropout: the only change between passes is the SGD step
    return [_single_token_row(probe, n_tokens), *_batch_rows(probe, n_batches)]


def format_table(rows: list[dict]) -> str:
    lines = ["| check | predicted | sign agreement | corr | median rel. error | other |", "|---|---|---|---|---|---|"]
    for r in rows:
        other = ", ".join(
            f"{k}={v:.3g}"
            for k, v in r.items()
            if k not in ("check", "predicted", "sign_agreement", "corr", "median_rel_error")
            and isinstance(v, (int, float))
        )
        cells = [
            f"{r[k]:.4g}" if isinstance(r.get(k), float) else "-"
            for k in ("sign_agreement", "corr", "median_rel_error")
        ]
        lines.append(f"| {r['check']} | {r['predicted']} | {' | '.join(cells)} | {other} |")
    return "\n".join(lines) + "\n"
