"""Math datasets of the paper: DAPO-Math-17k (training), its DAPO500 held-out split, AIME 2024, AIME 2025, AMC23.

A dataset is named (`aime24`), given as a path (a .parquet, .jsonl or .json file, or a directory of them such as a
hub snapshot), or as `name=path` to point a named dataset at a local copy. Named datasets without a local copy
are downloaded from the hub (huggingface_hub.snapshot_download) when the machine is online.

Schemas read (detected from the columns of the first row):
    dapo        BytedTsinghua-SIA/DAPO-Math-17k: prompt [{role, content}] with DAPO's template, reward_model
                {ground_truth}, extra_info {index}; the original file repeats each problem many times
    dapo_openr1 open-r1/DAPO-Math-17k-Processed: prompt (the templated text), solution (the answer), ...
    problem     HuggingFaceH4/aime_2024 (id, problem, solution, answer, ...), math-ai/aime25 (problem, answer, id),
                AMC23 copies (question or problem, answer; answers may be floats such as 27.0)
    entropy_rft this project's JSONL (question, answer, id, source, and extra keys such as pass_rate)
Problems are deduplicated by identity (`MathProblem.identity`: the question text with whitespace normalised; first
occurrence kept) and the template is stripped, so the same problem reads the same from every copy.

DAPO500 (Section 5.1: "we exclude 500 questions from the training set to form the validation set"): the paper does
not publish its split. Ours is deterministic and independent of row order and schema: the deduplicated problems
are ranked by sha256(f"{seed}:{question}") and the first 500 form DAPO500, the rest `dapo_train`; seed 0.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from ..core.registry import Registry
from .math import MathProblem, strip_template

DAPO500_SIZE = 500
DAPO500_SEED = 0
DATA_SUFFIXES = (".parquet", ".jsonl", ".json")


@dataclass(frozen=True)
class DatasetSpec:
    hub_id: str  # where the named dataset lives on the hub
    split: str | None = None  # "heldout" or "train" of the DAPO500 split; None: the whole dataset


DATASETS: Registry[DatasetSpec] = Registry("dataset")
DATASETS.register("dapo17k", DatasetSpec("BytedTsinghua-SIA/DAPO-Math-17k"))
DATASETS.register("dapo500", DatasetSpec("BytedTsinghua-SIA/DAPO-Math-17k", split="heldout"))
DATASETS.register("dapo_train", DatasetSpec("BytedTsinghua-SIA/DAPO-Math-17k", split="train"))
DATASETS.register("aime24", DatasetSpec("HuggingFaceH4/aime_2024"))
DATASETS.register("aime25", DatasetSpec("math-ai/aime25"))
DATASETS.register("amc23", DatasetSpec("math-ai/amc23"))


# ---------------------------------------------------------------------------------------------------------------
# Reading rows


def _read_file(path: Path) -> list[dict]:
    if path.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError as err:
            raise ImportError(f"reading {path} needs pyarrow: pip install 'entropy-rft[math]'") from err
        return pq.read_table(path).to_pylist()
    if path.suffix == ".jsonl":
        rows = []
        for n, line in enumerate(path.read_text(encoding="utf-8-sig").splitlines(), 1):  # a leading BOM is dropped
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as err:
                    raise ValueError(f"{path}:{n}: not JSON ({err})") from None
        return rows
    if path.suffix == ".json":
        data = json.loads(path.read_text(encoding="utf-8-sig"))
        rows = data.get("data", data) if isinstance(data, dict) else data
        if not isinstance(rows, list):
            raise ValueError(f"{path}: a .json dataset must hold a list of rows (or {{'data': [...]}})")
        return rows
    raise ValueError(f"{path}: unsupported file type {path.suffix!r}; use .parquet, .jsonl or .json")


def read_rows(path: Path) -> list[dict]:
    """Rows of a data file, or of every data file (sorted by path) under a directory."""
    path = Path(path)
    if path.is_file():
        return _read_file(path)
    if path.is_dir():
        files = sorted(
            p
            for p in path.rglob("*")
            if p.suffix in DATA_SUFFIXES
            and p.is_file()
            and not any(part.startswith(".") for part in p.relative_to(path).parts)
        )
        if not files:
            raise FileNotFoundError(f"{path} holds no .parquet, .jsonl or .json data files")
        return [row for f in files for row in _read_file(f)]
    raise FileNotFoundError(f"no dataset at {path}")


def _user_text(messages) -> str:
    users = [m["content"] for m in messages if m.get("role", "user") == "user"]
    if not users:
        raise ValueError("the prompt has no user message")
    return users[-1]


def _question_text(value) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"the question {value!r} is not non-empty text")
    return value


def _answer_text(value) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)) or not str(value).strip():
        raise ValueError(f"the answer {value!r} is neither text nor a number")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"the answer {value!r} is not a finite number")
    if isinstance(value, float) and value.is_integer():
        return str(int(value))  # AMC23 copies store 27.0 for 27
    return str(value).strip()


def detect_schema(row: dict) -> str:
    if "question" in row and "answer" in row and "problem" not in row:
        return "entropy_rft"
    if isinstance(row.get("prompt"), list) and "reward_model" in row:
        return "dapo"
    if isinstance(row.get("prompt"), str) and "solution" in row and ("reward_model" in row or "source_prompt" in row):
        return "dapo_openr1"
    if "answer" in row and ("problem" in row or "question" in row):
        return "problem"
    raise ValueError(
        f"unknown math dataset schema with columns {sorted(row)}; expected DAPO-Math-17k (prompt, "
        "reward_model), open-r1's processed DAPO (prompt, solution), AIME/AMC (problem, answer) or "
        "this project's JSONL (question, answer)"
    )


def row_to_problem(row: dict, schema: str, source: str) -> MathProblem:
    if schema == "entropy_rft":
        return MathProblem.from_json(
            {**row, "answer": _answer_text(row["answer"]), "source": row.get("source") or source}
        )
    if schema == "dapo":
        extra = row.get("extra_info") or {}
        return MathProblem(
            strip_template(_question_text(_user_text(row["prompt"]))),
            _answer_text(row["reward_model"]["ground_truth"]),
            str(extra.get("index", "")),
            source,
        )
    if schema == "dapo_openr1":
        extra = row.get("extra_info") or {}
        return MathProblem(
            strip_template(_question_text(row["prompt"])),
            _answer_text(row["solution"]),
            str(extra.get("index", "")),
            source,
        )
    question = row["problem"] if "problem" in row else row["question"]
    ident = next((row[k] for k in ("id", "ID", "problem_idx") if k in row), "")
    return MathProblem(_question_text(question).strip(), _answer_text(row["answer"]), str(ident), source)


def to_problems(rows: Iterable[dict], source: str) -> list[MathProblem]:
    """Problems from raw rows, schema detected from the first row, deduplicated by identity (normalised question
    text)."""
    rows = list(rows)
    if not rows:
        raise ValueError(f"{source}: the dataset is empty")
    for n, row in enumerate(rows, 1):
        if not isinstance(row, dict):
            raise ValueError(
                f"{source}: row {n} is {row!r}, not an object of named fields; each row of a math "
                "dataset holds a problem and its answer (schemas: entropy_rft.tasks.data)"
            )
    schema = detect_schema(rows[0])
    seen: set[str] = set()
    out = []
    for n, row in enumerate(rows, 1):
        try:
            problem = row_to_problem(row, schema, source)
        except (KeyError, TypeError, AttributeError, ValueError) as err:
            raise ValueError(
                f"{source}: row {n} does not fit the {schema!r} schema of the first row "
                f"({type(err).__name__}: {err}); row keys: {sorted(row)}. Fix or drop the row "
                "(schemas: entropy_rft.tasks.data)"
            ) from None
        if problem.identity not in seen:
            seen.add(problem.identity)
            out.append(problem)
    return out


# ---------------------------------------------------------------------------------------------------------------
# Named datasets, local copies, the hub


def dapo_split(
    problems: list[MathProblem], *, size: int = DAPO500_SIZE, seed: int = DAPO500_SEED
) -> tuple[list[MathProblem], list[MathProblem]]:
    """(held-out, train): the `size` problems with the smallest sha256(f"{seed}:{question}") are held out."""
    if len(problems) <= size:
        raise ValueError(f"a held-out split of {size} needs more than {size} problems, got {len(problems)}")
    rank = sorted(
        range(len(problems)), key=lambda i: hashlib.sha256(f"{seed}:{problems[i].question}".encode()).hexdigest()
    )
    held = set(rank[:size])
    return ([problems[i] for i in sorted(held)], [p for i, p in enumerate(problems) if i not in held])


def _download(hub_id: str) -> Path:
    """A local snapshot of a hub dataset's data files."""
    try:
        from huggingface_hub import snapshot_download
    except ImportError as err:  # pragma: no cover - huggingface_hub comes with transformers
        raise ImportError("downloading datasets needs huggingface_hub (installed with transformers)") from err
    try:
        return Path(snapshot_download(hub_id, repo_type="dataset", allow_patterns=[f"*{x}" for x in DATA_SUFFIXES]))
    except Exception as err:  # offline, missing repo, auth: all mean "no local copy could be made"
        raise FileNotFoundError(
            f"dataset {hub_id!r} is not available locally and could not be downloaded ({err}); "
            f"download it where you are online and pass its path, e.g. --data NAME=/data/copy"
        ) from err


def _local_copy(data_dir: str | Path | None, name: str) -> Path | None:
    if data_dir is None:
        return None
    for candidate in [Path(data_dir) / name, *(Path(data_dir) / f"{name}{s}" for s in DATA_SUFFIXES)]:
        if candidate.exists():
            return candidate
    return None


def load_math(
    spec: str, *, data_dir: str | Path | None = None, dapo500_size: int = DAPO500_SIZE, dapo500_seed: int = DAPO500_SEED
) -> tuple[str, list[MathProblem]]:
    """(name, problems) for a dataset spec (module docstring):
    `name=path`  the file or directory at path, used as it is (a dapo500 file is not split again);
    `path`       likewise, named after the file;
    `name`       a local copy under data_dir (name.parquet, name.jsonl, name/), else the hub. dapo500 and dapo_train
                 are cut from a local dapo17k copy (or the hub's) by `dapo_split` unless data_dir holds the split."""
    name, sep, path = spec.partition("=")
    if sep:
        return name, to_problems(read_rows(Path(path)), name)
    if spec not in DATASETS:
        if Path(spec).exists():
            return Path(spec).stem, to_problems(read_rows(Path(spec)), Path(spec).stem)
        raise FileNotFoundError(f"{spec!r} is neither a known dataset ({', '.join(DATASETS)}) nor an existing path")
    named = DATASETS.get(spec)
    own = _local_copy(data_dir, spec)
    if own is not None:
        return spec, to_problems(read_rows(own), spec)
    full = _local_copy(data_dir, "dapo17k") if named.split else None
    source = full or _download(named.hub_id)
    problems = to_problems(read_rows(source), spec)
    if named.split is not None:
        held, train = dapo_split(problems, size=dapo500_size, seed=dapo500_seed)
        problems = held if named.split == "heldout" else train
    return spec, problems


def write_jsonl(problems: Iterable[MathProblem], path: Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(p.to_json(), ensure_ascii=False) + "\n" for p in problems))
    return path


def synthetic_problems(n: int, *, seed: int = 0) -> list[MathProblem]:
    """n distinct made-up arithmetic problems with integer answers, for dry runs and tests (no download)."""
    import random

    rng = random.Random(seed)
    out, seen = [], set()
    while len(out) < n:
        a, b, c = rng.randint(2, 99), rng.randint(2, 99), rng.randint(2, 9)
        question, answer = rng.choice(
            [
                (f"What is ${a} + {b}$?", a + b),
                (f"What is ${a} \\cdot {c}$?", a * c),
                (f"What is ${a} + {b} \\cdot {c}$?", a + b * c),
            ]
        )
        if question not in seen:
            seen.add(question)
            out.append(MathProblem(question, str(answer), f"synthetic-{len(out)}", "synthetic"))
    return out
