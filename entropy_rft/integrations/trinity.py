"""entropy-rft's token filters inside Trinity-RFT 0.6.0 (`pip install "entropy-rft[trinity]"`), loaded by dotted
path through Trinity's own registries: no plugin directory, no fork.

    algorithm:
      algorithm_type: grpo_verl            # the advantage is computed in the trainer, on the whole batch
      bypass_old_logprobs: false           # recompute log-probs and entropies (0.6.0's default skips them)
      advantage_fn: entropy_rft.integrations.trinity.EntropyAdvantageFn
      advantage_fn_args: {method: clip_b, mu: 2.5}   # or {method: clip_v, mu: 8.5, max_frac: 1.0e-4}
      policy_loss_fn: entropy_rft.integrations.trinity.GlobalTokenMeanPPO

EntropyAdvantageFn runs a Trinity advantage function (`base`, GRPO by default) on the trainer's batch, computes
S* (and, for Clip_V, S_c = S* - E_p[S]) from the batch's log-probs and entropies, lets an entropy-rft method
(METHODS: clip_b, clip_v, the s_sign filters of Figure 1, ...) choose the tokens to keep over the WHOLE batch, and
writes `response_mask * keep` back, so the dropped tokens leave the loss and, through `loss_mask` (Trinity copies
it from `response_mask`), the engine's token count.

E_p[S] for Clip_V: no Trinity or verl release computes it. Importing this module installs three wrappers:
- in the trainer process (which imports it when it resolves advantage_fn), VERLTrainer._compute_old_log_prob asks
  the workers for E_p[S] when EntropyAdvantageFn's method needs it (a flag on that request only, named apart from
  any stored field: Trinity hands every later worker call every field of the batch) and stores it as `necs` (the
  authors' key); VERLTrainer._update_critic gives the critic the response tokens before the filter (departure 4);
- in the worker processes (which import it when they resolve policy_loss_fn, hence Clip_V needs
  GlobalTokenMeanPPO or another policy loss from this module), verl's FSDPEngineWithLMHead.prepare_model_outputs
  adds E_p[S] from the logits it already holds (token_stats, after verl's temperature division).

Departures, numbered, from Trinity 0.6.0 and the authors' ClipB/ClipVAdvantageFn:
1. The statistics read `old_log_probs` (recomputed with the entropies, under the same policy) by default; the
   authors' clipb reads `rollout_log_probs` (vLLM's) next to the trainer's entropies. log_prob_key selects either.
2. Trinity's PPO loss takes the token mean per micro-batch and verl 0.8's engine sums the micro-batch losses: the
   gradient grows with the number of micro-batches (x5.2 with 4 on the batch of tests/test_trinity.py).
   GlobalTokenMeanPPO divides by the mini-batch's kept-token count over all data-parallel ranks (the engine's
   `batch_num_tokens`), so its gradient is the whole mini-batch token mean whatever the micro-batch size. Its
   aggregation is always token-mean (another loss_agg_mode is refused); Trinity's entropy and KL loss terms are still
   per micro-batch (the paper's settings use neither: entropy_loss_fn none, kl_coef 0).
3. E_p[S] needs the logits: fused kernels, Ulysses sequence parallelism and the Megatron engine are refused with
   an error naming the setting.
4. The filter applies to the actor's loss only. With a critic (algorithm_type ppo, base ppo: GAE, Table 4) the
   critic learns on every valid response token, as the built-in trainer's critic does: the advantage function keeps
   the response_mask it was given as `entropy_rft_valid`, and the critic's update reads that. Trinity's data
   metrics after the step (response lengths) read the filtered response_mask, as with the authors' clipb.
   Trinity 0.6.0 has no rollout correction in its trainer (a TODO there), so nothing else rewrites the mask.

What tests/test_trinity.py drives for real, on the CPU: Trinity's registries; the authors' clipb / clipv on the
same DataProto batches (their fixtures); VERLTrainer.train_step itself (to_data_proto from Experiences, batch
balancing, the old-log-prob recompute with these wrappers, the reference forward, values, the advantage step with
the filter, the critic update, the actor update, the metrics) on verl 0.8's TrinityActorRolloutRefWorker /
TrinityCriticWorker, TrainingWorker and FSDP engine code path with the shipped tiny Qwen2, TrinityPolicyLoss with
GlobalTokenMeanPPO or Trinity's ppo loss, and verl's value_loss, for Clip_B, Clip_V, an S*-sign filter and PPO
with GAE: each optimizer step's gradient against the token mean written directly. Stood in: the Ray worker groups
(one rank, called in-process), the explorer (a list of Experiences), FSDP's sharding (the unwrapped module), the
optimizer (it records gradients and never steps), verl's device helpers (pointed at the CPU), flash-attn's
unpadding helpers (verl's pure-PyTorch port), the MFU counter, the offload moves and gloo's missing ReduceOp.AVG.
Not run: several ranks, Megatron, fused kernels, vLLM rollouts, the explorer/trainer processes, a GPU.
"""

from __future__ import annotations

import torch

from ..core.advantages import broadcast_advantages
from ..core.dynamics import TokenStats, batch_covariance, token_stats
from ..core.losses import Aggregation, masked_mean, ppo_clip_loss
from ..core.methods import METHODS, NO_CAP

try:
    from tensordict import TensorDict
    from trinity.algorithm.advantage_fn import ADVANTAGE_FN, AdvantageFn
    from trinity.algorithm.policy_loss_fn.policy_loss_fn import PolicyLossFn
    from trinity.trainer.verl.trainer import VERLTrainer
    from verl.utils import tensordict_utils as tu
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead
    from verl.workers.utils.padding import no_padding_2_padding
except ImportError as err:  # the adapter is an optional extra
    raise ImportError(
        "entropy_rft.integrations.trinity needs Trinity-RFT 0.6: pip install 'entropy-rft[trinity]'"
    ) from err

S_EXPECT_KEY = "necs"  # E_p[S] in the trainer's batch, the authors' name for it
VALID_KEY = "entropy_rft_valid"  # the response tokens before the filter, which the critic learns on
# A name no stored field has: Trinity hands every later worker call every field of the batch.
_REQUEST = "entropy_rft_want_s_expect"  # non-tensor flag on the log-prob request that asks the engine for E_p[S]
_BYPASS_HINT = (
    "set `algorithm.bypass_old_logprobs: false` in the Trinity config (Trinity 0.6.0 defaults to true, "
    "which skips the recompute that produces `entropys`)"
)


def _filters() -> str:
    return ", ".join(n for n in METHODS.names() if METHODS.get(n).filter is not None)


def batch_token_stats(batch: dict, *, log_prob_key: str, need_s_expect: bool) -> TokenStats:
    """TokenStats [B, T] from a trainer batch: log p (log_prob_key), H (`entropys`), S* = p (H + log p) and, when
    needed, E_p[S] (`necs`); float32, with the authors' formulas."""
    if "entropys" not in batch.keys():
        raise ValueError(f"the batch has no `entropys`, which the entropy filters read: {_BYPASS_HINT}.")
    if log_prob_key not in batch.keys():
        raise ValueError(f"the batch has no {log_prob_key!r} (log_prob_key); it has {sorted(batch.keys())}")
    logp = batch[log_prob_key].float()
    entropy = batch["entropys"].float()
    s_star = logp.exp() * (entropy + logp)
    if need_s_expect and S_EXPECT_KEY not in batch.keys():
        raise ValueError(
            f"the batch has no E_p[S] (`{S_EXPECT_KEY}`), which Clip_V reads: set `algorithm.policy_loss_fn: "
            "entropy_rft.integrations.trinity.GlobalTokenMeanPPO` so the workers load the engine hook, keep "
            f"algorithm.bypass_old_logprobs false, and use the FSDP engine without fused kernels"
        )
    s_expect = batch[S_EXPECT_KEY].float() if need_s_expect else torch.zeros_like(s_star)
    return TokenStats(logp, entropy, s_star, s_expect)


def write_back(batch, keep: torch.Tensor) -> None:
    """Drop the tokens not kept: response_mask (and loss_mask, if present) times keep, in their own dtype."""
    for key in ("response_mask", "loss_mask"):
        if key in batch.keys():
            batch[key] = batch[key] * keep.to(batch[key].dtype)


class EntropyAdvantageFn(AdvantageFn):
    """Trinity's `base` advantage, then an entropy-rft token filter over the whole trainer batch (module docstring).

    method: a METHODS name with a token filter; base / base_args: a Trinity ADVANTAGE_FN computed in the trainer
    (default grpo_verl, GRPO on DataProto); log_prob_key: departure 1; options: the filter's keyword options
    (e.g. mu, max_frac, mu_plus, side), defaults from METHODS. max_frac: null clips every Clip_V violator."""

    def __init__(
        self,
        method: str = "clip_b",
        base: str = "grpo_verl",
        base_args: dict | None = None,
        log_prob_key: str = "old_log_probs",
        **options,
    ) -> None:
        spec = METHODS.get(method)
        if spec.filter is None:
            raise ValueError(
                f"method {method!r} is not a token filter, so it has no Trinity advantage function; "
                f"filters: {_filters()}"
            )
        if spec.weigh is not None or spec.rollout_rule or spec.advantage_rule or spec.top_entropy:
            raise ValueError(
                f"method {method!r} composes a filter with token weights, a rollout or advantage rule or TRE's "
                "bonus, which Trinity's advantage function does not run: use its filter alone or the built-in trainer"
            )
        accepted = set(spec.option_names())
        unknown = sorted(set(options) - accepted)
        if unknown:
            raise ValueError(f"{method} takes no option {unknown}; its options: {sorted(accepted)}")
        base_cls = ADVANTAGE_FN.get(base)
        if not base_cls.compute_in_trainer():
            raise ValueError(
                f"base advantage {base!r} runs in the explorer on experiences, not in the trainer on the "
                "whole batch; use one computed in the trainer, e.g. grpo_verl, ppo, reinforceplusplus"
            )
        self.base = base_cls(**(base_args or {}))
        self.method = spec
        self.options = {**spec.options, **options}
        # for Method.apply: a None given here reaches the filter as None (max_frac: null), not as "the default"
        self.given = {k: NO_CAP if v is None else v for k, v in options.items()}
        self.log_prob_key = log_prob_key

    @property
    def needs_s_expect(self) -> bool:
        return self.method.score in ("s_centered", "s_expect")

    def __call__(self, exps, **kwargs):
        exps, base_metrics = self.base(exps, **kwargs)
        batch = exps.batch
        stats = batch_token_stats(batch, log_prob_key=self.log_prob_key, need_s_expect=self.needs_s_expect)
        mask = batch["response_mask"].bool()  # (B, T)
        adv = batch["advantages"].float()  # (B, T)
        # the method's filter (reading S*, S_c, or several statistics: RSI-S), with its entropy_gate where given
        keep, metrics = self.method.apply(stats, adv, mask, **self.given)
        batch[VALID_KEY] = batch["response_mask"].clone()  # for the critic's update (departure 4)
        write_back(batch, keep)
        metrics = {**base_metrics, **{f"entropy_rft/{k}": float(v) for k, v in metrics.items()}}
        metrics.update(
            {
                "entropy_rft/kept_frac": float(masked_mean((keep & mask).float(), mask)),
                "entropy_rft/s_star_mean": float(masked_mean(stats.s_star, mask)),
                "entropy_rft/entropy": float(masked_mean(stats.entropy, mask)),
            }
        )
        if self.needs_s_expect:
            metrics["entropy_rft/s_centered_mean"] = float(masked_mean(stats.s_centered, mask))
            cov = batch_covariance(broadcast_advantages(adv, mask), stats.s_centered, mask)  # Corollary 4
            metrics["entropy_rft/cov_a_sc"] = float(cov)
        return exps, metrics

    @classmethod
    def default_args(cls) -> dict:
        return {"method": "clip_b"}


class GlobalTokenMeanPPO(PolicyLossFn):
    """Trinity's PPO loss (dual clip) with the token-mean over the whole mini-batch: sum of this micro-batch's
    kept-token losses / (batch_num_tokens / dp_size), so the engine's sum over micro-batches (and the
    data-parallel gradient average) is the mini-batch token mean (departure 2)."""

    def __init__(
        self,
        backend: str = "verl",
        clip_range: float = 0.2,
        clip_range_low: float | None = None,
        clip_range_high: float | None = None,
        clip_ratio_c: float = 3.0,
        loss_agg_mode: str = "token-mean",
    ) -> None:
        super().__init__(backend=backend)
        if loss_agg_mode != "token-mean":
            raise ValueError(
                f"GlobalTokenMeanPPO is a token mean over the whole mini-batch; loss_agg_mode "
                f"{loss_agg_mode!r} asks for another aggregation: set algorithm.loss_agg_mode: token-mean "
                "or use Trinity's ppo loss"
            )
        self.eps_low = clip_range if clip_range_low is None else clip_range_low
        self.eps_high = clip_range if clip_range_high is None else clip_range_high
        self.clip_ratio_c = clip_ratio_c

    def __call__(self, logprob, old_logprob, action_mask, advantages, batch_num_tokens, dp_size, **kwargs):
        # a mini-batch with no kept token (all filtered) gives a zero loss, as the authors' clamp_min(1) does
        loss, metrics = ppo_clip_loss(
            logprob,
            old_logprob,
            advantages,
            action_mask,
            eps_low=self.eps_low,
            eps_high=self.eps_high,
            dual_clip_c=self.clip_ratio_c,
            agg=Aggregation("token-mean", num_tokens=max(batch_num_tokens, 1) / dp_size),
        )
        return loss, {f"pg_{k}": float(v) for k, v in metrics.items()} | {"pg_loss": float(loss.detach())}

    @classmethod
    def default_args(cls) -> dict:
        return {"clip_range": 0.2, "clip_ratio_c": 3.0}


# ---------------------------------------------------------------------------------------------------------------
# E_p[S] from the engine (module docstring): one wrapper per process, installed once at import.


def _s_expect_like_engine(self, output, output_args, micro_batch: TensorDict) -> torch.Tensor:
    """E_p[S] per position as a jagged tensor laid out as verl's log_probs, from the temperature-scaled logits."""
    if tu.get_non_tensor_data(data=micro_batch, key="use_fused_kernels", default=False):
        raise NotImplementedError(
            "E_p[S] (Clip_V) needs the logits, which fused kernels never materialise: set "
            "the actor's use_fused_kernels: false (Trinity's default)"
        )
    if getattr(self, "use_ulysses_sp", False):
        raise NotImplementedError(
            "E_p[S] (Clip_V) is not gathered across Ulysses sequence-parallel ranks: set "
            "trainer.ulysses_sequence_parallel_size: 1"
        )
    offsets = micro_batch["input_ids"].offsets()
    with torch.no_grad():
        if tu.get_non_tensor_data(data=micro_batch, key="use_remove_padding", default=True):
            logits = output.logits.squeeze(0)  # (nnz, V), divided by the temperature in place by verl
            s = token_stats(logits, output_args["input_ids_rmpad_rolled"]).s_expect  # (nnz,)
        else:
            logits = output.logits  # (B, L, V), divided in place
            s_pad = token_stats(logits, torch.zeros(logits.shape[:-1], dtype=torch.long, device=logits.device)).s_expect
            s = torch.cat([s_pad[i, :n] for i, n in enumerate(offsets.diff().tolist())])
    return torch.nested.nested_tensor_from_jagged(s, offsets)


def _install_engine_hook() -> None:
    original = FSDPEngineWithLMHead.prepare_model_outputs
    if getattr(original, "_entropy_rft", False):
        return

    def prepare_model_outputs(self, output, output_args, micro_batch, logits_processor_func):
        model_output = original(self, output, output_args, micro_batch, logits_processor_func)
        if tu.get_non_tensor_data(data=micro_batch, key=_REQUEST, default=False) is True:
            model_output[S_EXPECT_KEY] = _s_expect_like_engine(self, output, output_args, micro_batch)
        return model_output

    prepare_model_outputs._entropy_rft = True
    FSDPEngineWithLMHead.prepare_model_outputs = prepare_model_outputs


def _install_critic_hook() -> None:
    original = VERLTrainer._update_critic
    if getattr(original, "_entropy_rft", False):
        return

    def _update_critic(self, batch, metrics):  # the critic learns on every valid token (departure 4)
        if VALID_KEY not in batch.batch.keys():
            return original(self, batch, metrics)
        filtered = batch.batch["response_mask"]
        batch.batch["response_mask"] = batch.batch[VALID_KEY]
        try:
            return original(self, batch, metrics)
        finally:
            batch.batch["response_mask"] = filtered

    _update_critic._entropy_rft = True
    _update_critic.original = original
    VERLTrainer._update_critic = _update_critic


def _install_trainer_hook() -> None:
    original = VERLTrainer._compute_old_log_prob
    if getattr(original, "_entropy_rft", False):
        return

    def _compute_old_log_prob(self, batch, metrics):
        if not getattr(getattr(self, "advantage_fn", None), "needs_s_expect", False):
            return original(self, batch, metrics)
        wg = self.actor_rollout_wg
        plain = wg.compute_log_prob
        seen = {}

        def compute_log_prob(batch_td):  # the request Trinity builds, plus the flag; keep its padding info
            tu.assign_non_tensor(batch_td, **{_REQUEST: True})
            seen["request"], seen["output"] = batch_td, plain(batch_td)
            return seen["output"]

        wg.compute_log_prob = compute_log_prob
        try:
            batch = original(self, batch, metrics)
        finally:
            wg.compute_log_prob = plain
        s_expect = tu.get(seen["output"], S_EXPECT_KEY)
        if s_expect is None:
            raise RuntimeError(
                "the workers returned no E_p[S] for Clip_V: they load entropy-rft's engine hook when they resolve "
                "`algorithm.policy_loss_fn: entropy_rft.integrations.trinity.GlobalTokenMeanPPO`; the hook covers "
                "verl's FSDP engine (not Megatron)"
            )
        batch.batch[S_EXPECT_KEY] = no_padding_2_padding(s_expect, seen["request"]).float()
        return batch

    _compute_old_log_prob._entropy_rft = True
    VERLTrainer._compute_old_log_prob = _compute_old_log_prob


_install_engine_hook()
_install_trainer_hook()
_install_critic_hook()
