"""The policy's set-up: which model a name means, loading it (and its tokenizer), LoRA and gradient checkpointing,
dropout off, the critic's value head, the optimizer, the reference policy and the rollout engine.

Departures, numbered:
1. PPO's critic is a value head on the policy (ValueHead: a zero-initialised linear map of the last hidden state)
   rather than a separate critic model; it has its own learning rate (critic_lr, default 10 x lr).
2. Dropout is switched off for RL (dropout.py, as TRL's disable_dropout), and checked: sampling, old log p and the
   update then see one policy.
3. A hub id is loaded from the hub cache alone (local_files_only) when the hub cannot be reached from here (one
   connection attempt of HUB_PROBE_SECONDS, `hub_unreachable`), as HF_HUB_OFFLINE=1 would: huggingface_hub would
   otherwise retry each file five times with backoff (about 45 s and 12 lines of retries) before the same error.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError

from .. import packaged
from ..config import TrainConfig, check_device
from ..packaged import BUILTIN_MODELS, PACKAGED
from ..rollout import ENGINES
from ..run.checkpoint import VALUE_HEAD
from .dropout import check_deterministic, disable_dropout

STAND_IN = "tiny-stand-in"  # a random tiny chat model built on first use (toy.build_stand_in), for dry runs


def cache_dir() -> Path:
    """$ENTROPY_RFT_CACHE or ~/.cache/entropy-rft, created; one that cannot be is named with the variable."""
    path = Path(os.environ.get("ENTROPY_RFT_CACHE", Path.home() / ".cache" / "entropy-rft"))
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise OSError(
            f"the entropy-rft cache {path} cannot be created ({err.strerror}); set ENTROPY_RFT_CACHE to a "
            "writable directory" + (" or unset it" if "ENTROPY_RFT_CACHE" in os.environ else "")
        ) from None
    return path


def _built_once(path: Path, build) -> str:
    """`path`, built by build(directory) on first use into a scratch directory beside it and renamed into place (a
    rename on one filesystem is atomic, so a process that sees config.json sees a whole model)."""
    if not (path / "config.json").exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}-", dir=path.parent))
        try:
            build(tmp)
            tmp.rename(path)
        except OSError:  # another process built it first
            shutil.rmtree(tmp, ignore_errors=True)
            if not (path / "config.json").exists():
                raise
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return str(path)


def resolve_model_path(name: str) -> str:
    """A shipped model name, the stand-in, a packaged model (packaged.py: converted into the cache on first use), an
    existing local directory, or a hub id (returned as given)."""
    if name == STAND_IN:
        from ..toy import build_stand_in

        return _built_once(cache_dir() / STAND_IN, build_stand_in)
    if name in PACKAGED:
        reason = packaged.missing(name)
        if reason is not None and not (cache_dir() / name / "config.json").exists():
            raise FileNotFoundError(reason)
        return _built_once(cache_dir() / name, lambda out: packaged.convert(name, out))
    if name in BUILTIN_MODELS:
        path = BUILTIN_MODELS[name]
        if not (path / "config.json").exists():
            raise FileNotFoundError(
                f"the shipped model {name!r} is missing at {path}; rebuild it with "
                "`entropy-rft pretrain-toy --out entropy_rft/assets/countdown-tiny`"
            )
        return str(path)
    path = Path(name)
    if path.exists():
        if not (path / "config.json").exists() and not (path / "adapter_config.json").exists():
            raise FileNotFoundError(
                f"model directory {path} has no config.json; pass a directory written by save_pretrained, or a hub id"
            )
        return str(path)
    looks_like_hub_id = name.count("/") == 1 and not name.startswith((".", "/", "~"))
    if not looks_like_hub_id:
        raise FileNotFoundError(
            f"model path {name!r} does not exist; pass a local model directory, a hub id like "
            f"'Qwen/Qwen2.5-7B-Instruct', or one of the shipped models: "
            f"{', '.join([*BUILTIN_MODELS, *PACKAGED])}"
        )
    return name


HUB_PROBE_SECONDS = 3.0


def hub_unreachable(timeout: float = HUB_PROBE_SECONDS) -> str | None:
    """Why the model hub (HF_ENDPOINT, default huggingface.co) cannot be reached from here, or None: one TCP
    connection to its host, given `timeout` seconds (name resolution included). None in offline mode
    (HF_HUB_OFFLINE), where huggingface_hub reads the cache without trying the network."""
    import socket
    import threading
    from urllib.parse import urlparse

    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return None
    url = urlparse(constants.ENDPOINT)
    host, port = url.hostname or "", url.port or (80 if url.scheme == "http" else 443)
    answer: list[str | None] = []

    def probe() -> None:
        try:
            socket.create_connection((host, port), timeout=timeout).close()
            answer.append(None)
        except OSError as err:
            answer.append(f"{host}:{port}: {err.strerror or type(err).__name__}")

    thread = threading.Thread(target=probe, daemon=True)  # name resolution takes no timeout of its own
    thread.start()
    thread.join(timeout)
    return answer[0] if answer else f"{host}:{port}: no answer in {timeout:g} s"


def hub_options(path: str) -> tuple[dict, str | None]:
    """from_pretrained's options for a model path, and why the hub cannot be reached (departure 3): a hub id is read
    from the cache alone (local_files_only) when the hub is unreachable; a local directory needs nothing."""
    if Path(path).is_dir():
        return {}, None
    why = hub_unreachable()
    return ({"local_files_only": True} if why else {}), why


def load_policy(name: str, device: torch.device, *, trainable: bool = False):
    """(model, tokenizer) in float32 (master weights; bf16 runs use autocast). A directory holding a PEFT adapter
    (a LoRA checkpoint) loads its base model with the adapter, trainable when asked, else merged."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # the trainer's own bar is the one to watch
    path = resolve_model_path(name)
    local = Path(path).is_dir()
    if local and not any((Path(path) / f).exists() for f in ("tokenizer_config.json", "tokenizer.json")):
        raise FileNotFoundError(
            f"model directory {path} has no tokenizer (tokenizer_config.json or tokenizer.json); "
            "save the tokenizer next to the model: tokenizer.save_pretrained(directory)"
        )
    hub, unreachable = hub_options(path)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, **hub)
        if (Path(path) / "adapter_config.json").exists():
            from peft import AutoPeftModelForCausalLM

            model = AutoPeftModelForCausalLM.from_pretrained(path, dtype=torch.float32, is_trainable=trainable)
            if not trainable:
                model = model.merge_and_unload()
        else:
            model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, **hub)
    except (OSError, ValueError, TypeError, KeyError, SafetensorError) as err:
        if local:  # what transformers says about a damaged directory is about its files, not about the hub
            raise OSError(
                f"model directory {path} could not be loaded ({type(err).__name__}: {err}); it must hold a "
                "model written by save_pretrained: config.json (a JSON object with model_type), the weights "
                "(model.safetensors) and the tokenizer files. Re-save the model there, or pass another "
                "directory"
            ) from None
        if not isinstance(err, OSError):
            raise
        if unreachable:
            raise OSError(
                f"could not load model {name!r}: it is not a local directory nor in the hub cache, and the hub "
                f"cannot be reached from here ({unreachable}); connect to the network, or download the model where "
                f"there is one (`hf download {name} --local-dir DIR`) and pass --model DIR"
            ) from None
        raise OSError(
            f"could not load model {name!r}: not a local directory, and the hub could not be reached or "
            f"has no such model ({err})"
        ) from err
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
        targets = (
            cfg.lora_targets if cfg.lora_targets == "all-linear" else [t.strip() for t in cfg.lora_targets.split(",")]
        )
        model = get_peft_model(
            model,
            LoraConfig(
                r=cfg.lora_rank,
                lora_alpha=cfg.lora_alpha,
                lora_dropout=0.0,
                target_modules=targets,
                task_type="CAUSAL_LM",
            ),
        )
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


def pick_device(name: str) -> torch.device:
    """The torch device for auto, cpu, cuda[:N] or mps; one this machine lacks raises ConfigError with the fix."""
    check_device(name)
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


class ValueHead(torch.nn.Module):
    """PPO's critic as a linear head on the policy's last hidden state (zero-initialised: V = 0 at the start)."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.proj = torch.nn.Linear(hidden_size, 1)
        torch.nn.init.zeros_(self.proj.weight)
        torch.nn.init.zeros_(self.proj.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.proj(hidden.float()).squeeze(-1)


def make_optimizer(groups: list[dict], cfg: TrainConfig) -> torch.optim.Adam:
    """torch.optim.Adam over the parameter groups, fused (one kernel over every tensor, as TRL's default
    adamw_torch_fused) where the device supports it, else the per-tensor loop; the two agree to float32 rounding."""
    try:
        return torch.optim.Adam(groups, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay, fused=True)
    except (RuntimeError, ValueError):  # a device or dtype without the fused kernel
        return torch.optim.Adam(groups, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)


@dataclass
class Policy:
    """What a run trains and samples with."""

    model: torch.nn.Module
    tokenizer: object
    optimizer: torch.optim.Optimizer
    engine: object  # the rollout engine (rollout.ENGINES), sampling from `model`
    value_head: ValueHead | None = None  # PPO's critic
    ref_model: torch.nn.Module | None = None  # the KL term's reference policy (kl_coef > 0)


def set_up_policy(
    cfg: TrainConfig,
    device: torch.device,
    checkpoint: Path | None = None,
    *,
    critic: bool = False,
    reference: bool = False,
) -> Policy:
    """The policy from cfg.model, or from a checkpoint's weights (and value head) to resume: prepared (LoRA, gradient
    checkpointing), dropout off and checked, with its optimizer (Adam's state is the checkpoint's to load), the
    reference policy when asked (rules.needs: kl_coef > 0) and the rollout engine."""
    source = str(checkpoint) if checkpoint is not None else cfg.model
    model, tokenizer = load_policy(source, device, trainable=True)
    model = prepare_policy(model, cfg)
    if cfg.disable_dropout:  # one policy for sampling, old log p and the update (departure 2)
        disable_dropout(model)
        check_deterministic(model)
    ref_model = load_policy(cfg.model, device)[0].eval() if reference else None
    engine = ENGINES.get(cfg.engine)(model, tokenizer, cfg, resolve_model_path(source))
    value_head = ValueHead(model.config.hidden_size).to(device) if critic else None
    groups = [{"params": [p for p in model.parameters() if p.requires_grad]}]
    if value_head is not None:
        if (Path(source) / VALUE_HEAD).exists():
            value_head.load_state_dict(torch.load(Path(source) / VALUE_HEAD))
        groups.append({"params": list(value_head.parameters()), "lr": cfg.critic_lr or 10 * cfg.lr})
    return Policy(model, tokenizer, make_optimizer(groups, cfg), engine, value_head, ref_model)
