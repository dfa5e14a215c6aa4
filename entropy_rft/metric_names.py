"""Every key a run's metrics.jsonl can hold: the one list the metrics reference (docs/reference/metrics.md, generated
by docs/hooks.py) is written from, and that tests/test_metric_names.py checks against the keys real runs write.

A Metric is a key as written (the built-in trainer's name), its meaning, its unit and when it is logged; `writers`
says which recorders write it: "trainer" (entropy-rft train), "trl" (EntropyGRPOTrainer's OUTPUT_DIR/metrics.jsonl),
"verl" (the verl trainer's metrics.jsonl). In TRL's and verl's own logs the same keys carry the prefix
`entropy_rft/` (docs/watch.md). Departures:
1. The filter's own fractions (`filter/frac_clipped`, ...) are the authors' float32 formulas, kept for parity; the
   trainer's `clip_frac` counts the same removed tokens over every valid token. They agree to float32 rounding on
   an ordinary batch and differ where a side has no token: the filter's `_pos` / `_neg` then read 1 (the authors'
   formula), the trainer's 0 (masks.clipped_fractions).
2. The engines write a filter's metrics without the `filter/` prefix (`frac_clipped`, `ES`, ...), as their own
   logs name them; the list holds both spellings.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Metric:
    name: str
    meaning: str
    unit: str
    when: str
    writers: tuple[str, ...] = ("trainer",)


EVERY = "every step"
ENGINES = ("trainer", "trl", "verl")
FILTERS = "every step of a token filter: clip_b, clip_v, the s_sign filters, forking, ppo_clip_b, ppo_clip_v"
PROBE = "every probe_every-th step (10th, 20th, ...; every step under the mu entropy control)"
PPO = (
    "every step of a ratio-clipped loss (grpo, dapo, dr_grpo, the filters, ...; not gspo, clip_cov or kl_cov, "
    "which log their own clipfrac and ppo_kl)"
)

M = Metric
METRICS: tuple[Metric, ...] = (
    # what the batch got
    M("step", "the optimizer step this line is about, 1-based", "step", EVERY, ENGINES),
    M("reward_mean", "mean reward of the step's responses (TRL: its `reward`)", "reward", EVERY, ("trainer", "trl")),
    M("accuracy", "fraction of the step's responses the task scores correct", "fraction of responses", EVERY),
    M("response_length", "mean response length", "tokens", EVERY),
    M(
        "truncation_rate",
        "fraction of responses cut at max_new_tokens before they ended",
        "fraction of responses",
        EVERY,
    ),
    M(
        "frac_zero_advantage",
        "fraction of responses (per-token estimators: tokens) with advantage exactly 0, such as "
        "every response of a group whose rewards are all equal",
        "fraction",
        EVERY,
    ),
    M(
        "sampling/rounds",
        "rounds of sampling the step took (above 1 only with dynamic_sampling, which redraws "
        "groups whose rewards are all equal)",
        "count",
        EVERY,
    ),
    M("sampling/groups", "groups in the step's batch after dynamic sampling", "count", EVERY),
    # entropy and the paper's statistics
    M(
        "entropy",
        "the policy's entropy, mean over every valid response token (the same for every method on the "
        "same policy and rollouts)",
        "nats per token",
        EVERY,
        ENGINES,
    ),
    M(
        "entropy_kept",
        "entropy, mean over the tokens the method keeps in its loss",
        "nats per token",
        EVERY,
        ("trainer", "trl"),
    ),
    M("s_star_mean", "batch mean of S* = p_k (H + log p_k) over every valid token (Figure 3)", "nats", EVERY, ENGINES),
    M(
        "s_centered_mean",
        "batch mean of S_c = S* - E_p[S] (Figure 3; about 0 on-policy, Corollary 2)",
        "nats",
        EVERY,
        ENGINES,
    ),
    M(
        "cov_a_sc",
        "Cov_B(A, S_c) over the loss's tokens (Figure 5 plots its negative): negative means the batch "
        "pushes entropy up",
        "advantage x nats",
        EVERY,
        ENGINES,
    ),
    M(
        "entropy_change/predicted",
        "Corollary 4's logit-space prediction of the step's change in mean entropy, each "
        "token stepped by the loss's own per-token step (lr / |T_B| for the token mean)",
        "nats per token",
        EVERY,
        ENGINES,
    ),
    *(
        M(
            f"entropy_change/by_region/{sign}_{kind}",
            f"the part of entropy_change/predicted from the loss's tokens with A {'>' if sign == 'pos' else '<'} 0 "
            f"and S* {'> 0 (likely: log p > -H)' if kind == 'likely' else '<= 0 (unlikely)'}; the four regions sum "
            "to it, tokens with A = 0 add nothing (dynamics.entropy_change_by_region)",
            "nats per token",
            EVERY + " (engines: every logged step whose step size is known)",
            ENGINES,
        )
        for sign in ("pos", "neg")
        for kind in ("likely", "unlikely")
    ),
    *(
        M(
            f"clip_frac_by_region/{sign}_{kind}",
            f"fraction of the valid tokens with A {'>' if sign == 'pos' else '<'} 0 and S* "
            f"{'> 0' if kind == 'likely' else '<= 0'} that the method removed from the loss (0 for a region with "
            "no token)",
            "fraction of tokens",
            EVERY + " (engines: every logged step whose step size is known)",
            ENGINES,
        )
        for sign in ("pos", "neg")
        for kind in ("likely", "unlikely")
    ),
    *(
        M(
            f"reweight_frac_by_region/{sign}_{kind}",
            f"fraction of the valid tokens with A {'>' if sign == 'pos' else '<'} 0 and S* "
            f"{'> 0' if kind == 'likely' else '<= 0'} whose advantage the method reweighted (weight != 1)",
            "fraction of tokens",
            "every step of a method with token weights: stare",
        )
        for sign in ("pos", "neg")
        for kind in ("likely", "unlikely")
    ),
    M(
        "entropy_change/predicted_offpolicy",
        "the same prediction with the importance ratio r of eq. 28 (4.1, "
        "off-policy epochs); equals entropy_change/predicted when every ratio is 1",
        "nats per token",
        EVERY,
    ),
    M(
        "entropy_change/first_order",
        "the exact first-order change through the network: the gradient of the batch's "
        "mean entropy dotted with the parameter step applied",
        "nats per token",
        PROBE,
    ),
    M(
        "entropy_change/realised",
        "the change of the batch's mean entropy measured by a forward pass after the update",
        "nats per token",
        PROBE,
    ),
    # what the method removed
    M(
        "clip_frac",
        "fraction of valid tokens the method's filter removed from the loss (TRL: the filter's "
        "frac_clipped); 0 for a method without a filter",
        "fraction of tokens",
        EVERY,
        ("trainer", "trl"),
    ),
    M("clip_frac_pos", "clip_frac among the tokens of responses with A > 0", "fraction of tokens", EVERY),
    M(
        "clip_frac_neg",
        "clip_frac among the tokens of responses with A < 0 (Clip_B and Clip_V clip here by default)",
        "fraction of tokens",
        EVERY,
    ),
    M(
        "filter/frac_clipped",
        "the filter's own removed fraction (the authors' float32 formula, departure 1)",
        "fraction of tokens",
        FILTERS,
    ),
    M(
        "filter/frac_clipped_pos",
        "the filter's removed fraction in responses with A > 0",
        "fraction of tokens",
        FILTERS,
    ),
    M(
        "filter/frac_clipped_neg",
        "the filter's removed fraction in responses with A < 0",
        "fraction of tokens",
        FILTERS,
    ),
    M(
        "filter/ES",
        "Clip_B: the batch mean of S* its threshold is centred on (eq. 15)",
        "nats",
        "every step of clip_b, ppo_clip_b",
    ),
    M(
        "filter/varS",
        "Clip_B: the batch variance of S* (its threshold is mu standard deviations)",
        "nats^2",
        "every step of clip_b, ppo_clip_b",
    ),
    M(
        "filter/stdD",
        "Clip_V: the batch standard deviation of S_c its threshold is mu times (eq. 16)",
        "nats",
        "every step of clip_v, ppo_clip_v",
    ),
    M(
        "filter/gate_open",
        "entropy_gate: 1 on a step whose batch mean entropy was below the gate (the filter acted), else 0 "
        "(masks.entropy_gate, STARE's gate)",
        "0 or 1",
        "every step of a gated filter with entropy_gate, and of stare",
    ),
    M(
        "filter/gate_entropy",
        "entropy_gate: the batch mean entropy the gate compared (every valid response token)",
        "nats per token",
        "every step of a gated filter with entropy_gate, and of stare",
    ),
    M(
        "filter/regime",
        "Entrocraft: the step's advantage rule: 1 RAFT++ (entropy above the band), -1 NSR (below), 0 GRPO (inside)",
        "rule",
        "every step of entrocraft",
    ),
    M(
        "filter/band_low",
        "Entrocraft: the band's lower bound at this step (annealed)",
        "nats per token",
        "every step of entrocraft",
    ),
    M(
        "filter/band_high",
        "Entrocraft: the band's upper bound at this step (annealed)",
        "nats per token",
        "every step of entrocraft",
    ),
    M(
        "filter/rollouts_kept_frac",
        "GRPODropout: the fraction of the batch's rollouts it kept (the rest left the loss and its denominator)",
        "fraction of rollouts",
        "every step of grpo_dropout",
    ),
    M(
        "filter/push_mean_before",
        "GRPODropout: the mean push h = A (s - H) of each group's rollouts, averaged over groups, before deletion",
        "advantage x nats",
        "every step of grpo_dropout",
    ),
    M(
        "filter/push_mean_after",
        "GRPODropout: the same mean over each group's kept rollouts (H of the whole group)",
        "advantage x nats",
        "every step of grpo_dropout",
    ),
    M(
        "filter/frac_groups_all_zero",
        "GRPODropout: groups whose pushes are all 0 (equal rewards), which keep max(1, G // 4) rollouts at random",
        "fraction of groups",
        "every step of grpo_dropout",
    ),
    M(
        "filter/frac_groups_one_sign",
        "GRPODropout: groups whose nonzero pushes all have one sign",
        "fraction of groups",
        "every step of grpo_dropout",
    ),
    M(
        "filter/rsi_drop_low",
        "RSI-S: fraction of valid tokens dropped for an RSI = -log p / H below rsi_lower_bound",
        "fraction of tokens",
        "every step of rsi",
    ),
    M(
        "filter/rsi_drop_high",
        "RSI-S: fraction of valid tokens dropped for an RSI above rsi_upper_bound (the unlikely tail)",
        "fraction of tokens",
        "every step of rsi",
    ),
    M(
        "filter/frac_reweighted_pos",
        "STARE: |L+|, the tokens of A > 0 it selected by surprisal, over every valid token (before the gate)",
        "fraction of tokens",
        "every step of stare",
    ),
    M(
        "filter/frac_reweighted_neg",
        "STARE: |L-| over every valid token (variant C2; 0 under O1)",
        "fraction of tokens",
        "every step of stare",
    ),
    M(
        "filter/mean_weight",
        "STARE: mean token weight over every valid token (1 while its gate is closed)",
        "weight",
        "every step of stare",
    ),
    M(
        "filter/mu",
        "the mu the entropy controller set for this step (entropy_target with entropy_control mu)",
        "standard deviations",
        "every step with entropy_target and entropy_control mu",
    ),
    M(
        "filter/kappa",
        "the controller's gain: predicted entropy change per unit of mu, as it has learned it",
        "nats per token per unit of mu",
        "every step with entropy_target and entropy_control mu",
    ),
    M(
        "frac_clipped",
        "the filter's removed fraction (filter/frac_clipped, engine spelling, departure 2)",
        "fraction of tokens",
        "every logged step of an engine run with a filter",
        ("trl", "verl"),
    ),
    M(
        "frac_clipped_pos",
        "filter/frac_clipped_pos, engine spelling",
        "fraction of tokens",
        "every logged step of an engine run with a filter",
        ("trl", "verl"),
    ),
    M(
        "frac_clipped_neg",
        "filter/frac_clipped_neg, engine spelling",
        "fraction of tokens",
        "every logged step of an engine run with a filter",
        ("trl", "verl"),
    ),
    M("ES", "filter/ES, engine spelling", "nats", "every logged step of an engine run with clip_b", ("trl", "verl")),
    M(
        "varS",
        "filter/varS, engine spelling",
        "nats^2",
        "every logged step of an engine run with clip_b",
        ("trl", "verl"),
    ),
    M(
        "stdD",
        "filter/stdD, engine spelling",
        "nats",
        "every logged step of an engine run with clip_v",
        ("trl", "verl"),
    ),
    M(
        "gate_open",
        "filter/gate_open, engine spelling",
        "0 or 1",
        "every logged step of an engine run with a gated filter and entropy_gate",
        ("trl", "verl"),
    ),
    M(
        "gate_entropy",
        "filter/gate_entropy, engine spelling",
        "nats per token",
        "every logged step of an engine run with a gated filter and entropy_gate",
        ("trl", "verl"),
    ),
    M(
        "rollouts_kept_frac",
        "filter/rollouts_kept_frac, engine spelling",
        "fraction of rollouts",
        "every logged step of a TRL run with grpo_dropout",
        ("trl",),
    ),
    M(
        "push_mean_before",
        "filter/push_mean_before, engine spelling",
        "advantage x nats",
        "every logged step of a TRL run with grpo_dropout",
        ("trl",),
    ),
    M(
        "push_mean_after",
        "filter/push_mean_after, engine spelling",
        "advantage x nats",
        "every logged step of a TRL run with grpo_dropout",
        ("trl",),
    ),
    M(
        "frac_groups_all_zero",
        "filter/frac_groups_all_zero, engine spelling",
        "fraction of groups",
        "every logged step of a TRL run with grpo_dropout",
        ("trl",),
    ),
    M(
        "frac_groups_one_sign",
        "filter/frac_groups_one_sign, engine spelling",
        "fraction of groups",
        "every logged step of a TRL run with grpo_dropout",
        ("trl",),
    ),
    M(
        "rsi_drop_low",
        "filter/rsi_drop_low, engine spelling",
        "fraction of tokens",
        "every logged step of an engine run with rsi",
        ("trl", "verl"),
    ),
    M(
        "rsi_drop_high",
        "filter/rsi_drop_high, engine spelling",
        "fraction of tokens",
        "every logged step of an engine run with rsi",
        ("trl", "verl"),
    ),
    M(
        "frac_reweighted_pos",
        "filter/frac_reweighted_pos, engine spelling",
        "fraction of tokens",
        "every logged step of an engine run with stare",
        ("trl", "verl"),
    ),
    M(
        "frac_reweighted_neg",
        "filter/frac_reweighted_neg, engine spelling",
        "fraction of tokens",
        "every logged step of an engine run with stare",
        ("trl", "verl"),
    ),
    M(
        "mean_weight",
        "filter/mean_weight, engine spelling",
        "weight",
        "every logged step of an engine run with stare",
        ("trl", "verl"),
    ),
    M(
        "kept_frac",
        "fraction of valid tokens the filter keeps in the loss (1 - clip_frac)",
        "fraction of tokens",
        "every logged step of an engine run with a filter",
        ("trl", "verl"),
    ),
    M(
        "clip_cov_selected_frac",
        "Clip-Cov: fraction of tokens whose advantage was zeroed",
        "fraction of tokens",
        "every step of a verl run with clip_cov",
        ("verl",),
    ),
    M(
        "would_clip_b/frac",
        "monitor: the fraction of the loss's tokens Clip_B (mu 2.5) would drop from this batch",
        "fraction of tokens",
        "every logged step of a monitored engine run (method none)",
        ("trl", "verl"),
    ),
    M(
        "would_clip_v/frac",
        "monitor: the fraction Clip_V (mu 8.5, cap 1e-4) would drop",
        "fraction of tokens",
        "every logged step of a monitored engine run (method none)",
        ("trl", "verl"),
    ),
    M(
        "would_clip_b/entropy_change",
        "monitor: the part of entropy_change/predicted the tokens Clip_B would drop account for",
        "nats per token",
        "every logged step of a monitored engine run whose step size is known",
        ("trl", "verl"),
    ),
    M(
        "would_clip_v/entropy_change",
        "monitor: the same for the tokens Clip_V would drop",
        "nats per token",
        "every logged step of a monitored engine run whose step size is known",
        ("trl", "verl"),
    ),
    # the loss and the update
    M("loss/total", "the loss minimised, mean over the update's optimizer steps", "loss", EVERY),
    M("loss/policy", "its policy-gradient term", "loss", EVERY),
    M(
        "loss/clipfrac",
        "PPO ratio clipping: fraction of the loss's tokens whose ratio fell outside [1 - eps_low, "
        "1 + eps_high] on the clipped side (not a token filter: 0 when strictly on-policy, ratio 1); Clip-Cov and "
        "GSPO: their own selected or clipped fraction",
        "fraction of tokens",
        "every step but kl_cov",
    ),
    M("loss/clipfrac_high", "the tokens with A > 0 and ratio above 1 + eps_high", "fraction of tokens", PPO),
    M("loss/clipfrac_low", "the tokens with A < 0 and ratio below 1 - eps_low", "fraction of tokens", PPO),
    M(
        "loss/clipfrac_dual",
        "the tokens where dual-clip (dual_clip_c) bounds the loss of a negative advantage",
        "fraction of tokens",
        PPO,
    ),
    M("loss/ppo_kl", "mean of log(old p / new p) over the loss's tokens (KL-Cov: of |log ratio|)", "nats", EVERY),
    M("loss/ratio_mean", "mean importance ratio new p / old p over the loss's tokens (1 when on-policy)", "ratio", PPO),
    M(
        "loss/cov_selected_frac",
        "KL-Cov: fraction of tokens its KL penalty applies to",
        "fraction of tokens",
        "every step of kl_cov",
    ),
    M(
        "loss/entropy_bonus",
        "the entropy bonus term before its coefficient: the mean token entropy it raises (TRE-K / TRE-P: the"
        " renormalised top-K / top-p entropy times log V / log K); the loss adds -entropy_coef x this",
        "nats",
        "every step with an entropy bonus (entropy_bonus, tre_k, entropy_control bonus)",
    ),
    M("loss/entropic", "EntroPIC's reweighting term of the loss", "loss", "every step with entropy_control pi"),
    M("loss/value", "PPO's critic loss", "loss", "every step of ppo, ppo_clip_b, ppo_clip_v"),
    M(
        "loss/value_mean",
        "mean value estimate over the loss's tokens",
        "reward",
        "every step of ppo, ppo_clip_b, ppo_clip_v",
    ),
    M(
        "loss/vf_clipfrac",
        "fraction of tokens whose value update was clipped (value_clip)",
        "fraction of tokens",
        "every step of ppo, ppo_clip_b, ppo_clip_v",
    ),
    M(
        "grad_norm",
        "gradient norm of the last optimizer step, before clipping at grad_clip",
        "norm",
        EVERY,
        ("trainer", "trl"),
    ),
    M("lr", "the learning rate of the step", "learning rate", EVERY, ("trainer", "trl")),
    M(
        "entropy_coef",
        "the entropy bonus coefficient of the step (0 without a bonus; moves under entropy_control bonus)",
        "coefficient",
        EVERY,
    ),
    M("entropic/alpha", "EntroPIC's coefficient of the step", "coefficient", "every step with entropy_control pi"),
    M(
        "entropic/integral",
        "EntroPIC's integral of the entropy error",
        "nats x steps",
        "every step with entropy_control pi",
    ),
    M(
        "entropic/high_prob_frac",
        "fraction of tokens EntroPIC counts as high-probability (above pi_threshold)",
        "fraction of tokens",
        "every step with entropy_control pi",
    ),
    M(
        "update/frac_rows_no_backward",
        "fraction of responses whose update forward ran without a graph (advantage 0, "
        "so their gradient is exactly 0; skip_zero_advantage)",
        "fraction of responses",
        EVERY,
    ),
    M(
        "rollout/sampler_logp_gap",
        "mean |log p| difference between the sampler and the trained policy on the "
        "sampled tokens (decode and vLLM against the training forward)",
        "nats",
        "every step whose sampler reports log-probs",
    ),
    M(
        "rollout/sampler_logp_gap_max",
        "its largest value over the batch",
        "nats",
        "every step whose sampler reports log-probs",
    ),
    # evaluation and time
    M(
        "eval/avg_at_k",
        "Avg@K on the evaluation problems (mean over K samples)",
        "fraction correct",
        "every eval_every-th step (when eval_every > 0)",
    ),
    M(
        "eval/pass_at_k",
        "Pass@K on the evaluation problems (unbiased estimate)",
        "fraction of problems",
        "every eval_every-th step (when eval_every > 0)",
    ),
    M("time/rollout", "time spent sampling the step's responses", "seconds", EVERY),
    M(
        "time/compile",
        "of time/rollout (and the evaluation before it), the time spent compiling the decode step: nonzero on "
        "the step whose rollout first met a shape under decode='compile' (auto on CUDA), 0 otherwise",
        "seconds",
        EVERY,
    ),
    M("time/stats", "time of the forward that gives the token statistics", "seconds", EVERY),
    M("time/update", "time of the update (advantages, filter, backward, optimizer)", "seconds", EVERY),
    M("time/diagnostics", "time of the step's metrics and the entropy probe", "seconds", EVERY),
    M("time/samples", "time writing the token samples", "seconds", EVERY),
    M("seconds", "the step's wall time", "seconds", EVERY),
)

BY_NAME = {m.name: m for m in METRICS}


def undocumented(keys, writer: str = "trainer") -> list[str]:
    """The keys of a metrics line that the list does not document for this writer, sorted."""
    return sorted(k for k in keys if k not in BY_NAME or writer not in BY_NAME[k].writers)
