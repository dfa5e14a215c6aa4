"""The RL loop, top to bottom: sample -> statistics -> decide -> update -> diagnostics -> commit.

One process, one device: the reference implementation and the embedded default. The loop only orders the phases;
each lives in the module that owns it:
- policy.py: the model, tokenizer, LoRA / checkpointing, value head, optimizer, reference policy, rollout engine;
- problems.py: the training and evaluation problems, their seeded order and each step's scored batch;
- step.py: a step over the batch: the behaviour policy's statistics, the decision over the whole batch (advantages,
  keep mask, selections, the entropy control's knobs) and the update on the objective (objective.py); its rules;
- diagnostics.py: the step's metrics line; samples.py: token-level samples; evaluate.py: Avg@K and Pass@K;
- checkpoint.py: what a checkpoint holds, its files, finding, loading and pruning them; rundir.py: the run
  directory's rules; stops.py: the stop signals and non-finite steps.

Departures, numbered:
1. On a stop (Ctrl-C, SIGTERM, SIGHUP) the run is saved as a checkpoint before it ends, and `resume=True`
   (`entropy-rft train --resume`) continues from the newest complete checkpoint of the run directory, whose settings
   must match (rundir.py). A step commits whole: a stop before its first optimizer step saves the state the step
   began from; a stop after it waits until the step's metrics are computed (stops.StopSignals); a stop during the
   step's evaluation or its logging leaves the step pending in the checkpoint (checkpoint.py), and resume evaluates
   and logs it. Checkpoints are atomic and hold the whole run state, so a run killed at any moment (SIGKILL
   included) and resumed ends with the same weights as one never interrupted, with every step logged once: the
   metric sinks and samples are cut back to the checkpoint's step first (logging.py, samples.py).
2. A step whose loss, gradient norm or sampled logits are not finite (stops.NonFinite) is not committed: no metrics
   line, no checkpoint; the run stops with one line and its newest checkpoint stays the last good one. Settings that
   cannot run (config.py's float32 rules, plan.check_fits's memory) are refused before the run directory is taken.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from .. import samples
from ..config import TrainConfig, preflight
from ..core.control import control_name, make_control
from ..evaluate import run_eval
from ..logging import MetricLogger, read_metrics
from ..run.checkpoint import (
    RunState,
    checkpoint_space,
    find_checkpoint,
    load_trainer_state,
    prune_checkpoints,
    save_checkpoint,
)
from ..run.rundir import Claim, finished_summary, new_run_dir, remove_if_empty
from ..run.rundir import claim as claim_run_dir
from ..run.stops import NonFinite, NonFiniteReward, RunStopped, StopSignals, finite_sampling, stop_signals_interrupt
from ..tasks import TASKS
from .diagnostics import loss_step_sizes
from .dropout import has_active_dropout
from .plan import check_fits
from .policy import pick_device, resolve_model_path, set_up_policy
from .problems import ProblemSampler, check_prompts, sample_batch, task_problems
from .rules import StepRules, needs
from .step import Step

__all__ = ["train"]  # what users import from here; every other name from the module that owns it


def train(cfg: TrainConfig, *, resume: bool | str = False, overwrite: bool = False) -> dict:
    """Run RL fine-tuning as configured; returns a summary with the per-step metrics of every step of the run (read
    from its metrics.jsonl, so a resumed run's begin at step 1) and its evaluations.

    The run directory (cfg.out; None: a new runs/<method>-<time>) follows entropy_rft/run/rundir.py's rules: held by
    this process alone; one holding another run's record is refused unless resume=True (continue from its newest
    checkpoint, with the same settings), resume="auto" (continue if it can, else start) or overwrite=True (replace
    it once this run is ready to start). SIGINT, SIGTERM and SIGHUP save the run where it stands and stop it."""
    preflight(cfg)  # device, engine and sink packages, before the directory is taken or any model loads
    device = pick_device(cfg.device)  # resolved once: the memory check and the policy's set-up use this one
    check_fits(cfg, device)  # lengths and batches that cannot be allocated: one line naming the field
    made = cfg.out is None
    if made:  # a new directory, created at once (two runs started in the same second get two): say where it is
        cfg = dataclasses.replace(cfg, out=str(new_run_dir(cfg.method)))
        print(f"entropy-rft: run directory {cfg.out}", file=sys.stderr)
    try:
        with claim_run_dir(cfg, resume=resume, overwrite=overwrite) as claim, stop_signals_interrupt() as stops:
            if claim.finished:
                return finished_summary(claim.run_dir, cfg)
            return _loop(_Run(cfg, claim, device), stops)
    except BaseException:
        if made:  # a run that never started leaves no directory (rundir.py rule 3)
            remove_if_empty(cfg.out)
        raise


class _Run:
    """What the loop works with, set up from the config and the claimed run directory (resumed from its checkpoint)
    on the run's device (train resolves it once)."""

    def __init__(self, cfg: TrainConfig, claim: Claim, device: torch.device):
        torch.manual_seed(cfg.seed)
        self.cfg, self.claim, self.run_dir = cfg, claim, claim.run_dir
        resolve_model_path(cfg.model)  # fail on a bad model path before any work
        self.task = TASKS.get(cfg.task)
        train_problems = task_problems(cfg, self.task, "train")
        self.eval_problems = task_problems(cfg, self.task, "eval")[: cfg.eval_problems or None]
        critic, reference = needs(cfg)  # a critic (GAE), a reference policy (kl_coef > 0)
        self.policy = set_up_policy(cfg, device, claim.checkpoint, critic=critic, reference=reference)
        for split, problems in (("train", train_problems), ("eval", self.eval_problems)):  # before any rollout
            given = cfg.train_data if split == "train" else cfg.eval_data
            source = f"{split}_data {given}" if given else f"the shipped {split} split"
            limits = dict(max_new_tokens=cfg.max_new_tokens, limit=cfg.max_prompt_tokens, option="max_prompt_tokens")
            check_prompts(self.policy.engine, self.task, problems, source=source, **limits)
        control = make_control(cfg)
        # the step's shape, built once for the run (the reuse of the update's forward reads the model's dropout)
        rules = StepRules.of(cfg, control=control, dropout_active=has_active_dropout(self.policy.model))
        update_gen = torch.Generator().manual_seed(cfg.seed + 1)
        self.step = Step(
            cfg,
            self.policy.model,
            self.policy.optimizer,
            value_head=self.policy.value_head,
            ref_model=self.policy.ref_model,
            control=control,
            rules=rules,
            update_gen=update_gen,
        )
        self.sampler = ProblemSampler(train_problems, cfg.seed)
        self.state = RunState(self.sampler, update_gen, control, control_name(cfg))
        self.start = 0
        if claim.checkpoint is not None:  # everything that steers the run continues where the checkpoint left it
            saved = load_trainer_state(claim.checkpoint)
            self.policy.optimizer.load_state_dict(saved["optimizer"])
            self.start = self.state.restore(saved)
        # the run is committed to start only now (config.yaml written, a replaced record deleted); metrics of steps
        # after the checkpoint (and of a pending step) are cut: they are logged again, and token samples too
        kept = self.start - (self.state.pending is not None)
        self.logger = claim.start(cfg, lambda: MetricLogger(self.run_dir, cfg.to_dict(), cfg.sinks, start_step=kept))
        samples.cut_after(self.run_dir, self.start)

    def evaluate(self) -> dict:
        cfg = self.cfg
        with finite_sampling():
            return run_eval(self.policy.engine, self.task, self.eval_problems, cfg, seed=cfg.seed + 10**6).to_json()

    def save(self, at: int, state: dict | None = None) -> Path:
        p = self.policy
        with checkpoint_space(self.run_dir, at):  # no space left: one line naming the checkpoint (checkpoint.py)
            ckpt = save_checkpoint(
                self.run_dir, at, p.model, p.tokenizer, p.optimizer, None, p.value_head, state or self.state.capture()
            )
        prune_checkpoints(self.run_dir, self.cfg.keep_checkpoints, self.cfg.steps)  # the newest few and the final
        return ckpt

    def write_samples(self, step: int, batch, behaviour, decision, metrics: dict) -> None:
        """Token-level samples of the step's batch, when due (samples.py)."""
        cfg, rollout = self.cfg, batch.rollout
        if not samples.due(step + 1, cfg.samples_every, cfg.steps):
            return
        sampled = samples.SampleBatch(
            rollout.prompt_ids,
            rollout.prompt_mask,
            rollout.response_ids,
            rollout.response_mask,
            rollout.finished,
            self.policy.tokenizer,
            behaviour.stats,
            decision.adv,
            decision.keep,
            behaviour.rewards,
            cfg.group_size,
            loss_step_sizes(rollout.response_mask, decision.loss_mask, cfg),
        )
        info = {"source": "trainer", "method": cfg.method, "lr": cfg.lr, "loss_agg": cfg.loss_agg}
        samples.write_step(self.run_dir, step + 1, sampled, groups=cfg.samples_groups, info=info, metrics=metrics)

    def eval_due(self, at: int) -> bool:
        return bool(self.cfg.eval_every) and at % self.cfg.eval_every == 0 and at < self.cfg.steps

    def commit(self, pending: dict) -> None:
        """Log a computed step: its evaluation first when due (its Avg@K and Pass@K join the line), then the metrics
        line, then a checkpoint when due. Until the line is written the step is pending (checkpoint.py)."""
        self.state.pending, metrics, at = pending, dict(pending["metrics"]), pending["step"]
        if self.eval_due(at):
            self.state.evals[at] = self.evaluate()
            metrics.update(
                {"eval/avg_at_k": self.state.evals[at]["avg_at_k"], "eval/pass_at_k": self.state.evals[at]["pass_at_k"]}
            )
        self.logger.log(metrics)
        self.state.pending = None
        if self.cfg.save_every and at % self.cfg.save_every == 0:
            self.save(at)


class _Clock:
    """A step's phase times: mark(name) ends phase `name` (metric time/<name>) and starts the next; `seconds` is
    the whole step."""

    def __init__(self):
        self.start = self.last = time.time()
        self.times: dict[str, float] = {}

    def mark(self, name: str) -> None:
        now = time.time()
        self.times[f"time/{name}"], self.last = now - self.last, now

    def metrics(self) -> dict[str, float]:
        return {**self.times, "seconds": time.time() - self.start}


@dataclass
class _Progress:
    """Where the loop stands: what a stop saves and the line a stop or a non-finite step ends the run with."""

    completed: int  # steps computed: a stop saves the run at this step
    doing: str = "the evaluation before step 1"  # what runs now (for a NonFinite's line)
    stopped_at: dict | None = None  # the run state a stop saves (None: the state as it stands)
    final: Path | None = None  # the final checkpoint, once saved


@contextmanager
def _ending(run: _Run, at: _Progress) -> Iterator[None]:
    """How the loop ends when it does not finish: a stop saves the run where it stands (departure 1), a step that is
    not finite commits nothing (departure 2), each with one line; the engine and the metric sinks close either way."""
    try:
        yield
    except KeyboardInterrupt as err:  # Ctrl-C, or SIGTERM / SIGHUP (stops.Interrupted)
        if not run.claim.committed:  # stopped before the first step: the directory is put back as it was (rundir)
            raise
        raise _saved_on_stop(run, at, getattr(err, "name", "SIGINT")) from None
    except NonFinite as err:  # nothing of the step is committed (departure 2)
        raise _not_committed(run, at, err) from None
    finally:
        run.policy.engine.close()
        run.logger.close()


def _saved_on_stop(run: _Run, at: _Progress, why: str) -> RunStopped:
    """The run saved where the stop `why` found it (a checkpoint at the last computed step, or the final one already
    saved); the line that ends it."""
    if at.final is not None:  # interrupted in the final evaluation: the final checkpoint is saved
        return RunStopped(
            f"{why} in the final evaluation; the trained policy is saved in {at.final}.",
            "Continue with --resume to evaluate it.",
        )
    ckpt = run.save(at.completed, at.stopped_at)
    return RunStopped(
        f"{why}: stopped after {at.completed} steps; saved {ckpt}.", f"Continue with --resume --out {run.run_dir}."
    )


def _not_committed(run: _Run, at: _Progress, err: NonFinite) -> NonFinite:
    """The line that ends a run at a step that is not finite: what was running and what the record keeps."""
    kept = (
        f"{run.run_dir} is left as it was before the run"
        if not run.claim.committed
        else f"its newest checkpoint stays {find_checkpoint(run.run_dir) or 'none (none was saved)'}, and "
        f"metrics.jsonl ends at step {at.completed}"
    )
    fix = (
        f"Fix the reward of task {run.cfg.task!r}"
        if isinstance(err, NonFiniteReward)
        else f"Start again with a smaller lr (now {run.cfg.lr:g}) or other settings"
    )
    return NonFinite(
        f"{at.doing}: {err}; it is not committed and the run stops: {kept}. {fix} (a resume would meet the same step)"
    )


def _loop(run: _Run, stops: StopSignals) -> dict:
    """The run's steps from where it starts, then the final checkpoint and evaluation (module docstring)."""
    cfg, step_, state, engine = run.cfg, run.step, run.state, run.policy.engine
    at = _Progress(completed=run.start)
    bar = tqdm(
        range(run.start, cfg.steps), desc=cfg.method, disable=not cfg.progress, initial=run.start, total=cfg.steps
    )
    with _ending(run, at):  # a stop saves the run, a non-finite step commits nothing
        if run.start == 0:
            state.evals[0] = run.evaluate()
        if state.pending is not None:  # a stop cut this step's evaluation or logging short
            at.stopped_at = state.capture()
            run.commit(state.pending)
        for step in bar:
            at.stopped_at, clock = state.capture(), _Clock()  # a stop before the first optimizer step saves it
            at.doing = f"step {step + 1}"
            with finite_sampling():  # logits that are not finite: NonFinite, not the sampler's own error
                batch = sample_batch(engine, run.task, run.sampler, cfg, step)  # B = groups x group_size rows, scored
            clock.mark("rollout")
            clock.times["time/compile"] = engine.pop_compile_seconds()  # part of time/rollout: 0 once compiled
            behaviour = step_.statistics(batch, step)  # (B, R) log p, H, S*, S_c (and values) of the behaviour policy
            clock.mark("stats")
            decision = step_.decide(batch, behaviour)  # the whole batch's (B,) advantages, (B, R) keep mask, knobs
            probe = step_.probe(batch.rollout, behaviour, step)  # d(mean H)/d(theta) on probe steps
            updated = step_.update(batch.rollout, decision, held=behaviour.held, on_first_step=stops.defer)
            at.completed = step + 1
            clock.mark("update")
            engine.sync_weights()  # the next rollout samples from the updated policy
            metrics = step_.diagnose(step, batch, behaviour, decision, updated, probe)  # the metrics line
            clock.mark("diagnostics")
            run.write_samples(step, batch, behaviour, decision, metrics)  # token samples, when due
            clock.mark("samples")
            metrics.update(clock.metrics())
            state.pending = {"step": at.completed, "metrics": metrics}
            at.stopped_at = state.capture()  # from here a stop saves the step as pending: resume evaluates and logs it
            if run.eval_due(at.completed):
                stops.release()  # an evaluation may be stopped (a held stop stops here): the step stays pending
            run.commit(state.pending)
            at.stopped_at = None
            stops.release()  # a stop held since the first optimizer step stops the run here, the step logged
            bar.set_postfix(
                reward=f"{metrics['reward_mean']:.2f}",
                H=f"{metrics['entropy']:.3f}",
                clip=f"{metrics['clip_frac']:.3f}",
            )
        at.final, at.doing = run.save(cfg.steps), "the final evaluation"
        state.evals[cfg.steps] = run.evaluate()
    (run.run_dir / "eval.json").write_text(json.dumps(state.evals, indent=1) + "\n")
    # the history is the record's, every step from the first: a resumed run's in-memory history starts at the resume
    history = read_metrics(run.run_dir, warn=False)
    return {"config": cfg.to_dict(), "evals": state.evals, "checkpoint": str(at.final), "history": history}
