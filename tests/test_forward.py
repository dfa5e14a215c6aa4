"""The trainer's forward pass: statistics streamed from hidden states equal the logits path, strict on-policy
reuse of the update's forward gives the same update bit for bit, and the entropy probe measures what it says."""

import copy

import pytest
import torch

from entropy_rft.config import load_config
from entropy_rft.core.dynamics import token_stats
from entropy_rft.rollout import Rollout
from entropy_rft.train.dropout import disable_dropout, has_active_dropout
from entropy_rft.train.forward import EntropyProbe, HeldForward, batch_forward, policy_forward, streams_from_hidden
from entropy_rft.train.policy import load_policy
from entropy_rft.train.rules import StepRules
from entropy_rft.train.step import Decision, Step, zero_advantage_rows
from entropy_rft.train.trainer import train


@pytest.fixture(scope="module")
def policy():
    return load_policy("countdown-tiny", torch.device("cpu"), trainable=True)


def make_rollout(tokenizer, n=6, seed=0):
    """Left-padded prompts of different lengths and right-padded responses with a few early ends."""
    gen = torch.Generator().manual_seed(seed)
    vocab = tokenizer.vocab_size if hasattr(tokenizer, "vocab_size") else 22
    prompt = torch.randint(3, vocab, (n, 7), generator=gen)
    prompt_mask = torch.ones(n, 7, dtype=torch.bool)
    prompt_mask[::2, :3] = False  # every other prompt is shorter (left padding)
    prompt[~prompt_mask] = 0
    response = torch.randint(3, vocab, (n, 9), generator=gen)
    lengths = torch.tensor([9, 4, 7, 9, 2, 6])[:n]
    response_mask = torch.arange(9)[None] < lengths[:, None]
    response[~response_mask] = 0
    return Rollout(prompt, prompt_mask, response, response_mask, lengths == 9, [""] * n)


@pytest.mark.slow
def test_hidden_path_equals_logits_path(policy):
    """Statistics streamed from the last hidden state (no [B, R, V] logits) equal token_stats on the model's
    logits, values and gradients of log p and H."""
    model, tok = policy
    ro = make_rollout(tok)
    assert streams_from_hidden(model)
    a, _ = policy_forward(model, ro, 0.8, from_hidden=True)
    b, _ = policy_forward(model, ro, 0.8, from_hidden=False)
    for key in ("logp", "entropy", "s_star", "s_expect"):
        torch.testing.assert_close(getattr(a, key), getattr(b, key), atol=2e-6, rtol=1e-5)
    params = [p for p in model.parameters()]
    ga = torch.autograd.grad((a.logp + 0.3 * a.entropy)[ro.response_mask].sum(), params)
    gb = torch.autograd.grad((b.logp + 0.3 * b.entropy)[ro.response_mask].sum(), params)
    for x, y in zip(ga, gb):
        torch.testing.assert_close(x, y, atol=2e-5, rtol=1e-4)


def test_logit_transforms_fall_back_to_logits(policy):
    """A biased LM head or a soft-capping config is not lm_head(hidden): those models take the logits path."""
    model, _ = policy
    other = copy.deepcopy(model)
    other.config.final_logit_softcapping = 30.0
    assert not streams_from_hidden(other)
    other = copy.deepcopy(model)
    head = other.get_output_embeddings()
    biased = torch.nn.Linear(head.in_features, head.out_features, bias=True)
    other.set_output_embeddings(biased)
    assert not streams_from_hidden(other)


@pytest.mark.slow
def test_statistics_pass_runs_in_the_update_mode(policy):
    """batch_forward runs in the module mode the update runs in (training mode once dropout is off), and in eval mode
    where dropout is deliberately left on (the statistics are then not noised); the flag is restored after."""
    model = copy.deepcopy(policy[0])
    model.model.layers[0].self_attn.attention_dropout = 0.3
    model.model.layers[1].mlp.add_module("drop", torch.nn.Dropout(0.5))
    seen = []
    model.get_decoder().register_forward_pre_hook(lambda m, a: seen.append(m.training))
    for was_training in (True, False):
        model.train(was_training)
        batch_forward(model, make_rollout(policy[1]), 1.0, 3)  # dropout active: eval mode
        assert seen and not any(seen) and model.training == was_training
        seen.clear()
    assert disable_dropout(model) == 2 and not has_active_dropout(model)
    model.eval()
    batch_forward(model, make_rollout(policy[1]), 1.0, 3)  # no dropout: the update's training mode
    assert seen and all(seen) and not model.training


def step_weights(tmp_path, name, **kw):
    cfg = load_config(
        None,
        steps=1,
        prompts_per_step=4,
        group_size=4,
        lr=1e-3,
        eval_problems=2,
        eval_k=1,
        progress=False,
        probe_every=0,
        out=str(tmp_path / name),
        **kw,
    )
    train(cfg)
    from safetensors.torch import load_file

    return load_file(tmp_path / name / "checkpoint-1" / "model.safetensors")


@pytest.mark.slow
@pytest.mark.parametrize("method", ["clip_b", "grpo"])
def test_reusing_the_update_forward_gives_the_same_update_bit_for_bit(tmp_path, method):
    """Strict on-policy, old log p and the statistics from the update's own forward give exactly the weights a
    separate no-grad statistics pass gives (torch.equal, not a tolerance). skip_zero_advantage off: it changes the
    order of float sums (test_zero_advantage_rows_skip_the_backward_not_the_update)."""
    kw = {"method": method, "mu": 0.5} if method == "clip_b" else {"method": method}
    kw["skip_zero_advantage"] = False
    a = step_weights(tmp_path, "reuse", reuse_forward="on", **kw)
    b = step_weights(tmp_path, "separate", reuse_forward="off", **kw)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_reuse_only_where_strict_on_policy(policy):
    """auto reuses the forward only with one epoch, one mini-batch, no Lopti, no micro-batching, no dropout."""
    model = policy[0]
    base = dict(prompts_per_step=4, group_size=4)

    def reuses(dropout: bool | None = None, **kw) -> bool:
        active = has_active_dropout(model) if dropout is None else dropout
        return StepRules.of(load_config(None, **base, **kw), dropout_active=active).reuse

    assert reuses()
    assert not reuses(mini_batches=2)
    assert not reuses(ppo_epochs=2)
    assert not reuses(method="lopti")
    assert not reuses(micro_batch_size=4)
    assert not reuses(dropout=True)
    assert reuses(micro_batch_size=4, reuse_forward="on")
    assert reuses(dropout=True, reuse_forward="on")
    assert not reuses(reuse_forward="off")


def reference_first_order(model, ro, temperature, before, after):
    """grad of the mean entropy over valid tokens (materialised logits, plain autograd) . (after - before)."""
    work = copy.deepcopy(model)
    work.load_state_dict(before)
    stats, _ = policy_forward(work, ro, temperature, from_hidden=False)
    h = stats.entropy[ro.response_mask].mean()
    names = [n for n, p in work.named_parameters() if p.requires_grad]
    grads = torch.autograd.grad(h, [p for _, p in work.named_parameters() if p.requires_grad])
    return sum(float((g.double() * (after[n].double() - before[n].double())).sum()) for n, g in zip(names, grads))


@pytest.mark.slow
@pytest.mark.parametrize("held", [True, False])
def test_probe_first_order_equals_gradient_dot_step(policy, held):
    """EntropyProbe.first_order() equals grad(mean H over valid tokens) . (theta_after - theta_before) computed
    by plain autograd on materialised logits, whether the graph is held (on-policy) or recomputed."""
    model = copy.deepcopy(policy[0])
    ro = make_rollout(policy[1])
    before = {k: v.clone() for k, v in model.state_dict().items()}
    forward = HeldForward(model, ro, 1.0, 3) if held else None
    probe = EntropyProbe(model, ro, 1.0, 3, held=forward)
    if forward is not None:  # the update can still backward through the held graph after the probe
        sum(s.logp[ro.response_mask[r]].sum() for r, (s, _) in zip(forward.rows, forward.parts)).backward()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1e-3 * torch.randn_like(p))
    after = model.state_dict()
    expected = reference_first_order(policy[0], ro, 1.0, before, after)
    assert abs(expected) > 1e-6
    assert probe.first_order() == pytest.approx(expected, rel=1e-4)


@pytest.mark.slow
def test_realised_entropy_change_follows_the_first_order_prediction(tmp_path):
    """On small steps the realised change of the batch's mean entropy is close to the first-order change the
    probe predicts: the ratio is within 10% of 1 on every probed step (measured: 0.98-1.01 at lr 1e-6; it
    drifts from 1 as the step grows, 0.5-2.1 at lr 2e-5 on these 32-row batches, as a first-order term should)."""
    cfg = load_config(
        None,
        steps=4,
        prompts_per_step=8,
        group_size=4,
        lr=1e-6,
        eval_problems=2,
        eval_k=1,
        progress=False,
        probe_every=1,
        out=str(tmp_path / "probe"),
    )
    history = train(cfg)["history"]
    for row in history:
        fo, real = row["entropy_change/first_order"], row["entropy_change/realised"]
        assert fo != 0 and 0.9 < real / fo < 1.1, (fo, real)


@pytest.mark.slow
def test_offpolicy_prediction_uses_the_current_policy(policy):
    """Corollary 4.1 (eq. 28) summed over optimizer steps uses, for each step, the ratios and S_c of the policy
    that step is taken from: equal to a reference that replays the optimizer steps from snapshots."""
    model = copy.deepcopy(policy[0])
    ro = make_rollout(policy[1])
    cfg = load_config(None, prompts_per_step=6, group_size=1, mini_batches=2, lr=3e-3, progress=False)
    stats, _ = batch_forward(model, ro, 1.0, 6)
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5, 2.0, -2.0])
    mask = ro.response_mask
    snapshots = []
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    step = optimizer.step

    def recording_step(*a, **k):
        snapshots.append({n: p.detach().clone() for n, p in model.named_parameters()})
        return step(*a, **k)

    optimizer.step = recording_step
    gen = torch.Generator().manual_seed(5)
    out = Step(cfg, model, optimizer, update_gen=gen).update(ro, Decision(adv, stats.logp, mask, mask))
    order = torch.randperm(6, generator=torch.Generator().manual_seed(5))
    from entropy_rft.core.dynamics import corollary4_entropy_change

    expected = 0.0
    for rows, snap in zip(order.chunk(2), snapshots):
        work = copy.deepcopy(policy[0])
        work.load_state_dict(snap, strict=False)
        now, _ = batch_forward(work, ro.select(rows), 1.0, 6)
        ratio = (now.logp - stats.logp[rows]).exp()
        share = float(mask[rows].sum()) / float(mask.sum())
        expected += share * float(
            corollary4_entropy_change(
                adv[rows], now.s_centered, mask[rows], lr=cfg.lr, ratio=ratio, num_tokens=float(mask[rows].sum())
            )
        )
    behaviour = sum(
        float(mask[r].sum())
        / float(mask.sum())
        * float(
            corollary4_entropy_change(adv[r], stats.s_centered[r], mask[r], lr=cfg.lr, num_tokens=float(mask[r].sum()))
        )
        for r in order.chunk(2)
    )
    assert out["entropy_change/predicted_offpolicy"] == pytest.approx(expected, rel=1e-4, abs=1e-12)
    assert abs(expected - behaviour) > 1e-4 * abs(expected)  # the behaviour policy's S_c would be a different value


@pytest.mark.slow
def test_token_stats_of_held_forward_match_separate_pass(policy):
    """The held forward's detached statistics equal the no-grad pass's, value for value."""
    model = copy.deepcopy(policy[0])
    ro = make_rollout(policy[1])
    held = HeldForward(model, ro, 1.0, 4)
    sep, _ = batch_forward(model, ro, 1.0, 4)
    ref = token_stats(
        model(
            input_ids=ro.input_ids(),
            attention_mask=ro.attention_mask().long(),
            position_ids=(ro.attention_mask().long().cumsum(-1) - 1).clamp_min(0),
        ).logits[:, 6:-1],
        ro.response_ids,
    )
    got, m = held.stats(), ro.response_mask
    for key in ("logp", "entropy", "s_star", "s_expect"):
        assert torch.equal(getattr(got, key), getattr(sep, key))
        torch.testing.assert_close(getattr(got, key)[m], getattr(ref, key)[m], atol=2e-6, rtol=1e-5)
        assert not getattr(got, key)[~m].any()  # padding: 0, no work spent on it


def grouped_rollout(groups=4, size=3, seed=1):
    gen = torch.Generator().manual_seed(seed)
    prompt = torch.randint(3, 22, (groups, 7), generator=gen)
    pm = torch.ones(groups, 7, dtype=torch.bool)
    pm[::2, :3] = False
    prompt[~pm] = 0
    prompt, pm = prompt.repeat_interleave(size, 0), pm.repeat_interleave(size, 0)
    resp = torch.randint(3, 22, (groups * size, 9), generator=gen)
    lengths = torch.randint(1, 10, (groups * size,), generator=gen)
    rm = torch.arange(9)[None] < lengths[:, None]
    resp[~rm] = 0
    return Rollout(prompt, pm, resp, rm, lengths == 9, [""] * (groups * size))


@pytest.mark.slow
def test_shared_prompt_prefix_equals_full_sequences(policy):
    """Running each group's prompt once and its responses over the cached prefix gives the statistics and the
    gradients of full prompt + response passes (float32 rounding only), with left-padded prompts."""
    from entropy_rft.train.forward import prompt_groups

    model, _ = policy
    ro = grouped_rollout()
    assert prompt_groups(ro).tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]
    # a rollout already on the model's device (TRL hands over CUDA tensors) keeps its groups there: the meta
    # device stands in for CUDA, where mixing devices raised (found on an H100)
    on_device = Rollout(
        *(t.to("meta") for t in (ro.prompt_ids, ro.prompt_mask, ro.response_ids, ro.response_mask, ro.finished)),
        ro.texts,
    )
    assert prompt_groups(on_device).device.type == "meta"
    a, _ = policy_forward(model, ro, 0.9, share_prefix=True)
    b, _ = policy_forward(model, ro, 0.9, share_prefix=False)
    m = ro.response_mask
    for key in ("logp", "entropy", "s_star", "s_expect"):
        torch.testing.assert_close(getattr(a, key)[m], getattr(b, key)[m], atol=1e-5, rtol=1e-5)
    params = list(model.parameters())
    ga = torch.autograd.grad(a.logp[m].sum() + a.entropy[m].sum(), params)
    gb = torch.autograd.grad(b.logp[m].sum() + b.entropy[m].sum(), params)
    for x, y in zip(ga, gb):  # float32 sums in another order: compare each tensor's error to its norm
        assert float((x - y).norm() / y.norm()) < 1e-5


def _positions(lengths: list[int], parts) -> int:
    return sum(len(rows) * width for rows, width in parts)


@pytest.mark.parametrize("seed", range(6))
def test_length_buckets_are_the_least_padded_split(seed):
    """length_buckets' split covers every row once, each bucket as wide as its longest response, and computes the
    fewest positions any split into that many contiguous length ranges can (brute force over all boundaries)."""
    import itertools

    from entropy_rft.train.forward import length_buckets

    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, 12, (int(torch.randint(1, 40, (1,), generator=gen)),), generator=gen)
    for most in (1, 2, 3, 4):
        parts = length_buckets(lengths, most, min_gain=0.0)
        rows = torch.cat([r for r, _ in parts]).sort().values
        assert torch.equal(rows, torch.arange(len(lengths)))
        assert all(w == int(lengths[r].max()) for r, w in parts) and len(parts) <= most
        values = sorted(set(lengths.tolist()))
        best = min(
            sum(
                int((lengths > lo).logical_and(lengths <= hi).sum()) * hi
                for lo, hi in zip((-1,) + cut, cut + (values[-1],))
            )
            for k in range(min(most, len(values)))
            for cut in itertools.combinations(values[:-1], k)
        )
        assert _positions(lengths.tolist(), parts) == best


def test_length_buckets_add_a_pass_only_when_it_pays():
    """One bucket when the lengths are equal or a split saves less than min_gain of the positions; a split when
    it saves more; wide length ranges are cut among quantiles."""
    from entropy_rft.train.forward import length_buckets

    assert len(length_buckets(torch.full((64,), 9))) == 1
    almost = torch.tensor([10] * 63 + [9])  # splitting off the short row saves 1 of 640 positions
    assert len(length_buckets(almost, 4, min_gain=0.05)) == 1
    two = torch.tensor([2] * 32 + [16] * 32)
    assert [(len(r), w) for r, w in length_buckets(two, 4)] == [(32, 2), (32, 16)]
    long = torch.randint(1, 8192, (512,), generator=torch.Generator().manual_seed(0))
    parts = length_buckets(long, 4)
    assert 2 <= len(parts) <= 4 and _positions([], parts) < 0.7 * 512 * int(long.max())
    assert all(w == int(long[r].max()) for r, w in parts)


@pytest.mark.slow
@pytest.mark.parametrize("share_prefix", [True, False])
def test_length_buckets_give_the_one_pass_statistics_and_gradients(policy, share_prefix):
    """Rows run in passes by response length (padding not computed) give the statistics and gradients of one pass
    over the padded batch: float32 rounding only; statistics at padding are 0 either way."""
    from entropy_rft.train.forward import length_buckets

    model, _ = policy
    ro = grouped_rollout(groups=6, size=4, seed=3)
    assert len(length_buckets(ro.lengths)) > 1  # the split under test happens
    a, _ = policy_forward(model, ro, 0.9, share_prefix=share_prefix)
    b, _ = policy_forward(model, ro, 0.9, share_prefix=share_prefix, buckets=1)
    m = ro.response_mask
    for key in ("logp", "entropy", "s_star", "s_expect"):
        torch.testing.assert_close(getattr(a, key), getattr(b, key), atol=1e-5, rtol=1e-5)
        assert not getattr(a, key)[~m].any()
    params = list(model.parameters())
    ga = torch.autograd.grad(a.logp[m].sum() + 0.5 * a.entropy[m].sum(), params)
    gb = torch.autograd.grad(b.logp[m].sum() + 0.5 * b.entropy[m].sum(), params)
    for x, y in zip(ga, gb):
        assert float((x - y).norm() / y.norm()) < 1e-5


@pytest.mark.slow
def test_lora_under_bf16_keeps_one_pass():
    """Training LoRA in bf16, autocast casts the frozen base weights again in every pass and autograd keeps each
    cast: policy_forward then runs one pass, so the saved bytes do not grow with the number of buckets."""
    from entropy_rft.train.forward import length_buckets
    from entropy_rft.train.policy import prepare_policy

    cfg = load_config(None, precision="bf16", lora_rank=4, probe_every=0)
    model = prepare_policy(load_policy("countdown-tiny", torch.device("cpu"), trainable=True)[0], cfg)
    ro = grouped_rollout(groups=6, size=4, seed=3)
    assert len(length_buckets(ro.lengths)) > 1

    def saved(buckets):
        seen = {}

        def pack(t):
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            policy_forward(model, ro, 1.0, precision="bf16", buckets=buckets)
        return sum(seen.values())

    assert saved(4) == saved(1)


@pytest.mark.slow
@pytest.mark.parametrize("micro", [12, 3])
def test_zero_advantage_rows_skip_the_backward_not_the_update(policy, micro):
    """Rows with advantage exactly 0 run their forward without a graph (fewer bytes saved for the backward), yet the
    statistics, the loss metrics and the gradient step equal those of the full graph (float32 rounding only); with
    micro-batches of 3, two micro-batches hold frozen rows only (no graph at all)."""
    ro = grouped_rollout(groups=4, size=3, seed=2)
    adv = torch.tensor([0.7, -1.2, 0.5, 0.0, 0.0, 0.0, 1.0, 0.0, -1.0, 0.0, 0.0, 0.0])
    frozen = adv == 0
    cfg = load_config(
        None,
        prompts_per_step=4,
        group_size=3,
        lr=1e-3,
        probe_every=0,
        method="clip_b",
        mu=0.5,
        micro_batch_size=0 if micro == 12 else micro,
    )
    out = {}
    for name, rows in (("full", None), ("skip", frozen)):
        model = copy.deepcopy(policy[0])
        optimizer = torch.optim.SGD(model.parameters(), lr=1.0)  # the step is the gradient (Adam's first step is
        saved = []  # its sign: ill-conditioned where it is ~0)
        with torch.autograd.graph.saved_tensors_hooks(
            lambda t, saved=saved: saved.append(t.numel() * t.element_size()) or t, lambda t: t
        ):
            held = HeldForward(model, ro, 1.0, micro, frozen=rows)
        stats = held.stats()
        step = Step(cfg, model, optimizer, update_gen=torch.Generator().manual_seed(0))
        metrics = step.update(ro, Decision(adv, stats.logp, ro.response_mask, ro.response_mask), held=held)
        out[name] = (sum(saved), stats, metrics, {k: v.detach().clone() for k, v in model.state_dict().items()})
    (bytes_full, s_full, m_full, w_full), (bytes_skip, s_skip, m_skip, w_skip) = out["full"], out["skip"]
    assert bytes_skip < 0.7 * bytes_full  # 7 of 12 rows keep no graph
    for key in ("logp", "entropy", "s_star", "s_expect"):
        torch.testing.assert_close(getattr(s_skip, key), getattr(s_full, key), atol=1e-5, rtol=1e-5)
    assert m_skip.keys() == m_full.keys()
    for k in m_full:
        assert m_skip[k] == pytest.approx(m_full[k], rel=1e-4, abs=1e-7), k
    moved = 0
    for k in w_full:
        torch.testing.assert_close(w_skip[k], w_full[k], atol=1e-6, rtol=1e-5)
        moved += int(not torch.equal(w_full[k], policy[0].state_dict()[k]))
    assert moved > 0  # the update did something


def test_zero_advantage_skip_only_where_the_gradient_is_exactly_zero():
    """StepRules.may_freeze: off under a KL to the reference, an entropy bonus (fixed or adaptive), a value head
    (PPO), KL-Cov (its |log r| term), advantages that read old log p, or when switched off; on with EntroPIC (its
    -r|A| term vanishes at A = 0); never on a probe step; zero_advantage_rows: None when no row, too few rows (their
    own passes would cost more than they save) or every row is 0 (then Adam still steps on zero gradients, as
    without the skip)."""
    from entropy_rft.core.advantages import ADVANTAGES

    def freezes(**kw) -> bool:
        return StepRules.of(load_config(None, prompts_per_step=2, group_size=2, **kw)).may_freeze

    grpo = ADVANTAGES.get("grpo")
    assert freezes() and freezes(policy_loss="clip_cov") and freezes(entropy_target=0.5, entropy_control="pi")
    assert not freezes(kl_coef=0.01)
    assert not freezes(skip_zero_advantage=False)
    assert not freezes(entropy_coef=1e-3)
    assert not freezes(entropy_target=0.5, entropy_control="bonus")
    assert not freezes(policy_loss="kl_cov")
    assert not freezes(rank_penalty_beta=0.1)
    assert not freezes(advantage="gae")
    rules = StepRules.of(load_config(None, prompts_per_step=2, group_size=2, probe_every=10))
    assert [s + 1 for s in range(30) if rules.probing(s)] == [10, 20, 30]
    groups = torch.tensor([0, 0, 1, 1])
    assert zero_advantage_rows(grpo, torch.tensor([1.0, 0.0, 1.0, 1.0]), groups).tolist() == [False, False, True, True]
    assert zero_advantage_rows(grpo, torch.tensor([1.0, 1.0, 0.0, 0.0]), groups) is None
    eight = torch.arange(8).repeat_interleave(2)  # 1 group of 8 all right: 1/8 of the rows, below MIN_FROZEN_SHARE
    assert zero_advantage_rows(grpo, torch.tensor([1.0, 1.0] + [1.0, 0.0] * 7), eight) is None
    assert zero_advantage_rows(grpo, torch.tensor([1.0, 1.0] + [1.0, 0.0] * 7), eight, min_share=0.1) is not None
    assert zero_advantage_rows(grpo, torch.tensor([1.0, 0.0, 0.0, 1.0]), groups) is None
