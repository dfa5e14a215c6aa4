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

from ..advantages import broadcast_advantages
from ..dynamics import TokenStats, batch_covariance
from ..methods import METHODS
from ..rollout.hf import Rollout
from ..trainer import batch_stats, masked_mean

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
    methods.NO_CAP passes None itself ({"max_frac": NO_CAP}: Clip_V clips every violator)."""

    def __init__(self, *args, method: str = "clip_b", method_options: dict | None = None, **kwargs):
        spec = METHODS.get(method)
        if spec.filter is None:
            hint = TRL_EQUIVALENTS.get(method, "no TRL equivalent here")
            raise ValueError(f"method {method!r} is not a token filter, so EntropyGRPOTrainer has nothing to add: "
                             f"use {hint}. Filters: {', '.join(n for n in METHODS.names() if METHODS.get(n).filter)}")
        self.entropy_method = spec
        self.method_options = dict(method_options or {})
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
        return out

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
