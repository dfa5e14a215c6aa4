"""Generation engines, chosen by name through ENGINES: `hf` (transformers generate, CPU or GPU; the default) and
`vllm` (optional extra, imported only when built). Every engine has `generate(...) -> Rollout`,
`sync_weights()` (called after each optimizer step), `pop_compile_seconds()` (seconds spent compiling since the last
call: the trainer's time/compile) and `close()`."""

from ..core.registry import Registry
from .batch import Rollout
from .hf import HFEngine

ENGINES: Registry = Registry("engine")


@ENGINES.register("hf")
def build_hf(model, tokenizer, cfg, model_path: str):
    return HFEngine(
        model,
        tokenizer,
        chat_template=cfg.chat_template,
        decode=cfg.decode,
        precision=cfg.precision,
        check_every=cfg.decode_check_every or None,
    )


@ENGINES.register("vllm")
def build_vllm(model, tokenizer, cfg, model_path: str):
    import torch

    from .vllm import VLLMEngine, generation_dtype

    return VLLMEngine(
        model,
        tokenizer,
        model_path=model_path,
        chat_template=cfg.chat_template,
        gpu_memory=cfg.vllm_gpu_memory,
        dtype=generation_dtype(cfg.precision, torch.cuda.is_available()),
        seed=cfg.seed,
        llm_args=cfg.vllm_args,
        sleep_level=cfg.vllm_sleep,
    )


__all__ = ["ENGINES", "HFEngine", "Rollout"]
