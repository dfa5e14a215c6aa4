"""entropy-rft's token filters inside TRL's GRPOTrainer (`pip install "entropy-rft[trl]"`), so Clip_B, Clip_V and
the S*-sign updates run wherever TRL runs (accelerate, DeepSpeed, several GPUs, TRL's vLLM rollouts).

    from entropy_rft.integrations.trl import EntropyGRPOTrainer
    trainer = EntropyGRPOTrainer(model=..., reward_funcs=..., args=GRPOConfig(...), train_dataset=...,
                                 method="clip_b")          # or "clip_v", "s_sign:mask:pos_s:neg_samples", ...
    trainer.train()

After TRL generates and scores a batch, the trainer computes the token statistics (S*, S_c, H) of the whole
generation batch under the current policy, gathers them from every process, lets the method choose the tokens to
keep over that whole batch (Clip_B's mean and std are batch statistics: never per micro-batch or per process), and
the loss then ignores the dropped tokens, in its terms and in its token count, as in the authors' code. Each
logging step adds `entropy_rft/*` metrics: the filter's own (clip fractions), the means of S* and S_c,
Cov_B(A, S_c) and entropy, over the generation batch.

Departures from the built-in trainer, numbered:
1. The dropped tokens ride on TRL's `tool_mask`, a loss-only mask; the forward pass still attends to them.
2. The statistics come from one extra forward pass per generation batch (no grad), at TRL's temperature and with
   entropy-rft's position ids (from the left padding); TRL's own log-probs are left as TRL computes them.
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
"""

from __future__ import annotations

import torch

from .. import samples
from ..advantages import broadcast_advantages
from ..config import TrainConfig
from ..dynamics import TokenStats, batch_covariance
from ..losses import step_sizes
from ..methods import METHODS
from ..rollout.hf import Rollout
from ..diagnostics import masked_mean
from ..forward import batch_stats

try:
    from trl import GRPOTrainer
except ImportError as err:  # the adapter is an optional extra
    raise ImportError("entropy_rft.integrations.trl needs TRL: pip install 'entropy-rft[trl]'") from err

TRL_EQUIVALENTS = {
    "grpo": "plain GRPOTrainer",
    "dapo": "GRPOConfig(loss_type='dapo', epsilon_high=0.28)",
    "dr_grpo": "GRPOConfig(loss_type='dr_grpo', scale_rewards='none')",
    "gspo": "GRPOConfig(importance_sampling_level='sequence', epsilon=3e-4, epsilon_high=4e-4)",
    "forking": "GRPOConfig(top_entropy_quantile=0.2)",
    "entropy_bonus": "GRPOConfig's entropy bonus options",
}


def rollout_of(out: dict) -> Rollout:
    """A generation batch of GRPOTrainer (prompt/completion ids and masks) as entropy-rft's Rollout."""
    b = out["completion_ids"].shape[0]
    return Rollout(out["prompt_ids"], out["prompt_mask"].bool(), out["completion_ids"], out["completion_mask"].bool(),
                   torch.ones(b, dtype=torch.bool), [""] * b)


class EntropyGRPOTrainer(GRPOTrainer):
    """GRPOTrainer whose loss keeps only the tokens an entropy-rft method keeps (module docstring).

    method: a name in METHODS with a token filter (clip_b, clip_v, s_sign:...); method_options override the
    filter's defaults (e.g. {"mu": 1.5} or {"mu": 8.5, "max_frac": 1e-4}); None values are ignored, and
    methods.NO_CAP passes None itself ({"max_frac": NO_CAP}: Clip_V clips every violator).

    samples_every, samples_groups: token-level samples of the generation batch, in the built-in trainer's format
    and with its defaults (TrainConfig), written to OUTPUT_DIR/samples (entropy_rft/samples.py; `entropy-rft
    inspect OUTPUT_DIR` shows them). A file is named by the first optimizer step its generation batch feeds."""

    def __init__(self, *args, method: str = "clip_b", method_options: dict | None = None,
                 samples_every: int = TrainConfig.samples_every, samples_groups: int = TrainConfig.samples_groups,
                 **kwargs):
        spec = METHODS.get(method)
        if spec.filter is None:
            hint = TRL_EQUIVALENTS.get(method, "no TRL equivalent here")
            raise ValueError(f"method {method!r} is not a token filter, so EntropyGRPOTrainer has nothing to add: "
                             f"use {hint}. Filters: {', '.join(n for n in METHODS.names() if METHODS.get(n).filter)}")
        self.entropy_method = spec
        self.method_options = dict(method_options or {})
        self.samples_every, self.samples_groups = samples_every, samples_groups
        self._samples_cut = False
        super().__init__(*args, **kwargs)

    def _generate_and_score_completions(self, inputs):
        out = super()._generate_and_score_completions(inputs)
        if not self.model.training:
            return out
        loss_mask = out["completion_mask"].bool()
        if "tool_mask" in out:
            loss_mask = loss_mask & out["tool_mask"].bool()
        stats = self._token_stats(out)
        keep, metrics = self._whole_batch_filter(stats, out["advantages"], loss_mask)
        base = out["tool_mask"] if "tool_mask" in out else torch.ones_like(out["completion_mask"])
        out["tool_mask"] = base * keep.to(base.dtype)
        if "num_items_in_batch" in out:  # departure 3
            out["num_items_in_batch"] = self.accelerator.gather((loss_mask & keep).sum()).sum()
        for name, value in metrics.items():
            self._metrics["train"][f"entropy_rft/{name}"].append(value)
        self._write_samples(out)
        return out

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
        if self.samples_every <= 0:
            return
        if not self._samples_cut and acc.is_main_process:
            samples.cut_after(run_dir, done)
        self._samples_cut = True
        span = max(1, self.args.steps_per_generation * self.num_iterations // self.args.gradient_accumulation_steps)
        if not any(samples.due(s, self.samples_every, self.state.max_steps) for s in range(done + 1, done + span + 1)):
            return
        every, adv, mask, keep = self._filtered
        tokenizer = getattr(self.processing_class, "tokenizer", self.processing_class)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        prompt_ids, prompt_mask = (acc.gather(acc.pad_across_processes(out[k], dim=1, pad_index=pad if k == "prompt_ids"
                                                                       else 0, pad_first=True))
                                   for k in ("prompt_ids", "prompt_mask"))
        completion_ids = acc.gather(acc.pad_across_processes(out["completion_ids"], dim=1, pad_index=pad))
        if not acc.is_main_process:
            return
        lengths = mask.sum(-1)
        last = completion_ids.gather(1, (lengths - 1).clamp_min(0)[:, None]).squeeze(1)
        finished = (lengths > 0) & (last == tokenizer.eos_token_id)
        lr = self.lr_scheduler.get_last_lr()[0] if self.lr_scheduler is not None else self.args.learning_rate
        record = samples.build_record(
            step=done + 1, prompt_ids=prompt_ids, prompt_mask=prompt_mask.bool(), response_ids=completion_ids,
            response_mask=mask, finished=finished, tokenizer=tokenizer, stats=every, advantages=adv, keep=keep,
            rewards=self._batch_rewards, group_size=self.num_generations, groups=self.samples_groups,
            step_size=self._step_size(lr, mask & keep),
            info={"source": "trl", "method": self.entropy_method.name, "loss_type": self.loss_type, "lr": lr,
                  "steps": [done + 1, done + span]})
        samples.write_record(run_dir, record)

    def _step_size(self, lr: float, kept: torch.Tensor):
        """lr times each token's weight in TRL's loss over the generation batch (global rows), by the shared rule
        (losses.step_sizes) for the aggregation each loss_type is: dapo the token mean over the kept tokens
        of the generation batch, rescaled per optimizer step; grpo each row's token mean, then the mean over rows;
        dr_grpo each row's sum over the constant rows x max_completion_length. At ratio 1 (the step's first
        optimizer step) a sequence-level importance ratio (GSPO) puts the same factor 1 on every token. None where the
        weight depends on how TRL splits the batch (bnpo) or the loss is not the clipped surrogate (the others)."""
        args, world = self.args, self.accelerator.num_processes
        rows = args.per_device_train_batch_size * args.gradient_accumulation_steps * world  # rows per optimizer step
        if self.loss_type == "dapo":  # TRL's token count spans the generation batch, rescaled per optimizer step
            tokens = args.gradient_accumulation_steps * max(float(kept.sum()), 1.0) / args.steps_per_generation
            return step_sizes(kept, "token-mean", lr=lr, num_tokens=tokens)
        if self.loss_type == "grpo":
            return step_sizes(kept, "seq-mean-token-mean", lr=lr, num_seqs=rows)
        if self.loss_type == "dr_grpo":
            return step_sizes(kept, "seq-mean-token-sum-norm", lr=lr, num_seqs=rows, norm=self.max_completion_length)
        return None

    @torch.no_grad()
    def _token_stats(self, out) -> TokenStats:
        """TokenStats of the completion tokens under the current policy, (B, T) each, on the CPU (departure 2)."""
        was_training = self.model.training
        self.model.eval()  # no dropout in the statistics
        try:
            return batch_stats(self.model, rollout_of(out), self.temperature, self.args.per_device_train_batch_size)
        finally:
            self.model.train(was_training)

    def _whole_batch_filter(self, stats: TokenStats, advantages, loss_mask):
        """(keep, metrics): the method's bool keep mask for this process's rows, chosen over every process's
        generation batch, and the batch's metrics."""
        device = loss_mask.device
        local = [stats.logp, stats.entropy, stats.s_star, stats.s_expect, loss_mask.float().cpu()]
        width = loss_mask.shape[1]
        # pad every process to the same width, then gather rows: [world * B, T]
        padded = [self.accelerator.pad_across_processes(t.to(device), dim=1) for t in local]
        logp, entropy, s_star, s_expect, mask = (self.accelerator.gather(t).float() for t in padded)
        adv = self.accelerator.gather(advantages.float())
        mask = mask.bool()
        every = TokenStats(logp, entropy, s_star, s_expect)
        keep, metrics = self.entropy_method.apply(every, adv, mask, **self.method_options)
        self._filtered = (every, adv, mask, keep)  # the whole batch, for the samples
        rows = slice(self.accelerator.process_index * loss_mask.shape[0],
                     (self.accelerator.process_index + 1) * loss_mask.shape[0])
        metrics = {
            **{k: float(v) for k, v in metrics.items()},
            "s_star_mean": masked_mean(every.s_star, mask),
            "s_centered_mean": masked_mean(every.s_centered, mask),
            "entropy": masked_mean(every.entropy, mask),  # the policy's, over every valid completion token
            "entropy_kept": masked_mean(every.entropy, keep & mask),  # over the tokens the filter keeps
            "cov_a_sc": float(batch_covariance(broadcast_advantages(adv, s_star), every.s_centered, mask)),
            "kept_frac": masked_mean(keep & mask, mask),
        }
        return keep[rows, :width].to(device), metrics
