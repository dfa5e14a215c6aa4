"""Randomness in a model's training-mode forward, and switching it off for RL.

Strict on-policy RL needs one policy: the sampler, the old log-probs and the update's forward must compute the same
function of the weights. Dropout breaks that (as TRL's `disable_dropout` and verl's RL recipes also assume), and
models hold it in two forms:
- `nn.Dropout` modules (GPT-2, Llama's MLPs in some ports, Phi);
- plain float attributes read at forward time: `attention_dropout` (Llama, Qwen2, Mistral attention passes it to
  the attention kernel), `dropout` / `activation_dropout` (OPT, BART), `layerdrop` (OPT, wav2vec2), and the router
  noise of mixture-of-experts blocks (`router_jitter_noise` in Mixtral's config, `jitter_noise` on the block).
`disable_dropout` zeroes both forms. `check_deterministic` then runs two training-mode forwards of one small batch;
if they differ, some randomness is left that no attribute names, and it reports the first module whose output
differs for an identical input, so the user knows what to switch off.
"""

from __future__ import annotations

import re

import torch

_RANDOM_ATTRIBUTE = re.compile(r"drop|jitter")  # dropout, attention_dropout, layerdrop, jitter_noise, ...


def _random_floats(module: torch.nn.Module):
    """(name, value) of the module's own float attributes that set a dropout or noise probability/scale > 0."""
    for name, value in vars(module).items():
        if type(value) is float and value > 0 and _RANDOM_ATTRIBUTE.search(name):
            yield name, value


def _is_dropout(module: torch.nn.Module) -> bool:
    return isinstance(module, torch.nn.modules.dropout._DropoutNd) and module.p > 0


def disable_dropout(model: torch.nn.Module) -> int:
    """Set every dropout probability and router noise of the model to 0: nn.Dropout modules and the float attributes
    of any module named like dropout, layerdrop or jitter noise. Returns how many were non-zero. The model's config
    is left as it was (a saved checkpoint keeps the user's values)."""
    changed = 0
    for module in model.modules():
        if _is_dropout(module):
            module.p, changed = 0.0, changed + 1
        for name, _ in list(_random_floats(module)):
            setattr(module, name, 0.0)
            changed += 1
    return changed


def has_active_dropout(model: torch.nn.Module) -> bool:
    """Whether any dropout module or float dropout / noise attribute of the model is non-zero."""
    return any(_is_dropout(m) or any(True for _ in _random_floats(m)) for m in model.modules())


def _probe_batch(model: torch.nn.Module, rows: int = 2, length: int = 8) -> torch.Tensor:
    vocab = int(getattr(getattr(model, "config", None), "vocab_size", 0) or 2)
    gen = torch.Generator().manual_seed(0)  # never the global generator: the check leaves the run's RNG untouched
    return torch.randint(0, vocab, (rows, length), generator=gen).to(next(model.parameters()).device)


@torch.no_grad()
def _outputs(model, ids: torch.Tensor, record: dict | None = None) -> torch.Tensor:
    hooks = []
    if record is not None:

        def keep(name):
            def hook(module, args, kwargs, out):
                first = out[0] if isinstance(out, (tuple, list)) else out
                given = next((a for a in (*args, *kwargs.values()) if torch.is_tensor(a)), None)
                if torch.is_tensor(first):
                    record.setdefault(name, []).append((None if given is None else given.clone(), first.clone()))

            return hook

        hooks = [m.register_forward_hook(keep(n), with_kwargs=True) for n, m in model.named_modules() if n]
    try:
        out = model(input_ids=ids, use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    return (out.logits if hasattr(out, "logits") else out[0]).float()


def _agree(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal, up to a few float32 roundings on devices whose reductions may run in another order (CUDA atomics);
    dropout or noise moves outputs by far more (dropout 0.1 moves logits by ~0.1 of their scale)."""
    if a.shape != b.shape:
        return False
    if a.device.type == "cpu":
        return torch.equal(a, b)
    return bool((a - b).abs().max() <= 64 * torch.finfo(torch.float32).eps * a.abs().max().clamp_min(1.0))


def check_deterministic(model: torch.nn.Module) -> None:
    """Two training-mode forwards of one small batch must agree (after disable_dropout). If they differ, raise an
    error naming the first module (in execution order) whose output differs although its input does not: the place
    that draws random numbers. The global random generators are left as they were."""
    was_training = model.training
    model.train()
    ids = _probe_batch(model)
    try:
        with torch.random.fork_rng(devices=[ids.device] if ids.device.type == "cuda" else []):
            if _agree(_outputs(model, ids), _outputs(model, ids)):
                return
            first, second = {}, {}
            _outputs(model, ids, first)
            _outputs(model, ids, second)
    finally:
        model.train(was_training)
    culprit = next(
        (
            name
            for name in first
            for (xa, ya), (xb, yb) in zip(first[name], second.get(name, []))
            if (xa is None or xb is None or _agree(xa.float(), xb.float())) and not _agree(ya.float(), yb.float())
        ),
        None,
    )
    where = (
        f"module {culprit!r} ({type(model.get_submodule(culprit)).__name__}) gives different outputs for the same input"
        if culprit
        else "no single module could be named (the randomness is outside module outputs)"
    )
    raise RuntimeError(
        f"the model is not deterministic in training mode after disable_dropout: {where}. Switch that "
        "randomness off in the model's config (a dropout probability or router noise set to 0), or set "
        "disable_dropout: false to train with it (strict on-policy steps are then not exactly on-policy)"
    )
