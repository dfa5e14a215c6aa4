"""entropy_rft.integrations.verl against the real verl 0.9.1 objects on the CPU (`make test-verl`; skipped where verl
is not installed).

Checked: the plugin loads through verl's own entry-point mechanism (and VERL_USE_EXTERNAL_MODULES) and registers the
trainer and the engine by name; verl's FSDP engine code path (packed and padded) returns log p, H and E_p[S] equal
to token_stats and to a float64 brute force on the same logits; the driver's advantage step (verl's own, through
TransferQueue) keeps exactly masks.clip_b / clip_v over the whole batch, which differs from filtering micro-batches
separately, and writes both masks back; verl's old-log-prob step asks the engine for E_p[S] and Clip_V's mask
then equals clip_v on the policy's own S_c (the Ray worker group, which needs GPUs, replaced by a stand-in that
runs the real engine between TransferQueue reads and writes); verl's ppo_loss gradients through the engine with
those masks are the whole-batch token mean whatever the micro-batch size; the write-back is load-bearing (mutation
checks).

verl has no CPU platform (verl.utils.device asks CUDA for the device id), so the engine tests point the device
helpers imported by verl's FSDP engine module and sequence balancing at "cpu"; everything else is verl's code as
installed."""

import os
import subprocess
import sys
import types
from functools import partial
from pathlib import Path

import pytest
import torch

pytest.importorskip("verl")
pytest.importorskip("transfer_queue")
import ray  # noqa: E402
import torch.distributed as dist  # noqa: E402
import transfer_queue as tq  # noqa: E402
import verl.utils.torch_functional as verl_F  # noqa: E402
import verl.utils.seqlen_balancing as seqlen_balancing  # noqa: E402
import verl.workers.engine.fsdp.transformer_impl as fsdp_impl  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402
from tensordict import TensorDict  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402
from verl.trainer.ppo.v1 import get_trainer_cls  # noqa: E402
from verl.utils import tensordict_utils as tu  # noqa: E402
from verl.utils.dataset.dataset_utils import DatasetPadMode  # noqa: E402
from verl.workers.config import FSDPActorConfig  # noqa: E402
from verl.workers.engine.base import EngineRegistry  # noqa: E402
from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead  # noqa: E402
from verl.workers.utils.losses import ppo_loss  # noqa: E402

import entropy_rft  # noqa: E402
from entropy_rft.dynamics import TokenStats, token_stats  # noqa: E402
from entropy_rft.integrations import verl as adapter  # noqa: E402
from entropy_rft.integrations.verl import (  # noqa: E402
    ENGINE_VENDOR, S_EXPECT, TRAINER_NAME, EntropyFSDPEngine, EntropyRFTTrainer, Settings, check_config,
    stats_from_engine, whole_batch_step)
from entropy_rft.masks import clip_b, clip_v  # noqa: E402

TINY = Path(entropy_rft.__file__).parent / "assets" / "countdown-tiny"
ROOT = Path(__file__).resolve().parents[1]


def nested(rows):
    return torch.nested.as_nested_tensor(list(rows), layout=torch.jagged)


# ---------------------------------------------------------------------------------------------------------------
# Plugin loading and registries


def _run_verl_import(env_extra: dict) -> subprocess.Popen:
    code = ("import verl\nfrom verl.trainer.ppo.v1 import get_trainer_cls\ntry:\n"
            "    print(get_trainer_cls('entropy_rft').__module__)\nexcept ValueError:\n    print('unknown')\n")
    env = {k: v for k, v in os.environ.items() if k not in ("VERL_USE_EXTERNAL_MODULES", "VERL_USE_EXTERNAL_PLUGINS")}
    env.update(env_extra)
    return subprocess.Popen([sys.executable, "-W", "ignore", "-c", code], env=env, cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


@pytest.mark.slow
def test_plugin_loads_through_verl_entry_point_and_explicit_module():
    """A fresh `import verl` registers the trainer through the `verl.plugins` entry point alone; with entry points
    off (VERL_USE_EXTERNAL_PLUGINS=none) it is unknown, and VERL_USE_EXTERNAL_MODULES brings it back."""
    runs = {
        "entry point": _run_verl_import({}),
        "plugins off": _run_verl_import({"VERL_USE_EXTERNAL_PLUGINS": "none"}),
        "explicit": _run_verl_import({"VERL_USE_EXTERNAL_PLUGINS": "none",
                                      "VERL_USE_EXTERNAL_MODULES": "entropy_rft.integrations.verl"}),
    }
    out = {}
    for name, proc in runs.items():
        stdout, stderr = proc.communicate(timeout=300)
        assert proc.returncode == 0, stderr[-2000:]
        out[name] = stdout.strip().splitlines()[-1]
    assert out == {"entry point": "entropy_rft.integrations.verl", "plugins off": "unknown",
                   "explicit": "entropy_rft.integrations.verl"}


def test_trainer_and_engine_registry_lookups(monkeypatch):
    """verl's V1 trainer registry returns EntropyRFTTrainer by name (a subclass of verl's sync trainer that reads
    trainer_mode "sync"), and verl's engine registry returns EntropyFSDPEngine for the fsdp/fsdp2 language model
    exactly when VERL_ENGINE_VENDOR names it (verl's own engine otherwise)."""
    cls = get_trainer_cls(TRAINER_NAME)
    assert cls is EntropyRFTTrainer and issubclass(cls, get_trainer_cls("sync"))
    monkeypatch.setenv("VERL_ENGINE_DEVICE", "cuda")
    for backend in ("fsdp", "fsdp2"):
        monkeypatch.setenv("VERL_ENGINE_VENDOR", ENGINE_VENDOR)
        assert EngineRegistry.get_engine_cls("language_model", backend) is EntropyFSDPEngine
        monkeypatch.setenv("VERL_ENGINE_VENDOR", "nvidia")
        assert EngineRegistry.get_engine_cls("language_model", backend) is FSDPEngineWithLMHead


def _verl_config(**over):
    base = {"entropy_rft": {"method": "clip_v", "options": {"mu": 8.5, "max_frac": None}},
            "algorithm": {"adv_estimator": "grpo", "use_kl_in_reward": False, "gamma": 1.0, "lam": 1.0,
                          "norm_adv_by_std_in_grpo": True, "rollout_correction": None},
            "actor_rollout_ref": {"actor": {"strategy": "fsdp"}, "model": {"use_fused_kernels": False},
                                  "rollout": {"n": 4}}}
    cfg = OmegaConf.create(base)
    for key, value in over.items():
        OmegaConf.update(cfg, key, value, merge=False, force_add=True)
    return cfg


@pytest.mark.parametrize("key,value,match", [
    ("actor_rollout_ref.model.use_fused_kernels", True, "use_fused_kernels"),
    ("actor_rollout_ref.actor.strategy", "megatron", "megatron"),
    ("algorithm.rollout_correction", {"bypass_mode": True}, "bypass_mode"),
])
def test_clip_v_refuses_configs_without_logits_or_entropies(key, value, match):
    """Clip_V is refused, naming the setting, with fused kernels, Megatron and bypass mode; Clip_B runs with fused
    kernels and Megatron (it needs only verl's entropies) but not in bypass mode (no entropies at all)."""
    cfg = _verl_config(**{key: value})
    with pytest.raises(ValueError, match=match):
        check_config(Settings.from_config(cfg), cfg)
    clip_b_cfg = _verl_config(**{key: value, "entropy_rft": {"method": "clip_b", "options": {}}})
    if match == "bypass_mode":
        with pytest.raises(ValueError, match=match):
            check_config(Settings.from_config(clip_b_cfg), clip_b_cfg)
    else:
        check_config(Settings.from_config(clip_b_cfg), clip_b_cfg)


def test_settings_name_what_is_wrong():
    """Unknown methods, non-filter methods and unknown keys fail at start-up with the fix in the message."""
    with pytest.raises(KeyError, match="known methods"):
        Settings(method="clip_q")
    with pytest.raises(ValueError, match="not a token filter"):
        Settings(method="dapo")
    with pytest.raises(ValueError, match=r"clip_v takes options \[.*'max_frac'.*\], got \['muu'\]"):
        Settings(method="clip_v", options={"muu": 8.5})
    with pytest.raises(ValueError, match="clip_cov takes options"):
        Settings(method="clip_cov", options={"mu": 1.0})
    with pytest.raises(ValueError, match="takes method, options, seed"):
        Settings.from_config(OmegaConf.create({"entropy_rft": {"method": "clip_b", "mu": 2.5}}))
    with pytest.raises(ValueError, match="needs an `entropy_rft` section"):
        Settings.from_config(OmegaConf.create({}))


@pytest.mark.parametrize("name,method,options", [
    ("qwen2.5-7b-instruct_clip_b", "clip_b", {"mu": 2.5}),
    ("qwen2.5-7b-instruct_clip_v", "clip_v", {"mu": 8.5, "max_frac": 1e-4}),
])
def test_example_configs_compose_with_verl_and_hold_table_1_settings(name, method, options):
    """The examples/verl configs compose with verl's own ppo_trainer config through Hydra, pass verl's
    validate_config and the adapter's start-up checks, hold Table 1's settings, and build the trainer they select,
    which keeps verl's sync behaviour (sync replay buffer)."""
    from hydra import compose, initialize_config_dir
    from verl.trainer.main_ppo import validate_config
    from verl.trainer.ppo.utils import need_critic, need_reference_policy

    with initialize_config_dir(config_dir=str(ROOT / "examples" / "verl"), version_base=None):
        cfg = compose(config_name=name)
    validate_config(config=cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
    settings = Settings.from_config(cfg)
    check_config(settings, cfg)
    assert (settings.method, settings.options) == (method, options)
    assert cfg.trainer.v1.trainer_mode == TRAINER_NAME and cfg.trainer.use_v1
    actor, rollout = cfg.actor_rollout_ref.actor, cfg.actor_rollout_ref.rollout
    assert (actor.optim.lr, list(actor.optim.betas), actor.optim.weight_decay) == (4e-7, [0.9, 0.999], 0.0)
    assert (cfg.data.train_batch_size, actor.ppo_mini_batch_size, rollout.n) == (64, 64, 16)
    assert (rollout.temperature, rollout.val_kwargs.temperature, cfg.data.max_response_length) == (1.0, 0.7, 7168)
    assert not actor.use_kl_loss and not cfg.algorithm.use_kl_in_reward and actor.entropy_coeff == 0
    assert cfg.algorithm.adv_estimator == "grpo" and actor.loss_agg_mode == "token-mean"
    trainer = get_trainer_cls(cfg.trainer.v1.trainer_mode)(cfg)  # verl's own __init__ on this config
    assert (trainer.trainer_mode, trainer.selected_by) == ("sync", TRAINER_NAME)  # verl's sync branches apply
    assert type(trainer.replay_buffer).__name__ == "ReplayBuffer" and trainer.entropy_rft == settings


# ---------------------------------------------------------------------------------------------------------------
# The engine: verl's FSDP LM engine code path on the shipped tiny Qwen2 policy, gloo process group of size 1


@pytest.fixture(scope="module")
def engine():
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(fsdp_impl, "get_device_id", lambda: "cpu")  # verl has no CPU platform (module docstring)
        mp.setattr(fsdp_impl, "get_device_name", lambda: "cpu")
        mp.setattr(seqlen_balancing, "get_device_name", lambda: "cpu")  # dynamic batch sizes
        created = not dist.is_initialized()
        if created:
            dist.init_process_group("gloo", rank=0, world_size=1, init_method="tcp://127.0.0.1:29517")
        eng = object.__new__(EntropyFSDPEngine)  # as verl's own *_on_cpu tests build it
        eng.module = AutoModelForCausalLM.from_pretrained(TINY).float().eval()
        eng.use_ulysses_sp, eng.ulysses_sequence_parallel_size, eng.ulysses_device_mesh = False, 1, None
        eng.engine_config = types.SimpleNamespace(entropy_checkpointing=False,
                                                  entropy_from_logits_with_chunking=False)
        eng.compute_entropy_from_logits = verl_F.entropy_from_logits
        eng.pad_to_length, eng._autocast_dtype, eng.scaler = False, torch.float32, None
        yield eng
        if created:
            dist.destroy_process_group()


def token_batch(vocab, *, seed=0, b=8, temperature=0.7):
    """Prompt/response rows in verl's no-padding layout (nested input_ids over prompt + response)."""
    g = torch.Generator().manual_seed(seed)
    p_len = torch.randint(2, 6, (b,), generator=g).tolist()
    r_len = torch.randint(2, 8, (b,), generator=g).tolist()
    prompts = [torch.randint(2, vocab, (n,), generator=g) for n in p_len]
    responses = [torch.randint(2, vocab, (n,), generator=g) for n in r_len]
    ids = [torch.cat([p, r]) for p, r in zip(prompts, responses)]
    ones = [torch.ones(n, dtype=torch.int64) for n in r_len]
    data = TensorDict({"input_ids": nested(ids), "position_ids": nested(torch.arange(len(x)) for x in ids),
                       "prompts": nested(prompts), "responses": nested(responses), "response_mask": nested(ones),
                       "loss_mask": nested(ones), "temperature": torch.full((b,), temperature)}, batch_size=b)
    tu.assign_non_tensor(data, pad_mode=DatasetPadMode.NO_PADDING, use_fused_kernels=False)
    return data, ids


def brute_force(logits, temperature):
    """log-softmax, H and E_p[S] = sum_i p_i S_i with S_i = p_i (H + log p_i), in float64, row by row."""
    logp = torch.log_softmax(logits.double() / temperature, dim=-1)
    p = logp.exp()
    h = -(p * logp).sum(-1)
    return logp, h, (p * p * (h.unsqueeze(-1) + logp)).sum(-1)


@pytest.mark.parametrize("packed", [True, False], ids=["packed", "padded"])
def test_engine_stats_equal_token_stats(engine, packed):
    """verl's engine forward (packed: use_remove_padding; padded) returns log p, H and, through
    EntropyFSDPEngine, E_p[S] equal to token_stats and to a float64 brute force on the very logits it saw."""
    data, ids = token_batch(engine.module.config.vocab_size)
    tu.assign_non_tensor(data, use_remove_padding=packed, calculate_entropy=True, **{S_EXPECT: True})
    seen = []
    handle = engine.module.register_forward_hook(lambda m, a, out: seen.append(out.logits.detach().clone()))
    try:
        with torch.no_grad():
            _, out = engine.forward_step(data, loss_function=None, forward_only=True)
    finally:
        handle.remove()
    z = seen[0].squeeze(0) if packed else torch.cat([seen[0][i, :len(x)] for i, x in enumerate(ids)])
    labels = torch.roll(torch.cat(ids), -1)  # verl's label layout: position t predicts token t + 1
    ours = token_stats(z, labels, temperature=0.7)
    mo = out["model_output"]
    assert set(mo) == {"log_probs", "entropy", S_EXPECT}
    for name, key in (("logp", "log_probs"), ("entropy", "entropy"), ("s_expect", S_EXPECT)):
        torch.testing.assert_close(mo[key].values(), getattr(ours, name), atol=1e-5, rtol=1e-5)
    logp, h, s_expect = brute_force(z, 0.7)
    torch.testing.assert_close(mo["log_probs"].values().double(), logp.gather(-1, labels[:, None]).squeeze(-1),
                               atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(mo["entropy"].values().double(), h, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(mo[S_EXPECT].values().double(), s_expect, atol=1e-6, rtol=1e-5)


def test_s_expect_survives_verl_micro_batching_and_reordering(engine):
    """Through verl's forward_backward_batch with dynamic batch sizes (several micro-batches, rows regrouped by
    length and restored), E_p[S] comes back row by row equal to one forward over the whole batch."""
    data, _ = token_batch(engine.module.config.vocab_size)
    tu.assign_non_tensor(data, use_remove_padding=True, calculate_entropy=True, **{S_EXPECT: True})
    with torch.no_grad():
        _, whole = engine.forward_step(data.clone(), loss_function=None, forward_only=True)
    split = data.clone()
    tu.assign_non_tensor(split, use_dynamic_bsz=True, max_token_len_per_gpu=16)
    out = engine.forward_backward_batch(split, loss_function=None, forward_only=True)
    assert len(out["model_output"][S_EXPECT].offsets()) - 1 == len(data)
    for got, want in zip(out["model_output"][S_EXPECT].unbind(), whole["model_output"][S_EXPECT].unbind()):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)


def test_clip_v_without_engine_output_names_the_fix():
    """A Clip_V batch whose workers did not add E_p[S] (engine not selected) fails with VERL_ENGINE_VENDOR named,
    instead of filtering on S* as if E_p[S] were 0."""
    keys, fields, _ = driver_batch()
    with pytest.raises(RuntimeError, match=f"VERL_ENGINE_VENDOR={ENGINE_VENDOR}"):
        adapter.filter_batch(Settings("clip_v"), fields.exclude(S_EXPECT))


def test_engine_adds_nothing_unless_asked_and_refuses_fused_kernels(engine):
    """Without the trainer's request the engine's output is verl's own; with fused kernels the request fails with
    the setting to change."""
    data, _ = token_batch(engine.module.config.vocab_size, b=2)
    tu.assign_non_tensor(data, use_remove_padding=True, calculate_entropy=True)
    with torch.no_grad():
        _, out = engine.forward_step(data, loss_function=None, forward_only=True)
    assert set(out["model_output"]) == {"log_probs", "entropy"}
    tu.assign_non_tensor(data, use_fused_kernels=True, **{S_EXPECT: True})
    with pytest.raises(ValueError, match="use_fused_kernels=false"):
        engine._s_expect(types.SimpleNamespace(logits=None), {}, data)


def _gradients(engine, data, micro_batch_size, packed):
    engine.module.zero_grad(set_to_none=True)
    data = data.clone()
    tu.assign_non_tensor(data, use_remove_padding=packed, use_dynamic_bsz=False, calculate_entropy=False,
                         micro_batch_size_per_gpu=micro_batch_size, global_batch_size=len(data))
    config = FSDPActorConfig(strategy="fsdp", ppo_mini_batch_size=len(data), ppo_micro_batch_size_per_gpu=1,
                             use_dynamic_bsz=False, rollout_n=1)
    engine.module.train()
    engine.forward_backward_batch(data, loss_function=partial(ppo_loss, config))
    engine.module.eval()
    return torch.cat([p.grad.flatten() for p in engine.module.parameters() if p.grad is not None])


def _filtered_training_batch(engine, *, write_loss_mask=True):
    """A batch with verl's old log-probs (current policy: ratio 1), per-sequence advantages and Clip_B's whole-batch
    keep mask written into response_mask and (unless write_loss_mask=False) loss_mask."""
    data, ids = token_batch(engine.module.config.vocab_size, temperature=1.0)
    tu.assign_non_tensor(data, use_remove_padding=True, calculate_entropy=True)
    with torch.no_grad():
        _, out = engine.forward_step(data, loss_function=None, forward_only=True)
    from verl.workers.utils.padding import response_from_nested, response_to_nested
    old = response_from_nested(out["model_output"]["log_probs"], data["response_mask"])
    ent = response_from_nested(out["model_output"]["entropy"], data["response_mask"])
    mask = torch.nested.to_padded_tensor(data["response_mask"], 0).bool()
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5, -1.5, 1.5, -0.7, 0.7])
    stats = stats_from_engine(torch.nested.to_padded_tensor(old, 0.0), torch.nested.to_padded_tensor(ent, 0.0))
    keep, adv_bt, _ = whole_batch_step(Settings("clip_b", {"mu": 0.5}), stats, adv, mask)
    assert 0 < int((mask & ~keep).sum()) < int(mask.sum()) // 2  # the filter drops some tokens, not most
    new_mask = response_to_nested((mask & keep).long(), data["response_mask"])
    data["response_mask"] = new_mask
    if write_loss_mask:
        data["loss_mask"] = new_mask
    data["old_log_probs"] = old
    data["advantages"] = response_to_nested(adv_bt, new_mask)
    return data, ids, mask & keep, adv


def rel_diff(a, b):
    return float((a - b).norm() / b.norm())


def _whole_batch_token_mean_gradient(engine, ids, resp_lens, kept, adv):
    """Reference: autograd of -(1 / n_kept) sum over kept tokens of A exp(log p - old log p), one sequence at a
    time (no packing, no engine), at ratio 1."""
    engine.module.zero_grad(set_to_none=True)
    total = 0.0
    n_kept = int(kept.sum())
    for i, x in enumerate(ids):
        logits = engine.module(input_ids=x[None]).logits[0, :-1]
        logp = torch.log_softmax(logits.float(), -1).gather(-1, x[1:, None]).squeeze(-1)[-resp_lens[i]:]
        ratio = (logp - logp.detach()).exp()
        total = total + (-adv[i] * ratio * kept[i, :resp_lens[i]]).sum() / n_kept
    total.backward()
    return torch.cat([p.grad.flatten() for p in engine.module.parameters() if p.grad is not None])


@pytest.mark.parametrize("packed", [True, False], ids=["packed", "padded"])
def test_filtered_gradients_are_the_whole_batch_token_mean_for_any_micro_batch(engine, packed):
    """verl's engine + ppo_loss with the written-back masks: the accumulated gradient is the same for micro-batches
    of 1, 2 and 8 rows and equals the token mean over the whole batch's kept tokens."""
    data, ids, kept, adv = _filtered_training_batch(engine)
    resp_lens = data["responses"].offsets().diff().tolist()
    ref = _whole_batch_token_mean_gradient(engine, ids, resp_lens, kept, adv)
    for mbs in (1, 2, 8):
        assert rel_diff(_gradients(engine, data, mbs, packed), ref) < 1e-5


def test_mutation_response_mask_alone_leaves_dropped_tokens_in_the_denominator(engine):
    """Mutation check on the loss_mask write-back: with only response_mask filtered (verl's rejection sampling
    does this), verl's denominator still counts the dropped tokens, so the gradient is the token mean scaled by
    n_kept / n_valid, not the token mean: the comparison of the test above fails."""
    data, ids, kept, adv = _filtered_training_batch(engine, write_loss_mask=False)
    resp_lens = data["responses"].offsets().diff().tolist()
    ref = _whole_batch_token_mean_gradient(engine, ids, resp_lens, kept, adv)
    g = _gradients(engine, data, 2, True)
    assert rel_diff(g, ref) > 100 * 1e-5  # far outside the tolerance of the test above
    n_valid = int(torch.nested.to_padded_tensor(data["loss_mask"], 0).sum())
    assert rel_diff(g, ref * int(kept.sum()) / n_valid) < 1e-5


# ---------------------------------------------------------------------------------------------------------------
# The driver step: verl's _compute_advantage through a real TransferQueue, then the whole-batch filter


def driver_batch(seed=0, groups=4, n=4):
    """Rows of a GRPO batch as TransferQueue holds them after verl's old-log-prob step: half the rows with a tight
    S* spread, half with a wide one, so per-micro-batch statistics disagree with the whole batch's."""
    g = torch.Generator().manual_seed(seed)
    b = groups * n
    r_len = torch.randint(3, 9, (b,), generator=g).tolist()
    p_len = torch.randint(2, 5, (b,), generator=g).tolist()
    old, ent, s_full, scores = [], [], [], []
    for i, t in enumerate(r_len):
        spread = 0.05 if i < b // 2 else 1.0
        old.append(-(torch.rand(t, generator=g) * spread * 3 + 0.01))
        ent.append(torch.rand(t, generator=g) * spread * 2)
        s_full.append(torch.randn(p_len[i] + t, generator=g) * spread * 0.05)  # E_p[S] over prompt + response
        score = torch.zeros(t)
        score[-1] = float(torch.rand((), generator=g) > 0.5)
        scores.append(score)
    ones = [torch.ones(t, dtype=torch.int64) for t in r_len]
    fields = TensorDict({"uid": torch.arange(b) // n, "response_mask": nested(ones), "loss_mask": nested(ones),
                         "rm_scores": nested(scores), "old_log_probs": nested(old), "entropy": nested(ent),
                         S_EXPECT: nested(s_full)}, batch_size=b)
    keys = [f"g{i // n}_s{i}_0" for i in range(b)]
    return keys, fields, r_len


@pytest.fixture(scope="module")
def transfer_queue():
    ray.init(_node_ip_address="127.0.0.1", include_dashboard=False, num_cpus=8, log_to_driver=False)
    tq.init()
    yield
    tq.close()
    ray.shutdown()


def run_driver_step(method, options, partition):
    """verl's V1 advantage step (EntropyRFTTrainer._compute_advantage) on a batch put into TransferQueue; returns
    what TransferQueue then holds, padded, and the expected whole-batch stats."""
    keys, fields, _ = driver_batch()
    meta = tq.kv_batch_put(keys=keys, partition_id=partition, fields=fields)
    trainer = object.__new__(EntropyRFTTrainer)
    trainer.config = _verl_config(entropy_rft={"method": method, "options": options})
    trainer.entropy_rft = Settings.from_config(trainer.config)
    trainer.entropy_rft_generator = torch.Generator().manual_seed(0)
    metrics = {}
    trainer._compute_advantage(meta, metrics)
    after = tq.kv_batch_get(keys=keys, partition_id=partition,
                            select_fields=["response_mask", "loss_mask", "advantages", "old_log_probs", "entropy"])
    after = after.to_padded_tensor()
    from verl.workers.utils.padding import response_from_nested
    s_expect = torch.nested.to_padded_tensor(response_from_nested(fields[S_EXPECT], fields["response_mask"]), 0.0)
    valid = torch.nested.to_padded_tensor(fields["response_mask"], 0).bool()
    stats = stats_from_engine(after["old_log_probs"], after["entropy"], s_expect)
    return after, stats, valid, metrics


def expected_keep(method, stats, adv, mask, **options):
    fn, score = {"clip_b": (clip_b, stats.s_star), "clip_v": (clip_v, stats.s_centered)}[method]
    return fn(score, adv, mask, **options)[0]


def assert_written_back(after, keep):
    """Both masks in TransferQueue equal the expected keep mask."""
    assert torch.equal(after["response_mask"].bool(), keep), "response_mask was not filtered"
    assert torch.equal(after["loss_mask"].bool(), keep), "loss_mask was not filtered"


@pytest.mark.slow
@pytest.mark.parametrize("method,options", [("clip_b", {"mu": 1.0}), ("clip_v", {"mu": 0.5, "max_frac": None})])
def test_driver_keep_mask_is_the_whole_batch_filter(transfer_queue, method, options):
    """After verl's advantage step on a TransferQueue batch, both masks hold exactly masks.clip_b / clip_v over the
    whole batch (with verl's GRPO advantages), which differs from filtering the two micro-batches separately."""
    after, stats, valid, metrics = run_driver_step(method, options, f"train_{method}")
    adv = after["advantages"]
    want = expected_keep(method, stats, adv, valid, **options)
    assert int((valid & ~want).sum()) > 0
    assert_written_back(after, want)
    halves = [slice(0, 8), slice(8, 16)]
    per_micro = torch.cat([expected_keep(method, TokenStats(*(getattr(stats, f)[h] for f in
                                                               ("logp", "entropy", "s_star", "s_expect"))),
                                         adv[h], valid[h], **options) for h in halves])
    assert not torch.equal(per_micro, want)
    assert metrics["entropy_rft/kept_frac"] == pytest.approx(float((want & valid).sum() / valid.sum()))


@pytest.mark.slow
def test_mutation_disabled_write_back_is_detected(transfer_queue, monkeypatch):
    """Mutation check: with the mask write-back disabled (the filter's new masks replaced by the old ones before
    the put), the check of the test above fails."""
    real = adapter.filter_batch

    def without_write_back(settings, data, **kw):
        out, metrics = real(settings, data, **kw)
        out["response_mask"], out["loss_mask"] = data["response_mask"], data["loss_mask"]
        return out, metrics

    monkeypatch.setattr(adapter, "filter_batch", without_write_back)
    after, stats, valid, _ = run_driver_step("clip_b", {"mu": 1.0}, "train_mutant")
    with pytest.raises(AssertionError, match="was not filtered"):
        assert_written_back(after, expected_keep("clip_b", stats, after["advantages"], valid, mu=1.0))


@pytest.mark.slow
def test_driver_clip_cov_zeroes_whole_batch_selection(transfer_queue):
    """Clip-Cov on the driver: masks unchanged, and exactly the tokens losses.select_clip_cov picks over the whole
    batch (same generator seed) get advantage 0; the others keep verl's GRPO advantage."""
    from entropy_rft.losses import select_clip_cov
    plain, _, valid, _ = run_driver_step("clip_b", {"mu": 1e9}, "train_plain")  # mu huge: nothing dropped
    after, stats, _, _ = run_driver_step("clip_cov", {"ratio": 0.05, "lb": -1e9, "ub": 1e9}, "train_cov")
    selected = select_clip_cov(plain["advantages"], stats.logp, valid, ratio=0.05, lb=-1e9, ub=1e9,
                               generator=torch.Generator().manual_seed(0))
    assert int(selected.sum()) == max(int(0.05 * int(valid.sum())), 1)
    assert_written_back(after, valid)
    torch.testing.assert_close(after["advantages"], torch.where(selected, 0.0, plain["advantages"]) * valid)


class EngineWorkerGroup:
    """Stands in for verl's Ray worker group (which needs GPUs) in the old-log-prob step: it does what verl's
    dispatch does around a worker, on the real engine: reads the batch from TransferQueue, passes the meta's
    extra_info as non-tensor data, runs the engine forward, and puts every tensor of the model output back."""

    def __init__(self, engine):
        self.engine, self.requests = engine, []

    def compute_log_prob(self, meta):
        self.requests.append(dict(meta.extra_info))
        data = tq.kv_batch_get(keys=meta.keys, partition_id=meta.partition_id,
                               select_fields=["input_ids", "position_ids", "response_mask", "loss_mask"])
        data["temperature"] = torch.full((len(data),), meta.extra_info["temperature"])
        tu.assign_non_tensor(data, pad_mode=DatasetPadMode.NO_PADDING, use_fused_kernels=False,
                             use_remove_padding=True, **meta.extra_info)
        with torch.no_grad():
            _, out = self.engine.forward_step(data, loss_function=None, forward_only=True)
        fields = TensorDict(dict(out["model_output"]), batch_size=len(data))
        return tq.kv_batch_put(keys=meta.keys, partition_id=meta.partition_id, fields=fields)


@pytest.mark.slow
def test_clip_v_step_with_the_engine_e_p_s(transfer_queue, engine):
    """verl's old-log-prob step asks the engine for E_p[S] (and only that step: the request is gone afterwards);
    the engine's E_p[S] reaches the driver through TransferQueue, and the advantage step's keep mask is
    masks.clip_v over the whole batch with S_c from token_stats of the policy's own logits."""
    data, ids = token_batch(engine.module.config.vocab_size, b=8, temperature=1.0)
    b = len(ids)
    keys = [f"g{i // 4}_s{i}_0" for i in range(b)]
    r_len = data["responses"].offsets().diff().tolist()
    scores = [torch.zeros(n) for n in r_len]
    for i in (0, 2, 5, 7):
        scores[i][-1] = 1.0
    fields = TensorDict({k: data[k] for k in ("input_ids", "position_ids", "response_mask", "loss_mask")},
                        batch_size=b)
    fields["uid"], fields["rm_scores"] = torch.arange(b) // 4, nested(scores)
    meta = tq.kv_batch_put(keys=keys, partition_id="train_e2e", fields=fields)
    trainer = object.__new__(EntropyRFTTrainer)
    trainer.config = _verl_config(entropy_rft={"method": "clip_v", "options": {"mu": 0.5, "max_frac": None}})
    OmegaConf.update(trainer.config, "actor_rollout_ref.rollout",
                     {"n": 4, "temperature": 1.0, "calculate_log_probs": False}, merge=False)
    OmegaConf.update(trainer.config, "actor_rollout_ref.actor",
                     {"strategy": "fsdp", "loss_agg_mode": "token-mean", "loss_scale_factor": None}, merge=False)
    trainer.entropy_rft = Settings.from_config(trainer.config)
    trainer.entropy_rft_generator = torch.Generator().manual_seed(0)
    trainer.actor_rollout_wg = EngineWorkerGroup(engine)
    metrics = {}
    meta = trainer._compute_old_log_prob(meta, metrics)
    assert trainer.actor_rollout_wg.requests[0][S_EXPECT] is True and S_EXPECT not in meta.extra_info
    trainer._compute_advantage(meta, metrics)
    after = tq.kv_batch_get(keys=keys, partition_id="train_e2e",
                            select_fields=["response_mask", "loss_mask", "advantages"]).to_padded_tensor()
    # the reference: token_stats of each response token under the policy, one sequence at a time
    valid = torch.nested.to_padded_tensor(data["response_mask"], 0).bool()
    s_c = torch.zeros(valid.shape)
    with torch.no_grad():
        for i, x in enumerate(ids):
            z = engine.module(input_ids=x[None]).logits[0, :-1]
            st = token_stats(z, x[1:])
            s_c[i, :r_len[i]] = st.s_centered[-r_len[i]:]
    want, _ = clip_v(s_c, after["advantages"], valid, mu=0.5, max_frac=None)
    assert 0 < int((valid & ~want).sum())
    assert_written_back(after, want)
    assert "entropy_rft/cov_a_sc" in metrics
