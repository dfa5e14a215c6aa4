"""End-to-end: the trainer's outputs, determinism, resume, micro-batch invariance, and the demo's files."""

import dataclasses
import json
import math

import pytest
import torch
from tiny import THREE_STEPS, tiny_config

from entropy_rft.config import load_config
from entropy_rft.logging import read_metrics
from entropy_rft.train.trainer import train

REQUIRED = {
    "step",
    "reward_mean",
    "accuracy",
    "entropy",
    "clip_frac",
    "clip_frac_pos",
    "clip_frac_neg",
    "response_length",
    "lr",
    "grad_norm",
    "seconds",
    "s_star_mean",
    "s_centered_mean",
    "cov_a_sc",
    "entropy_change/predicted",
    "entropy_change/predicted_offpolicy",
    "truncation_rate",
}
PROBED = {"entropy_change/realised", "entropy_change/first_order"}  # on probe steps only


def tiny(tmp_path, name="run", **kw):
    return tiny_config(tmp_path, name, shape=THREE_STEPS, **kw)


@pytest.mark.slow
def test_train_writes_metrics_checkpoint_and_evals(tmp_path):
    """Every step writes one metrics line with the required keys, the entropy probe's keys exactly on the probe
    steps; the final checkpoint loads and evals exist."""
    cfg = tiny(tmp_path, method="clip_b", mu=1.0, probe_every=2)
    summary = train(cfg)
    rows = read_metrics(cfg.out)
    assert [r["step"] for r in rows] == [1, 2, 3]
    for row in rows:
        assert REQUIRED <= set(row)
        assert (PROBED <= set(row)) == (row["step"] == 2) and (PROBED & set(row) in (set(), PROBED))
        assert 0.0 <= row["clip_frac"] <= 1.0 and row["entropy"] > 0
    assert set(summary["evals"]) == {0, 3}
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(summary["checkpoint"])
    assert json.loads((tmp_path / "run" / "eval.json").read_text())["3"]["k"] == 2


@pytest.mark.slow
def test_headline_entropy_is_the_policys_whatever_the_filter(tmp_path):
    """`entropy` is the policy's mean over every valid response token, so at step 1 (same policy, seed and
    rollouts) every method logs GRPO's value; the kept-token mean is `entropy_kept`, which the filters move."""
    rows = {}
    for method, kw in {
        "grpo": {},
        "clip_b": {"mu": 0.5},
        "clip_v": {"mu": 0.5, "max_frac": 0.05},
        "forking": {},
    }.items():
        cfg = tiny(tmp_path, method, method=method, steps=1, eval_problems=2, **kw)
        train(cfg)
        rows[method] = read_metrics(cfg.out)[0]
    grpo = rows["grpo"]
    assert grpo["entropy_kept"] == grpo["entropy"]  # GRPO keeps every token
    for method, row in rows.items():
        assert row["entropy"] == grpo["entropy"], method
        assert row["clip_frac"] > 0 or method == "grpo"
    assert rows["forking"]["entropy_kept"] > rows["forking"]["entropy"]  # it keeps the highest-entropy 20%


@pytest.mark.slow
def test_seeded_runs_are_identical(tmp_path):
    """Same config and seed on CPU give identical metrics (timings aside)."""

    def strip(rows):
        return [{k: v for k, v in r.items() if k != "seconds" and not k.startswith("time/")} for r in rows]

    train(tiny(tmp_path, "a"))
    train(tiny(tmp_path, "b"))
    assert strip(read_metrics(tmp_path / "a")) == strip(read_metrics(tmp_path / "b"))


@pytest.mark.slow
def test_resume_continues_exactly(tmp_path):
    """A run stopped after 2 steps and resumed to 3 ends with the same weights as an uninterrupted run."""
    train(tiny(tmp_path, "full"))
    train(tiny(tmp_path, "part", steps=2))
    cfg = tiny(tmp_path, "part")
    train(cfg, resume=True)
    from safetensors.torch import load_file

    a = load_file(tmp_path / "full" / "checkpoint-3" / "model.safetensors")
    b = load_file(tmp_path / "part" / "checkpoint-3" / "model.safetensors")
    for key in a:
        torch.testing.assert_close(a[key], b[key], atol=1e-6, rtol=0)


@pytest.mark.slow
def test_interrupt_saves_the_steps_completed(tmp_path, monkeypatch):
    """Ctrl-C while step 2's metrics line is being written (after its update) saves checkpoint-2 with step 2
    pending (two updates applied), stops the engine, and the resumed run logs step 2 once and finishes with a
    well-formed checkpoint-3. (A Ctrl-C between the update and its metrics is held by the stop signals until the line
    is written: tests/test_step_commit.py.)"""
    from entropy_rft.logging import MetricLogger
    from entropy_rft.rollout import HFEngine

    calls = {"log": 0, "close": 0}
    log = MetricLogger.log

    def cut(self, metrics):
        calls["log"] += 1
        if calls["log"] == 2:
            raise KeyboardInterrupt
        return log(self, metrics)

    monkeypatch.setattr(MetricLogger, "log", cut)
    monkeypatch.setattr(HFEngine, "close", lambda self: calls.__setitem__("close", calls["close"] + 1))
    cfg = tiny(tmp_path, "cut")
    with pytest.raises(SystemExit, match="after 2 steps"):
        train(cfg)
    assert (tmp_path / "cut" / "latest_checkpoint").read_text() == "checkpoint-2" and calls["close"] == 1
    state = torch.load(tmp_path / "cut" / "checkpoint-2" / "trainer_state.pt", weights_only=False)
    assert state["step"] == 2
    monkeypatch.undo()
    train(cfg, resume=True)
    assert [r["step"] for r in read_metrics(cfg.out)] == [1, 2, 3]
    assert (tmp_path / "cut" / "latest_checkpoint").read_text() == "checkpoint-3"


@pytest.mark.slow
def test_micro_batches_give_the_same_update():
    """Gradient accumulation over micro-batches of 3 rows gives each optimizer step the gradient of one full batch,
    compared before the optimizer (Adam's first step, about lr * sign(g), would amplify rounding where a gradient
    element is near 0). The shipped policy's weights in float64 on its own sampled rollouts, strict on-policy and
    with two mini-batches: the statistics are float32 (dynamics' tiles), so a token's terms move by up to one
    float32 rounding when the batch composition changes its float64 hidden state, and a gradient summed over N
    tokens by N * 2^-24 of its norm."""
    from invariants import grad_distance, grad_norm, recipe_step, synthetic_batch

    from entropy_rft.train.policy import load_policy

    model = load_policy("countdown-tiny", torch.device("cpu"), trainable=True)[0].double()
    for mini_batches in (1, 2):
        cfg = load_config(None, prompts_per_step=4, group_size=4, mini_batches=mini_batches, grad_clip=0.0)
        scored = synthetic_batch(4, 4, vocab=model.config.vocab_size, max_response=8, model=model, seed=3)
        whole = recipe_step(cfg, model, scored)
        micro = recipe_step(dataclasses.replace(cfg, micro_batch_size=3), model, scored)
        assert len(whole.grads) == len(micro.grads) == mini_batches
        tol = int(scored.rollout.response_mask.sum()) * 2.0**-24
        for a, b in zip(whole.grads, micro.grads):
            assert grad_distance(a, b) <= tol * grad_norm(a) and grad_norm(a) > 0


@pytest.mark.slow
def test_strict_on_policy_is_exact_in_the_shape_users_train_in(tmp_path):
    """One strict on-policy step of GSPO (clip range 3e-4 / 4e-4, where a ratio off by rounding is clipped) in bf16
    autocast with LoRA, micro-batches of 2 and gradient checkpointing: no token is clipped and ppo_kl is exactly 0
    (the statistics pass and the update's forward are one construction; the first step's old log p is its own)."""
    pytest.importorskip("peft")
    cfg = tiny(
        tmp_path,
        steps=1,
        policy_loss="gspo",
        eps_low=3e-4,
        eps_high=4e-4,
        precision="bf16",
        lora_rank=8,
        micro_batch_size=2,
        gradient_checkpointing=True,
        probe_every=0,
        eval_problems=2,
        eval_k=1,
    )
    train(cfg)
    row = read_metrics(cfg.out)[0]
    assert row["loss/ppo_kl"] == 0.0 and row["loss/clipfrac"] == 0.0


@pytest.mark.slow
def test_off_policy_epochs_use_true_ratios(tmp_path):
    """With two epochs and two mini-batches, later updates see ratios != 1 (ppo_kl != 0)."""
    cfg = tiny(tmp_path, steps=1, ppo_epochs=2, mini_batches=2, lr=1e-3)
    train(cfg)
    row = read_metrics(cfg.out)[0]
    assert abs(row["loss/ppo_kl"]) > 0


@pytest.mark.slow
def test_demo_writes_summary_report_and_plots(tmp_path):
    """`entropy-rft demo` writes summary.json in the documented schema, report.md and PNG plots."""
    from entropy_rft.commands.cli import main

    main(["demo", "--out", str(tmp_path), "--steps", "2", "--quiet"])
    s = json.loads((tmp_path / "summary.json").read_text())
    assert set(s) >= {"k", "wall_seconds", "methods"} and set(s["methods"]) == {"grpo", "clip_b", "clip_v"}
    for m in s["methods"].values():
        assert len(m["entropy"]) == len(m["clip_fraction"]) == 2
        for key in ("avg_at_k_before", "avg_at_k_after", "pass_at_k_before", "pass_at_k_after"):
            assert 0.0 <= m[key] <= 1.0
    assert "Avg@" in (tmp_path / "report.md").read_text()
    for png in ("entropy.png", "clip_fraction.png"):
        assert (tmp_path / png).read_bytes()[:4] == b"\x89PNG"
    page = (tmp_path / "inspect.html").read_text()  # the token view of the three runs, steps 1 and 2 (the last)
    assert all(f'"name":"{m}"' in page for m in ("grpo", "clip_b", "clip_v")) and '"steps":[1,2]' in page
    assert "inspect.html" in (tmp_path / "report.md").read_text()


@pytest.mark.slow
def test_demo_resumed_after_ctrl_c_reports_every_step(tmp_path, monkeypatch, capsys, request):
    """The issue's case: Ctrl-C (SIGINT) after GRPO's step 3 of a 5-step demo stops it with the demo's own resume
    command (the one given, --overwrite dropped, --resume added), not the method's `train --resume`; that command
    finishes the demo, and summary.json and report.md hold GRPO's whole history, steps 1-5 as its metrics.jsonl
    has them (before, only the steps after the resume). SIGINT gets Python's own handler for the test: a test process
    started in the background or under nohup inherits it ignored, and the run leaves an ignored signal ignored
    (tests/test_rundir.py), so the Ctrl-C would pass unseen."""
    import os
    import signal

    from entropy_rft.commands.cli import main
    from entropy_rft.logging import JsonlSink

    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
    request.addfinalizer(lambda: signal.signal(signal.SIGINT, inherited))
    real_log = JsonlSink.log

    def log_then_sigint(self, metrics):
        real_log(self, metrics)
        if metrics["step"] == 3 and "grpo" in str(self.path):
            os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.chdir(tmp_path)
    sets = ["--set", "prompts_per_step=2", "group_size=2", "eval_problems=2", "eval_k=1", "save_every=2"]
    argv = ["demo", "--out", "d", "--steps", "5", "--methods", "grpo,clip_b", "--quiet", *sets, "--overwrite"]
    monkeypatch.setattr(JsonlSink, "log", log_then_sigint)
    with pytest.raises(SystemExit) as stop:
        main(argv)
    monkeypatch.undo()
    monkeypatch.chdir(tmp_path)
    again = " ".join(a for a in argv if a != "--overwrite") + " --resume"
    assert str(stop.value.code).endswith(f"Continue the demo with `entropy-rft {again}`.")
    assert "train --resume" not in str(stop.value.code) and "Continue with --resume" not in str(stop.value.code)
    main(again.split())
    summary = json.loads((tmp_path / "d" / "summary.json").read_text())
    recorded = read_metrics(tmp_path / "d" / "runs" / "grpo")
    assert [r["step"] for r in recorded] == [1, 2, 3, 4, 5]
    assert summary["methods"]["grpo"]["entropy"] == [r["entropy"] for r in recorded]
    assert summary["methods"]["grpo"]["reward"] == [r["reward_mean"] for r in recorded]
    first, last = recorded[0]["entropy"], recorded[-1]["entropy"]
    assert f"| grpo | {first:.4f} | {last:.4f} |" in (tmp_path / "d" / "report.md").read_text()


def test_cli_reports_bad_model_path(tmp_path, capsys):
    from entropy_rft.commands.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["train", "--model", str(tmp_path / "missing"), "--out", str(tmp_path / "o"), "--steps", "1"])
    assert exc.value.code == 2
    assert "does not exist" in capsys.readouterr().err


@pytest.mark.slow
def test_kl_and_entropy_bonus_terms_run(tmp_path):
    """With a KL coefficient and an entropy bonus the loop logs the KL term (0 at the first step: the policy
    equals the reference)."""
    cfg = tiny(tmp_path, steps=2, kl_coef=0.1, entropy_coef=0.01)
    train(cfg)
    rows = read_metrics(cfg.out)
    assert rows[0]["loss/kl"] == pytest.approx(0.0, abs=1e-7)
    assert rows[1]["loss/kl"] > 0


@pytest.mark.slow
def test_eval_cli(tmp_path, capsys):
    """`entropy-rft eval` with no --data evaluates the shipped policy on the shipped countdown split."""
    from entropy_rft.commands.cli import main

    main(["eval", "--k", "2", "--n", "4", "--limit", "20", "--out", str(tmp_path)])
    assert "countdown Avg@2" in capsys.readouterr().out
    res = json.loads((tmp_path / "eval.json").read_text())["results"]["countdown"]
    assert res["k"] == 2 and res["n"] == 4 and len(res["pass_rates"]) == 20
    assert 0 < res["avg_at_k"] <= res["pass_at_k"] <= 1  # the shipped policy solves some countdown problems


@pytest.mark.slow
def test_a_nan_reward_is_named_not_blamed_on_the_learning_rate(tmp_path, monkeypatch, capsys):
    """A task whose reward returns NaN stops the run at its first step in one line that names the task's reward, the
    response and its prompt, and says to fix the reward (before: a NaN loss, with advice to lower the learning
    rate); nothing of the step is committed."""
    from entropy_rft.commands.cli import main
    from entropy_rft.tasks import TASKS

    nan = dataclasses.replace(TASKS.get("countdown"), reward_of=lambda completion, finished, problem: (math.nan, False))
    monkeypatch.setitem(TASKS._items, "countdown", nan)  # the task as a user's own reward would be
    tiny = ["prompts_per_step=2", "group_size=2", "eval_problems=2", "eval_k=1", "progress=false"]
    with pytest.raises(SystemExit) as exc:
        main(["train", "--steps", "2", "--out", str(tmp_path / "r"), "--set", *tiny])
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert exc.value.code == 2
    assert "the reward of task 'countdown' is nan, not a finite number, for response 1" in line
    assert "Fix the reward of task 'countdown'" in line and "smaller lr" not in line
    assert not (tmp_path / "r" / "checkpoint-1").exists()
