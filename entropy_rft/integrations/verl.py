"""entropy-rft inside verl (`pip install "entropy-rft[verl]"`, written against verl 0.9.1): watch a GRPO run's
entropy dynamics with verl's loss untouched (method "none"), or run Clip_B, Clip_V, the S*-sign filters of Figure 1,
RSI-S, STARE's weights, Entrocraft's advantages and a whole-batch Clip-Cov in verl's V1 trainer, on verl's Ray/FSDP
workers and vLLM/SGLang rollouts, with their statistics taken over the whole training batch.

    VERL_ENGINE_VENDOR=entropy_rft python -m verl.trainer.main_ppo ... \\
        trainer.v1.trainer_mode=entropy_rft +entropy_rft.method=clip_b +entropy_rft.options.mu=2.5
    # or +entropy_rft.method=none: verl's own loss, watched

How it plugs in (docs/howto/verl.md; examples/verl/ has complete configs):
- `import verl` loads entropy_rft.integrations.verl_plugin in every process through the `verl.plugins` entry point
  of this package: it registers the trainer and the engine by name and imports this module (with verl's V1 trainer
  and engine modules) only in a process that chooses one of them, so a user who does not ask pays nothing (a
  failing import is logged at DEBUG only; `VERL_USE_EXTERNAL_MODULES=entropy_rft.integrations.verl` imports this
  module at once and raises).
- Monitor (entropy_rft.method=none): the advantage step reads the whole batch's statistics (with E_p[S] from
  EntropyFSDPEngine, so S_c) and adds diagnostics.watch_metrics to the step's metrics, which verl's tracking logs
  (entropy, the means of S* and S_c, Cov_B(A, S_c), the predicted entropy change with verl's per-token step
  sizes, what Clip_B and Clip_V at their default mu would drop and the change those tokens account for); it
  writes nothing back, and the actor update is verl's own.
- EntropyRFTTrainer, V1 trainer "entropy_rft", is verl's sync trainer whose advantage step, after verl's own,
  filters the whole batch on the driver (which holds every data-parallel rank's rows): S* = p_k (H + log p_k) from
  the old log-probs and entropies verl always recomputes; the keep mask goes into a TransferQueue field of its own
  (KEEP). Its actor update multiplies `response_mask` (the loss's terms) and `loss_mask` (verl's engine divides by
  `loss_mask.sum()` over all ranks) by it for that call only, then puts verl's masks back.
- An advantage rule (Entrocraft, alone or before Clip_B in entrocraft+clip_b) runs in the same driver step, before
  the filter, as the built-in trainer runs it after its estimator: on verl's advantages, with the batch's mean entropy
  over every valid token, each rollout's summed reward (rm_scores, or token_level_rewards when verl puts a KL
  penalty in the reward) and verl's 1-based global step of total_training_steps (RunPosition). The advantages field
  is written back; no token leaves the loss. Rollout deletion (GRPODropout) is refused by name.
- Clip_V also needs E_p[S] = sum_i p_i S_i (Theorem 2): EntropyFSDPEngine, a registered subclass of verl's FSDP
  language-model engine (`VERL_ENGINE_VENDOR=entropy_rft` in the workers' environment), adds it to the
  old-log-prob forward from the logits it already holds, packed or padded. The request (WANT_S_EXPECT) and the
  stored output (S_EXPECT) have different names: verl hands every later worker call every stored field, and the
  reference forward, the critic and the actor update ignore S_EXPECT and KEEP.

Departures and limits, numbered:
1. The statistics are those of the policy that computed the old log-probs (verl's recompute, at the rollout
   temperature), as in the authors' code; the filter is chosen once per batch for every mini-batch and epoch. That
   pass is verl's own engine forward, so it runs in the run's compute dtype (FSDP's mixed precision, bf16 by
   default) with no extra forward; this module only adds E_p[S] from the logits it already holds, divided by the
   temperature as verl divides them (in the logits' dtype), so that E_p[S] is the expectation under the distribution
   verl's log p and H describe (E[S_c] = 0 under it), then in float32 one chunk of rows at a time
   (`s_expect_of_logits`).
2. Clip_V needs the unfused FSDP engine (fused kernels and Megatron never materialise the logits): refused at
   start-up. Every method refuses `rollout_correction.bypass_mode` (no recompute, so no entropy).
3. Clip-Cov selects over the whole batch on the driver with the old log-probs and zeroes the selected tokens'
   advantages (they stay in the denominator); verl's clip_cov loss selects per micro-batch with the current
   log-probs. KL-Cov needs the current log-prob in the loss, so it stays verl's per-micro-batch
   `actor.policy_loss.loss_mode=kl_cov` (verl issue #7829; docs/howto/verl.md).
4. The trainer keeps verl's "sync" behaviour (its trainer_mode reads "sync"); the async V1 trainers are not wrapped.
5. The filter applies to the actor's loss only: PPO's critic (GAE, Table 4) learns on every valid response token,
   as the built-in trainer's, and verl's metrics read verl's own masks.
6. The filter's population is every valid response token, `loss_mask` as the rollout wrote it (the authors' batch
   statistics are over all response tokens of the batch). Under verl's rejection sampling, which rewrites only
   `response_mask`, the statistics stay over every valid token, with verl's advantages (0 on rejected tokens:
   Clip_V's zero-advantage rule may drop one); the actor then uses verl's post-rejection response_mask & keep and
   loss_mask & keep. Only the filter's tokens leave the loss and the denominator (rejected ones stay in it, as in
   stock verl), and a filter that drops nothing gives stock verl's update.
7. The monitor writes SAMPLES_DIR/metrics.jsonl (its metrics, a line per step) and token samples of every
   samples_every-th step (entropy_rft/samples.py's format, rows regrouped by uid) to entropy_rft.samples_dir,
   default verl's experiment directory (trainer.default_local_dir), from the driver, once; `entropy-rft inspect`
   and `entropy-rft report` read that directory (with entropy_rft_run.json: what was watched). The per-token step
   sizes (verl_step_sizes) model verl's token-mean loss with unshuffled mini-batches composed as verl 0.9.1 forms
   them over its data-parallel ranks (actor_mini_batches: the k-th mini-batch is the k-th block of every rank's
   contiguous chunk), at ratio 1 (the first epoch) and at the lr verl's scheduler applies at that step (actor_lr);
   for the other loss_agg_modes and shuffled mini-batches the predicted change is left out (not None-logged). Like
   TRL's, it is eq. 23 with SGD step sizes on the logits, not the change Adam's step makes. The filters still
   write no token samples.
8. A batch whose uid groups are not all rollout.n rows gets no token samples that step (a warning says why); the
   metrics and the training run go on.
9. TRE-K / TRE-P (tre_k, tre_k+clip_b) is verl's own entropy term with TRE's entropy in it: for the actor update
   only, EntropyFSDPEngine computes the packed forward's entropy as core/tre.top_entropy of the temperature-scaled
   logits, so verl's loss subtracts actor.entropy_coeff (TRE's coefficient: set it, 0.001 in its Countdown scripts)
   times its aggregate over the loss's tokens (the kept ones under a filter); the authors' verl fork computes it in
   its utils/torch_functional.entropy_from_logits(logits, top_k, top_p). The old-log-prob forward keeps the full
   entropy (S*, the metrics); verl's actor/entropy_loss then reports TRE's entropy. Refused at start-up with
   entropy_coeff 0, fused kernels, a non-FSDP engine or the padded forward (use_remove_padding=false), which
   computes its entropy elsewhere; a step whose workers are not EntropyFSDPEngine (no E_p[S] returned) stops,
   where verl's own engine would silently train with H's bonus.

What tests/test_verl.py drives for real on the CPU: the V1 trainer's `_step_once` (batch balancing, old-log-prob,
reference forward, values, advantage and filter, critic and actor updates) through TransferQueue on Ray, the
tqbridge of every worker call, ActorRolloutRefWorker, TrainingWorker, the FSDP engine (packed and padded, dynamic
and fixed micro-batches; the value-head engine for the critic), `ppo_loss` and `value_loss`, for Clip_B, Clip_V,
an S*-sign filter, PPO with GAE and rejection sampling, each optimizer step's gradient against the token mean
written directly. Stood in: the Ray dispatch (one rank, in-process), the rollout (a batch put as verl's agent loop
puts it), the replay buffer and rollout replicas, FSDP sharding (unwrapped module), the optimizer (records
gradients, never steps), verl's device helpers (CPU), the MFU counter, gloo's missing ReduceOp.AVG. With two
data-parallel ranks (gloo, two processes) only the choice of each optimizer step's rows and token count is run
(verl's dispatch chunking and per-rank iterator): the whole step is not. Not run: Megatron, fused kernels,
vLLM/SGLang, a GPU.
"""

from __future__ import annotations

import dataclasses
import warnings
from functools import partial
from pathlib import Path

import torch
from torch import Tensor
from torch.distributed.tensor import DTensor

from .. import samples
from ..config import TrainConfig
from ..core.advantages import broadcast_advantages
from ..core.dynamics import TokenStats, batch_covariance, token_stats
from ..core.losses import select_clip_cov, step_sizes
from ..core.methods import METHODS, NO_CAP
from ..core.tre import check_top, top_entropy
from ..logging import JsonlSink, write_engine_run
from ..train.diagnostics import float_mean, watch_metrics

try:
    import transfer_queue as tq
    import verl
    from tensordict import TensorDict
    from verl.trainer.ppo.v1.trainer_base import register_trainer
    from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
    from verl.utils import tensordict_utils as tu
    from verl.workers.engine.base import EngineRegistry
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead
    from verl.workers.utils.padding import response_from_nested, response_to_nested
except ImportError as err:  # the adapter is an optional extra
    raise ImportError(
        f"entropy_rft.integrations.verl needs verl 0.9 with its V1 trainer (TransferQueue): "
        f"pip install 'entropy-rft[verl]' ({err})"
    ) from err

TRAINER_NAME = "entropy_rft"  # trainer.v1.trainer_mode
ENGINE_VENDOR = "entropy_rft"  # VERL_ENGINE_VENDOR in the workers' environment
MONITOR = "none"  # entropy_rft.method: verl's loss unchanged, the statistics, metrics and token samples only
# Two names, never one: verl hands every later worker call every field stored in TransferQueue, so a stored tensor
# under the request's name would reach the actor update and the reference forward as the request.
WANT_S_EXPECT = "entropy_rft_want_s_expect"  # non-tensor request on the old-log-prob call: add E_p[S]
S_EXPECT = "entropy_rft_s_expect"  # the engine's output and its TransferQueue field (nested, full sequence)
KEEP = "entropy_rft_keep"  # the filter's keep mask, a TransferQueue field of its own (nested, response tokens)
TOP_K = "entropy_rft_tre_top_k"  # non-tensor request on the actor-update call: TRE-K's entropy for the bonus
TOP_P = "entropy_rft_tre_top_p"  # ... or TRE-P's
CLIP_COV = "clip_cov"
CLIP_COV_DEFAULTS = {"ratio": TrainConfig.clip_cov_ratio, "lb": TrainConfig.clip_cov_lb, "ub": TrainConfig.clip_cov_ub}
_ROW_ELEMENTS = 1 << 22  # logits elements per chunk of the E_p[S] computation


# ---------------------------------------------------------------------------------------------------------------
# The whole-batch step on the driver: pure functions of padded [B, T] tensors.


def driver_method(name: str) -> bool:
    """Whether a METHODS row runs in this adapter: a token filter, token weights (STARE) or an advantage rule
    (Entrocraft) on the driver, TRE's bonus in the actor update (EntropyFSDPEngine), or a composition of them; not
    rollout deletion (GRPODropout), which needs the built-in trainer's update."""
    spec = METHODS.get(name)
    acts = spec.filter is not None or spec.weigh is not None or spec.advantage_rule is not None or spec.top_entropy
    return acts and spec.rollout_rule is None


@dataclasses.dataclass(frozen=True)
class Settings:
    """The `entropy_rft` section of a verl config: method (a METHODS name with a token filter, token weights or an
    advantage rule: driver_method; clip_cov; or "none" to watch verl's own loss) and options (the method's keyword
    options, e.g. {mu: 2.5}; YAML null passes None, e.g. max_frac: null = no cap); samples_every and samples_groups
    as TrainConfig's (token samples of every samples_every-th step, 0 for none), written with metrics.jsonl to
    samples_dir (default: verl's experiment directory, trainer.default_local_dir)."""

    method: str = "clip_b"
    options: dict = dataclasses.field(default_factory=dict)
    seed: int = 0  # Clip-Cov's random selection
    samples_every: int = TrainConfig.samples_every
    samples_groups: int = TrainConfig.samples_groups
    samples_dir: str | None = None

    def __post_init__(self):
        if self.method == MONITOR:
            if self.options:
                raise ValueError(
                    f"entropy_rft.method={MONITOR} changes nothing in verl's loss, so it takes no "
                    f"options (got {dict(self.options)}); pick a filter (clip_b, clip_v, ...) to pass them"
                )
            return
        spec = METHODS.get(self.method)
        if spec.rollout_rule is not None:
            raise ValueError(
                f"entropy_rft.method={self.method!r} deletes whole rollouts, which this adapter does not run in "
                "verl: use the built-in trainer (GRPODropout also runs in TRL)"
            )
        if not driver_method(self.method) and self.method != CLIP_COV:
            methods = ", ".join(n for n in METHODS.names() if driver_method(n))
            raise ValueError(
                f"entropy_rft.method={self.method!r} is not a token filter, so it has no driver step in "
                f"verl; use one of {methods} or {CLIP_COV}, or {MONITOR} to watch verl's own loss (other "
                f"rows of METHODS are verl settings: docs/howto/verl.md)"
            )
        accepted = set(CLIP_COV_DEFAULTS) if self.method == CLIP_COV else set(spec.option_names())
        if set(self.options) - accepted:
            raise ValueError(f"{self.method} takes options {sorted(accepted)}, got {sorted(self.options)}")

    @property
    def monitor(self) -> bool:
        return self.method == MONITOR

    @property
    def rewrites_advantages(self) -> bool:
        """Whether the method has an advantage rule (Entrocraft), which reads the rollouts' rewards and the step."""
        return not self.monitor and self.method != CLIP_COV and METHODS.get(self.method).advantage_rule is not None

    @property
    def top_entropy(self) -> tuple[int | None, float | None] | None:
        """(K, p) of TRE's bonus entropy for a method with it (K 2 unless tre_top_k or tre_top_p is given, as
        TrainConfig.top_entropy), else None."""
        if self.monitor or self.method == CLIP_COV or not METHODS.get(self.method).top_entropy:
            return None
        k, p = self.options.get("tre_top_k"), self.options.get("tre_top_p")
        if k is not None and p is not None:
            raise ValueError("TRE takes one of tre_top_k (TRE-K) and tre_top_p (TRE-P), not both")
        top = (None, float(p)) if p is not None else (2 if k is None else int(k), None)
        check_top(*top)
        return top

    @property
    def needs_s_expect(self) -> bool:
        """E_p[S] from the engine: Clip_V's score, S_c for every metric of the monitor, and TRE's proof that the
        actor workers run EntropyFSDPEngine (verl's own engine would ignore the request for TRE's entropy and train
        with H's bonus)."""
        if self.monitor:
            return True
        return self.method != CLIP_COV and (
            METHODS.get(self.method).score == "s_centered" or METHODS.get(self.method).top_entropy
        )

    @classmethod
    def from_config(cls, config) -> Settings:
        section = config.get("entropy_rft", None)
        if section is None:
            raise ValueError(
                f"trainer.v1.trainer_mode={TRAINER_NAME} needs an `entropy_rft` section, e.g. "
                "+entropy_rft.method=clip_b +entropy_rft.options.mu=2.5 (or +entropy_rft.method=none "
                "to watch verl's own loss)"
            )
        section = dict(section)
        names = [f.name for f in dataclasses.fields(cls)]
        unknown = set(section) - set(names)
        if unknown:
            raise ValueError(f"unknown keys {sorted(unknown)} in entropy_rft; it takes {', '.join(names)}")
        return cls(options=dict(section.pop("options", None) or {}), **section)


def stats_from_engine(old_log_probs: Tensor, entropy: Tensor, s_expect: Tensor | None = None) -> TokenStats:
    """TokenStats from verl's recomputed old log-probs and entropies ([B, T]): S* = p_k (H + log p_k) (Theorem 1);
    E_p[S] from the engine when given, else zeros (then S_c is not available)."""
    logp, h = old_log_probs.float(), entropy.float()
    s_star = logp.exp() * (h + logp)
    return TokenStats(logp, h, s_star, torch.zeros_like(logp) if s_expect is None else s_expect.float())


@dataclasses.dataclass(frozen=True)
class RunPosition:
    """What an advantage rule (Entrocraft's) reads besides the batch: each rollout's score (its summed token-level
    reward, [B]), verl's 1-based global step and the run's total_training_steps (the band's schedule)."""

    scores: Tensor
    step: int
    total_steps: int


def whole_batch_step(
    settings: Settings,
    stats: TokenStats,
    advantages: Tensor,
    mask: Tensor,
    *,
    generator: torch.Generator | None = None,
    position: RunPosition | None = None,
) -> tuple[Tensor, Tensor, dict[str, float]]:
    """(keep [B, T] bool, advantages [B, T], metrics) for the whole batch: a token filter's keep mask (advantages
    unchanged), a method's token weights on the advantages (STARE: keep unchanged), an advantage rule's advantages
    (Entrocraft, at the batch's mean entropy and the run's `position`; a composed filter then reads them), or for
    Clip-Cov the mask unchanged and the selected tokens' advantages zeroed (departure 3)."""
    mask = mask.bool()
    adv = broadcast_advantages(advantages, mask).float()
    rule_metrics: dict = {}
    if settings.rewrites_advantages:
        adv, rule_metrics = advantage_rule(settings, stats, adv, mask, position)
    if settings.method == CLIP_COV:
        opts = {**CLIP_COV_DEFAULTS, **settings.options}
        selected = select_clip_cov(adv, stats.logp, mask, generator=generator, **opts)
        keep, adv = mask.clone(), torch.where(selected, torch.zeros_like(adv), adv)
        metrics = {"clip_cov_selected_frac": float_mean(selected, mask)}
    else:
        options = {k: NO_CAP if v is None else v for k, v in settings.options.items()}  # YAML null: pass None
        spec = METHODS.get(settings.method)
        keep, metrics = spec.apply(stats, adv, mask, **options)
        # STARE: its weight on each token's advantage (step.py, departure 3), ranked over the kept tokens (stare+clip_b)
        weights, weight_metrics = spec.weights(stats, adv, mask & keep, **options)
        if weights is not None:
            adv, metrics = adv * weights.to(adv.dtype), {**metrics, **weight_metrics}
    metrics = {
        **{k: float(v) for k, v in {**rule_metrics, **metrics}.items()},
        "s_star_mean": float_mean(stats.s_star, mask),
        "entropy": float_mean(stats.entropy, mask),
        "kept_frac": float_mean(keep & mask, mask),
    }
    if settings.needs_s_expect:
        metrics["s_centered_mean"] = float_mean(stats.s_centered, mask)
        metrics["cov_a_sc"] = float(batch_covariance(adv, stats.s_centered, mask))
    return keep & mask, adv, metrics


def advantage_rule(
    settings: Settings, stats: TokenStats, adv: Tensor, mask: Tensor, position: RunPosition | None
) -> tuple[Tensor, dict]:
    """The method's advantage rule on verl's token advantages ([B, T], GRPO's: one value per row), as the built-in
    trainer runs it (step.py, Step.decide): the batch's mean entropy over every valid token, each rollout's score,
    verl's 1-based step of total_training_steps. The rule is elementwise (Entrocraft: max(R, 0), min(R, 0) or the
    estimator's advantage), so the scores go in broadcast over each row's valid tokens."""
    if position is None:
        raise ValueError(f"{settings.method} rewrites advantages with the run's step and rewards: pass a RunPosition")
    options = {k: NO_CAP if v is None else v for k, v in settings.options.items()}
    scores = position.scores.float()[:, None].expand_as(adv)
    out, metrics = METHODS.get(settings.method).advantages(
        scores,
        adv,
        entropy=float_mean(stats.entropy, mask),
        step=position.step,
        total_steps=position.total_steps,
        **options,
    )
    return out * mask, metrics


def check_top_entropy_config(settings: Settings, config) -> None:
    """TRE's bonus is verl's entropy term with the engine's entropy replaced by TRE's (departure 9): it needs a
    non-zero actor.entropy_coeff and the packed, unfused FSDP forward that computes the entropy from the logits."""
    actor = config.actor_rollout_ref.actor
    if float(actor.get("entropy_coeff", 0.0)) == 0.0:
        raise ValueError(
            f"{settings.method} adds TRE's bonus through verl's entropy term, but "
            "actor_rollout_ref.actor.entropy_coeff is 0: set it to TRE's coefficient (0.001 in its Countdown scripts)"
        )
    if actor.get("strategy", "fsdp") not in ("fsdp", "fsdp2") or config.actor_rollout_ref.model.get(
        "use_fused_kernels", False
    ):
        raise ValueError(
            f"{settings.method} computes TRE's entropy from the logits, which only the unfused FSDP engine "
            "materialises: use actor.strategy=fsdp or fsdp2 with actor_rollout_ref.model.use_fused_kernels=false"
        )
    if not config.actor_rollout_ref.model.get("use_remove_padding", True):
        raise ValueError(
            f"{settings.method} replaces the entropy of verl's packed forward; the padded one "
            "(actor_rollout_ref.model.use_remove_padding=false) computes it elsewhere: set it to true"
        )


def check_config(settings: Settings, config) -> None:
    """Refuse, at start-up, configurations the method cannot run in (departure 2)."""
    corr = config.algorithm.get("rollout_correction", None)
    if corr is not None and corr.get("bypass_mode", False):
        raise ValueError(
            "entropy_rft needs verl's recomputed old log-probs and entropies, but "
            "algorithm.rollout_correction.bypass_mode=true skips that step: set it to false"
        )
    if settings.top_entropy is not None:
        check_top_entropy_config(settings, config)
    if not settings.needs_s_expect:
        return
    what = f"the monitor (entropy_rft.method={MONITOR}, for S_c)" if settings.monitor else settings.method
    strategy = config.actor_rollout_ref.actor.get("strategy", "fsdp")
    if strategy not in ("fsdp", "fsdp2"):
        raise ValueError(
            f"{what} needs E_p[S] from the full token distribution, which only the FSDP "
            f"engine computes here; actor strategy {strategy!r} (Megatron and the others) never "
            "materialises the logits: use actor.strategy=fsdp or fsdp2, or Clip_B"
        )
    if config.actor_rollout_ref.model.get("use_fused_kernels", False):
        raise ValueError(
            f"{what} needs E_p[S] from the logits, but actor_rollout_ref.model."
            "use_fused_kernels=true never materialises them: set it to false, or use Clip_B"
        )


# ---------------------------------------------------------------------------------------------------------------
# The trainer: verl's sync V1 trainer plus the whole-batch step.


@register_trainer(TRAINER_NAME)
class EntropyRFTTrainer(PPOTrainerSync):
    """verl's sync V1 trainer whose advantage step ends with entropy-rft's whole-batch filter (module docstring)."""

    # verl branches on `trainer_mode == "sync"` (replay buffer, refills, checkpoints): this trainer is the sync
    # trainer under another name, so it reads "sync" whatever trainer.v1.trainer_mode selected it (departure 4).
    @property
    def trainer_mode(self) -> str:
        return "sync"

    @trainer_mode.setter
    def trainer_mode(self, selected_by: str) -> None:
        self.selected_by = selected_by

    def __init__(self, config):
        self.entropy_rft = Settings.from_config(config)
        check_config(self.entropy_rft, config)
        self.entropy_rft_generator = torch.Generator().manual_seed(self.entropy_rft.seed)
        super().__init__(config)

    def _compute_old_log_prob(self, batch, metrics: dict):
        if self.entropy_rft.needs_s_expect:
            batch.extra_info[WANT_S_EXPECT] = True  # read by EntropyFSDPEngine on every worker
        out = batch
        try:
            out = super()._compute_old_log_prob(batch, metrics)
        finally:
            for meta in (batch, out):
                meta.extra_info.pop(WANT_S_EXPECT, None)  # not for the ref and update forwards
        return out

    def _compute_advantage(self, batch, metrics: dict):
        batch = super()._compute_advantage(batch, metrics)
        fields = ["loss_mask", "old_log_probs", "entropy", "advantages"]
        if self.entropy_rft.needs_s_expect:
            fields.append(S_EXPECT)
        if self.entropy_rft.monitor:  # verl's batch stays as verl made it
            data = tq.kv_batch_get(
                keys=batch.keys, partition_id=batch.partition_id, select_fields=[*fields, "response_mask"]
            )
            stats, valid, used, adv = monitor_inputs(data)
            step = verl_step_sizes(self.config, valid, used, int(self.global_steps))
            watched = watch_metrics(stats, adv, valid, used, step)
            metrics.update({f"entropy_rft/{k}": v for k, v in watched.items() if v is not None})
            self._entropy_rft_record(batch, stats, adv, valid, used, step, metrics)
            return batch
        reward = "token_level_rewards" if self.config.algorithm.get("use_kl_in_reward", False) else "rm_scores"
        rule = self.entropy_rft.rewrites_advantages
        if rule:  # Entrocraft: the rollouts' rewards (verl's, with the KL penalty where it applies one)
            fields.append(reward)
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=fields)
        position = None
        if rule:
            position = RunPosition(
                torch.stack([row.sum() for row in data[reward].unbind()]),
                int(self.global_steps),
                int(self.total_training_steps),
            )
            data = data.exclude(reward)
        output, step_metrics = filter_batch(
            self.entropy_rft, data, generator=self.entropy_rft_generator, position=position
        )
        metrics.update({f"entropy_rft/{k}": v for k, v in step_metrics.items()})
        return tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id, fields=output)

    def _update_actor(self, batch, metrics: dict):
        if self.entropy_rft.monitor:  # verl's own masks, untouched
            return super()._update_actor(batch, metrics)
        top = self.entropy_rft.top_entropy
        if top is not None:  # TRE: the update's forward returns TRE's entropy for verl's bonus (EntropyFSDPEngine)
            batch.extra_info[TOP_K if top[0] is not None else TOP_P] = top[0] if top[0] is not None else top[1]
        try:
            return self._update_actor_kept(batch, metrics)
        finally:
            batch.extra_info.pop(TOP_K, None)
            batch.extra_info.pop(TOP_P, None)

    def _update_actor_kept(self, batch, metrics: dict):
        # The keep mask reaches the actor's loss only: its masks lose the dropped tokens for this call, and the
        # masks every other reader sees (critic update, metrics) are put back afterwards (departure 5).
        fields = ["response_mask", "loss_mask", KEEP]
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=fields)
        tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id, fields=actor_masks(data))
        try:
            return super()._update_actor(batch, metrics)
        finally:
            tq.kv_batch_put(
                keys=batch.keys, partition_id=batch.partition_id, fields=data.select("response_mask", "loss_mask")
            )

    def _entropy_rft_record(self, batch, stats, adv, valid, used, step, metrics: dict) -> None:
        """SAMPLES_DIR/metrics.jsonl (a line per step: the entropy_rft metrics, as the built-in trainer names them)
        and, on the due steps, SAMPLES_DIR/samples/step-N.json.gz (departure 7)."""
        settings, done = self.entropy_rft, int(self.global_steps)
        run_dir = settings.samples_dir or self.config.trainer.default_local_dir
        if getattr(self, "entropy_rft_metrics", None) is None:
            Path(run_dir).mkdir(parents=True, exist_ok=True)
            samples.cut_after(run_dir, done - 1)  # a resumed run writes the later steps again
            self.entropy_rft_metrics = JsonlSink(Path(run_dir), {}, start_step=done - 1)
            actor = self.config.actor_rollout_ref.actor
            write_engine_run(
                run_dir,
                {
                    "source": "verl",
                    "verl_version": getattr(verl, "__version__", None),
                    "method": settings.method,
                    "loss_agg_mode": actor.loss_agg_mode,
                    "policy_loss": actor.get("policy_loss", {}).get("loss_mode"),
                    "rollout_n": int(self.config.actor_rollout_ref.rollout.n),
                    "lr": actor_lr(self.config),
                    "samples_every": settings.samples_every,
                },
            )
        ours = {k.removeprefix("entropy_rft/"): v for k, v in metrics.items() if k.startswith("entropy_rft/")}
        self.entropy_rft_metrics.log({"step": done, **ours})
        if not samples.due(done, settings.samples_every, getattr(self, "total_training_steps", None)):
            return
        data = tq.kv_batch_get(
            keys=batch.keys, partition_id=batch.partition_id, select_fields=["prompts", "responses", "uid", "rm_scores"]
        )
        n = int(self.config.actor_rollout_ref.rollout.n)
        try:
            regrouped = sample_batch(data, stats, adv, valid, used, step, tokenizer=self.tokenizer, group_size=n)
        except MalformedGroups as err:  # the samples are a diagnostic: the run goes on without them (departure 8)
            warnings.warn(f"entropy_rft: no token samples at step {done}: {err}", stacklevel=2)
            return
        info = {
            "source": "verl",
            "method": settings.method,
            "lr": actor_lr(self.config, done),
            "loss_agg": self.config.actor_rollout_ref.actor.loss_agg_mode,
        }
        samples.write_step(run_dir, done, regrouped, groups=settings.samples_groups, info=info)


def monitor_inputs(data: TensorDict) -> tuple[TokenStats, Tensor, Tensor, Tensor]:
    """(stats, valid, loss tokens, advantages), padded [B, T] in the batch's row order, from TransferQueue's fields:
    valid = loss_mask as the rollout wrote it (every response token: the statistics' population and the engine's
    denominator), loss tokens = that & response_mask (verl's rejection sampling removes tokens from the loss's
    terms only)."""
    if S_EXPECT not in data.keys():
        raise RuntimeError(
            f"entropy_rft.method={MONITOR} needs E_p[S] for S_c, but the actor workers did not return "
            f"{S_EXPECT!r}: start them with VERL_ENGINE_VENDOR={ENGINE_VENDOR} (e.g. "
            f"+ray_kwargs.ray_init.runtime_env.env_vars.VERL_ENGINE_VENDOR={ENGINE_VENDOR})"
        )
    nested_mask = data["loss_mask"]
    padded = data.exclude(S_EXPECT).to_padded_tensor()
    valid = padded["loss_mask"].bool()
    s_expect = torch.nested.to_padded_tensor(response_from_nested(data[S_EXPECT], nested_mask), 0.0)
    stats = stats_from_engine(padded["old_log_probs"], padded["entropy"], s_expect)
    return stats, valid, valid & padded["response_mask"].bool(), padded["advantages"].float()


def actor_lr(config, step: int | None = None) -> float:
    """The actor's lr at global step `step` (1-based) as verl 0.9.1's FSDP engine schedules it
    (FSDPEngine._build_lr_scheduler: constant or cosine with warmup, from actor.optim; the scheduler steps once
    after each step's last mini-batch, so step s runs at the schedule's value after s - 1 steps); the configured
    lr when step is None."""
    optim = config.actor_rollout_ref.actor.optim
    lr = float(optim.lr)
    if step is None:
        return lr
    from verl.utils.torch_functional import get_constant_schedule_with_warmup, get_cosine_schedule_with_warmup

    total = int(optim.get("total_training_steps", -1))
    warmup = int(optim.get("lr_warmup_steps", -1) or -1)
    if warmup <= 0:
        warmup = int(float(optim.get("lr_warmup_steps_ratio", 0.0)) * total)
    kind = optim.get("lr_scheduler_type", None) or optim.get("warmup_style", None) or "constant"
    probe = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=lr)  # the schedule's factor, no real optimizer
    if kind == "constant":
        schedule = get_constant_schedule_with_warmup(optimizer=probe, num_warmup_steps=warmup)
    elif kind == "cosine":
        schedule = get_cosine_schedule_with_warmup(
            optimizer=probe,
            num_warmup_steps=warmup,
            num_training_steps=total,
            min_lr_ratio=optim.get("min_lr_ratio", 0.0),
            num_cycles=optim.get("num_cycles", 0.5),
            zero_indexed_step=optim.get("zero_indexed_step", True),
        )
    else:
        raise ValueError(f"actor.optim.lr_scheduler_type={kind!r}: verl's FSDP engine has constant and cosine only")
    return lr * float(schedule.lr_lambdas[0](max(int(step) - 1, 0)))


def actor_dp_size(config) -> int:
    """Data-parallel ranks of verl's FSDP actor: its workers (trainer.nnodes x trainer.n_gpus_per_node) over the
    Ulysses sequence-parallel size (FSDPEngine.get_data_parallel_size)."""
    actor = config.actor_rollout_ref.actor
    world = int(config.trainer.nnodes) * int(config.trainer.n_gpus_per_node)
    sp = (
        actor.get("fsdp_config", {}).get("ulysses_sequence_parallel_size", None)
        or actor.get("ulysses_sequence_parallel_size", 1)
        or 1
    )
    return max(world // int(sp), 1)


def actor_mini_batches(rows: int, mini_batch_rows: int, dp_size: int) -> list[Tensor]:
    """The driver's row indices of each of the actor's mini-batches (one pass, shuffle off), as verl 0.9.1 forms
    them: update_actor's dispatch (make_nd_compute_dataproto_dispatch_fn) hands DP rank r the r-th of dp_size
    contiguous chunks of the batch, and each rank's train_mini_batch iterates its chunk in contiguous blocks of
    mini_batch_rows / dp_size rows (tensordict_utils.make_iterator); the k-th optimizer step is the k-th block of
    every rank. With one rank, contiguous blocks of the batch."""
    if rows % dp_size or mini_batch_rows % dp_size:
        raise ValueError(
            f"verl needs the batch ({rows} rows) and the mini-batch ({mini_batch_rows} rows) to divide "
            f"among {dp_size} data-parallel ranks"
        )
    chunk, per_rank = rows // dp_size, mini_batch_rows // dp_size
    if chunk % per_rank:
        raise ValueError(f"verl needs each rank's {chunk} rows to split into mini-batches of {per_rank} rows")
    return [
        torch.cat([torch.arange(r * chunk + k, r * chunk + k + per_rank) for r in range(dp_size)])
        for k in range(0, chunk, per_rank)
    ]


def verl_step_sizes(config, denominator: Tensor, used: Tensor, step: int | None = None) -> Tensor | None:
    """lr w_t of each token of one pass over the batch (losses.step_sizes), [B, T] float64, for verl's token-mean
    loss (actor.loss_agg_mode, verl's default and the paper's): the actor's mini-batches as verl forms them over
    its data-parallel ranks (actor_mini_batches, shuffle off), each dividing by its own `denominator` tokens
    (loss_mask, all-reduced over the data-parallel ranks in the engine), at the lr verl's scheduler applies at
    global step `step` (actor_lr). At ratio 1, the first epoch's step. None for the other aggregations, for sapo
    and geo_mean (verl aggregates those its own way, whatever loss_agg_mode says) and for
    shuffled mini-batches (not modelled here: departure 7)."""
    actor = config.actor_rollout_ref.actor
    own_aggregation = actor.get("policy_loss", {}).get("loss_mode", "vanilla") in ("sapo", "geo_mean")
    if actor.loss_agg_mode != "token-mean" or actor.get("shuffle", False) or own_aggregation:
        return None
    rows = int(actor.ppo_mini_batch_size) * int(config.actor_rollout_ref.rollout.n)
    lr = actor_lr(config, step)
    out = torch.zeros(used.shape, dtype=torch.float64)
    for block in actor_mini_batches(used.shape[0], min(rows, used.shape[0]), actor_dp_size(config)):
        tokens = max(float(denominator[block].sum()), 1.0)
        out[block] = (step_sizes(used[block], "token-mean", lr=lr, num_tokens=tokens) * used[block]).double()
    return out


class MalformedGroups(ValueError):
    """A batch whose uid groups are not all rollout.n rows (a rollout that lost or added rows)."""


def sample_batch(
    data: TensorDict, stats: TokenStats, adv: Tensor, valid: Tensor, keep: Tensor, step, *, tokenizer, group_size: int
) -> samples.SampleBatch:
    """The batch as samples.write_step takes it, its rows regrouped by uid (verl's batch balancing reorders rows; a
    group's rows keep their batch order), prompts left-padded, rewards the sum of rm_scores over the response; step:
    the step sizes (verl_step_sizes) or None."""
    uids = data["uid"].tolist()
    first = {}
    for u in uids:
        first.setdefault(u, len(first))
    order = sorted(range(len(uids)), key=lambda i: first[uids[i]])  # stable: batch order within a group
    counts = [uids.count(u) for u in first]
    if any(c != group_size for c in counts):
        raise MalformedGroups(
            f"token samples need groups of rollout.n={group_size} rows, got group sizes {sorted(set(counts))}"
        )
    idx = torch.tensor(order)
    prompts = [data["prompts"][i] for i in order]
    width = max(len(p) for p in prompts)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    prompt_ids = torch.stack([torch.cat([torch.full((width - len(p),), pad, dtype=p.dtype), p]) for p in prompts])
    prompt_mask = torch.arange(width)[None, :] >= torch.tensor([width - len(p) for p in prompts])[:, None]
    padded = data.select("responses", "rm_scores").to_padded_tensor()
    responses = padded["responses"][idx]
    mask = valid[idx]
    lengths = mask.sum(-1)
    last = responses.gather(1, (lengths - 1).clamp_min(0)[:, None]).squeeze(1)
    return samples.SampleBatch(
        prompt_ids,
        prompt_mask,
        responses,
        mask,
        (lengths > 0) & (last == tokenizer.eos_token_id),
        tokenizer,
        TokenStats(*(t[idx] for t in (stats.logp, stats.entropy, stats.s_star, stats.s_expect))),
        adv[idx],
        keep[idx],
        (padded["rm_scores"][idx].float() * mask).sum(-1),
        group_size,
        None if step is None else step[idx],
    )


def filter_batch(
    settings: Settings, data: TensorDict, *, generator=None, position: RunPosition | None = None
) -> tuple[TensorDict, dict[str, float]]:
    """The driver's step on the TransferQueue fields of the whole batch (nested [B, response_len] each): the keep
    mask (KEEP) and the advantages, as nested tensors to write back, and the metrics.

    The population is every valid response token, `loss_mask` (as the rollout wrote it: verl's rejection sampling
    rewrites only `response_mask`), with verl's advantages (0 on the tokens rejection sampling dropped)."""
    if settings.needs_s_expect and S_EXPECT not in data.keys():
        why = "TRE's entropy in the update" if settings.top_entropy else "E_p[S]"
        raise RuntimeError(
            f"{settings.method} needs entropy-rft's engine on the actor workers (for {why}), but they did not "
            f"return {S_EXPECT!r}: "
            f"start them with VERL_ENGINE_VENDOR={ENGINE_VENDOR} (e.g. "
            f"+ray_kwargs.ray_init.runtime_env.env_vars.VERL_ENGINE_VENDOR={ENGINE_VENDOR})"
        )
    nested_mask = data["loss_mask"]
    padded = data.exclude(S_EXPECT).to_padded_tensor()
    valid = padded["loss_mask"].bool()  # (B, T)
    s_expect = None
    if S_EXPECT in data.keys():  # the engine's full-sequence output, cut to the response as verl cuts entropies
        s_expect = torch.nested.to_padded_tensor(response_from_nested(data[S_EXPECT], nested_mask), 0.0)
    stats = stats_from_engine(padded["old_log_probs"], padded["entropy"], s_expect)
    keep, adv, metrics = whole_batch_step(
        settings, stats, padded["advantages"], valid, generator=generator, position=position
    )
    out = {
        KEEP: response_to_nested(keep.to(padded["loss_mask"].dtype), nested_mask),
        "advantages": response_to_nested(adv.to(padded["advantages"].dtype), nested_mask),
    }
    return TensorDict(out, batch_size=len(nested_mask)), metrics


def actor_masks(data: TensorDict) -> TensorDict:
    """The masks the actor's loss reads, from TransferQueue's response_mask, loss_mask and KEEP: response_mask (the
    loss's terms; after verl's rejection sampling, if on) and loss_mask (the engine's token-mean denominator), each
    times keep, so exactly the tokens the filter dropped leave both."""
    template = data["loss_mask"]
    padded = data.to_padded_tensor()
    keep = padded[KEEP].bool()
    return TensorDict(
        {
            key: response_to_nested(padded[key] * keep.to(padded[key].dtype), template)
            for key in ("response_mask", "loss_mask")
        },
        batch_size=len(template),
    )


# ---------------------------------------------------------------------------------------------------------------
# The engine: verl's FSDP language-model engine plus E_p[S] for Clip_V.


def s_expect_of_logits(logits: Tensor, temperature: Tensor) -> Tensor:
    """E_{i~p}[S_i] of each row of logits [N, V] at per-row temperatures [N] (Theorem 2), float32 [N], computed by
    token_stats one chunk of rows at a time (no [N, V] copy for the temperature). Each chunk is divided by the
    temperature as verl 0.9.1's engine divides the logits its log p and H come from (_scale_logits_by_temperature:
    in the logits' dtype, the temperature clamped at 1e-8), elementwise the same quotients: under bf16 mixed
    precision, a float32 quotient would put E_p[S] under another distribution than S*'s (departure 1)."""
    rows = max(1, _ROW_ELEMENTS // max(logits.shape[-1], 1))
    zeros = torch.zeros(logits.shape[0], dtype=torch.long, device=logits.device)  # E_p[S] does not read the token
    t = temperature.clamp(min=1e-8).to(logits.dtype)
    parts = [
        token_stats(logits[i : i + rows] / t[i : i + rows, None], zeros[i : i + rows]).s_expect
        for i in range(0, logits.shape[0], rows)
    ]
    return torch.cat(parts) if parts else logits.new_zeros(0, dtype=torch.float32)


def _tre_entropy(logits: Tensor, chunk_size: int | None = None, *, top_k=None, top_p=None) -> Tensor:
    """verl's compute_entropy_from_logits signature (rows of logits already divided by the temperature), TRE's
    entropy (core/tre.top_entropy: differentiable, float32); chunk_size is verl's memory knob, unused here."""
    return top_entropy(logits, top_k=top_k, top_p=top_p)


@EngineRegistry.register(
    model_type="language_model", backend=["fsdp", "fsdp2"], device=["cuda", "npu"], vendor=ENGINE_VENDOR
)
class EntropyFSDPEngine(FSDPEngineWithLMHead):
    """verl's FSDP language-model engine; when a forward is asked for E_p[S] (WANT_S_EXPECT, the trainer's
    old-log-prob step for Clip_V) it also returns it as S_EXPECT, laid out as verl's entropy output (nested, full
    sequence). Other forwards see the stored S_EXPECT field among their inputs and ignore it. When the actor update
    asks for TRE's entropy (TOP_K or TOP_P), its packed forward computes that instead of H (departure 9)."""

    def prepare_model_outputs(self, output, output_args, micro_batch, logits_processor_func):
        wanted = tu.get_non_tensor_data(data=micro_batch, key=WANT_S_EXPECT, default=False) is True
        s_expect = self._s_expect(output, output_args, micro_batch) if wanted else None  # before verl reuses logits
        top_k = tu.get_non_tensor_data(data=micro_batch, key=TOP_K, default=None)
        top_p = tu.get_non_tensor_data(data=micro_batch, key=TOP_P, default=None)
        if top_k is None and top_p is None:
            model_output = super().prepare_model_outputs(output, output_args, micro_batch, logits_processor_func)
        else:  # TRE: the packed forward's entropy (verl's bonus term) is TRE's top-K / top-p entropy (departure 9)
            verls = self.compute_entropy_from_logits
            self.compute_entropy_from_logits = partial(_tre_entropy, top_k=top_k, top_p=top_p)
            try:
                model_output = super().prepare_model_outputs(output, output_args, micro_batch, logits_processor_func)
            finally:
                self.compute_entropy_from_logits = verls
        if s_expect is not None:
            model_output[S_EXPECT] = s_expect
        return model_output

    @torch.no_grad()
    def _s_expect(self, output, output_args, micro_batch) -> Tensor:
        if tu.get_non_tensor_data(data=micro_batch, key="use_fused_kernels", default=False):
            raise ValueError(
                "Clip_V needs E_p[S] from the logits, but use_fused_kernels=true never materialises "
                "them: set actor_rollout_ref.model.use_fused_kernels=false, or use Clip_B"
            )
        logits = output.logits
        if isinstance(logits, DTensor):  # tensor parallel: sharded over the vocabulary
            logits = logits.full_tensor()
        offsets = micro_batch["input_ids"].offsets()
        if tu.get_non_tensor_data(data=micro_batch, key="use_remove_padding", default=True):  # packed (1, nnz, V)
            s = s_expect_of_logits(logits.squeeze(0), output_args["temperature_rmpad"])
            s = self._gather_and_unpad_packed(s, output_args["pad_size"])
        else:  # padded (B, L, V): keep each row's first len_b positions
            lengths = offsets.diff()
            temperature = output_args["temperature"].unsqueeze(1).expand(logits.shape[:2])
            s = s_expect_of_logits(logits.flatten(0, 1), temperature.flatten()).view(logits.shape[:2])
            s = torch.cat([s[b, : int(n)] for b, n in enumerate(lengths)])
        return torch.nested.nested_tensor_from_jagged(s, offsets)


__all__ = [
    "EntropyRFTTrainer",
    "EntropyFSDPEngine",
    "Settings",
    "filter_batch",
    "monitor_inputs",
    "verl_step_sizes",
    "sample_batch",
    "MONITOR",
    "actor_masks",
    "whole_batch_step",
    "RunPosition",
    "stats_from_engine",
    "s_expect_of_logits",
    "check_config",
    "TRAINER_NAME",
    "ENGINE_VENDOR",
    "WANT_S_EXPECT",
    "S_EXPECT",
    "KEEP",
    "TOP_K",
    "TOP_P",
]
