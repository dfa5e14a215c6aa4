"""entropy-rft inside TRL's GRPOTrainer (`pip install "entropy-rft[trl]"`): watch any GRPO run's entropy dynamics
with TRL's own loss untouched (method "none"), or run Clip_B, Clip_V and the S*-sign updates wherever TRL runs
(accelerate, DeepSpeed, several GPUs, TRL's vLLM rollouts).

    from entropy_rft.integrations.trl import EntropyGRPOTrainer
    trainer = EntropyGRPOTrainer(model=..., reward_funcs=..., args=GRPOConfig(...), train_dataset=...,
                                 method="none")            # or "clip_b", "clip_v", "s_sign:mask:pos_s:neg_samples", ...
    trainer.train()

After TRL generates and scores a batch, the trainer computes the token statistics (S*, S_c, H) of the whole
generation batch under the current policy and gathers them from every process. With a filter (clip_b, ...), the
method chooses the tokens to keep over that whole batch (Clip_B's mean and std are batch statistics: never per
micro-batch or per process), and the loss then ignores the dropped tokens, in its terms and in its token count, as in
the authors' code. With method "none" (monitor mode) the generation batch TRL's loss reads is left exactly as TRL
made it. Each logging step adds `entropy_rft/*` metrics to TRL's own logs (so W&B, TensorBoard and trackio show
them), over the generation batch (diagnostics.watch_metrics): entropy over every valid completion token, the means
of S* and S_c, Cov_B(A, S_c), eq. 23's logit-space entropy change with SGD step sizes, the loss's own per-token
lr w_t (entropy_change/predicted: not the size, nor reliably the sign, of the change Adam's step makes; docs/watch.md),
and what Clip_B and Clip_V at their default mu would drop (would_clip_b/frac, ...) and those tokens' share of that
logit-space change; with probe_every, the real step's change to first order through the network and as measured
(entropy_change/first_order, entropy_change/realised); a filter adds its own (clip fractions, kept_frac,
entropy_kept). OUTPUT_DIR gets token samples (OUTPUT_DIR/samples, entropy_rft/samples.py's format) and the
entropy_rft metrics of each logging step in metrics.jsonl (MetricsFile), so `entropy-rft inspect OUTPUT_DIR` and
`entropy-rft report OUTPUT_DIR` read it as they read a run of the built-in trainer.

Departures from the built-in trainer, numbered:
1. The dropped tokens ride on TRL's `tool_mask`, a loss-only mask; the forward pass still attends to them.
2. The statistics come from one extra forward pass per generation batch (no grad), at TRL's temperature and with
   entropy-rft's position ids (from the left padding); TRL's own log-probs are left as TRL computes them. TRL 1.16's
   forward cannot serve: its fused LM head returns log p, H and log sum_i p_i^2 per token, not sum_i p_i^2 log p_i,
   so E_p[S] (Theorem 2) and with it S_c need the logits again (benchmarks/monitor_overhead.py measures the cost).
   The monitor runs that forward only for generation batches that feed a logging step (TRL's logging_steps), a
   samples step or a probe; a filter needs it for every batch. It runs in the training step's precision
   (`compute_precision`): under bf16 (fp16) autocast where accelerate autocasts TRL's forward (GRPOConfig's bf16,
   fp16), as TRL's own log-probs are computed, else in float32, with TF32 matmuls where the user allowed them
   (transformers' tf32 setting sets torch's flags for the process; this pass leaves them as they are). The
   statistics themselves are float32 either way (forward.policy_forward). Measured on an H200 (benchmarks/gpu.md
   section 5), the float32 pass cost 0.243 s of a bf16 step against the built-in trainer's 0.071 s in bf16.
3. The dropped tokens always leave the loss's terms; where they leave its denominator depends on TRL's
   loss_type (TRL 1.16's GRPOTrainer.compute_loss): dapo, cispo and vespo divide by `num_items_in_batch`, which
   this trainer recounts over the kept tokens of the whole generation batch (every process), so their loss is
   the token mean over the kept tokens, as in the authors' code; grpo and sapo take each sequence's mean over its
   kept tokens, then the mean over sequences (a sequence with every token dropped counts as 0 in that mean);
   bnpo divides by the kept tokens of the micro-batch on this process only; dr_grpo divides by the constant
   B x max_completion_length, so dropped tokens leave only the numerator; luspo sums each sequence's kept tokens.
   With top_entropy_quantile < 1 (forking tokens), TRL takes its entropy quantile over the loss mask, which
   carries the filter: the quantile is over the kept tokens only.
4. Only methods that are token filters apply here; the other rows of METHODS are TRL settings or different losses
   (the error for them says which).
5. The logit-space entropy change (entropy_change/predicted) is that of the policy-gradient term at ratio 1 (the
   first optimizer step of each generation batch) over every optimizer step the batch feeds (`_step_size`), each
   token's logits moved by SGD with step lr w_t: TRL's optimizer (Adam), KL term, entropy bonus and vLLM
   importance-sampling correction are not in it, and it is None for bnpo (its weights depend on TRL's random split
   into micro-batches), vespo (its sequence weights) and top_entropy_quantile < 1 (a quantile per micro-batch).
6. The probe (probe_every) takes the gradient of each process's own rows' mean entropy, in the statistics pass's
   module mode (forward.update_mode: no random number drawn, so TRL's run is unchanged), with
   torch.autograd.grad (TRL's .grad untouched), at the weights that generated the batch, and keeps it until the
   batch's last optimizer step (span: steps_per_generation x num_iterations / gradient_accumulation_steps); then
   first_order = g . (theta_after - theta_before) over every step the batch fed (forward.EntropyProbe) and realised
   = the mean entropy on the same tokens after minus before, each combined over processes weighted by their valid
   completion tokens. The entropy is over every valid completion token (completion_mask; TRL's tool_mask not
   applied), at TRL's temperature; the probe needs each process to hold the whole model (refused under FSDP,
   DeepSpeed ZeRO-3, Megatron) and one gradient's memory between generation and the batch's last step.
7. Which steps a log line covers: TRL averages its own metrics over every step of the logging window. A filter
   computes its statistics for every batch, so its entropy_rft/* values are the window's mean too. The monitor
   computes them only for batches that feed a logged step, a samples step or a probe, and logs them only for
   those that feed a logged step: with logging_steps L a log line's entropy_rft/* values are those of the logged
   step's batch, not the window's mean (the probe's two values are appended at its batch's last step and averaged
   with any other probe of the window).
8. A rollout rule (GRPODropout) runs over every process's generation batch (TRL's num_generations consecutive rows
   a group, TRL's summed rewards): its deleted rollouts ride on tool_mask like dropped tokens (so, as departure 3
   says per loss_type, they leave dapo's token count), and the kept ones' advantages are recomputed by TRL's own
   group rule (rollout_estimator) and recentred; its draws for all-zero groups come from a generator seeded with
   TrainingArguments.seed. TRE's bonus (tre_k) is refused: TRL's GRPO loss has no entropy bonus to make top-K.
"""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path

import torch

from .. import samples
from ..config import TrainConfig
from ..core.advantages import ADVANTAGES, broadcast_advantages, grpo
from ..core.dynamics import TokenStats
from ..core.losses import step_sizes
from ..core.methods import METHODS
from ..logging import JsonlSink, write_engine_run
from ..rollout.hf import Rollout
from ..train.diagnostics import WOULD_CLIP, float_mean, watch_metrics, would_clip_label
from ..train.forward import EntropyProbe, batch_stats

try:
    import trl
    from transformers import TrainerCallback
    from trl import GRPOTrainer
except ImportError as err:  # the adapter is an optional extra
    raise ImportError("entropy_rft.integrations.trl needs TRL: pip install 'entropy-rft[trl]'") from err

MONITOR = "none"  # method: TRL's loss unchanged, the statistics only
# The TRL releases this adapter is tested against (tests/test_trl.py; the newest this project's package index
# serves is 1.16.0). It overrides GRPOTrainer._generate_and_score_completions and _calculate_rewards and reads
# their outputs' keys, TRL's loss_type / importance_sampling_level / top_entropy_quantile and its _metrics.
TRL_TESTED = ((1, 16), (1, 17))  # [lowest, first untested)
# What TRL's release notes say changed after the tested range, where it touches this adapter (docs/howto/trl.md).
TRL_KNOWN_CHANGES = (
    "1.17: vLLM log-probs renormalised under top-k/top-p/min-p for the importance-sampling correction (not in "
    "the monitor's step sizes either way); 1.18: AsyncGRPOTrainer stable, a separate trainer with its own rollout "
    "worker and loss path, which EntropyGRPOTrainer does not wrap"
)
OUT_KEYS = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "advantages")  # what we read
UNTESTED_TRL = "ENTROPY_RFT_ALLOW_UNTESTED_TRL"  # set to 1: warn instead of refusing an untested TRL release


def check_trl_version(version: str, allow_untested: bool = False) -> None:
    """Refuses a TRL release outside TRL_TESTED with an error naming the tested range and what is known to differ
    (a warning instead with allow_untested: ENTROPY_RFT_ALLOW_UNTESTED_TRL=1)."""
    import warnings

    parts = tuple(int(p) for p in re.findall(r"\d+", version)[:2])
    lo, hi = TRL_TESTED
    if lo <= parts < hi:
        return
    message = (
        f"entropy_rft.integrations.trl is tested with TRL >= {lo[0]}.{lo[1]}, < {hi[0]}.{hi[1]}; this is TRL "
        f"{version}. It overrides GRPOTrainer internals (_generate_and_score_completions, _calculate_rewards, "
        f"the loss_type aggregations) that may differ there. Known since: {TRL_KNOWN_CHANGES}. Install "
        f"'trl>={lo[0]}.{lo[1]},<{hi[0]}.{hi[1]}', or set {UNTESTED_TRL}=1 to run untested"
    )
    if not allow_untested:
        raise RuntimeError(message)
    warnings.warn(message, stacklevel=3)


def check_trl_internals(trainer_cls) -> None:
    """The GRPOTrainer methods and settings this adapter uses exist (a clear error before training, not a wrong
    statistic after)."""
    missing = [
        name
        for name in ("_generate_and_score_completions", "_calculate_rewards", "_compute_loss")
        if not callable(getattr(trainer_cls, name, None))
    ]
    if missing:
        raise RuntimeError(
            f"this TRL's GRPOTrainer has no {', '.join(missing)}: entropy_rft.integrations.trl needs "
            f"TRL >= {TRL_TESTED[0][0]}.{TRL_TESTED[0][1]}, < {TRL_TESTED[1][0]}.{TRL_TESTED[1][1]}"
        )


TRL_EQUIVALENTS = {
    "grpo": f"method={MONITOR!r} (TRL's own loss, watched)",
    "dapo": "GRPOConfig(loss_type='dapo', epsilon_high=0.28)",
    "dr_grpo": "GRPOConfig(loss_type='dr_grpo', scale_rewards='none')",
    "gspo": "GRPOConfig(importance_sampling_level='sequence', epsilon=3e-4, epsilon_high=4e-4)",
    "forking": "GRPOConfig(top_entropy_quantile=0.2)",
    "cispo": "GRPOConfig(loss_type='cispo') (TRL's CISPO caps r at epsilon_high only; Clip_B / Clip_V apply on top)",
    "sapo": "GRPOConfig(loss_type='sapo') (Clip_B / Clip_V apply on top)",
    "entropy_bonus": "GRPOConfig's entropy bonus options",
}


def check_rollout_rule(args) -> None:
    """A rollout rule (GRPODropout) recomputes TRL's group advantages over the kept rollouts: TRL's group scaling
    ("group" or "none"), not its batch scaling, whose statistics span every group."""
    scale = getattr(args, "scale_rewards", "group")
    if scale not in ("group", "none", True, False):
        raise ValueError(
            f"GRPODropout recomputes each group's advantages: use scale_rewards 'group' or 'none', got {scale!r}"
        )


def rollout_estimator(scale_rewards):
    """TRL 1.16's group advantages as an estimator of (rewards, group ids): (R - mean_G) / (std_G + 1e-4) with the
    unbiased std ("group"), R - mean_G ("none"); a group of one keeps its reward (advantages.grpo's rule, where TRL's
    fixed-size groups have none)."""
    if scale_rewards in ("none", False):
        return ADVANTAGES.get("dr_grpo")
    return functools.partial(grpo, epsilon=1e-4)


def rollout_of(out: dict) -> Rollout:
    """A generation batch of GRPOTrainer (prompt/completion ids and masks) as entropy-rft's Rollout."""
    b = out["completion_ids"].shape[0]
    return Rollout(
        out["prompt_ids"],
        out["prompt_mask"].bool(),
        out["completion_ids"],
        out["completion_mask"].bool(),
        torch.ones(b, dtype=torch.bool),
        [""] * b,
    )


class MetricsFile(TrainerCallback):
    """OUTPUT_DIR/metrics.jsonl (entropy_rft/logging.py's JsonlSink, the built-in trainer's file) from TRL's logs:
    one line per logging step that carries entropy_rft/* metrics, named as the built-in trainer names them
    (the prefix dropped; TRL's reward as reward_mean, grad_norm, learning_rate as lr, a filter's frac_clipped as
    clip_frac), so `entropy-rft report OUTPUT_DIR` plots them. The main process writes; a run resumed at step S
    first drops the lines after S."""

    RENAMED = {"reward": "reward_mean", "grad_norm": "grad_norm", "learning_rate": "lr"}

    def __init__(self, about: dict | None = None):
        self.sink, self.about = None, about

    def on_train_begin(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            Path(args.output_dir).mkdir(parents=True, exist_ok=True)
            if self.about is not None:  # what `entropy-rft report` names in its table
                write_engine_run(args.output_dir, self.about)
            self.sink = JsonlSink(args.output_dir, {}, start_step=state.global_step)

    def on_log(self, args, state, control, logs=None, **kwargs):
        ours = {k.removeprefix("entropy_rft/"): v for k, v in (logs or {}).items() if k.startswith("entropy_rft/")}
        if self.sink is None or not ours:
            return
        if "frac_clipped" in ours:
            ours["clip_frac"] = ours["frac_clipped"]
        theirs = {new: logs[old] for old, new in self.RENAMED.items() if old in logs}
        self.sink.log({"step": state.global_step, **theirs, **ours})

    def on_train_end(self, args, state, control, **kwargs):
        if self.sink is not None:
            self.sink.close()
            self.sink = None


def compute_precision(accelerator) -> str:
    """The precision of TRL's training forward as forward.autocast names it: "bf16" or "fp16" where accelerate
    autocasts the step (its mixed_precision, from GRPOConfig's bf16 / fp16), else "fp32" (departure 2)."""
    return {"bf16": "bf16", "fp16": "fp16"}.get(str(getattr(accelerator, "mixed_precision", "no")), "fp32")


def mean_entropy(stats: TokenStats, mask: torch.Tensor) -> float:
    """The mean entropy over the mask's tokens, summed in float64 (a probe's realised change is a difference of
    two of these, about 1e-5 of their size)."""
    m = mask.to(stats.entropy.device).double()
    return float((stats.entropy.double() * m).sum() / m.sum().clamp_min(1.0))


def sharded(accelerator) -> bool:
    """Whether each process holds a shard of the weights (FSDP, Megatron-LM, DeepSpeed ZeRO-3), not the whole model."""
    kind = accelerator.distributed_type.value
    if kind == "DEEPSPEED":
        return getattr(accelerator.state.deepspeed_plugin, "zero_stage", 0) == 3
    return kind in ("FSDP", "MEGATRON_LM")


class ProbeCallback(TrainerCallback):
    """Ends the trainer's entropy probe after TRL's optimizer step (on_step_end: the weights are the new ones, the
    step's log line is still to come)."""

    def __init__(self, trainer: EntropyGRPOTrainer):
        self.trainer = trainer

    def on_step_end(self, args, state, control, **kwargs):
        self.trainer._finish_probe(state.global_step)


# TRL's clipped surrogates, where a weight on a token's A is one on its loss
STARE_LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo")


def check_weighable(args) -> None:
    """A method with token weights (STARE) multiplies each token's advantage (step.py, departure 3), which equals the
    authors' weight on each token's clipped surrogate for TRL's token-level clipped losses only."""
    loss_type = getattr(args, "loss_type", "dapo")
    level = getattr(args, "importance_sampling_level", "token")
    if loss_type not in STARE_LOSS_TYPES or level != "token":
        raise ValueError(
            f"STARE weights the clipped surrogate per token: use loss_type in {STARE_LOSS_TYPES} with "
            f"importance_sampling_level='token' (got {loss_type!r}, {level!r})"
        )


class EntropyGRPOTrainer(GRPOTrainer):
    """GRPOTrainer that reports what moves its entropy and, with a filter, whose loss keeps only the tokens an
    entropy-rft method keeps (module docstring).

    method: "none" (MONITOR): TRL's loss exactly as GRPOTrainer computes it, for any loss_type and
    importance_sampling_level, with the entropy_rft/* metrics, metrics.jsonl and the token samples; or a name in
    METHODS with a token filter (clip_b, clip_v, s_sign:...) or token weights (stare: the generation batch's
    advantages become per token, A times the weight), whose method_options override the filter's defaults
    (e.g. {"mu": 1.5} or {"mu": 8.5, "max_frac": 1e-4}); None values are ignored, and methods.NO_CAP passes None
    itself ({"max_frac": NO_CAP}: Clip_V clips every violator).

    samples_every, samples_groups: token-level samples of the generation batch, in the built-in trainer's format
    and with its defaults (TrainConfig), written to OUTPUT_DIR/samples (entropy_rft/samples.py; `entropy-rft
    inspect OUTPUT_DIR` shows them). A file is named by the first optimizer step its generation batch feeds.

    probe_every: N > 0 probes the generation batches that feed an optimizer step divisible by N (0: never; None,
    the default, is the built-in trainer's TrainConfig.probe_every, 10, which is also TRL's default logging_steps,
    so each default log line carries one probe, and 0 where the weights are sharded): the gradient of the batch's mean
    entropy over its valid completion tokens at the weights that generated it (one extra forward and backward), TRL's
    own optimizer steps on the batch, then that mean entropy on the same tokens at the new weights (one extra forward),
    logged at the batch's last optimizer step as entropy_rft/entropy_change/first_order (gradient . parameter change,
    the change to first order through the network of the step Adam really took) and entropy_rft/entropy_change/realised
    (departure 6)."""

    def __init__(
        self,
        *args,
        method: str = "clip_b",
        method_options: dict | None = None,
        samples_every: int = TrainConfig.samples_every,
        samples_groups: int = TrainConfig.samples_groups,
        probe_every: int | None = None,
        **kwargs,
    ):
        if probe_every is not None and probe_every < 0:
            raise ValueError(f"probe_every must be >= 0 (0: never probe), got {probe_every}")
        check_trl_version(trl.__version__, os.environ.get(UNTESTED_TRL) == "1")
        check_trl_internals(GRPOTrainer)
        if method == MONITOR:
            if method_options:
                raise ValueError(
                    f"method {MONITOR!r} changes nothing in the loss, so it takes no method_options "
                    f"(got {method_options}); pick a filter (clip_b, clip_v, ...) to pass options"
                )
            spec = None
        else:
            spec = METHODS.get(method)
            if spec.top_entropy:
                raise ValueError(
                    f"method {method!r} adds TRE's top-K entropy bonus, which needs the logits inside TRL's loss "
                    "(TRL 1.16's GRPO loss has no entropy bonus to replace): run it in the built-in trainer"
                )
            if spec.advantage_rule is not None:
                raise ValueError(
                    f"method {method!r} rewrites the advantages with the run's entropy and step (Entrocraft), which "
                    "this adapter does not run: use the built-in trainer"
                )
            if spec.weigh is not None:
                check_weighable(kwargs.get("args", args[2] if len(args) > 2 else None))
            if spec.rollout_rule is not None:
                check_rollout_rule(kwargs.get("args", args[2] if len(args) > 2 else None))
            elif spec.filter is None and spec.weigh is None:
                hint = TRL_EQUIVALENTS.get(method, "no TRL equivalent here")
                raise ValueError(
                    f"method {method!r} is not a token filter, so EntropyGRPOTrainer has nothing to add: "
                    f"use {hint}. Filters: "
                    f"{', '.join(n for n in METHODS.names() if METHODS.get(n).filter)}; "
                    f"method={MONITOR!r} watches TRL's own loss"
                )
        self.entropy_method = spec
        self.method_options = dict(method_options or {})
        self.samples_every, self.samples_groups = samples_every, samples_groups
        self._samples_cut = False
        self.probe_every, self._probe = TrainConfig.probe_every if probe_every is None else probe_every, None
        super().__init__(*args, **kwargs)
        if self.probe_every and sharded(self.accelerator):
            if probe_every is not None:
                raise ValueError(
                    f"probe_every={probe_every} needs every process to hold the whole model; this run "
                    f"shards it ({self.accelerator.distributed_type.value}): set probe_every=0"
                )
            self.probe_every = 0  # the default probes only where it can
        self.add_callback(MetricsFile(self._about()))
        self.add_callback(ProbeCallback(self))

    def _about(self) -> dict:
        """The settings `entropy-rft report` names for this run (diagnostics.write_engine_run)."""
        args = self.args
        return {
            "source": "trl",
            "trl_version": trl.__version__,
            "method": self.method_name,
            "method_options": self.method_options,
            "loss_type": self.loss_type,
            "importance_sampling_level": self.importance_sampling_level,
            "num_generations": self.num_generations,
            "learning_rate": args.learning_rate,
            "lr_scheduler_type": getattr(args.lr_scheduler_type, "value", args.lr_scheduler_type),
            "logging_steps": args.logging_steps,
            "probe_every": self.probe_every,
            "samples_every": self.samples_every,
        }

    @property
    def method_name(self) -> str:
        return MONITOR if self.entropy_method is None else self.entropy_method.name

    def _generate_and_score_completions(self, inputs):
        out = super()._generate_and_score_completions(inputs)
        if not self.model.training:
            return out
        if self.entropy_method is None and not self._watched():  # departure 2: nothing to log or write
            self._cut_samples()
            return out
        missing = [k for k in OUT_KEYS if k not in out]
        if missing:
            raise RuntimeError(
                f"TRL's generation batch has no {', '.join(missing)}: this TRL ({trl.__version__}) "
                f"differs from the tested range {TRL_TESTED} (check_trl_version)"
            )
        loss_mask = out["completion_mask"].bool()
        if "tool_mask" in out:
            loss_mask = loss_mask & out["tool_mask"].bool()
        local = self._token_stats(out)
        if self._probing():
            self._start_probe(out, local)
        every, adv, mask = self._gather(local, out["advantages"], loss_mask)
        metrics = {}
        if self.entropy_method is None:  # monitor mode: `out` stays exactly as TRL made it
            keep = mask
        else:
            rows = slice(
                self.accelerator.process_index * loss_mask.shape[0],
                (self.accelerator.process_index + 1) * loss_mask.shape[0],
            )
            adv, kept_rows, rollout_metrics = self._rollout_rule(every, adv, mask)  # GRPODropout (departure 8)
            valid = mask if kept_rows is None else mask & kept_rows[:, None]
            keep, metrics = self._whole_batch_filter(every, adv, valid)
            keep = keep & valid
            metrics.update(rollout_metrics)
            # STARE: its weight on each token's advantage (step.py, departure 3), ranked over the kept tokens
            weights, weight_metrics = self.entropy_method.weights(every, adv, keep, **self.method_options)
            if weights is not None:
                adv = broadcast_advantages(adv, mask) * weights
                metrics.update(weight_metrics)
            if weights is not None or kept_rows is not None:
                local_adv = adv[rows, : loss_mask.shape[1]] if adv.dim() == 2 else adv[rows]
                out["advantages"] = local_adv.to(out["advantages"].device, out["advantages"].dtype)  # TRL takes both
            mine = keep[rows, : loss_mask.shape[1]].to(loss_mask.device)
            base = out["tool_mask"] if "tool_mask" in out else torch.ones_like(out["completion_mask"])
            out["tool_mask"] = base * mine.to(base.dtype)
            if "num_items_in_batch" in out:  # departure 3
                out["num_items_in_batch"] = self.accelerator.gather((loss_mask & mine).sum()).sum()
        self._filtered = (every, adv, mask, keep)  # the whole batch, for the samples
        self._step_sizes = self._step_size(self._lr(), mask & keep)
        metrics.update(watch_metrics(every, adv, mask, mask & keep, self._step_sizes))
        if self.entropy_method is not None or self._feeds_log():  # departure 7
            for name, value in metrics.items():
                if value is not None:
                    self._metrics["train"][f"entropy_rft/{name}"].append(value)
        self._write_samples(out)
        return out

    def _fed_steps(self) -> range:
        """The optimizer steps (1-based) this generation batch feeds."""
        args, done = self.args, self.state.global_step
        span = max(1, args.steps_per_generation * self.num_iterations // args.gradient_accumulation_steps)
        return range(done + 1, done + span + 1)

    def _watched(self) -> bool:
        """Whether one of the steps this generation batch feeds logs, writes samples or is probed: the monitor's
        statistics are for them."""
        steps = self._fed_steps()
        return (
            self._feeds_log()
            or self._probing()
            or any(samples.due(s, self.samples_every, self.state.max_steps) for s in steps)
        )

    def _feeds_log(self) -> bool:
        """Whether one of the steps this generation batch feeds logs (TRL's logging_steps, logging_first_step; every
        batch under another logging strategy than "steps")."""
        args, steps = self.args, self._fed_steps()
        if args.logging_strategy != "steps":
            return args.logging_strategy != "no"
        every = self.state.logging_steps or 1
        return any(s % every == 0 or (s == 1 and args.logging_first_step) for s in steps)

    def _probing(self) -> bool:
        """Whether this generation batch feeds an optimizer step divisible by probe_every."""
        return self.probe_every > 0 and any(s % self.probe_every == 0 for s in self._fed_steps())

    def _start_probe(self, out, before: TokenStats) -> None:
        """The gradient of this process's rows' mean entropy at the behaviour weights (forward.EntropyProbe, in the
        statistics pass's module mode, so no random number is drawn), kept until the batch's last optimizer step."""
        rollout = rollout_of(out)
        probe = EntropyProbe(
            self.model,
            rollout,
            self.temperature,
            self.args.per_device_train_batch_size,
            compute_precision(self.accelerator),
            in_update_mode=True,
        )
        self._probe = (
            probe,
            rollout,
            mean_entropy(before, rollout.response_mask),
            float(rollout.response_mask.sum()),
            self._fed_steps()[-1],
        )

    def _finish_probe(self, step: int) -> None:
        """After the optimizer step `step`: if it is the probed batch's last, the first-order and the realised change
        of the mean entropy over every process's valid completion tokens (each process's weighted by its tokens:
        the parameter step is the same on every process, the gradient is of its own rows)."""
        if self._probe is None or self._probe[-1] != step:
            return
        probe, rollout, before, n, _ = self._probe
        self._probe = None
        after = mean_entropy(
            batch_stats(
                self.model,
                rollout,
                self.temperature,
                self.args.per_device_train_batch_size,
                compute_precision(self.accelerator),
            ),
            rollout.response_mask,
        )
        local = torch.tensor(
            [n, n * probe.first_order(), n * (after - before)], dtype=torch.float64, device=self.accelerator.device
        )
        total = self.accelerator.gather(local[None]).sum(0).cpu()
        tokens = max(float(total[0]), 1.0)
        self._metrics["train"]["entropy_rft/entropy_change/first_order"].append(float(total[1]) / tokens)
        self._metrics["train"]["entropy_rft/entropy_change/realised"].append(float(total[2]) / tokens)

    def _cut_samples(self) -> None:
        """The first batch of a run cuts the samples of later steps (a run resumed from a checkpoint writes them
        again)."""
        if not self._samples_cut and self.accelerator.is_main_process and self.samples_every > 0:
            samples.cut_after(self.args.output_dir, self.state.global_step)
        self._samples_cut = True

    def _lr(self) -> float:
        return self.lr_scheduler.get_last_lr()[0] if self.lr_scheduler is not None else self.args.learning_rate

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        """TRL's rewards per function (every process's rows); keeps their weighted sum, as TRL forms it, for the
        samples."""
        per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._batch_rewards = (per_func * self.reward_weights.to(per_func.device).unsqueeze(0)).nansum(dim=1)
        return per_func

    def _write_samples(self, out) -> None:
        """OUTPUT_DIR/samples/step-N.json.gz of this generation batch, when one of the optimizer steps it feeds is
        due; every process joins the gathers, the main process writes. The first batch of a run cuts the samples of
        later steps (a run resumed from a checkpoint writes them again)."""
        acc, run_dir, done = self.accelerator, self.args.output_dir, self.state.global_step
        self._cut_samples()
        steps = self._fed_steps()
        if not any(samples.due(s, self.samples_every, self.state.max_steps) for s in steps):
            return
        every, adv, mask, keep = self._filtered
        tokenizer = getattr(self.processing_class, "tokenizer", self.processing_class)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        prompt_ids, prompt_mask = (
            acc.gather(
                acc.pad_across_processes(out[k], dim=1, pad_index=pad if k == "prompt_ids" else 0, pad_first=True)
            )
            for k in ("prompt_ids", "prompt_mask")
        )
        completion_ids = acc.gather(acc.pad_across_processes(out["completion_ids"], dim=1, pad_index=pad))
        if not acc.is_main_process:
            return
        lengths = mask.sum(-1)
        last = completion_ids.gather(1, (lengths - 1).clamp_min(0)[:, None]).squeeze(1)
        finished = (lengths > 0) & (last == tokenizer.eos_token_id)
        batch = samples.SampleBatch(
            prompt_ids,
            prompt_mask.bool(),
            completion_ids,
            mask,
            finished,
            tokenizer,
            every,
            adv,
            keep,
            self._batch_rewards,
            self.num_generations,
            self._step_sizes,
        )
        info = {
            "source": "trl",
            "method": self.method_name,
            "loss_type": self.loss_type,
            "importance_sampling_level": self.importance_sampling_level,
            "lr": self._lr(),
            "steps": [steps[0], steps[-1]],
        }
        marks = []
        if self.entropy_method is None:  # what the filters would drop (watch_metrics' would_<name>/frac)
            for name in WOULD_CLIP:
                dropped = mask & ~METHODS.get(name).apply(every, adv, mask)[0]
                marks.append((f"would_{name}", dropped, would_clip_label(name)))
        samples.write_step(run_dir, done + 1, batch, groups=self.samples_groups, info=info, marks=marks)

    def _step_size(self, lr: float, kept: torch.Tensor):
        """lr times each token's weight in TRL's loss over the generation batch (global rows), by the shared rule
        (losses.step_sizes) for the aggregation each loss_type is (TRL 1.16's compute_loss): dapo and cispo the token
        mean over the kept tokens of the generation batch, rescaled per optimizer step; grpo and sapo each row's
        token mean, then the mean over rows; dr_grpo each row's sum over the constant rows x
        max_completion_length; luspo each row's sum, then the mean over rows. At ratio 1 (the step's first
        optimizer step) every one of these losses puts the factor 1 on d log p_t, with a token-level or a
        sequence-level (GSPO) importance ratio alike (sapo: sigmoid'(0) x 4 = 1), except cispo, whose factor is
        min(1, epsilon_high). None where the weight depends on how TRL splits the batch (bnpo, top_entropy_quantile
        < 1) or the loss is not of this form (vespo): departure 5."""
        args, world = self.args, self.accelerator.num_processes
        rows = args.per_device_train_batch_size * args.gradient_accumulation_steps * world  # rows per optimizer step
        if self.top_entropy_quantile < 1.0:
            return None
        if self.loss_type in ("dapo", "cispo"):  # TRL's token count spans the generation batch, rescaled per step
            tokens = args.gradient_accumulation_steps * max(float(kept.sum()), 1.0) / args.steps_per_generation
            step = step_sizes(kept, "token-mean", lr=lr, num_tokens=tokens)
            return step if self.loss_type == "dapo" else step * min(1.0, self.epsilon_high)
        if self.loss_type in ("grpo", "sapo"):
            return step_sizes(kept, "seq-mean-token-mean", lr=lr, num_seqs=rows)
        if self.loss_type == "dr_grpo":
            return step_sizes(kept, "seq-mean-token-sum-norm", lr=lr, num_seqs=rows, norm=self.max_completion_length)
        if self.loss_type == "luspo":
            return step_sizes(kept, "seq-mean-token-sum", lr=lr, num_seqs=rows)
        return None

    @torch.no_grad()
    def _token_stats(self, out) -> TokenStats:
        """TokenStats of the completion tokens under the current policy, (B, T) each, on the CPU, in the training
        step's precision (departure 2)."""
        was_training = self.model.training
        self.model.eval()  # no dropout in the statistics
        try:
            return batch_stats(
                self.model,
                rollout_of(out),
                self.temperature,
                self.args.per_device_train_batch_size,
                compute_precision(self.accelerator),
            )
        finally:
            self.model.train(was_training)

    def _gather(self, stats: TokenStats, advantages, loss_mask) -> tuple[TokenStats, torch.Tensor, torch.Tensor]:
        """(stats, advantages, loss mask) of every process's generation batch, rows in process order, each padded to
        the widest process's completions: [world * B, T]."""
        device = loss_mask.device
        local = [stats.logp, stats.entropy, stats.s_star, stats.s_expect, loss_mask.float().cpu()]
        padded = [self.accelerator.pad_across_processes(t.to(device), dim=1) for t in local]
        logp, entropy, s_star, s_expect, mask = (self.accelerator.gather(t).float() for t in padded)
        adv = self.accelerator.gather(advantages.float())
        return TokenStats(logp, entropy, s_star, s_expect), adv, mask.bool()

    def _rollout_rule(self, every: TokenStats, adv, mask):
        """(advantages (B,), kept rollouts (B,) bool or None, metrics): the method's rollout rule (GRPODropout) over
        every process's generation batch, its groups TRL's num_generations consecutive rows, its recomputed
        advantages TRL's own (rollout_estimator; departure 8)."""
        spec = self.entropy_method
        if spec is None or spec.rollout_rule is None:
            return adv, None, {}
        groups = torch.arange(adv.shape[0]) // self.num_generations
        rewards = self._batch_rewards.float().cpu()
        if getattr(self, "_rollout_gen", None) is None:
            self._rollout_gen = torch.Generator().manual_seed(self.args.seed)
        new, kept, metrics = spec.rollouts(
            rewards,
            adv.float().cpu(),
            groups,
            every.logp.cpu(),
            mask.cpu(),
            estimator=rollout_estimator(self.scale_rewards),
            generator=self._rollout_gen,
            **self.method_options,
        )
        return new.to(adv.device), kept.to(mask.device), {k: float(v) for k, v in metrics.items()}

    def _whole_batch_filter(self, every: TokenStats, adv, mask):
        """(keep, metrics): the method's bool keep mask over every process's generation batch, and its metrics."""
        keep, metrics = self.entropy_method.apply(every, adv, mask, **self.method_options)
        return keep, {
            **{k: float(v) for k, v in metrics.items()},
            "entropy_kept": float_mean(every.entropy, keep & mask),  # over the tokens the filter keeps
            "kept_frac": float_mean(keep & mask, mask),
        }
