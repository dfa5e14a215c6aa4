"""EntropyGRPOTrainer: entropy-rft's token filters inside TRL's GRPOTrainer, on the CPU stand-in model.

Checked: the keep mask is the method's over the whole generation batch (not per micro-batch), dropped tokens leave
the loss and its token count, nothing changes when nothing is dropped, and the metrics reach TRL's logs."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import free_port

pytest.importorskip("trl")
from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer

from entropy_rft.core.dynamics import TokenStats
from entropy_rft.core.methods import METHODS
from entropy_rft.integrations.trl import EntropyGRPOTrainer, rollout_of
from entropy_rft.train.forward import policy_stats
from entropy_rft.train.policy import STAND_IN, resolve_model_path


def reward_a(completions, **kwargs):
    """Share of 'a' characters: graded rewards, so groups have non-zero advantages."""
    return [c.count("a") / max(len(c), 1) for c in completions]


def config(tmp_path, **kw):
    base = dict(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=8,
        max_steps=2,
        learning_rate=1e-3,
        use_cpu=True,
        report_to=[],
        logging_steps=1,
        save_strategy="no",
        steps_per_generation=2,
        gradient_accumulation_steps=2,
        seed=0,
        bf16=False,
        disable_tqdm=True,
    )
    return GRPOConfig(**{**base, **kw})


def dataset():
    return Dataset.from_list([{"prompt": p} for p in ["abc", "hello", "xyz", "what"] * 4])


class Capturing(EntropyGRPOTrainer):
    """Keeps each generation batch as the loss will see it, with the policy's statistics at that moment."""

    def _generate_and_score_completions(self, inputs):
        out = super()._generate_and_score_completions(inputs)
        self.model.eval()
        with torch.no_grad():
            stats = policy_stats(self.model, rollout_of(out), self.temperature)
        self.model.train()
        self.captured.append(({k: v.clone() if torch.is_tensor(v) else v for k, v in out.items()}, stats))
        return out


def build(tmp_path, cls=Capturing, **kw):
    options = kw.pop("method_options", {"mu": 0.5})
    method = kw.pop("method", "clip_b")
    path = resolve_model_path(STAND_IN)
    extra = {"method": method, "method_options": options} if issubclass(cls, EntropyGRPOTrainer) else {}
    if "peft_config" in kw:  # GRPOTrainer's own argument, not GRPOConfig's
        extra["peft_config"] = kw.pop("peft_config")
    for name in ("probe_every", "samples_every"):  # the trainer's own settings, not GRPOConfig's
        if name in kw:
            value = kw.pop(name)
            if extra:
                extra[name] = value
    trainer = cls(model=path, reward_funcs=reward_a, args=config(tmp_path, **kw), train_dataset=dataset(), **extra)
    trainer.captured = []
    return trainer


@pytest.mark.slow
def test_keep_mask_is_the_methods_over_the_whole_generation_batch(tmp_path):
    """Two micro-batches per generation batch: the kept tokens are Clip_B's on all 8 rows at once, Clip_B clips
    some tokens, and TRL's logs carry the entropy_rft metrics."""
    trainer = build(tmp_path)
    trainer.train()
    out, stats = trainer.captured[0]
    assert out["completion_ids"].shape[0] == 8  # the generation batch, two micro-batches of 4
    mask = out["completion_mask"].bool()
    want, _ = METHODS.get("clip_b").apply(stats, out["advantages"], mask, mu=0.5)
    assert torch.equal(out["tool_mask"].bool() & mask, want & mask)
    assert (mask & ~want).any()  # mu 0.5 drops tokens: the test sees a real filter
    logged = trainer.state.log_history[0]
    assert logged["entropy_rft/frac_clipped"] > 0 and logged["entropy_rft/kept_frac"] < 1
    assert {
        "entropy_rft/s_star_mean",
        "entropy_rft/cov_a_sc",
        "entropy_rft/entropy",
        "entropy_rft/entropy_kept",
    } <= set(logged)
    # the headline entropy is the policy's over every valid completion token, not over the kept ones
    m = mask.float()
    assert logged["entropy_rft/entropy"] == pytest.approx(float((stats.entropy * m).sum() / m.sum()), rel=1e-5)
    kept = (want & mask).float()
    assert logged["entropy_rft/entropy_kept"] == pytest.approx(
        float((stats.entropy * kept).sum() / kept.sum()), rel=1e-5
    )
    check_samples(tmp_path / "out", out, stats, want & mask)


def check_samples(run_dir, out, stats, kept):
    """The adapter's samples of the first generation batch (entropy_rft/samples.py's format): every row written
    (2 groups, samples_groups 4), the kept tokens TRL's loss keeps, and dapo's per-token step lr * steps_per_generation
    / (grad accumulation * kept tokens): each term is -step A S_c / |T| against the captured statistics (rel 1e-4:
    stored to 7 digits, statistics from another forward pass of the same weights)."""
    from entropy_rft import samples

    rec = samples.read_samples(run_dir)[1]
    assert rec["source"] == "trl" and rec["loss_type"] == "dapo" and rec["lr"] == pytest.approx(1e-3)
    mask = out["completion_mask"].bool()
    n = int(kept.sum())
    step = rec["lr"] * 2 / (2 * n)  # steps_per_generation 2, gradient_accumulation_steps 2 (config above)
    rows = [r for g in rec["groups"] for r in g["responses"]]
    assert sorted(r["row"] for r in rows) == list(range(mask.shape[0]))
    for r in rows:
        i = r["row"]
        assert r["length"] == int(mask[i].sum()) and r["kept"] == kept[i, : r["length"]].int().tolist()
        assert r["advantage"] == pytest.approx(float(out["advantages"][i]), rel=1e-6, abs=1e-7)
        for t in range(r["length"]):
            want = -step * float(out["advantages"][i]) * float(stats.s_centered[i, t]) / n if kept[i, t] else 0.0
            assert r["term"][t] == pytest.approx(want, rel=1e-4, abs=1e-4 * step / n)


def launch_two(tmp_path, steps: int, mode: str) -> None:
    """tests/trl_worker.py in two processes under `accelerate launch --multi_gpu` (CPU processes over gloo)."""
    cmd = [
        str(Path(sys.executable).parent / "accelerate"),
        "launch",
        "--multi_gpu",
        "--num_processes",
        "2",
        "--num_machines",
        "1",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
        "--main_process_port",  # a free one: the other two-process test may run beside it (make test's workers)
        str(free_port()),
        str(Path(__file__).parent / "trl_worker.py"),
        str(tmp_path),
        str(steps),
        mode,
    ]
    if not Path(cmd[0]).exists():
        cmd[:1] = [sys.executable, "-m", "accelerate.commands.launch"]
    root = str(Path(__file__).parents[1])  # this checkout's entropy_rft, not the one the environment installed
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=root, env=env)
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.slow
def test_two_processes_filter_the_batch_they_share(tmp_path):
    """TRL's own training loop in two processes (`accelerate launch --multi_gpu --num_processes 2`: CPU processes over
    gloo) on countdown with Clip_B, three steps of 8 rows a process: at every step each process's kept tokens are its
    rows of Clip_B applied to both processes' generation batches together, and filtering each process's rows alone would
    give another mask (so the check can tell them apart)."""
    steps = 3
    launch_two(tmp_path, steps, "clip_b")
    ranks = [torch.load(tmp_path / f"rank{i}.pt", weights_only=False) for i in range(2)]
    assert len(ranks[0]) == len(ranks[1]) == steps
    alone_differs, filtered = [], []
    for step in range(steps):
        runs = [r[step] for r in ranks]
        width = max(r["out"]["completion_mask"].shape[1] for r in runs)

        def joined(get, runs=runs, width=width):
            return torch.cat([torch.nn.functional.pad(get(r), (0, width - get(r).shape[1])) for r in runs])

        stats = TokenStats(*(joined(lambda r, k=k: r["stats"][k]) for k in ("logp", "entropy", "s_star", "s_expect")))
        mask = joined(lambda r: r["out"]["completion_mask"]).bool()
        adv = torch.cat([r["out"]["advantages"] for r in runs])
        keep, _ = METHODS.get("clip_b").apply(stats, adv, mask, mu=1.5)
        assert (mask & ~keep).any()  # Clip_B drops tokens: the check sees a real filter
        filtered.append((mask, keep))
        for i, r in enumerate(runs):
            m = r["out"]["completion_mask"].bool()
            rows, w = slice(i * m.shape[0], (i + 1) * m.shape[0]), m.shape[1]
            got = r["out"]["tool_mask"].bool() & m
            assert torch.equal(got, keep[rows, :w] & m), (step, i)
            own = TokenStats(*(r["stats"][k] for k in ("logp", "entropy", "s_star", "s_expect")))
            alone, _ = METHODS.get("clip_b").apply(own, r["out"]["advantages"], m, mu=1.5)
            alone_differs.append(not torch.equal(alone & m, got))
    assert any(alone_differs)  # the batch-level statistics matter here: the check can tell the two apart
    # the token samples of the first and the last step (samples_every 10): written once, by the main process, with
    # both processes' rows in their order and the whole batch's keep mask
    from entropy_rft import samples

    written_steps = samples.read_samples(tmp_path / "trl")
    assert sorted(written_steps) == [1, steps]
    for step, (mask, keep) in ((1, filtered[0]), (steps, filtered[-1])):
        written = {r["row"]: r for g in written_steps[step]["groups"] for r in g["responses"]}
        assert sorted(written) == list(range(mask.shape[0]))  # 2 groups of 8, within samples_groups (4)
        for i, r in written.items():
            assert r["length"] == int(mask[i].sum()) and r["kept"] == (keep & mask)[i, : r["length"]].int().tolist()


def loss_and_grad(trainer, out: dict, adv):
    """TRL's own loss on a captured generation batch with these (B, T) advantages, and its gradient (flattened)."""
    model = trainer.model
    model.zero_grad()
    loss = trainer._compute_loss(model, {**out, "advantages": adv})
    loss.backward()
    return loss.detach(), torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


@pytest.mark.slow
def test_dropped_tokens_leave_the_loss_and_its_count(tmp_path):
    """loss_type bnpo (token mean over the batch): the loss is the mean of -A over kept tokens only; advantages on
    dropped tokens do not move the gradient, advantages on kept ones do. dapo's token count is the kept count."""
    trainer = build(tmp_path, loss_type="bnpo")
    trainer.train()
    out, _ = trainer.captured[-1]
    keep = out["tool_mask"].bool() & out["completion_mask"].bool()
    trainer.model.train()
    grads = lambda adv: loss_and_grad(trainer, out, adv)  # noqa: E731

    adv = out["advantages"][:, None].expand_as(keep).clone()
    loss, g = grads(adv)
    scale = trainer.current_gradient_accumulation_steps
    torch.testing.assert_close(loss * scale, -(adv * keep).sum() / keep.sum())  # ratio 1 on-policy
    _, g_dropped = grads(torch.where(keep, adv, adv + 100.0))
    torch.testing.assert_close(g_dropped, g)
    _, g_kept = grads(torch.where(keep, adv + 1.0, adv))
    assert not torch.allclose(g_kept, g)

    dapo = build(tmp_path, loss_type="dapo")
    dapo.train()
    out, _ = dapo.captured[0]
    kept = (out["tool_mask"].bool() & out["completion_mask"].bool()).sum()
    assert int(out["num_items_in_batch"]) == int(kept) < int(out["completion_mask"].sum())


@pytest.mark.slow
@pytest.mark.parametrize("loss_type", ["cispo", "sapo"])
def test_clip_b_on_trls_cispo_and_sapo(tmp_path, loss_type):
    """Clip_B on TRL's own cispo and sapo losses, in TRL's training loop: advantages on dropped tokens do not move the
    gradient, those on kept tokens do; cispo's token count (num_items_in_batch) is the kept count; sapo's loss at ratio
    1 is each sequence's mean over its kept tokens of -A g(1) = -2 A / tau (tau_pos where A > 0, tau_neg elsewhere),
    then the mean over sequences (a sequence with every token dropped counts 0)."""
    trainer = build(tmp_path, loss_type=loss_type)
    trainer.train()
    dropped = [o for o, _ in trainer.captured if (o["completion_mask"].bool() & ~o["tool_mask"].bool()).any()]
    assert dropped, "Clip_B (mu 0.5) dropped no token in any generation batch"
    out = dropped[-1]
    valid = out["completion_mask"].bool()
    keep = out["tool_mask"].bool() & valid
    trainer.model.train()
    grads = lambda adv: loss_and_grad(trainer, out, adv)  # noqa: E731

    adv = out["advantages"][:, None].expand_as(keep).clone()
    loss, g = grads(adv)
    _, g_dropped = grads(torch.where(keep, adv, adv + 100.0))
    torch.testing.assert_close(g_dropped, g)
    _, g_kept = grads(torch.where(keep, adv + 1.0, adv))
    assert not torch.allclose(g_kept, g)
    if loss_type == "cispo":
        assert int(out["num_items_in_batch"]) == int(keep.sum())
    else:
        args = trainer.args
        tau = torch.where(adv > 0, args.sapo_temperature_pos, args.sapo_temperature_neg)
        per_seq = (-2.0 * adv / tau * keep).sum(-1) / keep.sum(-1).clamp(min=1)
        torch.testing.assert_close(loss * trainer.current_gradient_accumulation_steps, per_seq.mean())


@pytest.mark.slow
def test_nothing_dropped_is_plain_trl(tmp_path):
    """With a threshold no token reaches, the adapter trains exactly as GRPOTrainer does."""
    ours = build(tmp_path, method_options={"mu": 1e9})
    ours.train()
    plain = build(tmp_path, cls=GRPOTrainer)
    plain.train()
    for (name, a), b in zip(ours.model.named_parameters(), plain.model.parameters()):
        assert torch.equal(a, b), name
    assert ours.state.log_history[0]["entropy_rft/kept_frac"] == 1.0


def test_a_method_that_is_not_a_filter_names_the_trl_setting(tmp_path):
    with pytest.raises(ValueError, match="loss_type='dapo'"):
        build(tmp_path, method="dapo")


# ---------------------------------------------------------------------------------------------------------------
# Monitor mode (method "none"): TRL's loss untouched, the entropy_rft metrics, metrics.jsonl and token samples.


def watched(tmp_path, **kw):
    return build(tmp_path, method="none", method_options=None, **kw)


@pytest.mark.slow
@pytest.mark.parametrize(
    "loss_type, level, iterations, probe",
    [("grpo", "token", 1, 0), ("dapo", "token", 1, 1), ("bnpo", "token", 1, 0), ("grpo", "sequence", 2, 1)],
)
def test_monitor_trains_exactly_as_plain_trl(tmp_path, loss_type, level, iterations, probe):
    """method "none" on grpo, dapo, bnpo and GSPO (sequence-level ratio, two iterations per generation batch, so the
    later steps are off-policy): every logged loss and every final weight equal GRPOTrainer's in the same test, bit
    for bit (the monitor's forward is a no-grad pass that draws no random numbers; the probe's gradient is taken
    with torch.autograd.grad, so TRL's .grad is untouched), and the metrics reach TRL's logs at every logging step;
    with probe_every 1 the probe's two changes are logged at each generation batch's last optimizer step."""
    kw = dict(loss_type=loss_type, importance_sampling_level=level, num_iterations=iterations, max_steps=4)
    ours = watched(tmp_path / "ours", probe_every=probe, **kw)
    ours.train()
    plain = build(tmp_path / "plain", cls=GRPOTrainer, **kw)
    plain.train()
    for (name, a), b in zip(ours.model.named_parameters(), plain.model.parameters()):
        assert torch.equal(a, b), name
    losses = [(h["step"], h["loss"]) for h in ours.state.log_history if "loss" in h]
    assert losses == [(h["step"], h["loss"]) for h in plain.state.log_history if "loss" in h] and len(losses) == 4
    generated = [h for h in ours.state.log_history if "reward" in h]  # the logging steps with a generation batch
    assert len(generated) == 4 // iterations
    assert [h for h in ours.state.log_history if "entropy_rft/entropy" in h] == generated
    for h in generated:
        assert {
            "entropy_rft/entropy",
            "entropy_rft/s_star_mean",
            "entropy_rft/s_centered_mean",
            "entropy_rft/cov_a_sc",
            "entropy_rft/would_clip_b/frac",
            "entropy_rft/would_clip_v/frac",
        } <= set(h)
        assert ("entropy_rft/entropy_change/predicted" in h) == (loss_type != "bnpo")  # departure 5
        assert "entropy_rft/kept_frac" not in h  # no filter
    probed = [h["step"] for h in ours.state.log_history if "entropy_rft/entropy_change/first_order" in h]
    assert probed == ([] if not probe else list(range(iterations, 5, iterations)))
    assert probed == [h["step"] for h in ours.state.log_history if "entropy_rft/entropy_change/realised" in h]


@pytest.mark.slow
def test_monitor_metrics_against_the_captured_batch(tmp_path):
    """The first generation batch's metrics on the shipped countdown policy (countdown_trainer: loss_type dapo, one
    optimizer step per generation batch of 256 rows, so each token's step is lr / n over the n valid tokens): the
    entropy and S_c means over every valid token; the predicted change -mean_T[step A (S_c - mean_T S_c)] written
    out by hand in float64; Clip_B's and Clip_V's would-be fractions at their default mu 2.5 and 8.5 (masks.py)
    and their eq. 23 shares -sum step A S_c / n over the tokens each drops (none, at the default mu, on this batch:
    tests/test_watch.py checks batches where they drop tokens). Tolerances: rel 1e-4 for numbers
    computed in float32 from statistics of another forward pass of the same weights (they agree to about 1e-6)."""
    from entropy_rft.core import masks
    from entropy_rft.integrations.trl_countdown import countdown_trainer

    trainer = countdown_trainer(tmp_path / "out", method="none", steps=1, cls=Capturing)
    trainer.captured = []
    trainer.train()
    out, stats = trainer.captured[0]
    logged = trainer.state.log_history[0]
    assert "tool_mask" not in out  # the monitor leaves TRL's batch alone
    mask = out["completion_mask"].bool()
    adv, lr, n = out["advantages"].double(), trainer.args.learning_rate, int(mask.sum())
    s_c, a = stats.s_centered.double()[mask], adv[:, None].expand_as(mask)[mask]
    step = lr / n
    assert logged["entropy_rft/entropy_change/predicted"] == pytest.approx(
        float(-(step * a * (s_c - s_c.mean())).mean()), rel=1e-4
    )
    assert logged["entropy_rft/entropy"] == pytest.approx(float(stats.entropy.double()[mask].mean()), rel=1e-5)
    assert logged["entropy_rft/s_centered_mean"] == pytest.approx(float(s_c.mean()), rel=1e-4, abs=1e-7)
    for name, keep in (
        ("clip_b", masks.clip_b(stats.s_star, out["advantages"], mask, mu=2.5)[0]),
        ("clip_v", masks.clip_v(stats.s_centered, out["advantages"], mask, mu=8.5, max_frac=1e-4)[0]),
    ):
        dropped = ~keep[mask]
        assert logged[f"entropy_rft/would_{name}/frac"] == pytest.approx(float(dropped.sum()) / n, rel=1e-6)
        share = float(-(step * a * s_c)[dropped].sum() / n)
        assert logged[f"entropy_rft/would_{name}/entropy_change"] == pytest.approx(share, rel=1e-4, abs=1e-15)
    # the same prediction by region (A's sign x S* > 0), written out in float64; the four add up to it
    s_star, terms = stats.s_star.double()[mask], -(step * a * (s_c - s_c.mean())) / n
    total = 0.0
    for sign, side in (("pos", a > 0), ("neg", a < 0)):
        for kind, where in (("likely", s_star > 0), ("unlikely", s_star <= 0)):
            got = logged[f"entropy_rft/entropy_change/by_region/{sign}_{kind}"]
            assert got == pytest.approx(float(terms[side & where].sum()), rel=1e-4, abs=1e-15)
            assert logged[f"entropy_rft/clip_frac_by_region/{sign}_{kind}"] == 0.0  # the monitor filters nothing
            total += got
    assert total == pytest.approx(logged["entropy_rft/entropy_change/predicted"], rel=1e-4, abs=1e-15)


@pytest.mark.slow
@pytest.mark.parametrize(
    "loss_type, level",
    [
        ("grpo", "token"),
        ("dapo", "token"),
        ("dr_grpo", "token"),
        ("sapo", "token"),
        ("luspo", "sequence"),
        ("cispo", "token"),
        ("grpo", "sequence"),
    ],
)
def test_step_sizes_are_trls_own_gradients(tmp_path, loss_type, level):
    """The per-token step the monitor predicts with is TRL's loss: for one micro-batch of the generation batch (rows
    0-3 of 8) at ratio 1, d loss / d log p_t from TRL's own _compute_loss under autograd equals -A_t step_t / lr, for
    each loss_type whose weight the monitor knows (GSPO's sequence ratio as grpo with importance_sampling_level
    "sequence"). rel 1e-5: float32 gradients against float64 weights."""
    trainer = watched(tmp_path, loss_type=loss_type, importance_sampling_level=level, max_steps=1)
    trainer.train()
    out, _ = trainer.captured[0]
    step = trainer._step_size(1e-3, out["completion_mask"].bool())
    held = {}
    original = trainer._get_per_token_logps_and_entropies

    def keep_logps(*args, **kwargs):
        logps, entropies, aux = original(*args, **kwargs)
        logps.retain_grad()
        held["logps"] = logps
        return logps, entropies, aux

    trainer._get_per_token_logps_and_entropies = keep_logps
    rows = slice(0, 4)
    micro = {k: v[rows] if torch.is_tensor(v) and v.dim() > 0 else v for k, v in out.items()}
    trainer.model.train()
    trainer._compute_loss(trainer.model, micro).backward()
    mask = out["completion_mask"][rows].bool()
    size = torch.as_tensor(step, dtype=torch.float64)
    want = -out["advantages"][rows, None].double() * (size[rows] if size.dim() == 2 else size) / 1e-3
    got = held["logps"].grad.double()
    torch.testing.assert_close(got * mask, want * mask, rtol=1e-5, atol=1e-9)
    assert (got * mask).abs().sum() > 0


@pytest.mark.slow
def test_monitor_writes_what_inspect_and_report_read(tmp_path):
    """A monitored run's OUTPUT_DIR: token samples of steps 1 and the last (samples_every 10), every row of the
    generation batch, every valid token kept (nothing filtered), the method "none"; metrics.jsonl with one line per
    logging step named as the built-in trainer's; `entropy-rft inspect` and `entropy-rft report` (the CLI, in a
    subprocess) build their pages from it."""
    from entropy_rft import samples
    from entropy_rft.logging import read_metrics

    trainer = watched(tmp_path, max_steps=3, steps_per_generation=2, gradient_accumulation_steps=2)
    trainer.train()
    run = tmp_path / "out"
    written = samples.read_samples(run)
    assert sorted(written) == [1, 3]
    rec = written[1]
    out, _ = trainer.captured[0]
    assert rec["method"] == "none" and rec["loss_type"] == "dapo"
    rows = {r["row"]: r for g in rec["groups"] for r in g["responses"]}
    assert sorted(rows) == list(range(8))
    mask = out["completion_mask"].bool()
    for i, r in rows.items():
        assert r["kept"] == [1] * int(mask[i].sum())
    lines = read_metrics(run)
    assert [m["step"] for m in lines] == [1, 2, 3]
    logged = [h for h in trainer.state.log_history if "entropy_rft/entropy" in h]
    assert [m["entropy"] for m in lines] == [h["entropy_rft/entropy"] for h in logged]
    assert {"reward_mean", "grad_norm", "cov_a_sc", "s_star_mean", "entropy_change/predicted"} <= set(lines[0])
    from entropy_rft.metric_names import undocumented

    assert undocumented(set().union(*lines), "trl") == []  # every key is in the metrics reference (issue 43)
    root = Path(__file__).parents[1]
    for cmd in (["inspect", str(run)], ["report", str(run), "--out", str(tmp_path / "report")]):
        done = subprocess.run(
            [sys.executable, "-m", "entropy_rft.commands.cli", *cmd],
            capture_output=True,
            text=True,
            cwd=root,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr[-2000:]
    assert (run / "inspect.html").stat().st_size > 0 and (tmp_path / "report" / "report.md").exists()


def test_monitor_takes_no_options(tmp_path):
    with pytest.raises(ValueError, match="no method_options"):
        build(tmp_path, method="none", method_options={"mu": 1.0})
    with pytest.raises(ValueError, match="method='none'"):
        build(tmp_path, method="grpo")


@pytest.mark.slow
def test_two_processes_monitor_changes_nothing_and_writes_once(tmp_path):
    """TRL's own loop in two processes on countdown, 3 steps of 8 rows a process, monitored and then plain from the
    same seed: on each process every logged loss and every final weight are equal bit for bit; the monitor's
    statistics are over both processes' rows (16, the same gathered batch on each process, and the logged entropy
    is their mean over every valid token); the token samples of steps 1 and 3 and metrics.jsonl are written once
    (by the main process: one line per step, not two) with both processes' rows."""
    from entropy_rft import samples
    from entropy_rft.logging import read_metrics

    steps = 3
    launch_two(tmp_path, steps, "monitor")
    ranks = [torch.load(tmp_path / f"monitor{i}.pt", weights_only=False) for i in range(2)]
    for rank in ranks:
        ours, plain = rank["monitor"], rank["plain"]
        assert ours["losses"] == plain["losses"] and len(ours["losses"]) == steps
        for name, value in ours["weights"].items():
            assert torch.equal(value, plain["weights"][name]), name
    for step in range(steps):
        seen = [rank["monitor"]["captured"][step]["gathered"] for rank in ranks]
        assert seen[0]["mask"].shape[0] == 16
        for key in seen[0]:
            assert torch.equal(seen[0][key], seen[1][key]), (step, key)
        mask = seen[0]["mask"]
        logged = [h for h in ranks[0]["monitor"]["logs"] if "entropy_rft/entropy" in h][step]
        assert logged["entropy_rft/entropy"] == pytest.approx(float(seen[0]["entropy"][mask].double().mean()), rel=1e-5)
        # this process's own rows are a part of the gathered batch: the check tells the two apart
        own = ranks[0]["monitor"]["captured"][step]["out"]["completion_mask"].shape[0]
        assert own == 8
    written = samples.read_samples(tmp_path / "monitor")
    assert sorted(written) == [1, steps]
    for rec in written.values():
        rows = sorted(r["row"] for g in rec["groups"] for r in g["responses"])
        assert rows == list(range(16)) and rec["method"] == "none"
    assert [m["step"] for m in read_metrics(tmp_path / "monitor")] == list(range(1, steps + 1))


@pytest.mark.slow
def test_monitor_forwards_only_for_logged_steps(tmp_path):
    """logging_steps 2 without samples (samples_every 0), one optimizer step per generation batch: the monitor's extra
    forward runs for the batches of steps 2 and 4 only, and each of those logs carries the metrics."""

    class Counting(EntropyGRPOTrainer):
        def _token_stats(self, out):
            self.forwards.append(self.state.global_step + 1)
            return super()._token_stats(out)

    path = resolve_model_path(STAND_IN)
    trainer = Counting(
        model=path,
        reward_funcs=reward_a,
        args=config(tmp_path, max_steps=4, logging_steps=2),
        train_dataset=dataset(),
        method="none",
        samples_every=0,
    )
    trainer.forwards = []
    trainer.train()
    assert trainer.forwards == [2, 4]
    logged = [h["step"] for h in trainer.state.log_history if "entropy_rft/entropy" in h]
    assert logged == [2, 4]


@pytest.mark.slow
def test_inspect_page_of_a_monitored_run_in_chromium(tmp_path):
    """The inspect page of a monitored TRL run on the shipped countdown policy (countdown_trainer, method "none", one
    step), in headless Chromium (`make chromium`): no console error and no request but the page; one token element
    per written token, none clipped (the monitor drops nothing), the tokens Clip_B and Clip_V would drop marked
    exactly as the file's marks (Clip_B drops some at step 1); Tab reaches a token and the panel shows its stored
    values. The same record without terms (a bnpo loss: step sizes unknown) opens coloured by -A S_c, its legend no
    "-0 ... +0" ramp. A screenshot is written (ENTROPY_RFT_SCREENSHOT: also copied there; docs/watch.png is one)."""
    import copy
    import shutil

    from cdp import Browser, find_chromium
    from test_inspect import _check_details, _check_dom, _tab_to_token, _token_places

    from entropy_rft import samples
    from entropy_rft.commands import inspect_page
    from entropy_rft.integrations.trl_countdown import countdown_trainer

    if find_chromium() is None:
        why = "no chromium on PATH: `make chromium` installs Debian's (apt-get install chromium)"
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    run = tmp_path / "trl-watched"
    countdown_trainer(run, method="none", steps=1).train()
    rec = samples.read_samples(run)[1]
    assert _token_places(rec)[1] == set()  # nothing clipped
    marked = {
        m["key"]: {
            (k, j, t)
            for k, g in enumerate(rec["groups"])
            for j, resp in enumerate(g["responses"])
            for t, x in enumerate(resp[m["key"]])
            if x
        }
        for m in rec["marks"]
    }
    assert list(marked) == ["would_clip_b", "would_clip_v"]  # which tokens: the written groups may hold none
    # the same record as a loss whose step sizes are unknown (bnpo): no terms, coloured by -A S_c instead; three
    # tokens of its first response marked as Clip_B's, so the underlining is checked on tokens that are marked
    blind, unknown = tmp_path / "trl-bnpo", copy.deepcopy(rec)
    for g in unknown["groups"]:
        for resp in g["responses"]:
            resp["term"], resp["term_scale"] = [None] * len(resp["text"]), None
    first = unknown["groups"][0]["responses"][0]
    first["would_clip_b"] = [1, 1, 1] + first["would_clip_b"][3:]
    planted = {(0, 0, t) for t, x in enumerate(first["would_clip_b"]) if x}
    samples.write_record(blind, {**unknown, "loss_type": "bnpo", "top": {}, "entropy_change": {}})
    out = inspect_page.build_page([run], tmp_path / "inspect.html")
    with Browser(find_chromium()) as browser:
        bnpo = browser.open(inspect_page.build_page([blind], tmp_path / "bnpo.html").resolve().as_uri())
        bnpo.wait_for("document.body.dataset.ready === '1'")
        assert bnpo.evaluate("document.getElementById('stat').value") == "push"
        coloured = bnpo.evaluate("Array.from(document.querySelectorAll('.tok')).filter(e => e.style.background).length")
        assert coloured > 0.5 * _token_places(rec)[0]
        assert "\u22120 " not in bnpo.evaluate("document.getElementById('legend').textContent")
        got = bnpo.evaluate(
            "Array.from(document.querySelectorAll('#runs .tok.mark-0'))"
            ".map(e => [+e.dataset.group, +e.dataset.resp, +e.dataset.pos])"
        )
        assert {tuple(x) for x in got} == planted | marked["would_clip_b"]
        assert "Clip_B (mu 2.5) would drop it" in bnpo.evaluate("document.getElementById('legend').textContent")
        page = browser.open(out.resolve().as_uri())
        page.wait_for("document.body.dataset.ready === '1'")
        _check_dom(page, [rec])
        for i, places in enumerate(marked.values()):
            got = page.evaluate(
                f"Array.from(document.querySelectorAll('#runs .tok.mark-{i}'))"
                ".map(e => [+e.dataset.group, +e.dataset.resp, +e.dataset.pos])"
            )
            assert {tuple(x) for x in got} == places
        assert "Clip_B (mu 2.5) would drop it" in page.evaluate("document.getElementById('legend').textContent")
        _tab_to_token(page)
        r, k, j, t = page.evaluate(
            "(e => [+e.dataset.run, +e.dataset.group, +e.dataset.resp, +e.dataset.pos])(document.activeElement)"
        )
        _check_details(page, rec, k, j, t)
        shot = page.screenshot(tmp_path / "inspect.png")
        browser.pump(0.2)
        assert page.errors() == []
        assert page.requests() == [out.resolve().as_uri()]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000
    if os.environ.get("ENTROPY_RFT_SCREENSHOT"):
        shutil.copy(shot, os.environ["ENTROPY_RFT_SCREENSHOT"])


@pytest.mark.slow
def test_probe_first_order_predicts_the_realised_change(tmp_path):
    """The monitor's probe (probe_every 1) on 12 steps of TRL's own loop (dapo, Adam, lr 5e-3 with TRL's linear
    decay): every logged step carries first_order and realised, the median of first_order / realised is within
    [0.5, 2], and the signs agree on at least 80% of the steps whose realised change exceeds 1e-4 (of which there are
    at least 6, so the check has steps to judge). Both reach metrics.jsonl under the built-in trainer's names."""
    import statistics

    from entropy_rft.logging import read_metrics

    trainer = watched(tmp_path, max_steps=12, learning_rate=5e-3, probe_every=1)
    trainer.train()
    logged = [h for h in trainer.state.log_history if "entropy_rft/entropy" in h]
    assert [h["step"] for h in logged] == list(range(1, 13))
    pairs = [(h["entropy_rft/entropy_change/first_order"], h["entropy_rft/entropy_change/realised"]) for h in logged]
    assert 0.5 <= statistics.median(f / r for f, r in pairs) <= 2.0
    moved = [(f, r) for f, r in pairs if abs(r) > 1e-4]
    assert len(moved) >= 6
    assert sum((f > 0) == (r > 0) for f, r in moved) >= 0.8 * len(moved)
    lines = read_metrics(tmp_path / "out")
    assert [(m["entropy_change/first_order"], m["entropy_change/realised"]) for m in lines] == pairs
    # `entropy-rft report` on it: what was watched, the would-clip metrics, the probe's figures, no clip column
    from entropy_rft.commands.report import build_report

    text = build_report([tmp_path / "out"], tmp_path / "report").read_text()
    table = text[text.index("| run | engine") :].split("\n")
    head, row = table[0], dict(zip(table[0].strip("|").split(" | "), table[2].strip("|").split(" | ")))
    assert "mean clip frac" not in head and "| run | method | mu |" not in text  # the built-in runs' table
    assert row["engine"].strip() == "trl 1.16.0" and row["method"] == "none" and row["loss watched"] == "dapo"
    assert row["steps"] == "12" and row["probed steps"] == "12"
    for name in ("clip_b", "clip_v"):
        mean = statistics.mean(m[f"would_{name}/frac"] for m in lines)
        assert float(row[f"{name} would drop (mean frac)"]) == pytest.approx(mean, abs=1e-4)
    ratio = statistics.median(r / f for f, r in pairs)
    assert float(row["realised / first order (median)"]) == pytest.approx(ratio, rel=1e-2)
    assert (tmp_path / "report" / "would_clip.png").stat().st_size > 0


def test_probe_every_rejects_a_negative_cadence(tmp_path):
    with pytest.raises(ValueError, match="probe_every"):
        watched(tmp_path, probe_every=-1)


@pytest.mark.slow
def test_logged_monitor_values_are_the_logged_steps_batch(tmp_path):
    """logging_steps 3 over 6 steps, samples at steps 1 and 6 (samples_every 10), one optimizer step per generation
    batch: the monitor's statistics are computed for the batches of steps 1 (samples), 3 and 6, and each log line's
    entropy_rft/entropy is that of the logged step's own batch (step 3's: not averaged with step 1's, which was
    computed only for its samples)."""
    trainer = watched(tmp_path, max_steps=6, logging_steps=3)
    trainer.train()
    logged = {h["step"]: h["entropy_rft/entropy"] for h in trainer.state.log_history if "entropy_rft/entropy" in h}
    assert sorted(logged) == [3, 6]
    for step, (out, stats) in enumerate(trainer.captured, start=1):
        if step in logged:
            mask = out["completion_mask"].bool()
            assert logged[step] == pytest.approx(float(stats.entropy[mask].double().mean()), rel=1e-5)


def test_an_untested_trl_release_is_refused_with_the_tested_range():
    """check_trl_version: TRL 1.16.x passes; 1.17, 1.18.1 and 1.15 are refused with an error naming the tested range
    and what the release notes say changed (AsyncGRPOTrainer), or only warned about when the user allows it."""
    from entropy_rft.integrations.trl import check_trl_version

    check_trl_version("1.16.0")
    check_trl_version("1.16.3.dev0")
    for version in ("1.17.0", "1.18.1", "1.15.2"):
        with pytest.raises(RuntimeError, match=r"TRL >= 1\.16, < 1\.17.*AsyncGRPOTrainer"):
            check_trl_version(version)
        with pytest.warns(UserWarning, match=r"TRL >= 1\.16, < 1\.17"):
            check_trl_version(version, allow_untested=True)


class CapturingLoRA(Capturing):
    """Capturing, plus the statistics the adapter filtered on and the base model's (LoRA adapters disabled)."""

    def _token_stats(self, out):
        from entropy_rft.train.forward import _checkpointing

        stats = super()._token_stats(out)
        self.used.append(stats)
        self.checkpointing.append(_checkpointing(self.model))
        return stats

    def _generate_and_score_completions(self, inputs):
        out = super()._generate_and_score_completions(inputs)
        self.model.eval()
        with torch.no_grad(), self.model.disable_adapter():
            self.base.append(policy_stats(self.model, rollout_of(out), self.temperature))
        self.model.train()
        return out


@pytest.mark.slow
def test_lora_with_gradient_checkpointing_filters_on_the_adapted_policy(tmp_path):
    """TRL's LoRA (peft_config) with gradient checkpointing, a shape TRL users train in. At every generation batch the
    statistics the adapter filters on are the adapted policy's (adapters on; to 1e-5, float32 round-off of another
    pass of the same weights: logits of order 10 carry about 1e-6, and 1e-5 is 100 times below the 1e-3 by which the
    premise requires the adapters to move log p); once optimizer steps have moved the adapters they are not the base
    model's; and the kept tokens are Clip_B's on them over the whole generation batch (checked on the first such
    batch with non-zero advantages)."""
    from peft import LoraConfig, PeftModel

    lora = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    trainer = build(tmp_path, cls=CapturingLoRA, max_steps=4, gradient_checkpointing=True, peft_config=lora)
    trainer.used, trainer.base, trainer.checkpointing = [], [], []
    trainer.train()
    assert isinstance(trainer.model, PeftModel) and trainer.checkpointing == [True] * 4
    assert len(trainer.captured) == len(trainer.used) == len(trainer.base) == 4
    for (out, adapted), used in zip(trainer.captured, trainer.used):
        mask = out["completion_mask"].bool()
        for key in ("logp", "entropy", "s_star"):
            assert (getattr(used, key) - getattr(adapted, key)).abs()[mask].max() <= 1e-5, key
    i = next((i for i in range(1, 4) if trainer.captured[i][0]["advantages"].any()), None)  # after an optimizer step
    assert i is not None, "every generation batch after the first had zero advantages: nothing to filter"
    (out, adapted), base = trainer.captured[i], trainer.base[i]
    mask = out["completion_mask"].bool()
    assert (adapted.logp - base.logp).abs()[mask].max() > 1e-3  # the premise: the adapters changed the policy
    want, _ = METHODS.get("clip_b").apply(adapted, out["advantages"], mask, mu=0.5)
    assert torch.equal(out["tool_mask"].bool() & mask, want & mask)
    assert (mask & ~want).any()  # the premise: a real filter


@pytest.mark.slow
@pytest.mark.parametrize("bf16", [True, False], ids=["bf16", "fp32"])
def test_statistics_pass_runs_in_the_steps_precision(tmp_path, bf16):
    """The adapter's statistics pass runs in the precision accelerate gives TRL's training forward (departure 2):
    with bf16 it is forward.batch_stats under bf16 autocast bit for bit, and its log p, H and S* lie within
    invariants.stats_tolerance of a float64 forward of the same weights (bf16's unit roundoff 2^-8 through the
    network's 2 L + 3 rounded contributions), with an error above float32's (bf16 is really at work); without, it
    is the float32 pass bit for bit."""
    from invariants import float64_reference, stats_tolerance

    from entropy_rft.integrations.trl import compute_precision
    from entropy_rft.train.forward import batch_stats

    trainer = build(tmp_path, max_steps=1, bf16=bf16)
    assert compute_precision(trainer.accelerator) == ("bf16" if bf16 else "fp32")
    trainer.train()
    out, _ = trainer.captured[0]
    rollout, rows = rollout_of(out), trainer.args.per_device_train_batch_size
    got = trainer._token_stats(out)
    for precision in ("bf16", "fp32"):
        want = batch_stats(trainer.model, rollout, trainer.temperature, rows, precision)
        same = all(torch.equal(getattr(got, k), getattr(want, k)) for k in ("logp", "entropy", "s_star", "s_expect"))
        assert same == (precision == ("bf16" if bf16 else "fp32")), precision
    cfg = trainer.model.config
    plain = type(trainer.model)(cfg)  # the same weights without accelerate's autocasting forward (a deep copy keeps it)
    plain.load_state_dict(trainer.model.state_dict())
    ref, logits = float64_reference(plain, rollout, trainer.temperature)
    bound = stats_tolerance(ref, logits, precision="bf16", layers=cfg.num_hidden_layers, width=cfg.hidden_size)
    mask = rollout.response_mask
    for key in ("logp", "entropy", "s_star"):
        err = (getattr(got, key).double() - getattr(ref, key)).abs()[mask]
        assert (err <= bound[key][mask]).all(), (key, float(err.max()))
    worst = float((got.logp.double() - ref.logp).abs()[mask].max())
    assert (worst > 1e-5) == bf16, worst


@pytest.mark.slow
def test_stare_weights_the_generation_batchs_advantages(tmp_path):
    """STARE (variant C2, P 0.25, its gate open) on the same seed as plain GRPOTrainer: the generation batch's
    advantages become per token, TRL's per-response advantage times 1.1 on the top-P surprisal tokens of A > 0 and
    0.9 on those of A < 0 (k = max(1, int(n P + 0.999999)) of each sign's n valid tokens; surprisal from the captured
    policy statistics, compared with 1e-5 slack for the two forwards' rounding), 1 elsewhere; nothing is dropped; a
    sequence-level or non-clipped TRL loss is refused."""
    options = {"variant": "C2", "top_p_ratio": 0.25, "entropy_gate": 100.0}
    ours = build(tmp_path / "ours", method="stare", method_options=options, max_steps=1)
    ours.train()
    plain = build(tmp_path / "plain", cls=Capturing, method="none", method_options=None, max_steps=1)
    plain.train()
    out, stats = ours.captured[0]
    base, _ = plain.captured[0]
    assert torch.equal(out["completion_ids"], base["completion_ids"])  # one seed: the same batch
    mask = out["completion_mask"].bool()
    assert "tool_mask" not in out or bool(out["tool_mask"].bool()[mask].all())
    a = base["advantages"][:, None].expand_as(mask)
    ratio = torch.where(a != 0, out["advantages"] / torch.where(a != 0, a, 1.0), torch.ones_like(a))
    surprisal = -stats.logp
    for sign, weight in ((1, 1.1), (-1, 0.9)):
        side = mask & ((a > 0) if sign > 0 else (a < 0))
        n = int(side.sum())
        chosen = side & torch.isclose(ratio, torch.tensor(weight), atol=1e-6)
        assert int(chosen.sum()) == (0 if n == 0 else min(max(1, int(n * 0.25 + 0.999999)), n))
        if n and int(chosen.sum()) < n:
            assert float(surprisal[chosen].min()) >= float(surprisal[side & ~chosen].max()) - 1e-5
    others = (
        mask & ~torch.isclose(ratio, torch.tensor(1.1), atol=1e-6) & ~torch.isclose(ratio, torch.tensor(0.9), atol=1e-6)
    )
    assert torch.allclose(ratio[others], torch.ones_like(ratio[others]), atol=1e-6)
    logged = [h for h in ours.state.log_history if "entropy_rft/mean_weight" in h]
    assert logged and logged[0]["entropy_rft/gate_open"] == 1.0
    with pytest.raises(ValueError, match="STARE weights the clipped surrogate"):
        build(tmp_path / "seq", method="stare", method_options={}, importance_sampling_level="sequence")


@pytest.mark.slow
def test_rsi_keep_mask_is_the_band_over_the_whole_generation_batch(tmp_path):
    """RSI-S (band [0.95, 1.02]: the stand-in policy is near uniform, RSI about 1) in TRL: the kept tokens are
    masks.rsi_band's over all 8 rows at once (the captured statistics), it drops tokens, and TRL's logs carry its
    drop fraction."""
    band = {"rsi_lower_bound": 0.95, "rsi_upper_bound": 1.02}
    trainer = build(tmp_path, method="rsi", method_options=band)
    trainer.train()
    out, stats = trainer.captured[0]
    mask = out["completion_mask"].bool()
    want, _ = METHODS.get("rsi").apply(stats, out["advantages"], mask, **band)
    assert torch.equal(out["tool_mask"].bool() & mask, want & mask)
    assert (mask & ~want).any()
    assert any("entropy_rft/rsi_drop_low" in h for h in trainer.state.log_history)


@pytest.mark.parametrize("recenter", [True, False])
def test_grpo_dropout_deletes_rollouts_over_the_whole_generation_batch(tmp_path, recenter):
    """GRPODropout in TRL, on the same seed as plain GRPOTrainer: the deleted rollouts are core.rollouts.grpo_dropout's
    over all 8 rows at once (TRL's groups of num_generations rows, TRL's rewards and advantages, the captured
    statistics), every token of a deleted rollout leaves the loss (tool_mask) and TRL's token count, and the kept
    rollouts' advantages are the rule's (recomputed by TRL's group rule, recentred); TRE's bonus is refused."""
    from entropy_rft.integrations.trl import rollout_estimator

    options = {"recenter": recenter}
    ours = build(tmp_path / "ours", method="grpo_dropout", method_options=options, max_steps=1)
    ours.train()
    plain = build(tmp_path / "plain", method="none", method_options=None, max_steps=1)
    plain.train()
    out, stats = ours.captured[0]
    base, _ = plain.captured[0]
    assert torch.equal(out["completion_ids"], base["completion_ids"])  # one seed: the same batch
    mask = out["completion_mask"].bool()
    groups = torch.arange(mask.shape[0]) // 4
    want, kept, _ = METHODS.get("grpo_dropout").rollouts(
        ours._batch_rewards.float(),
        base["advantages"].float(),
        groups,
        stats.logp,
        mask,
        estimator=rollout_estimator(ours.scale_rewards),
        generator=torch.Generator().manual_seed(0),
        **options,
    )
    assert not kept.all()  # the rule deletes rollouts here: the check is not empty
    tool = out["tool_mask"].bool() & mask
    assert torch.equal(tool.any(-1) | ~mask.any(-1), kept | ~mask.any(-1))
    assert torch.equal(tool, mask & kept[:, None])
    torch.testing.assert_close(out["advantages"].float(), want, rtol=1e-5, atol=1e-6)
    assert int(out["num_items_in_batch"]) == int((mask & kept[:, None]).sum())
    assert any("entropy_rft/rollouts_kept_frac" in h for h in ours.state.log_history)
    for method in ("tre_k", "tre_k+clip_b", "entrocraft+clip_b"):  # their rule would be silently skipped
        with pytest.raises(ValueError, match="built-in trainer"):
            build(tmp_path / method, method=method, method_options={})


def test_stare_with_clip_b_weights_the_tokens_clip_b_keeps(tmp_path):
    """stare+clip_b in TRL: the loss keeps Clip_B's tokens (mu 0.5, over the whole batch), and the advantages carry
    STARE's weights ranked over those kept tokens (masks.stare_weights on Clip_B's keep mask)."""
    from entropy_rft.core.masks import stare_weights

    options = {"mu": 0.5, "top_p_ratio": 0.25, "entropy_gate": 100.0}
    ours = build(tmp_path / "ours", method="stare+clip_b", method_options=options, max_steps=1)
    ours.train()
    plain = build(tmp_path / "plain", method="none", method_options=None, max_steps=1)
    plain.train()
    out, stats = ours.captured[0]
    base, _ = plain.captured[0]
    mask = out["completion_mask"].bool()
    keep, _ = METHODS.get("clip_b").apply(stats, base["advantages"], mask, mu=0.5)
    assert torch.equal(out["tool_mask"].bool() & mask, keep & mask) and (mask & ~keep).any()
    omega, _ = stare_weights(
        stats.logp, base["advantages"], keep & mask, stats.entropy, top_p_ratio=0.25, entropy_gate=100.0
    )
    want = base["advantages"][:, None] * omega
    torch.testing.assert_close(out["advantages"][keep & mask], want[keep & mask], rtol=1e-5, atol=1e-5)
