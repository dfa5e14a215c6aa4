"""entropy_rft.integrations.verl against the real verl 0.9.1 objects on the CPU (`make test-verl`; skipped where verl
is not installed).

Checked: the plugin loads through verl's own entry-point mechanism (and VERL_USE_EXTERNAL_MODULES) and registers the
trainer and the engine by name; verl's FSDP engine code path (packed and padded) returns log p, H and E_p[S] equal
to token_stats and to a float64 brute force on the same logits, and returns verl's own output when not asked, even
with the stored fields of earlier steps among its inputs; the driver's advantage step (verl's own, through
TransferQueue) keeps exactly masks.clip_b / clip_v over the whole batch, which differs from filtering micro-batches
separately. Then verl's whole step (the V1 trainer's _step_once: batch balancing, old-log-prob, reference forward,
values, advantage and filter, critic update, actor update, over 2 mini-batches x 2 epochs) through TransferQueue,
the tqbridge of every worker call, ActorRolloutRefWorker, TrainingWorker, the FSDP engine and verl's ppo_loss /
value_loss, for Clip_B, Clip_V (E_p[S] from the engine), an S*-sign filter, PPO with GAE and rejection sampling:
every optimizer step's gradient equals the token mean over that mini-batch's kept tokens written directly (the
critic's over every valid token), a filter that drops nothing gives stock verl's gradients, and mutations (wrong
mask, wrong denominator, the critic reading the filtered masks) fail those checks.

Stood in (verl has no CPU platform and its workers are Ray actors on GPUs): verl's device helpers point at "cpu";
the worker groups' Ray dispatch is one rank called in this process; the rollout is a batch put into TransferQueue as
verl's agent loop puts it; the replay buffer's sample, the rollout replicas' sleep and the MFU counter are stubs;
the engines run on the unwrapped module (as verl's own *_on_cpu tests build them) with an optimizer that records
each step's gradient and never steps; gloo's missing ReduceOp.AVG runs as SUM / group size. Everything else is
verl's code as installed."""

import copy
import dataclasses
import os
import subprocess
import sys
import types
from functools import partial
from pathlib import Path

import pytest
import torch

# the environment before this process imports verl (which sets variables, TORCH_CUDA_ARCH_LIST among them), for the
# fresh processes of the import-cost test
ENV_BEFORE_VERL = dict(os.environ)
pytest.importorskip("verl")
pytest.importorskip("transfer_queue")
import ray  # noqa: E402
import torch.distributed as dist  # noqa: E402
import transfer_queue as tq  # noqa: E402
import verl.utils.seqlen_balancing as seqlen_balancing  # noqa: E402
import verl.utils.torch_functional as verl_F  # noqa: E402
import verl.workers.engine.fsdp.transformer_impl as fsdp_impl  # noqa: E402
import verl.workers.engine_workers as engine_workers  # noqa: E402
from engine_step import (  # noqa: E402
    GRAD_RTOL,
    InProcessWorkerGroup,
    actor_rollout_ref_worker,
    all_reduce_with_average,
    flat_grad,
    fsdp_engine,
    policy_gradient,
    rel_diff,
    training_worker,
    value_gradient,
)
from omegaconf import OmegaConf  # noqa: E402
from tensordict import TensorDict  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402
from verl.trainer.ppo.v1 import get_trainer_cls  # noqa: E402
from verl.utils import tensordict_utils as tu  # noqa: E402
from verl.utils.dataset.dataset_utils import DatasetPadMode  # noqa: E402
from verl.workers.engine.base import EngineRegistry  # noqa: E402
from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead  # noqa: E402
from verl.workers.utils.losses import ppo_loss  # noqa: E402
from verl.workers.utils.padding import response_from_nested  # noqa: E402

import entropy_rft  # noqa: E402
from entropy_rft.core import masks  # noqa: E402
from entropy_rft.core.dynamics import TokenStats, token_stats  # noqa: E402
from entropy_rft.core.masks import clip_b, clip_v  # noqa: E402
from entropy_rft.core.methods import METHODS  # noqa: E402
from entropy_rft.integrations import verl as adapter  # noqa: E402
from entropy_rft.integrations.verl import (  # noqa: E402
    ENGINE_VENDOR,
    KEEP,
    S_EXPECT,
    TRAINER_NAME,
    WANT_S_EXPECT,
    EntropyFSDPEngine,
    EntropyRFTTrainer,
    Settings,
    check_config,
    stats_from_engine,
)

TINY = Path(entropy_rft.__file__).parent / "assets" / "countdown-tiny"
ROOT = Path(__file__).resolve().parents[1]


def nested(rows):
    return torch.nested.as_nested_tensor(list(rows), layout=torch.jagged)


# ---------------------------------------------------------------------------------------------------------------
# Plugin loading and registries


LOOKUPS = """
import os
import verl
from verl.trainer.ppo.v1 import get_trainer_cls
import verl.workers.engine
from verl.workers.engine.base import EngineRegistry
os.environ.update(VERL_ENGINE_DEVICE="cuda", VERL_ENGINE_VENDOR="entropy_rft")
try:
    print(get_trainer_cls("entropy_rft").__module__, EngineRegistry.get_engine_cls("language_model", "fsdp").__name__)
except ValueError:
    print("unknown")
"""


def _run_verl_import(env_extra: dict, code: str = LOOKUPS) -> subprocess.Popen:
    """A fresh python running `code`, in the environment this process had before it imported verl."""
    env = {
        k: v for k, v in ENV_BEFORE_VERL.items() if k not in ("VERL_USE_EXTERNAL_MODULES", "VERL_USE_EXTERNAL_PLUGINS")
    }
    env.update(env_extra)
    return subprocess.Popen(
        [sys.executable, "-W", "ignore", "-c", code],
        env=env,
        cwd=ROOT,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


@pytest.mark.slow
def test_plugin_loads_through_verl_entry_point_and_explicit_module():
    """A fresh `import verl` registers the trainer and the engine vendor through the `verl.plugins` entry point alone
    (verl_plugin: verl's own lookups, get_trainer_cls and EngineRegistry.get_engine_cls, import the adapter); with
    entry points off (VERL_USE_EXTERNAL_PLUGINS=none) the trainer is unknown, and VERL_USE_EXTERNAL_MODULES brings
    both back."""
    runs = {
        "entry point": _run_verl_import({}),
        "plugins off": _run_verl_import({"VERL_USE_EXTERNAL_PLUGINS": "none"}),
        "explicit": _run_verl_import(
            {"VERL_USE_EXTERNAL_PLUGINS": "none", "VERL_USE_EXTERNAL_MODULES": "entropy_rft.integrations.verl"}
        ),
    }
    out = {}
    for name, proc in runs.items():
        stdout, stderr = proc.communicate(timeout=300)
        assert proc.returncode == 0, stderr[-2000:]
        out[name] = stdout.strip().splitlines()[-1]
    both = "entropy_rft.integrations.verl EntropyFSDPEngine"
    assert out == {"entry point": both, "plugins off": "unknown", "explicit": both}


IMPORT_COST = """
import contextlib, io, json, os, sys, warnings
env = dict(os.environ)
err = io.StringIO()
with warnings.catch_warnings(record=True) as caught, contextlib.redirect_stderr(err):
    warnings.simplefilter("always")
    import verl
    filters = [repr(f) for f in warnings.filters]  # before catch_warnings restores them
print(json.dumps({"modules": sorted(sys.modules), "warnings": [str(w.message) for w in caught],
                  "stderr": err.getvalue(), "filters": filters,
                  "env": {k: v for k, v in os.environ.items() if env.get(k) != v}}))
"""


@pytest.mark.slow
def test_import_verl_with_the_plugin_costs_nothing():
    """`import verl` in a fresh process with the entry point (verl_plugin) against the same with entry points off:
    the only extra modules are entropy_rft, entropy_rft.integrations and the plugin itself (none of verl's V1 trainer
    or engine modules, pandas, datasets, fastapi, peft, accelerate, hydra: the adapter imported at once adds about
    1,500), the same warnings and stderr (none of verl's 'engine is not available'), the same environment changes
    (no TORCH_CUDA_ARCH_LIST) and warning filters."""
    import json

    runs = {
        name: _run_verl_import(env, IMPORT_COST)
        for name, env in (
            ("plugin", {}),
            ("off", {"VERL_USE_EXTERNAL_PLUGINS": "none"}),
            (
                "adapter",
                {"VERL_USE_EXTERNAL_PLUGINS": "none", "VERL_USE_EXTERNAL_MODULES": "entropy_rft.integrations.verl"},
            ),
        )
    }
    seen = {}
    for name, proc in runs.items():
        stdout, stderr = proc.communicate(timeout=300)
        assert proc.returncode == 0, stderr[-2000:]
        seen[name] = json.loads(stdout.strip().splitlines()[-1])
    plugin, off, adapter_on = seen["plugin"], seen["off"], seen["adapter"]
    extra = set(plugin["modules"]) - set(off["modules"])
    assert extra == {"entropy_rft", "entropy_rft.integrations", "entropy_rft.integrations.verl_plugin"}
    assert plugin["warnings"] == off["warnings"] and plugin["stderr"] == off["stderr"]
    assert plugin["env"] == off["env"] and "TORCH_CUDA_ARCH_LIST" not in plugin["env"]
    assert plugin["filters"] == off["filters"]
    # the check can tell: the adapter imported at once pulls in the heavy modules and verl's side effects
    heavy = set(adapter_on["modules"]) - set(off["modules"])
    assert {"verl.trainer.ppo.v1.trainer_sync", "pandas", "fastapi"} <= heavy
    assert adapter_on["env"].get("TORCH_CUDA_ARCH_LIST") == "8.0" and adapter_on["filters"] != off["filters"]


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
    base = {
        "entropy_rft": {"method": "clip_v", "options": {"mu": 8.5, "max_frac": None}},
        "algorithm": {
            "adv_estimator": "grpo",
            "use_kl_in_reward": False,
            "gamma": 1.0,
            "lam": 1.0,
            "norm_adv_by_std_in_grpo": True,
            "rollout_correction": None,
        },
        "actor_rollout_ref": {
            "actor": {"strategy": "fsdp"},
            "model": {"use_fused_kernels": False},
            "rollout": {"n": 4},
        },
    }
    cfg = OmegaConf.create(base)
    for key, value in over.items():
        OmegaConf.update(cfg, key, value, merge=False, force_add=True)
    return cfg


@pytest.mark.parametrize(
    "key,value,match",
    [
        ("actor_rollout_ref.model.use_fused_kernels", True, "use_fused_kernels"),
        ("actor_rollout_ref.actor.strategy", "megatron", "megatron"),
        ("algorithm.rollout_correction", {"bypass_mode": True}, "bypass_mode"),
    ],
)
def test_clip_v_refuses_configs_without_logits_or_entropies(key, value, match):
    """Clip_V and the monitor are refused, naming the setting, with fused kernels, Megatron and bypass mode; Clip_B runs
    with fused kernels and Megatron (it needs only verl's entropies) but not in bypass mode (no entropies at all)."""
    cfg = _verl_config(**{key: value})
    with pytest.raises(ValueError, match=match):
        check_config(Settings.from_config(cfg), cfg)
    monitor_cfg = _verl_config(**{key: value, "entropy_rft": {"method": "none", "options": {}}})
    with pytest.raises(ValueError, match=match):  # the monitor needs E_p[S] too (S_c)
        check_config(Settings.from_config(monitor_cfg), monitor_cfg)
    clip_b_cfg = _verl_config(**{key: value, "entropy_rft": {"method": "clip_b", "options": {}}})
    if match == "bypass_mode":
        with pytest.raises(ValueError, match=match):
            check_config(Settings.from_config(clip_b_cfg), clip_b_cfg)
    else:
        check_config(Settings.from_config(clip_b_cfg), clip_b_cfg)


@pytest.mark.parametrize(
    "key,value,match",
    [
        ("actor_rollout_ref.actor.entropy_coeff", 0.0, "entropy_coeff is 0"),
        ("actor_rollout_ref.model.use_fused_kernels", True, "use_fused_kernels=false"),
        ("actor_rollout_ref.model.use_remove_padding", False, "use_remove_padding=false"),
    ],
)
def test_tre_refuses_configs_without_its_bonus_term(key, value, match):
    """TRE's bonus is verl's entropy term with TRE's entropy: a zero entropy_coeff, fused kernels or the padded
    forward are refused at start-up, naming the setting."""
    base = {"actor_rollout_ref.actor.entropy_coeff": 0.001, "entropy_rft": {"method": "tre_k", "options": {}}}
    check_config(Settings.from_config(_verl_config(**base)), _verl_config(**base))  # TRE's own settings pass
    cfg = _verl_config(**{**base, key: value})
    with pytest.raises(ValueError, match=match):
        check_config(Settings.from_config(cfg), cfg)


def test_settings_name_what_is_wrong():
    """Unknown methods, non-filter methods and unknown keys fail at start-up with the fix in the message."""
    with pytest.raises(KeyError, match="known methods"):
        Settings(method="clip_q")
    with pytest.raises(ValueError, match="not a token filter"):
        Settings(method="dapo")
    for refused in ("grpo_dropout", "grpo_dropout+clip_b"):  # whole rollouts deleted: not in verl
        with pytest.raises(ValueError, match="built-in trainer"):
            Settings(method=refused)
    assert Settings(method="entrocraft+clip_b", options={"mu": 1.0, "lower_range": [0.5, 0.3]})  # a driver rule
    assert Settings(method="tre_k").top_entropy == (2, None)  # TRE-K's K 2, as TrainConfig.top_entropy
    assert Settings(method="tre_k+clip_b", options={"tre_top_p": 0.99}).top_entropy == (None, 0.99)
    assert Settings(method="clip_b").top_entropy is None
    with pytest.raises(ValueError, match="not both"):
        _ = Settings(method="tre_k", options={"tre_top_k": 2, "tre_top_p": 0.9}).top_entropy
    with pytest.raises(ValueError, match="top_k must be an integer >= 1"):
        _ = Settings(method="tre_k", options={"tre_top_k": 0}).top_entropy
    with pytest.raises(ValueError, match=r"clip_v takes options \[.*'max_frac'.*\], got \['muu'\]"):
        Settings(method="clip_v", options={"muu": 8.5})
    with pytest.raises(ValueError, match="clip_cov takes options"):
        Settings(method="clip_cov", options={"mu": 1.0})
    with pytest.raises(ValueError, match="takes method, options, seed"):
        Settings.from_config(OmegaConf.create({"entropy_rft": {"method": "clip_b", "mu": 2.5}}))
    with pytest.raises(ValueError, match="needs an `entropy_rft` section"):
        Settings.from_config(OmegaConf.create({}))
    with pytest.raises(ValueError, match="takes no options"):
        Settings(method="none", options={"mu": 2.5})
    assert Settings(method="none").monitor and Settings(method="none").needs_s_expect


@pytest.mark.parametrize(
    "name,method,options",
    [
        ("qwen2.5-7b-instruct_clip_b", "clip_b", {"mu": 2.5}),
        ("qwen2.5-7b-instruct_clip_v", "clip_v", {"mu": 8.5, "max_frac": 1e-4}),
    ],
)
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


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """One intra-op thread: the tiny model's matrices are small, and next to Ray's processes on a 2-core machine
    two threads made a forward and backward 6 to 60 times slower (measured 117 ms and 1.1 s against 18 ms)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def engine():
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(fsdp_impl, "get_device_id", lambda: "cpu")  # verl has no CPU platform (module docstring)
        mp.setattr(fsdp_impl, "get_device_name", lambda: "cpu")
        mp.setattr(seqlen_balancing, "get_device_name", lambda: "cpu")  # dynamic batch sizes
        mp.setattr(
            engine_workers,
            "get_torch_device",
            lambda: types.SimpleNamespace(  # TrainingWorker's metrics
                max_memory_allocated=lambda: 0, max_memory_reserved=lambda: 0
            ),
        )
        mp.setattr(dist, "all_reduce", partial(all_reduce_with_average, dist.all_reduce))
        created = not dist.is_initialized()
        if created:
            dist.init_process_group("gloo", rank=0, world_size=1, init_method="tcp://127.0.0.1:29517")
        eng = object.__new__(EntropyFSDPEngine)  # as verl's own *_on_cpu tests build it
        eng.module = AutoModelForCausalLM.from_pretrained(TINY).float().eval()
        eng.use_ulysses_sp, eng.ulysses_sequence_parallel_size, eng.ulysses_device_mesh = False, 1, None
        eng.engine_config = types.SimpleNamespace(entropy_checkpointing=False, entropy_from_logits_with_chunking=False)
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
    data = TensorDict(
        {
            "input_ids": nested(ids),
            "position_ids": nested(torch.arange(len(x)) for x in ids),
            "prompts": nested(prompts),
            "responses": nested(responses),
            "response_mask": nested(ones),
            "loss_mask": nested(ones),
            "temperature": torch.full((b,), temperature),
        },
        batch_size=b,
    )
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
    tu.assign_non_tensor(data, use_remove_padding=packed, calculate_entropy=True, **{WANT_S_EXPECT: True})
    seen = []
    handle = engine.module.register_forward_hook(lambda m, a, out: seen.append(out.logits.detach().clone()))
    try:
        with torch.no_grad():
            _, out = engine.forward_step(data, loss_function=None, forward_only=True)
    finally:
        handle.remove()
    z = seen[0].squeeze(0) if packed else torch.cat([seen[0][i, : len(x)] for i, x in enumerate(ids)])
    labels = torch.roll(torch.cat(ids), -1)  # verl's label layout: position t predicts token t + 1
    ours = token_stats(z, labels, temperature=0.7)
    mo = out["model_output"]
    assert set(mo) == {"log_probs", "entropy", S_EXPECT}
    for name, key in (("logp", "log_probs"), ("entropy", "entropy"), ("s_expect", S_EXPECT)):
        torch.testing.assert_close(mo[key].values(), getattr(ours, name), atol=1e-5, rtol=1e-5)
    logp, h, s_expect = brute_force(z, 0.7)
    torch.testing.assert_close(
        mo["log_probs"].values().double(), logp.gather(-1, labels[:, None]).squeeze(-1), atol=1e-5, rtol=1e-5
    )
    torch.testing.assert_close(mo["entropy"].values().double(), h, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(mo[S_EXPECT].values().double(), s_expect, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("precision", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("packed", [True, False], ids=["packed", "padded"])
def test_engine_s_expect_is_over_the_distribution_of_verls_log_p_and_h(engine, packed, precision, monkeypatch):
    """E_p[S] is the expectation under the very distribution verl's log p and H describe: token_stats of the
    tempered logits verl computes them from (recorded from its _scale_logits_by_temperature), to float32 round-off
    (the float32 test's tolerances), and float32. Checked under verl's default precision (FSDP MixedPrecision
    param_dtype bf16: bf16 weights and the forward under bf16 autocast; modelled by a bf16 copy of the weights and
    _autocast_dtype bf16), where verl divides the bf16 logits by the temperature in bf16: E_p[S] of float32
    quotients instead is off by bf16's rounding of each z_i / T (relative 2^-9), far outside the tolerance, and
    S_c = S* - E_p[S] would no longer have mean 0 under verl's distribution. That slip passes in float32."""
    module = copy.deepcopy(engine.module).to(precision)
    # eager attention: PyTorch's CPU SDPA kernel for bf16 needs AVX-512 (ATEN_CPU_CAPABILITY=avx2 raises "pack_vnni2
    # is only supported when avx512 is supported"); E_p[S] reads the logits, whichever kernel made them
    module.config._attn_implementation = "eager"
    monkeypatch.setattr(engine, "module", module)
    monkeypatch.setattr(engine, "_autocast_dtype", precision)
    tempered = []
    scale = fsdp_impl._scale_logits_by_temperature
    monkeypatch.setattr(
        fsdp_impl, "_scale_logits_by_temperature", lambda *a, **k: tempered.append(scale(*a, **k)) or tempered[-1]
    )
    data, ids = token_batch(engine.module.config.vocab_size)
    tu.assign_non_tensor(data, use_remove_padding=packed, calculate_entropy=True, **{WANT_S_EXPECT: True})
    with torch.no_grad():
        _, out = engine.forward_step(data, loss_function=None, forward_only=True)
    (z,) = tempered  # the one tensor verl's log p and H come from
    assert z.dtype == precision  # the shape being tested: under bf16 verl holds and tempers bf16 logits
    z = z.squeeze(0) if packed else torch.cat([z[i, : len(x)] for i, x in enumerate(ids)])
    got = out["model_output"][S_EXPECT].values()
    assert got.dtype == torch.float32
    torch.testing.assert_close(
        got, token_stats(z, torch.zeros(len(z), dtype=torch.long)).s_expect, atol=1e-6, rtol=1e-5
    )
    torch.testing.assert_close(got.double(), brute_force(z, 1.0)[2], atol=1e-6, rtol=1e-5)


def test_s_expect_survives_verl_micro_batching_and_reordering(engine):
    """Through verl's forward_backward_batch with dynamic batch sizes (several micro-batches, rows regrouped by
    length and restored), E_p[S] comes back row by row equal to one forward over the whole batch."""
    data, _ = token_batch(engine.module.config.vocab_size)
    tu.assign_non_tensor(data, use_remove_padding=True, calculate_entropy=True, **{WANT_S_EXPECT: True})
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
    instead of filtering on S* as if E_p[S] were 0; so does a TRE batch, whose bonus would silently be H's."""
    keys, fields, _ = driver_batch()
    with pytest.raises(RuntimeError, match=f"VERL_ENGINE_VENDOR={ENGINE_VENDOR}"):
        adapter.filter_batch(Settings("clip_v"), fields.exclude(S_EXPECT))
    with pytest.raises(RuntimeError, match=f"VERL_ENGINE_VENDOR={ENGINE_VENDOR}"):  # the monitor's S_c needs it too
        adapter.monitor_inputs(fields.exclude(S_EXPECT))
    # TRE: verl's own engine would train with H's bonus, silently; E_p[S] missing proves the engine is not ours
    with pytest.raises(RuntimeError, match=f"TRE's entropy in the update.*VERL_ENGINE_VENDOR={ENGINE_VENDOR}"):
        adapter.filter_batch(Settings("tre_k"), fields.exclude(S_EXPECT))


def test_engine_adds_nothing_unless_asked_and_refuses_fused_kernels(engine):
    """Without the trainer's request the engine's output is verl's own, also when the batch carries a stored E_p[S]
    tensor and a tensor under the request's own name (verl hands every later worker call every stored field: one
    name for both made the first actor update fail, issue 21); with fused kernels the request fails with the
    setting to change."""
    assert WANT_S_EXPECT != S_EXPECT
    data, ids = token_batch(engine.module.config.vocab_size, b=2)
    tu.assign_non_tensor(data, use_remove_padding=True, calculate_entropy=True)
    data[S_EXPECT] = data[WANT_S_EXPECT] = nested(torch.ones(len(x)) for x in ids)
    with torch.no_grad():
        _, out = engine.forward_step(data, loss_function=None, forward_only=True)
    assert set(out["model_output"]) == {"log_probs", "entropy"}
    tu.assign_non_tensor(data, use_fused_kernels=True, **{WANT_S_EXPECT: True})
    with pytest.raises(ValueError, match="use_fused_kernels=false"):
        engine._s_expect(types.SimpleNamespace(logits=None), {}, data)


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
    fields = TensorDict(
        {
            "uid": torch.arange(b) // n,
            "response_mask": nested(ones),
            "loss_mask": nested(ones),
            "rm_scores": nested(scores),
            "old_log_probs": nested(old),
            "entropy": nested(ent),
            S_EXPECT: nested(s_full),
        },
        batch_size=b,
    )
    keys = [f"g{i // n}_s{i}_0" for i in range(b)]
    return keys, fields, r_len


@pytest.fixture(scope="module")
def transfer_queue():
    ray.init(_node_ip_address="127.0.0.1", include_dashboard=False, num_cpus=8, log_to_driver=False)
    tq.init()
    yield
    tq.close()
    ray.shutdown()


def run_driver_step(method, options, partition, *, step=1, total_steps=10):
    """verl's V1 advantage step (EntropyRFTTrainer._compute_advantage) on a batch put into TransferQueue, at verl's
    global step `step` of total_training_steps; returns what TransferQueue then holds, padded, and the expected
    whole-batch stats."""
    keys, fields, _ = driver_batch()
    meta = tq.kv_batch_put(keys=keys, partition_id=partition, fields=fields)
    trainer = object.__new__(EntropyRFTTrainer)
    trainer.config = _verl_config(entropy_rft={"method": method, "options": options})
    trainer.entropy_rft = Settings.from_config(trainer.config)
    trainer.entropy_rft_generator = torch.Generator().manual_seed(0)
    trainer.global_steps, trainer.total_training_steps = step, total_steps
    metrics = {}
    trainer._compute_advantage(meta, metrics)
    after = tq.kv_batch_get(
        keys=keys,
        partition_id=partition,
        select_fields=["response_mask", "loss_mask", KEEP, "advantages", "old_log_probs", "entropy"],
    ).to_padded_tensor()
    s_expect = torch.nested.to_padded_tensor(response_from_nested(fields[S_EXPECT], fields["response_mask"]), 0.0)
    valid = torch.nested.to_padded_tensor(fields["response_mask"], 0).bool()
    stats = stats_from_engine(after["old_log_probs"], after["entropy"], s_expect)
    return after, stats, valid, metrics


def expected_keep(method, stats, adv, mask, **options):
    fn, score = {"clip_b": (clip_b, stats.s_star), "clip_v": (clip_v, stats.s_centered)}[method]
    return fn(score, adv, mask, **options)[0]


def assert_written_back(after, keep, valid):
    """TransferQueue's keep field equals the expected keep mask; verl's masks are untouched (the critic and the
    metrics read them; the actor update applies the keep mask itself)."""
    assert torch.equal(after[KEEP].bool(), keep), "the keep mask was not written"
    assert torch.equal(after["response_mask"].bool(), valid) and torch.equal(after["loss_mask"].bool(), valid)


@pytest.mark.slow
@pytest.mark.parametrize("method,options", [("clip_b", {"mu": 1.0}), ("clip_v", {"mu": 0.5, "max_frac": None})])
def test_driver_keep_mask_is_the_whole_batch_filter(transfer_queue, method, options):
    """After verl's advantage step on a TransferQueue batch, the keep field holds exactly masks.clip_b / clip_v over
    the whole batch (with verl's GRPO advantages), which differs from filtering the two micro-batches separately."""
    after, stats, valid, metrics = run_driver_step(method, options, f"train_{method}")
    adv = after["advantages"]
    want = expected_keep(method, stats, adv, valid, **options)
    assert int((valid & ~want).sum()) > 0
    assert_written_back(after, want, valid)
    halves = [slice(0, 8), slice(8, 16)]
    per_micro = torch.cat(
        [
            expected_keep(
                method,
                TokenStats(*(getattr(stats, f)[h] for f in ("logp", "entropy", "s_star", "s_expect"))),
                adv[h],
                valid[h],
                **options,
            )
            for h in halves
        ]
    )
    assert not torch.equal(per_micro, want)
    assert metrics["entropy_rft/kept_frac"] == pytest.approx(float((want & valid).sum() / valid.sum()))


@pytest.mark.slow
def test_mutation_disabled_write_back_is_detected(transfer_queue, monkeypatch):
    """Mutation check: with the keep mask's write-back disabled (every valid token written as kept), the check of
    the test above fails."""
    real = adapter.filter_batch

    def without_write_back(settings, data, **kw):
        out, metrics = real(settings, data, **kw)
        out[KEEP] = data["loss_mask"]
        return out, metrics

    monkeypatch.setattr(adapter, "filter_batch", without_write_back)
    after, stats, valid, _ = run_driver_step("clip_b", {"mu": 1.0}, "train_mutant")
    with pytest.raises(AssertionError, match="was not written"):
        assert_written_back(after, expected_keep("clip_b", stats, after["advantages"], valid, mu=1.0), valid)


@pytest.mark.slow
def test_driver_rsi_keep_mask_is_the_whole_batch_band(transfer_queue):
    """RSI-S on the driver (rsi_upper_bound 1.2): the keep field holds masks.rsi_band over the whole batch (the
    stored old log p and entropies), which drops tokens; advantages unchanged."""
    plain, stats, valid, _ = run_driver_step("clip_b", {"mu": 1e9}, "train_plain_rsi")
    after, _, _, metrics = run_driver_step("rsi", {"rsi_upper_bound": 1.2}, "train_rsi")
    want, _ = masks.rsi_band(stats, after["advantages"], valid, rsi_upper_bound=1.2)
    assert int((valid & ~want).sum()) > 0
    assert_written_back(after, want, valid)
    torch.testing.assert_close(after["advantages"], plain["advantages"])
    assert metrics["entropy_rft/rsi_drop_high"] > 0


@pytest.mark.slow
def test_driver_stare_weights_the_whole_batch_advantages(transfer_queue):
    """STARE on the driver (variant C2, P 0.2, its gate open): masks unchanged, and verl's GRPO advantages times
    masks.stare_weights over the whole batch (the behaviour policy's log p; step.py, departure 3)."""
    plain, stats, valid, _ = run_driver_step("clip_b", {"mu": 1e9}, "train_plain_stare")  # mu huge: nothing dropped
    options = {"variant": "C2", "top_p_ratio": 0.2, "entropy_gate": 100.0}
    after, _, _, metrics = run_driver_step("stare", options, "train_stare")
    weights, _ = masks.stare_weights(stats.logp, plain["advantages"], valid, stats.entropy, **options)
    assert int((weights == 1.1).sum()) > 0 and int((weights == 0.9).sum()) > 0
    assert_written_back(after, valid, valid)
    torch.testing.assert_close(after["advantages"], plain["advantages"] * weights * valid)
    assert metrics["entropy_rft/gate_open"] == 1.0


def driver_scores() -> torch.Tensor:
    """Each driver_batch rollout's score: its rm_scores summed over the response (the reward on its last token)."""
    _, fields, _ = driver_batch()
    return torch.stack([row.sum() for row in fields["rm_scores"].unbind()])


@pytest.mark.slow
@pytest.mark.parametrize(
    "band,regime",
    [(((0.0, 0.0), (0.01, 0.01)), 1.0), (((5.0, 5.0), (6.0, 6.0)), -1.0), (((0.0, 0.0), (6.0, 6.0)), 0.0)],
    ids=["above: RAFT++", "below: NSR", "inside: GRPO"],
)
def test_driver_entrocraft_rewrites_the_whole_batch_advantages(transfer_queue, band, regime):
    """Entrocraft on the driver, with the batch's mean entropy (over every valid token, about 0.5 here) above, below
    and inside its band: the advantages become each rollout's reward clamped at 0 from below (RAFT++) or above (NSR)
    on its valid tokens, or stay verl's GRPO advantages; no token is dropped (advantages.entrocraft)."""
    plain, stats, valid, _ = run_driver_step("clip_b", {"mu": 1e9}, f"train_plain_entrocraft_{regime}")
    options = {"lower_range": list(band[0]), "upper_range": list(band[1])}
    after, _, _, metrics = run_driver_step("entrocraft", options, f"train_entrocraft_{regime}")
    entropy = float((stats.entropy * valid).sum() / valid.sum())
    low, high = band[0][0], band[1][0]  # the band at step 1 of 10: its ranges are constant here
    assert {1.0: entropy > high, -1.0: entropy < low, 0.0: low <= entropy <= high}[regime], entropy
    scores = driver_scores()[:, None] * valid
    want = {1.0: scores.clamp(min=0.0), -1.0: scores.clamp(max=0.0), 0.0: plain["advantages"]}[regime]
    assert_written_back(after, valid, valid)
    torch.testing.assert_close(after["advantages"], want.to(after["advantages"].dtype))
    assert metrics["entropy_rft/regime"] == regime
    if regime == 1.0:
        assert not torch.equal(after["advantages"], plain["advantages"])


@pytest.mark.slow
def test_driver_entrocraft_band_follows_verls_step(transfer_queue):
    """The band anneals over verl's 1-based global step of total_training_steps as the built-in trainer's does over
    its steps (advantages.entrocraft_band): at step 5 of 10, halfway from (0.6, 0.7) to (0.4, 0.5)."""
    from entropy_rft.core.advantages import entrocraft_band

    _, _, _, first = run_driver_step("entrocraft", {}, "train_entrocraft_step1", step=1, total_steps=10)
    _, _, _, mid = run_driver_step("entrocraft", {}, "train_entrocraft_step5", step=5, total_steps=10)
    for at, metrics in ((1, first), (5, mid)):
        assert (metrics["entropy_rft/band_low"], metrics["entropy_rft/band_high"]) == entrocraft_band(at, 10)
    assert mid["entropy_rft/band_low"] == pytest.approx(0.5) and mid["entropy_rft/band_high"] == pytest.approx(0.6)
    assert first["entropy_rft/band_low"] == pytest.approx(0.58)


@pytest.mark.parametrize(
    "method, options, sent",
    [("tre_k", {}, {adapter.TOP_K: 2}), ("tre_k", {"tre_top_p": 0.9}, {adapter.TOP_P: 0.9}), ("clip_b", {}, {})],
)
def test_the_tre_request_reaches_every_data_parallel_rank(transfer_queue, monkeypatch, method, options, sent):
    """The driver's actor update (EntropyRFTTrainer._update_actor) puts TRE's request in the batch's extra_info;
    verl 0.9.1's dispatch chunking for two data-parallel ranks (BatchData.chunk, what update_actor's
    make_nd_compute_dataproto_dispatch_fn applies: the TransferQueue batch's meta, split) hands it to both ranks'
    halves, whose extra_info each worker makes its micro-batches' non-tensor data (the whole-step tests, one rank);
    afterwards the driver's batch is as it was. A method without TRE sends nothing."""
    from verl.protocol import BatchData

    keys, fields, _ = driver_batch()
    batch = tq.kv_batch_put(keys=keys, partition_id=f"request_{method}_{len(options)}", fields=fields)
    batch.extra_info = {"temperature": 1.0}
    trainer = object.__new__(EntropyRFTTrainer)
    trainer.entropy_rft = Settings(method=method, options=options)
    ranks = []

    def dispatch(self, meta, metrics):
        ranks.extend((len(half), dict(half.extra_info)) for half in BatchData(meta).chunk(chunks=2))

    monkeypatch.setattr(EntropyRFTTrainer, "_update_actor_kept", dispatch)
    trainer._update_actor(batch, {})
    assert ranks == [(len(keys) // 2, {"temperature": 1.0} | sent)] * 2
    assert batch.extra_info == {"temperature": 1.0}


@pytest.mark.slow
def test_driver_clip_cov_zeroes_whole_batch_selection(transfer_queue):
    """Clip-Cov on the driver: masks unchanged, and exactly the tokens losses.select_clip_cov picks over the whole
    batch (same generator seed) get advantage 0; the others keep verl's GRPO advantage."""
    from entropy_rft.core.losses import select_clip_cov

    plain, _, valid, _ = run_driver_step("clip_b", {"mu": 1e9}, "train_plain")  # mu huge: nothing dropped
    after, stats, _, _ = run_driver_step("clip_cov", {"ratio": 0.05, "lb": -1e9, "ub": 1e9}, "train_cov")
    selected = select_clip_cov(
        plain["advantages"], stats.logp, valid, ratio=0.05, lb=-1e9, ub=1e9, generator=torch.Generator().manual_seed(0)
    )
    assert int(selected.sum()) == max(int(0.05 * int(valid.sum())), 1)
    assert_written_back(after, valid, valid)
    torch.testing.assert_close(after["advantages"], torch.where(selected, 0.0, plain["advantages"]) * valid)


# ---------------------------------------------------------------------------------------------------------------
# verl's whole step on the CPU: the V1 trainer's own _step_once (batch balancing, old-log-prob, reference forward,
# values, advantage and filter, critic update, actor update) through TransferQueue, tqbridge, ActorRolloutRefWorker,
# TrainingWorker, the FSDP engine code path and verl's ppo_loss / value_loss. Stood in (module docstring): the
# worker groups' Ray dispatch (one rank, in this process), the rollout (a batch put into TransferQueue as verl's
# agent loop puts it), the replay buffer's sample and the rollout replicas' sleep. Oracle: an optimizer that
# records each mini-batch's gradient and never steps, so every mini-batch sees the same weights and its gradient
# is compared with the token mean over that mini-batch's tokens written directly (one sequence at a time).

GROUPS, N = 4, 4  # prompts x rollouts per prompt: 16 rows
MINI_BATCHES, EPOCHS = 2, 2  # 4 optimizer steps per update


@pytest.fixture(scope="module")
def verl_cfg():
    """verl's own ppo_trainer config (Hydra), models at the shipped tiny Qwen2; each test copies and edits it."""
    from hydra import compose, initialize_config_module

    with initialize_config_module(config_module="verl.trainer.config", version_base=None):
        return compose(
            config_name="ppo_trainer",
            overrides=[
                f"actor_rollout_ref.model.path={TINY}",
                f"critic.model.path={TINY}",
                f"actor_rollout_ref.rollout.n={N}",
                f"actor_rollout_ref.actor.ppo_mini_batch_size={GROUPS // MINI_BATCHES}",
                f"actor_rollout_ref.actor.ppo_epochs={EPOCHS}",
                "actor_rollout_ref.rollout.temperature=1.0",
                "actor_rollout_ref.actor.use_kl_loss=false",
                "algorithm.use_kl_in_reward=false",
                "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
                "critic.ppo_micro_batch_size_per_gpu=2",
                "actor_rollout_ref.rollout.calculate_log_probs=false",
                "algorithm.adv_estimator=grpo",
                "trainer.critic_warmup=0",
                # one data-parallel rank, as the in-process stand-in of verl's dispatch runs (the monitor's step sizes
                # compose mini-batches over trainer.nnodes x n_gpus_per_node ranks: adapter.actor_dp_size)
                "trainer.nnodes=1",
                "trainer.n_gpus_per_node=1",
            ],
        )


@pytest.fixture(scope="module")
def models():
    """The tiny policy (actor), a copy as the reference policy, and a value model of the same shape
    (Qwen2ForTokenClassification, one label: verl's critic architecture); all float32, weights never change."""
    from transformers import AutoModelForTokenClassification

    actor = AutoModelForCausalLM.from_pretrained(TINY).float()
    torch.manual_seed(0)  # the value head is initialised at random
    critic = AutoModelForTokenClassification.from_pretrained(TINY, num_labels=1).float()
    critic.dropout.p = 0.0  # the head's dropout (0.1 by default) would make each gradient random
    return types.SimpleNamespace(actor=actor, ref=AutoModelForCausalLM.from_pretrained(TINY).float(), critic=critic)


def rollout_batch(policy, *, seed, rollout_noise=0.0):
    """GROUPS x N rollouts as verl's agent loop puts them into TransferQueue: nested prompts, responses, input_ids,
    position_ids, response_mask = loss_mask, rm_scores (a reward in [0, 1] on the last token), uid, and
    rollout_log_probs (the policy's own log-probs plus Gaussian noise of that std, for rollout correction); and
    the tags."""
    g = torch.Generator().manual_seed(seed)
    b, vocab = GROUPS * N, policy.config.vocab_size
    prompts = [torch.randint(2, vocab, (int(n),), generator=g) for n in torch.randint(2, 6, (b,), generator=g)]
    responses = [torch.randint(2, vocab, (int(n),), generator=g) for n in torch.randint(3, 11, (b,), generator=g)]
    ids = [torch.cat([p, r]) for p, r in zip(prompts, responses)]
    ones = [torch.ones(len(r), dtype=torch.int64) for r in responses]
    scores = [torch.zeros(len(r)) for r in responses]
    for s in scores:  # graded rewards: every group has positive and negative advantages
        s[-1] = float(torch.rand((), generator=g))
    fields = TensorDict(
        {
            "prompts": nested(prompts),
            "responses": nested(responses),
            "input_ids": nested(ids),
            "position_ids": nested(torch.arange(len(x)) for x in ids),
            "response_mask": nested(ones),
            "loss_mask": nested(ones),
            "rm_scores": nested(scores),
            "uid": torch.arange(b) // N,
        },
        batch_size=b,
    )
    if rollout_noise:
        logp = [reference_stats(policy, x, len(r)).logp for x, r in zip(ids, responses)]
        fields["rollout_log_probs"] = nested(lp + rollout_noise * torch.randn(lp.shape, generator=g) for lp in logp)
    tags = [
        {"seq_len": len(x), "prompt_len": len(p), "response_len": len(r)} for x, p, r in zip(ids, prompts, responses)
    ]
    return fields, tags


@torch.no_grad()
def reference_stats(policy, ids, response_len):
    """token_stats of a sequence's response tokens under the policy (temperature 1), one sequence alone."""
    logits = policy(input_ids=ids[None]).logits[0, :-1]
    return token_stats(logits[-response_len:], ids[1:][-response_len:])


def engine_config(*, remove_padding=True, dynamic_bsz=True):
    """Dynamic batch sizes with a 24-token budget (several micro-batches of rows regrouped by length), or fixed
    micro-batches of 2 rows for training and 4 for the forwards."""
    from verl.workers.config import FSDPEngineConfig

    return FSDPEngineConfig(
        strategy="fsdp",
        use_dynamic_bsz=dynamic_bsz,
        max_token_len_per_gpu=24,
        infer_max_token_len_per_gpu=24,
        micro_batch_size_per_gpu=2,
        infer_micro_batch_size_per_gpu=4,
        use_remove_padding=remove_padding,
        use_torch_compile=False,
    )


@dataclasses.dataclass
class Step:
    """What one whole step left: the rows in the order the workers saw them (after verl's batch balancing), each
    row's token ids and response length, TransferQueue's fields after the step (padded [B, T], in that order), the
    gradients each engine's optimizer recorded (one per mini-batch and epoch), and the step's metrics."""

    keys: list
    ids: list
    response_lens: list
    after: TensorDict
    actor_grads: list
    critic_grads: list
    metrics: dict

    @property
    def valid(self):
        """Every response token of the rollout, [B, T] (from the response lengths, not from TransferQueue)."""
        return torch.arange(self.after["advantages"].shape[1])[None, :] < torch.tensor(self.response_lens)[:, None]


def whole_step(
    cfg,
    models,
    partition,
    *,
    adapter_on=True,
    critic=False,
    seed=0,
    rollout_noise=0.0,
    remove_padding=True,
    dynamic_bsz=True,
    tokenizer=None,
) -> Step:
    """One _step_once of verl's sync V1 trainer (EntropyRFTTrainer, or verl's own PPOTrainerSync with its own
    engines when adapter_on is False) on a fresh batch in TransferQueue partition `partition`; `tokenizer` the
    trainer's (default: a stand-in with the eos id alone, all that batch balancing reads)."""
    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithValueHead
    from verl.workers.utils.losses import value_loss

    lm_engine = EntropyFSDPEngine if adapter_on else FSDPEngineWithLMHead
    eng_cfg = engine_config(remove_padding=remove_padding, dynamic_bsz=dynamic_bsz)
    actor = training_worker(
        fsdp_engine(lm_engine, models.actor, eng_cfg),
        partial(ppo_loss, config=omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)),
        remove_padding,
    )
    ref = training_worker(fsdp_engine(lm_engine, models.ref, eng_cfg), None, remove_padding)
    trainer = object.__new__(EntropyRFTTrainer if adapter_on else get_trainer_cls("sync"))
    trainer.config = cfg
    if adapter_on:
        trainer.entropy_rft = Settings.from_config(cfg)
        check_config(trainer.entropy_rft, cfg)
        trainer.entropy_rft_generator = torch.Generator().manual_seed(0)
    trainer.actor_rollout_wg = trainer.ref_policy_wg = InProcessWorkerGroup(actor_rollout_ref_worker(actor, ref))
    trainer.use_reference_policy, trainer.ref_in_actor, trainer.use_critic = True, False, critic
    if critic:
        critic_worker = training_worker(
            fsdp_engine(FSDPEngineWithValueHead, models.critic, eng_cfg),
            partial(value_loss, config=omega_conf_to_dataclass(cfg.critic)),
            remove_padding,
        )
        trainer.critic_wg = InProcessWorkerGroup(critic_worker)
    fields, tags = rollout_batch(models.actor, seed=seed, rollout_noise=rollout_noise)
    keys = [f"{partition}_{i // N}_{i % N}_0" for i in range(len(tags))]
    meta = tq.kv_batch_put(keys=keys, partition_id=partition, fields=fields, tags=tags)
    trainer.replay_buffer = types.SimpleNamespace(sample=lambda **kwargs: (meta, {}))  # the rollout's batch
    trainer.reward_loop_manager = types.SimpleNamespace(reward_loop_worker_handles=[])  # scores are in the batch
    trainer.checkpoint_manager = types.SimpleNamespace(sleep_replicas=lambda: None)  # no rollout replicas
    trainer.tokenizer = tokenizer or types.SimpleNamespace(eos_token_id=models.actor.config.eos_token_id)
    trainer.curr_step_profile, trainer.global_steps, trainer.total_training_steps = False, 1, 10
    metrics = {}
    out = trainer._step_once(metrics, {}, len(keys))
    order = [keys.index(k) for k in out.keys]
    after = tq.kv_batch_get(keys=out.keys, partition_id=partition).exclude(
        "uid", "prompts", "input_ids", "position_ids"
    )
    if S_EXPECT in after.keys():  # the engine's full-sequence E_p[S], cut to the response tokens as verl cuts H
        after[S_EXPECT] = response_from_nested(after[S_EXPECT], after["loss_mask"])
    return Step(
        list(out.keys),
        [fields["input_ids"][i] for i in order],
        [len(fields["responses"][i]) for i in order],
        after.to_padded_tensor(),
        actor.engine.optimizer.grads,
        critic_worker.engine.optimizer.grads if critic else [],
        metrics,
    )


def mini_batches(step):
    """Row blocks of each optimizer step: verl's iterator without shuffling takes contiguous blocks in the
    workers' row order, MINI_BATCHES per epoch, EPOCHS times."""
    size = len(step.keys) // MINI_BATCHES
    return [list(range(j * size, (j + 1) * size)) for j in range(MINI_BATCHES)] * EPOCHS


def check_actor(step, policy, terms, count_mask):
    """Every actor optimizer step's gradient = the token mean of A * ratio over the mini-batch's `terms` tokens,
    divided by the mini-batch's `count_mask` tokens."""
    adv = step.after["advantages"]
    assert len(step.actor_grads) == MINI_BATCHES * EPOCHS
    for k, (rows, got) in enumerate(zip(mini_batches(step), step.actor_grads, strict=True)):
        want = policy_gradient(
            policy,
            [(step.ids[r], step.response_lens[r]) for r in rows],
            adv[rows],
            terms[rows].float(),
            count_mask[rows].sum(),
        )
        assert rel_diff(got, want) < GRAD_RTOL, f"actor step {k}: relative difference {rel_diff(got, want):.2e}"


def check_critic(step, critic, mask):
    """Every critic optimizer step's gradient = the value loss's token mean over the mini-batch's `mask` tokens."""
    assert len(step.critic_grads) == MINI_BATCHES * EPOCHS
    for k, (rows, got) in enumerate(zip(mini_batches(step), step.critic_grads, strict=True)):
        want = value_gradient(
            critic,
            [(step.ids[r], step.response_lens[r]) for r in rows],
            step.after["returns"][rows],
            mask[rows].float(),
        )
        assert rel_diff(got, want) < GRAD_RTOL, f"critic step {k}: relative difference {rel_diff(got, want):.2e}"


def whole_batch_keep(step, policy, method, options, dropped_range=(0.03, 0.75)):
    """The filter's keep mask over the whole batch, from the statistics verl's old-log-prob step stored (checked
    here against token_stats of each sequence alone, to float32 round-off of the same logits packed vs alone) and
    verl's advantages: masks.* called directly. The filter must drop a fraction of the tokens in dropped_range."""
    valid = step.valid
    stats = stats_from_engine(step.after["old_log_probs"], step.after["entropy"], step.after.get(S_EXPECT, None))
    for r, (x, n) in enumerate(zip(step.ids, step.response_lens)):
        ours = reference_stats(policy, x, n)
        torch.testing.assert_close(stats.s_star[r, :n], ours.s_star, atol=1e-5, rtol=1e-4)
        if S_EXPECT in step.after.keys():
            torch.testing.assert_close(stats.s_expect[r, :n], ours.s_expect, atol=1e-5, rtol=1e-4)
    score = stats.s_centered if METHODS.get(method).score == "s_centered" else stats.s_star
    keep, _ = METHODS.get(method).filter(
        score, step.after["advantages"], valid, **{**METHODS.get(method).options, **options}
    )
    dropped = int((valid & ~keep).sum()) / int(valid.sum())
    assert dropped_range[0] <= dropped < dropped_range[1], f"dropped {dropped:.2f}, expected within {dropped_range}"
    assert torch.equal(step.after[KEEP].bool(), keep & valid)
    return keep & valid


def step_config(verl_cfg, method, options, **over):
    cfg = copy.deepcopy(verl_cfg)
    OmegaConf.set_struct(cfg, False)
    cfg.entropy_rft = {"method": method, "options": options}
    for key, value in over.items():
        OmegaConf.update(cfg, key, value, merge=False)
    return cfg


GAE = {"algorithm.adv_estimator": "gae"}
# verl's token-level rejection sampling on 0.5 (log r)^2 <= 0.02 (|log r| <= 0.2), r = pi_old / pi_rollout, with
# rollout log-probs 0.15 off (std) the policy's: it rejects about a sixth of the tokens
REJECTION = {
    "algorithm.rollout_correction.rollout_rs": "token_k2",
    "algorithm.rollout_correction.rollout_rs_threshold": 0.02,
    "actor_rollout_ref.rollout.calculate_log_probs": True,
}
ROLLOUT_NOISE = 0.15


@pytest.mark.slow
@pytest.mark.parametrize(
    "method,options,layout",
    [
        ("clip_b", {"mu": 0.5}, {}),
        ("clip_v", {"mu": 0.5, "max_frac": None}, {"remove_padding": False, "dynamic_bsz": False}),
        ("s_sign:mask:neg_s:neg_samples", {}, {"dynamic_bsz": False}),
    ],
    ids=["clip_b-packed-dynamic_bsz", "clip_v-padded-micro2", "s_sign-packed-micro2"],
)
def test_whole_step_actor_gradients_are_the_kept_token_mean(
    transfer_queue, engine, verl_cfg, models, method, options, layout
):
    """verl's whole GRPO step (2 mini-batches x 2 epochs) with the filter: the keep mask is the filter over the
    whole batch; every actor optimizer step's gradient is the token mean over the mini-batch's kept tokens; the masks
    every other reader sees are verl's own again after the update; Clip_V's E_p[S] (stored in TransferQueue) reaches
    the reference forward and the update without harm."""
    step = whole_step(step_config(verl_cfg, method, options), models, f"actor_{method}", **layout)
    keep = whole_batch_keep(step, models.actor, method, options)
    valid = step.valid
    assert torch.equal(step.after["response_mask"].bool(), valid) and torch.equal(step.after["loss_mask"].bool(), valid)
    check_actor(step, models.actor, keep, keep)
    assert step.metrics["entropy_rft/kept_frac"] == pytest.approx(float(keep.sum() / valid.sum()))


@pytest.mark.slow
def test_whole_step_stare_gradients_use_the_weighted_advantages(transfer_queue, engine, verl_cfg, models):
    """verl's whole GRPO step with STARE (variant C2, P 0.2, gate open): the advantages the actor reads are verl's
    per-row GRPO advantage times masks.stare_weights over the whole batch (from the stored old log p), no token is
    dropped, and every actor optimizer step's gradient is the token mean of the weighted A * ratio (step.py,
    departure 3: the authors' weight on the clipped surrogate)."""
    options = {"variant": "C2", "top_p_ratio": 0.2, "entropy_gate": 100.0}
    step = whole_step(step_config(verl_cfg, "stare", options), models, "actor_stare")
    valid, adv = step.valid, step.after["advantages"]
    stats = stats_from_engine(step.after["old_log_probs"], step.after["entropy"], None)
    weights, _ = masks.stare_weights(stats.logp, adv, valid, stats.entropy, **options)  # omega > 0 keeps A's sign
    assert int((weights[valid] != 1).sum()) > 0
    plain = adv / weights
    for r in range(len(step.ids)):
        row = plain[r][valid[r]]
        torch.testing.assert_close(row, row[:1].expand_as(row))  # one GRPO advantage per response
    assert torch.equal(step.after[KEEP].bool(), valid)
    check_actor(step, models.actor, valid, valid)
    assert step.metrics["entropy_rft/gate_open"] == 1.0


def bonus_gradient(policy, sequences, advantages, terms, count, coef, entropy):
    """policy_gradient's reference with an entropy bonus: autograd of -(1/count) sum over the `terms` tokens of
    (A * ratio + coef * entropy(logits)), as verl's ppo_loss subtracts entropy_coeff times the token mean of its
    engine's entropy (temperature 1)."""
    policy.zero_grad(set_to_none=True)
    total = 0.0
    for r, (x, n) in enumerate(sequences):
        logits = policy(input_ids=x[None]).logits[0, :-1].float()[-n:]
        logp = torch.log_softmax(logits, -1).gather(-1, x[1:][-n:, None]).squeeze(-1)
        term = advantages[r, :n] * (logp - logp.detach()).exp() + coef * entropy(logits)
        total = total - (term * terms[r, :n]).sum()
    (total / count).backward()
    grads = flat_grad(policy)
    policy.zero_grad(set_to_none=True)
    return grads


@pytest.mark.slow
@pytest.mark.parametrize("method,options", [("tre_k", {}), ("tre_k+clip_b", {"mu": 0.5})])
def test_whole_step_tre_bonus_is_verls_entropy_term_with_tres_entropy(
    transfer_queue, engine, verl_cfg, models, method, options
):
    """verl's whole GRPO step with TRE-K (K 2) at entropy_coeff 0.05: every actor optimizer step's gradient is the
    token mean of A * ratio + 0.05 x TRE's scaled top-2 entropy (core/tre.top_entropy, oracle-tested against the
    authors' code) over the mini-batch's loss tokens (Clip_B's kept ones under tre_k+clip_b), and not the same with
    the full entropy; the old-log-prob forward still stored the full entropy (S*)."""
    from entropy_rft.core.tre import top_entropy

    coef = 0.05
    cfg = step_config(verl_cfg, method, options, **{"actor_rollout_ref.actor.entropy_coeff": coef})
    step = whole_step(cfg, models, f"actor_{method.replace('+', '_')}")
    valid = step.valid
    keep = whole_batch_keep(step, models.actor, "clip_b", options) if "clip_b" in method else valid
    sequences = [(step.ids[r], step.response_lens[r]) for r in range(len(step.ids))]
    for r, (x, n) in enumerate(sequences):  # the stored entropy is the full one, for S* and the metrics
        torch.testing.assert_close(
            step.after["entropy"][r, :n], reference_stats(models.actor, x, n).entropy, atol=1e-5, rtol=1e-4
        )
    adv = step.after["advantages"]
    tre = partial(top_entropy, top_k=2)
    full = lambda z: -(torch.softmax(z, -1) * torch.log_softmax(z, -1)).sum(-1)  # noqa: E731
    assert len(step.actor_grads) == MINI_BATCHES * EPOCHS
    for k, (rows, got) in enumerate(zip(mini_batches(step), step.actor_grads, strict=True)):
        args = ([sequences[r] for r in rows], adv[rows], keep[rows].float(), keep[rows].sum(), coef)
        want = bonus_gradient(models.actor, *args, tre)
        assert rel_diff(got, want) < GRAD_RTOL, f"actor step {k}: relative difference {rel_diff(got, want):.2e}"
        assert rel_diff(got, bonus_gradient(models.actor, *args, full)) > 100 * GRAD_RTOL  # TRE's, not H


@pytest.mark.slow
def test_whole_step_entrocraft_gradients_use_its_advantages(transfer_queue, engine, verl_cfg, models):
    """verl's whole GRPO step with Entrocraft above its band (the tiny policy's entropy on random tokens is far above
    0.01): the advantages the actor reads are each rollout's reward, max(R, 0) = R here, on every valid token (RAFT++,
    no group baseline), no token is dropped, and every actor optimizer step's gradient is the token mean of
    R * ratio."""
    options = {"lower_range": [0.0, 0.0], "upper_range": [0.01, 0.01]}
    step = whole_step(step_config(verl_cfg, "entrocraft", options), models, "actor_entrocraft")
    valid, adv = step.valid, step.after["advantages"]
    scores = step.after["rm_scores"].sum(-1)
    torch.testing.assert_close(adv, (scores[:, None] * valid).to(adv.dtype))
    assert torch.equal(step.after[KEEP].bool(), valid)
    check_actor(step, models.actor, valid, valid)
    assert step.metrics["entropy_rft/regime"] == 1.0


@pytest.mark.slow
@pytest.mark.parametrize("loss_mode", ["cispo", "dppo_tv", "sapo", "geo_mean"])
def test_whole_step_clip_b_on_verls_engine_losses(transfer_queue, engine, verl_cfg, models, loss_mode):
    """Clip_B on verl's own cispo, dppo_tv, sapo and geo_mean (actor.policy_loss.loss_mode), verl's whole step with
    fixed micro-batches of 2 rows: the keep mask is the whole-batch filter and every actor optimizer step's gradient is
    that loss's over the kept tokens at ratio 1 (the weights never move): cispo and dppo_tv the token mean over the
    mini-batch's kept tokens (weight clip(1) = min(1, c) = 1, every token inside DPPO's region); sapo the mean over
    the mini-batch's rows (verl's global_batch_size counts every row) of each row's mean over its kept tokens (the
    gate's slope is 1 at r = 1); geo_mean each row's mean over its kept tokens, summed over the micro-batches with
    each divided by its own 2 rows (verl's torch.mean per micro-batch, which nothing rescales)."""
    cfg = step_config(verl_cfg, "clip_b", {"mu": 0.5}, **{"actor_rollout_ref.actor.policy_loss.loss_mode": loss_mode})
    step = whole_step(cfg, models, f"loss_{loss_mode}", dynamic_bsz=False)
    keep = whole_batch_keep(step, models.actor, "clip_b", {"mu": 0.5})
    if loss_mode in ("cispo", "dppo_tv"):
        check_actor(step, models.actor, keep, keep)
        return
    per_row = keep.float() / keep.sum(-1, keepdim=True).clamp(min=1)  # each row's mean over its kept tokens
    adv = step.after["advantages"]
    assert len(step.actor_grads) == MINI_BATCHES * EPOCHS
    for k, (rows, got) in enumerate(zip(mini_batches(step), step.actor_grads, strict=True)):
        count = len(rows) if loss_mode == "sapo" else 2
        want = policy_gradient(
            models.actor, [(step.ids[r], step.response_lens[r]) for r in rows], adv[rows], per_row[rows], count
        )
        assert rel_diff(got, want) < GRAD_RTOL, f"actor step {k}: relative difference {rel_diff(got, want):.2e}"


@pytest.mark.slow
def test_example_clip_v_config_runs_the_whole_step(transfer_queue, engine, models):
    """examples/verl/qwen2.5-7b-instruct_clip_v.yaml (issue 21: it died at its first update) with only the model and
    the batch shrunk to the tiny policy: verl's whole step runs, and the actor's gradients are the token mean over
    the kept tokens of Clip_V at the paper's mu 8.5 and cap 1e-4 (which drops at most one token here)."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(ROOT / "examples" / "verl"), version_base=None):
        cfg = compose(
            config_name="qwen2.5-7b-instruct_clip_v",
            overrides=[
                f"actor_rollout_ref.model.path={TINY}",
                f"critic.model.path={TINY}",
                f"data.train_batch_size={GROUPS}",
                f"actor_rollout_ref.rollout.n={N}",
                f"actor_rollout_ref.actor.ppo_mini_batch_size={GROUPS // MINI_BATCHES}",
                f"actor_rollout_ref.actor.ppo_epochs={EPOCHS}",
                "actor_rollout_ref.rollout.calculate_log_probs=false",
            ],
        )
    step = whole_step(
        cfg,
        models,
        "example_clip_v",
        remove_padding=cfg.actor_rollout_ref.model.use_remove_padding,
        dynamic_bsz=cfg.actor_rollout_ref.actor.use_dynamic_bsz,
    )
    keep = whole_batch_keep(step, models.actor, "clip_v", dict(cfg.entropy_rft.options), dropped_range=(0.0, 0.01))
    check_actor(step, models.actor, keep, keep)


@pytest.mark.slow
def test_whole_step_ppo_gae_critic_learns_on_every_valid_token(transfer_queue, engine, verl_cfg, models):
    """PPO with GAE (the paper's Table 4) + Clip_B: the critic's every optimizer step is the value loss's token
    mean over every valid response token (as the built-in trainer's critic), the actor's over the kept tokens."""
    step = whole_step(step_config(verl_cfg, "clip_b", {"mu": 0.5}, **GAE), models, "gae", critic=True)
    keep = whole_batch_keep(step, models.actor, "clip_b", {"mu": 0.5})
    check_critic(step, models.critic, step.valid)
    check_actor(step, models.actor, keep, keep)


@pytest.mark.slow
def test_whole_step_rollout_correction_removes_only_the_filtered_tokens(transfer_queue, engine, verl_cfg, models):
    """With verl's rejection sampling on, the filter's statistics are over every valid response token and the actor
    loses exactly the tokens the filter dropped: terms = verl's post-rejection response_mask & keep, denominator =
    the valid tokens & keep (rejected tokens stay in it, as in stock verl)."""
    cfg = step_config(verl_cfg, "clip_b", {"mu": 0.5}, **REJECTION)
    step = whole_step(cfg, models, "rejection", rollout_noise=ROLLOUT_NOISE)
    valid, kept_by_verl = step.valid, step.after["response_mask"].bool()
    assert 0.05 < float((valid & ~kept_by_verl).sum() / valid.sum()) < 0.5  # verl rejected some tokens
    keep = whole_batch_keep(step, models.actor, "clip_b", {"mu": 0.5})
    check_actor(step, models.actor, kept_by_verl & keep, valid & keep)


@pytest.mark.slow
def test_whole_step_filter_dropping_nothing_is_stock_verl(transfer_queue, engine, verl_cfg, models):
    """Rejection sampling on and a filter that drops nothing (mu huge): every optimizer step's gradient equals
    stock verl's (its own trainer and engines, no adapter) on the same batch, and both equal the token mean over
    verl's post-rejection tokens divided by every valid token."""
    cfg = step_config(verl_cfg, "clip_b", {"mu": 1e9}, **REJECTION)
    ours = whole_step(cfg, models, "nothing_ours", rollout_noise=ROLLOUT_NOISE)
    stock = whole_step(cfg, models, "nothing_stock", rollout_noise=ROLLOUT_NOISE, adapter_on=False)
    assert ours.keys == [k.replace("stock", "ours") for k in stock.keys]
    assert torch.equal(ours.after[KEEP].bool(), ours.valid)
    for got, want in zip(ours.actor_grads, stock.actor_grads, strict=True):
        assert rel_diff(got, want) < GRAD_RTOL
    check_actor(stock, models.actor, stock.after["response_mask"].bool(), stock.valid)


adapter_actor_masks = adapter.actor_masks  # the real one, for the mutants below to call


def _terms_unfiltered(data):
    """Mutation: the loss's terms keep every token (only the denominator loses the dropped ones)."""
    return adapter_actor_masks(data).update({"response_mask": data["response_mask"]})


def _denominator_unfiltered(data):
    """Mutation: the denominator keeps every valid token (what writing response_mask alone gives)."""
    return adapter_actor_masks(data).update({"loss_mask": data["loss_mask"]})


def _denominator_from_rejection(data):
    """Mutation: the denominator is verl's post-rejection response_mask & keep (issue 21: the old adapter copied
    response_mask into loss_mask, so rejected tokens left the denominator too)."""
    masks = adapter_actor_masks(data)
    return masks.update({"loss_mask": masks["response_mask"]})


def _critic_sees_the_filter(monkeypatch):
    """Mutation: the advantage step writes the actor's filtered masks into TransferQueue (the old adapter), so the
    critic's update reads them too."""
    real = EntropyRFTTrainer._compute_advantage

    def compute_advantage(self, batch, metrics):
        batch = real(self, batch, metrics)
        data = tq.kv_batch_get(
            keys=batch.keys, partition_id=batch.partition_id, select_fields=["response_mask", "loss_mask", KEEP]
        )
        return tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id, fields=adapter_actor_masks(data))

    monkeypatch.setattr(EntropyRFTTrainer, "_compute_advantage", compute_advantage)


@pytest.mark.slow
@pytest.mark.parametrize(
    "mutation", ["terms unfiltered", "denominator unfiltered", "denominator from rejection", "critic sees the filter"]
)
def test_mutations_fail_the_whole_step_oracle(transfer_queue, engine, verl_cfg, models, monkeypatch, mutation):
    """Mutation checks: a wrong mask in the actor's loss terms, a wrong denominator (with or without rejection
    sampling) and a critic that reads the filtered masks each make the oracle checks of the tests above fail."""
    over, noise, critic = {}, 0.0, False
    if mutation == "critic sees the filter":
        _critic_sees_the_filter(monkeypatch)
        over, critic = GAE, True
    else:
        mutant = {
            "terms unfiltered": _terms_unfiltered,
            "denominator unfiltered": _denominator_unfiltered,
            "denominator from rejection": _denominator_from_rejection,
        }[mutation]
        monkeypatch.setattr(adapter, "actor_masks", mutant)
        if mutation == "denominator from rejection":
            over, noise = REJECTION, ROLLOUT_NOISE
    cfg = step_config(verl_cfg, "clip_b", {"mu": 0.5}, **over)
    step = whole_step(cfg, models, "mutant_" + mutation.replace(" ", "_"), critic=critic, rollout_noise=noise)
    keep = whole_batch_keep(step, models.actor, "clip_b", {"mu": 0.5})
    valid = step.valid
    with pytest.raises(AssertionError, match="relative difference"):
        if critic:
            check_critic(step, models.critic, valid)
        else:
            check_actor(step, models.actor, step.after["response_mask"].bool() & keep, valid & keep)


@pytest.mark.slow
def test_whole_step_monitor_is_stock_verl_and_writes_what_inspect_reads(
    transfer_queue, engine, verl_cfg, models, tmp_path
):
    """entropy_rft.method=none (monitor) with rejection sampling on: every actor optimizer step's gradient equals
    stock verl's (its own trainer and engines) on the same batch, to float32 rounding (GRAD_RTOL); verl's masks are
    untouched. The step's metrics over the whole batch: entropy over every valid token; the predicted change
    -mean_T[step A (S_c - mean_T S_c)] over verl's post-rejection tokens T with step lr / (valid tokens of the
    token's mini-batch), the first epoch's 2 mini-batches written out by hand (rel 1e-5: float32 statistics, summed
    in another order); Clip_B's would-be fraction. Token samples of step 1 in the experiment directory
    (trainer.default_local_dir): every row, grouped by uid, rows rejected tokens marked not kept, its Corollary 4
    total the logged prediction; metrics.jsonl has the step; the inspect page and the report build from the
    directory."""
    from transformers import AutoTokenizer

    from entropy_rft import samples
    from entropy_rft.commands.inspect_page import build_page
    from entropy_rft.commands.report import build_report
    from entropy_rft.logging import read_metrics

    cfg = step_config(verl_cfg, "none", {}, **REJECTION, **{"trainer.default_local_dir": str(tmp_path / "exp")})
    ours = whole_step(
        cfg, models, "monitor_ours", rollout_noise=ROLLOUT_NOISE, tokenizer=AutoTokenizer.from_pretrained(TINY)
    )
    stock = whole_step(cfg, models, "monitor_stock", rollout_noise=ROLLOUT_NOISE, adapter_on=False)
    assert ours.keys == [k.replace("stock", "ours") for k in stock.keys]
    for got, want in zip(ours.actor_grads, stock.actor_grads, strict=True):
        assert rel_diff(got, want) < GRAD_RTOL
    valid, used = ours.valid, ours.after["response_mask"].bool()
    assert torch.equal(ours.after["loss_mask"].bool(), valid) and 0 < int((valid & ~used).sum())  # rejection acted
    assert KEEP not in ours.after.keys()

    stats = stats_from_engine(ours.after["old_log_probs"], ours.after["entropy"], ours.after[S_EXPECT])
    lr, adv = float(cfg.actor_rollout_ref.actor.optim.lr), ours.after["advantages"].double()
    step = torch.zeros(valid.shape, dtype=torch.float64)
    for rows in mini_batches(ours)[:MINI_BATCHES]:  # the first epoch
        step[rows] = lr / float(valid[rows].sum())
    s_c = stats.s_centered.double()[used]
    want = float(-(step[used] * adv[used] * (s_c - s_c.mean())).mean())
    m = ours.metrics
    assert m["entropy_rft/entropy_change/predicted"] == pytest.approx(want, rel=1e-5)
    assert m["entropy_rft/entropy"] == pytest.approx(float(stats.entropy.double()[valid].mean()), rel=1e-5)
    # the same prediction by region (A's sign x S* > 0) and each region's share the rejection removed
    a_t, s_star = adv[:, None].expand_as(valid) if adv.dim() == 1 else adv, stats.s_star
    terms = torch.zeros(valid.shape, dtype=torch.float64)
    terms[used] = -(step[used] * a_t[used] * (s_c - s_c.mean())) / float(used.sum())
    for sign, side in (("pos", a_t > 0), ("neg", a_t < 0)):
        for kind, where in (("likely", s_star > 0), ("unlikely", s_star <= 0)):
            region = side & where
            got = m[f"entropy_rft/entropy_change/by_region/{sign}_{kind}"]
            assert got == pytest.approx(float(terms[region & used].sum()), rel=1e-5, abs=1e-15)
            frac = float((region & valid & ~used).sum()) / max(int((region & valid).sum()), 1)
            assert m[f"entropy_rft/clip_frac_by_region/{sign}_{kind}"] == pytest.approx(frac, abs=1e-12)
    keep_b, _ = clip_b(stats.s_star, ours.after["advantages"], used)
    assert m["entropy_rft/would_clip_b/frac"] == pytest.approx(float((used & ~keep_b).sum() / used.sum()), rel=1e-6)

    exp = tmp_path / "exp"
    rec = samples.read_samples(exp)[1]
    assert rec["source"] == "verl" and rec["method"] == "none"
    assert rec["entropy_change"]["corollary4"] == pytest.approx(want, rel=1e-5)
    rows = [r for g in rec["groups"] for r in g["responses"]]
    assert sorted(r["row"] for r in rows) == list(range(GROUPS * N))
    uids = [int(k.split("_")[-3]) for k in ours.keys]  # keys are PARTITION_GROUP_ROLLOUT_0
    first = {u: j for j, u in reversed(list(enumerate(uids)))}
    order = sorted(range(len(uids)), key=lambda i: (first[uids[i]], i))  # rows by group, batch order within
    for r in rows:
        i = order[r["row"]]
        assert r["length"] == ours.response_lens[i] and r["kept"] == used[i, : r["length"]].int().tolist()
    assert sum(r["length"] - sum(r["kept"]) for r in rows) == int((valid & ~used).sum())  # the rejected tokens
    assert [line["step"] for line in read_metrics(exp)] == [1]
    from entropy_rft.metric_names import undocumented

    assert undocumented(set().union(*read_metrics(exp)), "verl") == []  # in the metrics reference (issue 43)
    assert build_page([exp], tmp_path / "inspect.html").stat().st_size > 0
    assert build_report([exp], tmp_path / "report").exists()


def _mini_batches_of_rank(rank: int, world: int, rows: int, mini_rows: int, port: int, out: str) -> None:
    """One data-parallel rank of verl's actor update, as far as it decides which rows form each optimizer step:
    verl's dispatch chunk (BatchData.chunk, what update_actor's make_nd_compute_dataproto_dispatch_fn applies) and
    verl's per-rank iterator (tensordict_utils.make_iterator with mini_batch_size / dp, as
    TrainingWorker.train_mini_batch calls it); the loss_mask tokens of each mini-batch all-reduced over the ranks over
    gloo, as the engine's denominator is. Rank 0 writes every mini-batch's rows and token count."""
    from verl.protocol import BatchData

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        row = torch.arange(rows)
        tokens = (row % 5 + 1).float()  # a different token count per row
        batch = TensorDict({"row": row, "tokens": tokens}, batch_size=[rows])
        mine = BatchData(batch).chunk(chunks=world)[rank]
        steps = tu.make_iterator(
            mine, mini_batch_size=mini_rows // world, epochs=1, seed=42 + rank, dataloader_kwargs={"shuffle": False}
        )
        seen = []
        for mini in steps:
            total = mini["tokens"].sum().reshape(1)
            dist.all_reduce(total)
            gathered = [None] * world
            dist.all_gather_object(gathered, mini["row"].tolist())
            seen.append((sorted(r for part in gathered for r in part), float(total)))
        if rank == 0:
            torch.save(seen, out)
    finally:
        dist.destroy_process_group()


def test_actor_mini_batches_are_verls_with_two_data_parallel_ranks(tmp_path):
    """Two gloo ranks on the CPU run verl 0.9.1's own dispatch chunking and per-rank mini-batch iterator over a batch of
    16 rows in mini-batches of 8 (4 a rank): the rows of each optimizer step, and the token count the engine divides
    by (all-reduced over the ranks), are what adapter.actor_mini_batches and verl_step_sizes assume, i.e. the k-th
    block of each rank's half, not a contiguous block of the driver's rows (rows 0-3 and 8-11 form step 1)."""
    import torch.multiprocessing as mp
    from conftest import free_port

    out = tmp_path / "seen.pt"
    mp.spawn(_mini_batches_of_rank, args=(2, 16, 8, free_port(), str(out)), nprocs=2, join=True)
    seen = torch.load(out)
    ours = adapter.actor_mini_batches(16, 8, 2)
    assert (
        [rows for rows, _ in seen]
        == [sorted(b.tolist()) for b in ours]
        == [[0, 1, 2, 3, 8, 9, 10, 11], [4, 5, 6, 7, 12, 13, 14, 15]]
    )
    # the step sizes the monitor gives each token: lr / the tokens of its mini-batch over both ranks
    cfg = OmegaConf.create(
        {
            "trainer": {"nnodes": 1, "n_gpus_per_node": 2},
            "actor_rollout_ref": {
                "rollout": {"n": 4},
                "actor": {
                    "loss_agg_mode": "token-mean",
                    "shuffle": False,
                    "ppo_mini_batch_size": 2,
                    "fsdp_config": {"ulysses_sequence_parallel_size": 1},
                    "optim": {"lr": 1e-3},
                },
            },
        }
    )
    width = 5
    valid = torch.arange(width)[None, :] < (torch.arange(16) % 5 + 1)[:, None]  # row r has r % 5 + 1 tokens
    step = adapter.verl_step_sizes(cfg, valid, valid)
    for rows, total in seen:
        for r in rows:
            assert torch.allclose(
                step[r][valid[r]], torch.full((int(valid[r].sum()),), 1e-3 / total, dtype=torch.float64)
            )


@pytest.mark.parametrize("kind, warmup", [("constant", 3), ("cosine", 2), ("cosine", -1)])
def test_actor_lr_is_the_lr_verls_scheduler_applies(kind, warmup):
    """actor_lr(config, s) equals the lr verl 0.9.1's FSDP engine applies at global step s: its own
    _build_lr_scheduler on the same optim config (warmup steps, or the warmup ratio when lr_warmup_steps <= 0),
    stepped once after each step, as TrainingWorker.train_batch steps it after a step's last mini-batch."""
    optim = {
        "lr": 1e-3,
        "lr_scheduler_type": kind,
        "lr_warmup_steps": warmup,
        "lr_warmup_steps_ratio": 0.25,
        "total_training_steps": 10,
        "min_lr_ratio": 0.1,
        "num_cycles": 0.5,
        "zero_indexed_step": True,
    }
    cfg = OmegaConf.create({"actor_rollout_ref": {"actor": {"optim": optim}}})
    engine = types.SimpleNamespace(optimizer_config=types.SimpleNamespace(**optim), rank=1)
    weight = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.AdamW([weight], lr=1e-3)
    scheduler = fsdp_impl.FSDPEngine._build_lr_scheduler(engine, optimizer)
    applied = []
    for _ in range(10):
        applied.append(optimizer.param_groups[0]["lr"])  # the lr of this step's mini-batches
        scheduler.step()
    assert [adapter.actor_lr(cfg, s) for s in range(1, 11)] == pytest.approx(applied, rel=1e-12)
    assert len(set(applied)) > 1  # the schedule moves: the check can tell the configured lr from the applied one


def test_a_malformed_group_skips_the_samples_with_a_warning(monkeypatch, tmp_path):
    """A batch whose uid groups are not rollout.n rows: sample_batch refuses it (MalformedGroups), and the
    trainer's record step warns, writes no samples for the step, and still writes its metrics line."""
    from entropy_rft import samples
    from entropy_rft.logging import read_metrics

    data = TensorDict({"uid": torch.tensor([0, 0, 0, 1])}, batch_size=[4])
    with pytest.raises(adapter.MalformedGroups, match="rollout.n=2"):
        adapter.sample_batch(data, None, None, None, None, None, tokenizer=None, group_size=2)
    monkeypatch.setattr(adapter.tq, "kv_batch_get", lambda **kw: data)
    trainer = types.SimpleNamespace(
        entropy_rft=adapter.Settings(method="none", samples_every=1, samples_dir=str(tmp_path)),
        global_steps=1,
        config=OmegaConf.create(
            {
                "trainer": {"default_local_dir": str(tmp_path)},
                "actor_rollout_ref": {
                    "rollout": {"n": 2},
                    "actor": {"loss_agg_mode": "token-mean", "optim": {"lr": 1e-3}},
                },
            }
        ),
        tokenizer=None,
        total_training_steps=3,
    )
    batch = types.SimpleNamespace(keys=["a"], partition_id="p")
    with pytest.warns(UserWarning, match="no token samples at step 1.*rollout.n=2"):
        adapter.EntropyRFTTrainer._entropy_rft_record(
            trainer, batch, None, None, None, None, None, {"entropy_rft/entropy": 1.0}
        )
    trainer.entropy_rft_metrics.close()
    assert samples.steps_written(tmp_path) == [] and [m["step"] for m in read_metrics(tmp_path)] == [1]
