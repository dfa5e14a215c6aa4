"""The RL loop, top to bottom: sample -> score -> advantages -> token statistics -> mask -> update -> log.

One process, one device: the reference implementation and the embedded default. Each step:
1. rollout: prompts_per_step prompts, group_size samples each (HF generate, rollout temperature);
2. score: the task's reward of each response;
3. advantages: the chosen estimator (GRPO by default) over each prompt's group;
4. token statistics: log p (the behaviour policy's, used as old log p), H, S*, E_p[S] of every response token,
   from one no-grad forward pass over the whole batch;
5. mask: the method's token filter over the whole batch (never per micro-batch);
6. update: ppo_epochs x mini_batches Adam steps of the clipped surrogate, gradient accumulation over
   micro-batches with the mini-batch's global token and sequence counts (so splitting changes nothing);
7. log: one metrics.jsonl line per step (and optional TensorBoard / W&B), evaluation and checkpoints.

Departures, numbered:
1. Old log-probs are recomputed by the trainer's forward pass (as verl does), not taken from generation.
2. On interruption (Ctrl-C, SIGTERM, SIGHUP) the current policy is saved as a checkpoint before the run stops;
   `resume=True` (`entropy-rft train --resume`) continues from the newest complete checkpoint of the run directory,
   whose settings must match (entropy_rft/rundir.py: one process per run directory, no run over another's record,
   the newest keep_checkpoints checkpoints and the final one kept). Checkpoints
   are written atomically and hold the whole run state (weights, Adam, sampler, update generator, torch RNG,
   evaluations, the entropy controller or adaptive bonus), so a run killed at any moment (SIGKILL included) and
   resumed ends with the same weights as one never interrupted; the metric sinks are cut back to the checkpoint's
   step first (entropy_rft/logging.py).
3. Exactly on-policy where the weights are the behaviour policy's (as TRL does with num_iterations 1): the first
   optimizer step of each update takes old log p (and the critic's old values) from its own forward, detached, so
   its ratio is exactly 1 in any precision; later steps use the statistics pass's old log p, which the same
   construction computes (forward.py: one construction), so they differ only through the weights' change.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from tqdm import tqdm

from .advantages import (ADVANTAGES, TokenLevel, advantage_reweight, broadcast_advantages, outcome_token_rewards, overlong_penalty,
                         rank_penalty)
from .config import TrainConfig, check_device, preflight
from .control import AdaptiveEntropyBonus, EntroPIC, MuController, entropic_adjustment, high_probability_tokens
from .dynamics import TokenStats, batch_covariance, corollary4_entropy_change
from .evaluate import EvalResult, evaluate_policy
from .logging import MetricLogger
from .losses import aggregate, kl_penalty, value_loss
from .masks import clipped_fractions
from .methods import METHODS, POLICY_LOSSES
from .data import load_math
from .dropout import check_deterministic, disable_dropout, has_active_dropout
from .forward import EntropyProbe, HeldForward, batch_forward, batch_stats, policy_forward, policy_stats  # noqa: F401
from .rollout import ENGINES, Rollout
from .rundir import Claim, finished_summary, find_checkpoint, new_run_dir, prune_checkpoints, stop_signals_interrupt  # noqa: F401
from .rundir import checkpoint_space, load_trainer_state
from .rundir import claim as claim_run_dir
from . import samples
from .tasks import TASKS, MathTask

BUILTIN_MODELS = {"countdown-tiny": Path(__file__).parent / "assets" / "countdown-tiny"}
SHIPPED_DATA = {"countdown": BUILTIN_MODELS["countdown-tiny"] / "data",  # task -> directory of train/eval.jsonl
                "countdown5": BUILTIN_MODELS["countdown-tiny"] / "data" / "countdown5"}
STAND_IN = "tiny-stand-in"  # a random tiny chat model built on first use (toy.build_stand_in), for dry runs


def cache_dir() -> Path:
    """$ENTROPY_RFT_CACHE or ~/.cache/entropy-rft, created; one that cannot be is named with the variable."""
    path = Path(os.environ.get("ENTROPY_RFT_CACHE", Path.home() / ".cache" / "entropy-rft"))
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise OSError(f"the entropy-rft cache {path} cannot be created ({err.strerror}); set ENTROPY_RFT_CACHE to a "
                      "writable directory" + (" or unset it" if "ENTROPY_RFT_CACHE" in os.environ else "")) from None
    return path


# ---------------------------------------------------------------------------------------------------------------
# Setup helpers


def resolve_model_path(name: str) -> str:
    """A shipped model name, the stand-in, an existing local directory, or a hub id (returned as given)."""
    if name == STAND_IN:
        path = cache_dir() / STAND_IN
        if not (path / "config.json").exists():
            from .toy import build_stand_in

            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=".stand-in-", dir=path.parent))  # same filesystem: rename is atomic
            build_stand_in(tmp)
            try:
                tmp.rename(path)
            except OSError:  # another process built it first
                shutil.rmtree(tmp, ignore_errors=True)
                if not (path / "config.json").exists():
                    raise
        return str(path)
    if name in BUILTIN_MODELS:
        path = BUILTIN_MODELS[name]
        if not (path / "config.json").exists():
            raise FileNotFoundError(f"the shipped model {name!r} is missing at {path}; rebuild it with "
                                    "`entropy-rft pretrain-toy --out entropy_rft/assets/countdown-tiny`")
        return str(path)
    path = Path(name)
    if path.exists():
        if not (path / "config.json").exists() and not (path / "adapter_config.json").exists():
            raise FileNotFoundError(f"model directory {path} has no config.json; pass a directory written by "
                                    "save_pretrained, or a hub id")
        return str(path)
    looks_like_hub_id = name.count("/") == 1 and not name.startswith((".", "/", "~"))
    if not looks_like_hub_id:
        raise FileNotFoundError(f"model path {name!r} does not exist; pass a local model directory, a hub id like "
                                f"'Qwen/Qwen2.5-7B-Instruct', or one of the shipped models: {', '.join(BUILTIN_MODELS)}")
    return name


def load_policy(name: str, device: torch.device, *, trainable: bool = False):
    """(model, tokenizer) in float32 (master weights; bf16 runs use autocast). A directory holding a PEFT adapter
    (a LoRA checkpoint) loads its base model with the adapter, trainable when asked, else merged."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # the trainer's own bar is the one to watch
    path = resolve_model_path(name)
    local = Path(path).is_dir()
    if local and not any((Path(path) / f).exists() for f in ("tokenizer_config.json", "tokenizer.json")):
        raise FileNotFoundError(f"model directory {path} has no tokenizer (tokenizer_config.json or tokenizer.json); "
                                "save the tokenizer next to the model: tokenizer.save_pretrained(directory)")
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        if (Path(path) / "adapter_config.json").exists():
            from peft import AutoPeftModelForCausalLM

            model = AutoPeftModelForCausalLM.from_pretrained(path, dtype=torch.float32, is_trainable=trainable)
            if not trainable:
                model = model.merge_and_unload()
        else:
            model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    except (OSError, ValueError, TypeError, KeyError, SafetensorError) as err:
        if local:  # what transformers says about a damaged directory is about its files, not about the hub
            raise OSError(f"model directory {path} could not be loaded ({type(err).__name__}: {err}); it must hold a "
                          "model written by save_pretrained: config.json (a JSON object with model_type), the weights "
                          "(model.safetensors) and the tokenizer files. Re-save the model there, or pass another "
                          "directory") from None
        if not isinstance(err, OSError):
            raise
        raise OSError(f"could not load model {name!r}: not a local directory, and the hub could not be reached or "
                      f"has no such model ({err})") from err
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model.to(device), tokenizer


def prepare_policy(model, cfg: TrainConfig):
    """LoRA adapters (PEFT) and gradient checkpointing, as configured; returns the model to train."""
    if cfg.lora_rank > 0 and not hasattr(model, "peft_config"):
        try:
            from peft import LoraConfig, get_peft_model
        except ImportError as err:
            raise ImportError("lora_rank > 0 needs PEFT: pip install 'entropy-rft[lora]'") from err
        targets = cfg.lora_targets if cfg.lora_targets == "all-linear" else [t.strip() for t in cfg.lora_targets.split(",")]
        model = get_peft_model(model, LoraConfig(r=cfg.lora_rank, lora_alpha=cfg.lora_alpha, lora_dropout=0.0,
                                                 target_modules=targets, task_type="CAUSAL_LM"))
    if cfg.gradient_checkpointing:
        kwargs = {"use_reentrant": False}
        if hasattr(model, "activation_checkpointing_enable"):  # the name since transformers 5
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
        model.config.use_cache = False
        if hasattr(model, "enable_input_require_grads"):
            model.enable_input_require_grads()  # frozen embeddings under LoRA still pass gradients on
    return model


def task_problems(cfg: TrainConfig, task, split: str) -> list:
    """Training or evaluation problems: math dataset specs through entropy_rft.data, else task JSONL."""
    if isinstance(task, MathTask):
        spec = cfg.train_data if split == "train" else cfg.eval_data
        if not spec:
            raise ValueError(f"task {cfg.task!r} needs {split}_data: a dataset name (dapo_train, dapo500, aime24), "
                             "name=path or a path")
        return load_math(spec, data_dir=cfg.data_dir)[1]
    return load_problems(default_data(cfg, split), task)


def default_data(cfg: TrainConfig, split: str) -> Path:
    given = cfg.train_data if split == "train" else cfg.eval_data
    if given:
        return Path(given)
    if cfg.task in SHIPPED_DATA:  # the shipped splits, filtered with the shipped policy
        return SHIPPED_DATA[cfg.task] / f"{split}.jsonl"
    raise ValueError(f"no {split}_data given: task {cfg.task!r} has no shipped data; set train_data and eval_data")


def load_problems(path: Path, task) -> list:
    if not path.exists():
        raise FileNotFoundError(f"no problem file at {path}")
    problems = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            try:
                problems.append(task.parse_row(json.loads(line)))
            except ValueError as err:
                raise ValueError(f"{path}:{n}: {err}") from None
    if not problems:
        raise ValueError(f"{path} holds no problems")
    return problems


def pick_device(name: str) -> torch.device:
    """The torch device for auto, cpu, cuda[:N] or mps; one this machine lacks raises ConfigError with the fix."""
    check_device(name)
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


# ---------------------------------------------------------------------------------------------------------------
# Step helpers (thin: the math lives in dynamics, masks, advantages, losses)


class ValueHead(torch.nn.Module):
    """PPO's critic as a linear head on the policy's last hidden state (zero-initialised: V = 0 at the start)."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.proj = torch.nn.Linear(hidden_size, 1)
        torch.nn.init.zeros_(self.proj.weight)
        torch.nn.init.zeros_(self.proj.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.proj(hidden.float()).squeeze(-1)


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> float:
    m = mask.float()
    return float((x.float() * m).sum() / m.sum().clamp_min(1.0))


@dataclass
class Batch:
    problems: list
    rollout: Rollout
    rewards: torch.Tensor  # (B,)
    correct: torch.Tensor  # (B,) bool
    group_ids: torch.Tensor  # (B,)


class ProblemSampler:
    """Epochs over the training problems in a seeded random order."""

    def __init__(self, problems: list, seed: int):
        self.problems = problems
        self.gen = torch.Generator().manual_seed(seed)
        self.order: list[int] = []

    def next(self, n: int) -> list:
        out = []
        while len(out) < n:
            if not self.order:
                self.order = torch.randperm(len(self.problems), generator=self.gen).tolist()
            out.append(self.problems[self.order.pop()])
        return out

    def state(self) -> dict:
        return {"gen": self.gen.get_state(), "order": list(self.order)}

    def load(self, state: dict) -> None:
        self.gen.set_state(state["gen"])
        self.order = list(state["order"])


def save_checkpoint(run_dir: Path, step: int, model, tokenizer, optimizer, sampler: ProblemSampler,
                    value_head: ValueHead | None = None, extra: dict | None = None) -> Path:
    """RUN_DIR/checkpoint-STEP, written whole or not at all: into a hidden temporary directory, then renamed into
    place, and only then named in latest_checkpoint (itself replaced atomically). A kill at any moment leaves the
    previous checkpoint and its pointer intact. `extra` holds the rest of the run state (trainer_state.pt)."""
    ckpt = run_dir / f"checkpoint-{step}"
    tmp = Path(tempfile.mkdtemp(prefix=f".{ckpt.name}.", dir=run_dir))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        if value_head is not None:
            torch.save(value_head.state_dict(), tmp / "value_head.pt")
        torch.save({"step": step, "optimizer": optimizer.state_dict(), "sampler": sampler.state(), **(extra or {})},
                   tmp / "trainer_state.pt")
        if ckpt.exists():  # the same step saved twice (save_every and the final save): swap the old one out
            old = Path(tempfile.mkdtemp(prefix=f".{ckpt.name}.old.", dir=run_dir))
            os.replace(ckpt, old / ckpt.name)
            os.replace(tmp, ckpt)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, ckpt)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    pointer = run_dir / ".latest_checkpoint.tmp"
    pointer.write_text(ckpt.name)
    os.replace(pointer, run_dir / "latest_checkpoint")
    return ckpt


def run_eval(engine, task, problems, cfg: TrainConfig, seed: int) -> EvalResult:
    return evaluate_policy(engine, task, problems, k=cfg.eval_k, temperature=cfg.eval_temperature, top_p=cfg.top_p,
                           max_new_tokens=cfg.max_new_tokens, seed=seed)


# ---------------------------------------------------------------------------------------------------------------
# The loop


def train(cfg: TrainConfig, *, resume: bool | str = False, overwrite: bool = False) -> dict:
    """Run RL fine-tuning as configured; returns a summary with the per-step metrics and evaluations.

    The run directory (cfg.out; None: a new runs/<method>-<time>) follows entropy_rft/rundir.py's rules: held by
    this process alone; one holding another run's record is refused unless resume=True (continue from its newest
    checkpoint, with the same settings), resume="auto" (continue if it can, else start) or overwrite=True (replace
    it once this run is ready to start). SIGINT, SIGTERM and SIGHUP save the run where it stands and stop it."""
    if cfg.out is None:
        cfg = dataclasses.replace(cfg, out=str(new_run_dir(cfg.method)))
    preflight(cfg)  # device, engine and sink packages, before the directory is taken or any model loads
    with claim_run_dir(cfg, resume=resume, overwrite=overwrite) as claim, stop_signals_interrupt():
        if claim.finished:
            return finished_summary(claim.run_dir, cfg)
        return _train(cfg, claim)


def _train(cfg: TrainConfig, claim: Claim) -> dict:
    # --- setup
    run_dir = claim.run_dir
    torch.manual_seed(cfg.seed)
    device = pick_device(cfg.device)
    resolve_model_path(cfg.model)  # fail on a bad model path before any work
    task = TASKS.get(cfg.task)
    method = METHODS.get(cfg.method)
    estimator = ADVANTAGES.get(cfg.advantage)
    train_problems = task_problems(cfg, task, "train")
    eval_problems = task_problems(cfg, task, "eval")
    if cfg.eval_problems:
        eval_problems = eval_problems[: cfg.eval_problems]
    start_step = 0
    model_source = cfg.model
    checkpoint = claim.checkpoint
    if checkpoint is not None:
        model_source = str(checkpoint)
    model, tokenizer = load_policy(model_source, device, trainable=True)
    model = prepare_policy(model, cfg)
    if cfg.disable_dropout:  # one policy for sampling, old log p and the update (dropout.py)
        disable_dropout(model)
        check_deterministic(model)
    ref_model = load_policy(cfg.model, device)[0].eval() if cfg.kl_coef > 0 else None
    engine = ENGINES.get(cfg.engine)(model, tokenizer, cfg, resolve_model_path(model_source))
    value_head = ValueHead(model.config.hidden_size).to(device) if isinstance(estimator, TokenLevel) else None
    groups = [{"params": [p for p in model.parameters() if p.requires_grad]}]
    if value_head is not None:
        if (Path(model_source) / "value_head.pt").exists():
            value_head.load_state_dict(torch.load(Path(model_source) / "value_head.pt"))
        groups.append({"params": list(value_head.parameters()), "lr": cfg.critic_lr or 10 * cfg.lr})
    optimizer = make_optimizer(groups, cfg)
    sampler = ProblemSampler(train_problems, cfg.seed)
    update_gen = torch.Generator().manual_seed(cfg.seed + 1)
    targeting = cfg.entropy_target is not None
    controller = (MuController(cfg.entropy_target, denominator=cfg.denominator)
                  if targeting and cfg.entropy_control == "mu" else None)
    bonus = (AdaptiveEntropyBonus(cfg.entropy_target, cfg.bonus_delta, cfg.entropy_coef, cfg.bonus_max)
             if targeting and cfg.entropy_control == "bonus" else None)
    pi = (EntroPIC(cfg.entropy_target, cfg.pi_kp, cfg.pi_ki, cfg.pi_alpha_max)
          if targeting and cfg.entropy_control == "pi" else None)
    evals: dict[int, dict] = {}
    if checkpoint is not None:  # everything that steers the run continues where the checkpoint left it
        state = load_trainer_state(checkpoint)
        optimizer.load_state_dict(state["optimizer"])
        sampler.load(state["sampler"])
        start_step = state["step"]
        if "update_gen" in state:  # checkpoints written before these were saved resume without them
            update_gen.set_state(state["update_gen"])
            torch.set_rng_state(state["torch_rng"])
            evals = {int(k): v for k, v in state["evals"].items()}
        if controller is not None and state.get("controller") is not None:
            controller.load_state(state["controller"])
        if bonus is not None and state.get("bonus") is not None:
            bonus.load_state(state["bonus"])
        if pi is not None and state.get("pi") is not None:
            pi.load_state(state["pi"])
    # the run is committed to start only now (config.yaml written, a replaced record deleted); metrics of steps after
    # the checkpoint (a run killed between checkpoints) are cut: they are logged again, and token samples too
    logger = claim.start(cfg, lambda: MetricLogger(run_dir, cfg.to_dict(), cfg.sinks, start_step=start_step))
    samples.cut_after(run_dir, start_step)

    def run_state() -> dict:  # what a checkpoint holds besides the weights and Adam's state
        return {"sampler": sampler.state(), "update_gen": update_gen.get_state(), "torch_rng": torch.get_rng_state(),
                "evals": dict(evals), "controller": controller.state() if controller else None,
                "bonus": bonus.state() if bonus else None, "pi": pi.state() if pi else None}

    def save(at: int, state: dict | None = None) -> Path:
        with checkpoint_space(run_dir, at):
            ckpt = save_checkpoint(run_dir, at, model, tokenizer, optimizer, sampler, value_head, state or run_state())
        prune_checkpoints(run_dir, cfg.keep_checkpoints, cfg.steps)  # the newest keep_checkpoints and the final one
        return ckpt

    reuse = reuses_forward(cfg, model)
    probe_every = 1 if controller else cfg.probe_every
    history: list[dict] = []
    if start_step == 0:
        evals[0] = run_eval(engine, task, eval_problems, cfg, seed=cfg.seed + 10**6).to_json()

    step = completed = start_step  # completed: optimizer updates applied so far (a checkpoint's step)
    final = None
    bar = tqdm(range(start_step, cfg.steps), desc=f"{cfg.method}", disable=not cfg.progress, initial=start_step,
               total=cfg.steps)
    try:
        for step in bar:
            t0 = time.time()
            step_start = run_state()  # an interrupt before this step's update saves the state it began from
            # --- rollout and score (DAPO's dynamic sampling keeps only groups with mixed outcomes)
            problems, rollout, rewards, correct, sampling = sample_batch(engine, task, sampler, cfg, step)
            group_ids = torch.arange(len(problems)).repeat_interleave(cfg.group_size)
            t_rollout = time.time()
            mask = rollout.response_mask
            rows_per_pass = micro_rows(cfg, len(rollout.texts))  # every pass over the batch runs the update's micro-batches
            if cfg.overlong_buffer_frac > 0:  # DAPO's soft overlong punishment
                rewards = rewards + overlong_penalty(mask.sum(-1), max_len=cfg.max_new_tokens,
                                                     buffer=round(cfg.overlong_buffer_frac * cfg.max_new_tokens),
                                                     factor=cfg.overlong_penalty_factor)
            # --- token statistics under the behaviour policy, (B, R) each (behaviour_statistics)
            probing = probe_every > 0 and (step + 1) % probe_every == 0
            frozen = (zero_advantage_rows(estimator, rewards, group_ids)
                      if reuse and skips_zero_advantage(cfg, estimator, bonus, ref_model, probing) else None)
            stats, old_values, held = behaviour_statistics(model, rollout, cfg, value_head, reuse=reuse, frozen=frozen)
            old_logp = stats.logp
            t_stats = time.time()
            ref_logp = (batch_forward(ref_model, rollout, cfg.temperature, rows_per_pass, precision=cfg.precision,
                                      from_hidden=cfg.stats_from_hidden)[0].logp if ref_model else None)
            # --- advantages, (B,) or (B, R) once reweighted per token
            adv, returns = compute_advantages(cfg, estimator, rewards, group_ids, mask, old_logp, old_values)
            # --- mask: the method's filter over the whole batch (mu chosen by the controller, if any)
            entropy_now = masked_mean(stats.entropy, mask)
            keep, filter_metrics = choose_tokens(method, controller, stats, adv, mask, entropy_now, cfg)
            loss_mask = mask & keep
            entropy_coef = bonus.update(entropy_now) if bonus else cfg.entropy_coef
            entropic = None  # EntroPIC: this step's alpha and its high-probability tokens, (B, R)
            if pi:
                high = high_probability_tokens(old_logp, loss_mask, threshold=cfg.pi_threshold)
                entropic = (pi.update(entropy_now), high)
            loss_spec = POLICY_LOSSES.get(cfg.policy_loss)
            selected = loss_spec.select(adv, old_logp, loss_mask, cfg, update_gen) if loss_spec.select else None
            # --- update (on probe steps, measure how it moves the batch's mean entropy)
            probe = (EntropyProbe(model, rollout, cfg.temperature, rows_per_pass, cfg.precision, held=held,
                                  from_hidden=cfg.stats_from_hidden) if probing else None)
            update_metrics = update_policy(model, optimizer, rollout, adv, old_logp, ref_logp, loss_mask, cfg,
                                           update_gen, entropy_coef=entropy_coef, selected=selected,
                                           critic=(value_head, old_values, returns), held=held, entropic=entropic)
            completed = step + 1
            t_update = time.time()
            engine.sync_weights()  # the next rollout samples from the updated policy
            update_metrics.update(sampling)
            # responses whose forward ran without a graph (advantage 0: their gradient is exactly 0)
            update_metrics["update/frac_rows_no_backward"] = float(frozen.float().mean()) if frozen is not None else 0.0
            update_metrics["entropy_coef"] = entropy_coef
            if entropic is not None:
                update_metrics.update({"entropic/alpha": entropic[0], "entropic/integral": pi.integral,
                                       "entropic/high_prob_frac": float(entropic[1].sum()) / max(float(mask.sum()), 1)})
            # --- diagnostics
            metrics = step_metrics(step, rewards, correct, adv, stats, mask, keep, rollout, cfg, optimizer)
            metrics.update(update_metrics)
            metrics.update({f"filter/{k}": v for k, v in filter_metrics.items()})
            metrics.update(after_update_metrics(model, rollout, stats, probe, cfg))
            if controller and probe is not None:  # kappa is fitted on the update's own first-order effect (control.py)
                controller.observe(metrics["entropy_change/first_order"])
            t_samples = time.time()  # token-level samples of the step's batch, when due (entropy_rft/samples.py)
            samples.write_step(run_dir, step + 1, every=cfg.samples_every, groups=cfg.samples_groups, last=cfg.steps,
                               rollout=rollout, tokenizer=tokenizer, stats=stats, advantages=adv, keep=keep,
                               rewards=rewards, group_size=cfg.group_size, lr=cfg.lr, method=cfg.method,
                               num_tokens=loss_denominator(mask, loss_mask, cfg), metrics=metrics)
            metrics["time/samples"] = time.time() - t_samples
            metrics["seconds"] = time.time() - t0
            # phases: rollout and scoring; statistics (the held forward, or the separate pass); advantages, filter,
            # update (the rest of the forward, backward, optimizer) and probe; diagnostics and the realised change
            metrics.update({"time/rollout": t_rollout - t0, "time/stats": t_stats - t_rollout,
                            "time/update": t_update - t_stats, "time/diagnostics": time.time() - t_update})
            # --- log, evaluate, checkpoint
            if cfg.eval_every and (step + 1) % cfg.eval_every == 0 and step + 1 < cfg.steps:
                evals[step + 1] = run_eval(engine, task, eval_problems, cfg, seed=cfg.seed + 10**6).to_json()
                metrics.update({"eval/avg_at_k": evals[step + 1]["avg_at_k"], "eval/pass_at_k": evals[step + 1]["pass_at_k"]})
            logger.log(metrics)
            history.append(metrics)
            bar.set_postfix(reward=f"{metrics['reward_mean']:.2f}", H=f"{metrics['entropy']:.3f}",
                            clip=f"{metrics['clip_frac']:.3f}")
            if cfg.save_every and (step + 1) % cfg.save_every == 0:
                save(step + 1)
        final = save(cfg.steps)
        evals[cfg.steps] = run_eval(engine, task, eval_problems, cfg, seed=cfg.seed + 10**6).to_json()
    except KeyboardInterrupt as err:  # Ctrl-C, or SIGTERM / SIGHUP (rundir.Interrupted)
        why = getattr(err, "name", "SIGINT")
        if not claim.committed:  # stopped before the first step: the directory is put back as it was (rundir rule 3)
            raise
        if final is not None:  # interrupted in the final evaluation: the final checkpoint is saved
            raise SystemExit(f"{why} in the final evaluation; the trained policy is saved in {final}. "
                             "Continue with --resume to evaluate it.") from None
        ckpt = save(completed, step_start if completed == step else None)
        raise SystemExit(f"{why}: stopped after {completed} steps; saved {ckpt}. Continue with --resume "
                         f"--out {run_dir}.") from None
    finally:
        engine.close()
        logger.close()
    summary = {"config": cfg.to_dict(), "evals": evals, "checkpoint": str(final), "history": history}
    (run_dir / "eval.json").write_text(json.dumps(evals, indent=1) + "\n")
    return summary


def sample_batch(engine, task, sampler: ProblemSampler, cfg: TrainConfig, step: int):
    """prompts_per_step groups of group_size responses with their rewards. With dynamic sampling (DAPO), groups
    whose responses are all correct or all wrong are dropped and more prompts are sampled, for at most
    max_sampling_rounds rounds; the batch may then hold fewer groups (never none: an all-uniform last round is
    kept as it is, and its zero advantages make the update a no-op)."""
    G = cfg.group_size
    kept_problems, parts, rewards, correct = [], [], [], []
    rounds = cfg.max_sampling_rounds if cfg.dynamic_sampling else 1
    for rnd in range(rounds):
        problems = sampler.next(cfg.prompts_per_step)
        ro = engine.generate([task.prompt(p) for p in problems], n=G, temperature=cfg.temperature, top_p=cfg.top_p,
                             max_new_tokens=cfg.max_new_tokens, seed=cfg.seed * 100003 + step + 7919 * rnd)
        scored = task.score_batch(ro.texts, ro.finished.tolist(), [problems[j // G] for j in range(len(ro.texts))])
        r = torch.tensor([x for x, _ in scored], dtype=torch.float32)
        c = torch.tensor([y for _, y in scored])
        for i, problem in enumerate(problems):
            rows = slice(i * G, (i + 1) * G)
            n_correct = int(c[rows].sum())
            if cfg.dynamic_sampling and n_correct in (0, G):
                continue
            if len(kept_problems) < cfg.prompts_per_step:
                kept_problems.append(problem)
                parts.append(ro.select(rows))
                rewards.append(r[rows])
                correct.append(c[rows])
        if len(kept_problems) >= cfg.prompts_per_step:
            break
    info = {"sampling/rounds": rnd + 1, "sampling/groups": len(kept_problems)}
    if not kept_problems:
        return problems, ro, r, c, info
    return kept_problems, Rollout.concat(parts, engine.tokenizer.pad_token_id), torch.cat(rewards), torch.cat(correct), info


def micro_rows(cfg: TrainConfig, n_rows: int) -> int:
    """Rows per forward pass: the update's micro-batch (the whole batch when micro_batch_size is 0 or larger)."""
    return min(cfg.micro_batch_size or n_rows, n_rows)


def behaviour_statistics(model, rollout: Rollout, cfg: TrainConfig, value_head=None, *, reuse: bool,
                         frozen: torch.Tensor | None = None) -> tuple[TokenStats, torch.Tensor | None, HeldForward | None]:
    """(stats, old values, held) of the behaviour policy, (B, R) each, over the whole batch. Strict on-policy with
    reuse: the update's own forward, kept with its graph until the filter has run (`held`). Otherwise one no-grad
    pass built exactly as the update's forward (forward.py: one construction): the update's micro-batches, its
    module mode, its precision, so at these weights it gives the update's log p bit for bit."""
    rows = micro_rows(cfg, len(rollout.texts))
    if reuse:
        held = HeldForward(model, rollout, cfg.temperature, rows, value_head, cfg.precision,
                           from_hidden=cfg.stats_from_hidden, frozen=frozen)
        return held.stats(), held.values(), held
    stats, values = batch_forward(model, rollout, cfg.temperature, rows, value_head, cfg.precision,
                                  from_hidden=cfg.stats_from_hidden)
    return stats, values, None


def compute_advantages(cfg: TrainConfig, estimator, rewards, group_ids, mask, old_logp,
                       old_values) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(advantages (B,) or (B, R), returns (B, R) or None): the estimator over each group, after the reward shaping
    that reads old log p (rewarding the unlikely's rank penalty), then advantage reweighting; PPO's GAE over the
    value head's old values."""
    shaped = rewards
    if cfg.rank_penalty_beta > 0:  # rewarding the unlikely
        seq_logp = (old_logp * mask).sum(-1) / mask.sum(-1).clamp_min(1)
        shaped = rank_penalty(rewards, group_ids, seq_logp, beta=cfg.rank_penalty_beta)
    returns = None
    if isinstance(estimator, TokenLevel):  # PPO: GAE over the value head's values, (B, R)
        adv, returns = estimator(outcome_token_rewards(shaped, mask), old_values, mask, gamma=cfg.gamma, lam=cfg.lam)
    else:
        adv = estimator(shaped, group_ids)
    if cfg.ar_alpha > 0:  # advantage reweighting
        adv = advantage_reweight(adv, old_logp, alpha=cfg.ar_alpha)
    return adv, returns


def choose_tokens(method, controller, stats: TokenStats, adv, mask, entropy_now: float,
                  cfg: TrainConfig) -> tuple[torch.Tensor, dict]:
    """(keep (B, R) bool, metrics): the method's token filter over the whole batch, never per micro-batch; with an
    entropy target, mu is chosen by the controller (control.py)."""
    if not controller:
        return method.apply(stats, adv, mask, **cfg.method_overrides())
    mu, keep, metrics = controller.choose(method, stats, adv, mask, entropy_now, cfg.method_overrides())
    return keep, {**metrics, "mu": mu if math.isfinite(mu) else None, "kappa": controller.kappa}


def after_update_metrics(model, rollout: Rollout, stats: TokenStats, probe: EntropyProbe | None,
                         cfg: TrainConfig) -> dict:
    """The sampler's log-probs (HF or vLLM) against the trained policy's on the same tokens; on probe steps, the
    first-order and the realised change of the batch's mean entropy (the `after` pass is built as the statistics
    pass was, so the difference is the update's alone)."""
    mask, out = rollout.response_mask, {}
    if rollout.sampler_logp is not None:
        gap = (stats.logp - rollout.sampler_logp.to(stats.logp.device)).abs()[mask]
        out["rollout/sampler_logp_gap"] = gap.mean().item()
        out["rollout/sampler_logp_gap_max"] = gap.max().item()
    if probe is not None:  # over every valid response token of the batch, before and after the update
        after = batch_forward(model, rollout, cfg.temperature, micro_rows(cfg, len(rollout.texts)),
                              precision=cfg.precision, from_hidden=cfg.stats_from_hidden)[0]
        out["entropy_change/first_order"] = probe.first_order()
        out["entropy_change/realised"] = masked_mean(after.entropy, mask) - masked_mean(stats.entropy, mask)
    return out


def reuses_forward(cfg: TrainConfig, model) -> bool:
    """Whether the statistics come from the update's own forward: only strict on-policy (one epoch, one mini-batch,
    no Lopti phases), where old log p equals the update's log p; `auto` also needs the update to hold the whole
    batch's activations anyway (no micro-batching) and no active dropout."""
    strict = cfg.ppo_epochs == 1 and cfg.mini_batches == 1 and cfg.lopti_eta is None
    if cfg.reuse_forward == "off" or not strict:
        return False
    if cfg.reuse_forward == "on":
        return True
    whole = cfg.micro_batch_size == 0 or cfg.micro_batch_size >= cfg.prompts_per_step * cfg.group_size
    return whole and not has_active_dropout(model)


def skips_zero_advantage(cfg: TrainConfig, estimator, bonus, ref_model, probing: bool) -> bool:
    """Whether responses with advantage 0 may run without a graph (HeldForward's frozen rows): their loss gradient
    is exactly zero when the policy loss is linear in A and nothing else differentiates them (no KL to a reference,
    no entropy bonus, no value head, no probe this step) and the advantages are known before the forward (no
    rank penalty or reweighting from old log p)."""
    return (cfg.skip_zero_advantage and not isinstance(estimator, TokenLevel) and ref_model is None and bonus is None
            and cfg.entropy_coef == 0 and cfg.rank_penalty_beta == 0 and cfg.ar_alpha == 0 and not probing
            and POLICY_LOSSES.get(cfg.policy_loss).linear_in_advantage)


MIN_FROZEN_SHARE = 0.2  # below it the frozen rows' own passes cost more than their backward saves (demo policy:
#                        12% of rows frozen 1.01x the time of none, 25% 0.95x)


def zero_advantage_rows(estimator, rewards, group_ids, min_share: float = MIN_FROZEN_SHARE) -> torch.Tensor | None:
    """(B,) rows whose advantage is exactly 0 (the step's own estimator on the same rewards), or None when fewer than
    min_share of the rows are, or every row is (then the backward runs as usual, so Adam steps on zero gradients
    exactly as before)."""
    zero = estimator(rewards, group_ids) == 0
    share = float(zero.float().mean())
    return zero if zero.dim() == 1 and min_share <= share < 1 and share > 0 else None


def make_optimizer(groups: list[dict], cfg: TrainConfig) -> torch.optim.Adam:
    """torch.optim.Adam over the parameter groups, fused (one kernel over every tensor, as TRL's default
    adamw_torch_fused) where the device supports it, else the per-tensor loop; the two agree to float32 rounding."""
    try:
        return torch.optim.Adam(groups, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay, fused=True)
    except (RuntimeError, ValueError):  # a device or dtype without the fused kernel
        return torch.optim.Adam(groups, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)


def update_policy(model, optimizer, rollout: Rollout, adv, old_logp, ref_logp, loss_mask, cfg: TrainConfig,
                  gen: torch.Generator, *, entropy_coef: float = 0.0, selected: torch.Tensor | None = None,
                  critic: tuple | None = None, held: HeldForward | None = None, observe=None,
                  entropic: tuple[float, torch.Tensor] | None = None) -> dict:
    """ppo_epochs x mini_batches optimizer steps (per Lopti phase); gradient accumulation over micro-batches with
    the mini-batch's global denominators. `held` (strict on-policy) supplies the micro-batches' forward already
    computed. `observe(rows, stats, old_logp)`, if given, sees each micro-batch's forward and the old log p its loss
    used (entropy_rft/invariants.py checks the update against the statistics pass with it). `entropic` (EntroPIC) is
    this step's (alpha, high-probability tokens (B, T)). Returns the mean loss
    metrics, the last grad norm and Corollary 4.1's prediction (eq. 28) summed over the optimizer steps, each with
    its true ratios and the current policy's S_c."""
    device = next(model.parameters()).device
    n_rows = loss_mask.shape[0]
    model.train()
    sums: dict[str, float] = {}
    grad_norms = []
    ratio = torch.ones_like(old_logp)
    s_centered = torch.zeros_like(old_logp)  # S_c under the policy of the current optimizer step
    predicted_off = 0.0
    n_total = loss_mask.sum().clamp_min(1)
    loss_spec = POLICY_LOSSES.get(cfg.policy_loss)
    loss_kwargs = loss_spec.kwargs(cfg)
    valid = rollout.response_mask
    value_head, old_values, returns = critic or (None, None, None)
    first_step = True  # until the first optimizer.step(), the weights are the behaviour policy's
    phases = [loss_mask]
    if cfg.lopti_eta is not None:  # Lopti: low-probability tokens first, then the rest
        low = old_logp.exp() < cfg.lopti_eta
        phases = [loss_mask & low, loss_mask & ~low]
    for phase_mask, _epoch in ((pm, e) for pm in phases for e in range(cfg.ppo_epochs)):
        order = torch.randperm(n_rows, generator=gen) if cfg.mini_batches > 1 else torch.arange(n_rows)
        for rows in order.chunk(cfg.mini_batches):
            mb_mask = phase_mask[rows]
            denom_mask = valid[rows] if cfg.denominator == "all" else mb_mask
            n_tokens = denom_mask.sum().clamp_min(1).to(device)
            n_seqs = (denom_mask.sum(-1) > 0).sum().clamp_min(1).to(device)
            optimizer.zero_grad(set_to_none=True)
            micro = cfg.micro_batch_size or len(rows)
            if entropic is not None:  # EntroPIC's term: T_hi within the phase's loss tokens, whole-mini-batch counts
                high = entropic[1] & phase_mask
                n_high = high[rows].sum().clamp_min(1).to(device)
                n_high_seqs = (high[rows].sum(-1) > 0).sum().clamp_min(1).to(device)
            for part in rows.split(micro):
                m = phase_mask[part].to(device)
                if held is not None:
                    stats, values = held.take(part)
                else:
                    stats, values = policy_forward(model, rollout.select(part), cfg.temperature, value_head,
                                                   cfg.precision, from_hidden=cfg.stats_from_hidden)
                # the first optimizer step runs at the weights that produced old_logp: its own forward is the
                # behaviour policy's, so its ratio is exactly 1 whatever the precision (departure 3)
                old = stats.logp.detach() if first_step else old_logp[part].to(device)
                extra = {"selected": selected[part].to(device)} if selected is not None else {}
                agg = {"agg": cfg.loss_agg, "num_tokens": n_tokens, "num_seqs": n_seqs, "norm": cfg.max_new_tokens}
                loss, pm = loss_spec.fn(stats.logp, old, adv[part].to(device), m, **agg, **loss_kwargs, **extra)
                if observe is not None:
                    observe(part, stats, old)
                if ref_logp is not None:
                    kl = aggregate(kl_penalty(stats.logp, ref_logp[part].to(device)), m, cfg.loss_agg,
                                   num_tokens=n_tokens, num_seqs=n_seqs, norm=cfg.max_new_tokens)
                    loss = loss + cfg.kl_coef * kl
                    pm["kl"] = kl.detach()
                if value_head is not None:  # the critic learns on every valid token
                    vm = valid[part].to(device)
                    old_v = values.detach() if first_step else old_values[part].to(device)
                    vl, vmetrics = value_loss(values, old_v, returns[part].to(device), vm,
                                              clip_range=cfg.value_clip, agg=cfg.loss_agg, norm=cfg.max_new_tokens,
                                              num_tokens=valid[rows].sum().clamp_min(1).to(device),
                                              num_seqs=(valid[rows].sum(-1) > 0).sum().clamp_min(1).to(device))
                    loss = loss + cfg.vf_coef * vl
                    pm.update(vmetrics, value_loss=vl.detach())
                if entropy_coef:
                    bonus = aggregate(stats.entropy, m, cfg.loss_agg, num_tokens=n_tokens, num_seqs=n_seqs,
                                      norm=cfg.max_new_tokens)
                    loss = loss - entropy_coef * bonus
                if entropic is not None:
                    adjust, _ = entropic_adjustment(stats.logp, old, adv[part].to(device),
                                                    high[part].to(device), alpha=entropic[0], agg=cfg.loss_agg,
                                                    num_tokens=n_high, num_seqs=n_high_seqs, norm=cfg.max_new_tokens)
                    loss = loss + adjust
                if loss.requires_grad or held is None or held.frozen is None:  # a micro-batch of frozen rows only
                    loss.backward()                                            # (advantage 0) has no graph
                ratio[part] = (stats.logp.detach() - old).exp().cpu()
                s_centered[part] = stats.s_centered.cpu()
                weight = float(m.sum()) / float(n_total) / cfg.ppo_epochs
                for k, v in pm.items():
                    sums[f"loss/{k}"] = sums.get(f"loss/{k}", 0.0) + float(v) * weight
                sums["loss/policy"] = sums.get("loss/policy", 0.0) + float(loss.detach()) * weight
            # Corollary 4.1, eq. 28: this optimizer step's share of the batch, at the policy it is taken from
            share = float(mb_mask.sum()) / float(n_total)
            predicted_off += share * float(corollary4_entropy_change(adv[rows], s_centered[rows], mb_mask,
                                                                     lr=cfg.lr, ratio=ratio[rows],
                                                                     num_tokens=float(n_tokens)))
            params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
            norm = torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip if cfg.grad_clip > 0 else math.inf)
            grad_norms.append(float(norm))
            optimizer.step()
            first_step = False
    sums["grad_norm"] = grad_norms[-1] if grad_norms else 0.0
    sums["entropy_change/predicted_offpolicy"] = predicted_off
    return sums


def loss_denominator(mask, loss_mask, cfg: TrainConfig) -> float:
    """|T_B| of the whole batch's token-mean loss: the kept tokens, or every valid token (denominator="all")."""
    return max(float((mask if cfg.denominator == "all" else loss_mask).sum()), 1.0)


def step_metrics(step, rewards, correct, adv, stats: TokenStats, mask, keep, rollout: Rollout, cfg: TrainConfig,
                 optimizer) -> dict:
    """The per-step diagnostics of the paper's figures, all over the batch's response tokens."""
    loss_mask = mask & keep
    token_adv = broadcast_advantages(adv, mask)
    fractions = clipped_fractions(mask, keep, adv)
    cov = batch_covariance(token_adv, stats.s_centered, loss_mask)
    return {
        "step": step + 1,
        "reward_mean": float(rewards.mean()),
        "accuracy": float(correct.float().mean()),
        "entropy": masked_mean(stats.entropy, mask),  # the policy's: token-mean over every valid response token
        "entropy_kept": masked_mean(stats.entropy, loss_mask),  # over the tokens the filter keeps in the loss
        "clip_frac": fractions["frac_clipped"],
        "clip_frac_pos": fractions["frac_clipped_pos"],
        "clip_frac_neg": fractions["frac_clipped_neg"],
        "s_star_mean": masked_mean(stats.s_star, mask),  # Figure 3
        "s_centered_mean": masked_mean(stats.s_centered, mask),  # Corollary 2: about 0 on-policy
        "cov_a_sc": float(cov),  # Figure 5 plots -Cov_B(A, S_c)
        # Corollary 4 in logit space for the token-mean loss: its step is lr / |T_B| per token (dynamics, departure 3)
        "entropy_change/predicted": float(corollary4_entropy_change(adv, stats.s_centered, loss_mask, lr=cfg.lr,
                                                                    num_tokens=loss_denominator(mask, loss_mask, cfg))),
        "response_length": float(mask.sum(-1).float().mean()),
        "truncation_rate": float((~rollout.finished).float().mean()),
        "frac_zero_advantage": float((adv == 0).float().mean()),  # responses (or tokens) with A = 0
        "lr": optimizer.param_groups[0]["lr"],
    }
