"""`entropy-rft inspect RUN_DIR [RUN_DIR ...]`: one self-contained HTML page of runs' token samples.

The page (template, style and script in entropy_rft/assets/inspect/) shows, for a chosen step, every written
response of each run side by side, each token coloured by a chosen statistic (H, S*, S_c, its term of the step's
entropy change, -A S_c, or log p) with the tokens the method clipped struck through and boxed and the tokens a record
marks (a monitored run: what Clip_B and Clip_V would drop) underlined; a token's values on hover
or keyboard focus; each response's reward and advantage; per run and step, the tokens with the largest terms in
each direction and the clipped tokens that would have weighed most (entropy_rft/samples.py writes all of these).

What is decided here, in Python, and unit-tested: which steps go on the page (`pick_steps`), the colour scale of
each step and statistic (`colour_scale`, shared by the runs shown side by side so that their colours compare), the
names of the runs, and the embedding of the data (`embed_json`: no sequence in a prompt or a token can close the
data's script element). The page loads nothing: its Content-Security-Policy allows no request at all, its style and
script are inline, its data is a JSON script element; it works from disk (file://).

Departures, numbered:
1. A page holds at most `max_steps` steps per run (default 60, evenly spaced, first and last included), and fewer
   when their data would pass MAX_DATA_BYTES (40 MB; a paper-scale file holds up to a few MB): a long run with
   samples every 10 steps would otherwise make a page of hundreds of megabytes. `--steps` picks the steps itself.
2. Colours saturate at the 98th percentile of |value| over the step's tokens on the page (the legend says so), so
   that one outlier does not wash out every other token; the values themselves are shown exactly.
"""

from __future__ import annotations

import html
import json
import math
import os
import re
from pathlib import Path

import yaml

from .. import samples

ASSETS = Path(__file__).parents[1] / "assets" / "inspect"
MAX_STEPS = 60
MAX_DATA_BYTES = 40_000_000  # embedded data of one page, beyond which fewer steps are shown (departure 1)
SCALE_QUANTILE = 0.98
# the statistics a page can colour by: key in the samples record, label, whether signed (diverging colours), help
STATISTICS = (
    {
        "key": "term",
        "label": "term of the entropy change (eq. 23)",
        "signed": True,
        "help": "-lr w A S_c / |T|: this token's share of the step's first-order change of the mean entropy over the "
        "kept tokens T (entropy_kept, not the all-token entropy the run logs; Theorem 2 averaged as in eq. 23). "
        "Positive: the update raises entropy here; 0 for clipped tokens.",
    },
    {
        "key": "entropy",
        "label": "H, entropy of the next-token distribution",
        "signed": False,
        "help": "H = -sum_i p_i log p_i of the distribution the token was sampled from.",
    },
    {
        "key": "s_star",
        "label": "S*, entropy discriminator",
        "signed": True,
        "help": "S* = p_k (H + log p_k): raising this token's logit changes entropy by -eps S* (Theorem 1).",
    },
    {
        "key": "s_centered",
        "label": "S_c = S* - E_p[S]",
        "signed": True,
        "help": "The centred score of Theorem 2: a step with advantage A changes this token's entropy by -alpha S_c.",
    },
    {
        "key": "logp",
        "label": "log p of the sampled token",
        "signed": False,
        "help": "Darker: less likely under the policy that sampled it.",
    },
    {
        "key": "push",
        "label": "-A S_c (the term's direction, any loss)",
        "signed": True,
        "help": "-A S_c: the token's term without its positive step size lr w / |T|, so defined for every loss, also "
        "where w depends on how the engine splits the batch (TRL's bnpo, vespo). Within one response (one A) it "
        "orders the tokens as the terms do. Positive: the update raises entropy here; not 0 for clipped tokens.",
    },
)


def colour_scale(values: list[float | None], quantile: float = SCALE_QUANTILE) -> float:
    """The magnitude at which colours saturate: the `quantile` of |v| over the finite values (nearest rank), or the
    largest |v| when that quantile is 0; 0 when there is no non-zero value."""
    mags = sorted(abs(v) for v in values if v is not None and math.isfinite(v))
    if not mags:
        return 0.0
    rank = max(0, math.ceil(quantile * len(mags)) - 1)
    return mags[rank] if mags[rank] > 0 else mags[-1]


def pick_steps(available: list[int], wanted: list[int] | None = None, max_steps: int = MAX_STEPS) -> list[int]:
    """The steps a page shows: `wanted` (each must be available), else all available ones, thinned to max_steps
    evenly spaced ones with the first and last kept (departure 1)."""
    if wanted:
        missing = [s for s in wanted if s not in available]
        if missing:
            raise ValueError(
                f"no samples at step {', '.join(map(str, missing))}; sampled steps: "
                f"{', '.join(map(str, available)) or 'none'}"
            )
        return sorted(set(wanted))
    if len(available) <= max_steps:
        return list(available)
    if max_steps < 2:
        return available[-1:]
    last = len(available) - 1
    return sorted({available[round(i * last / (max_steps - 1))] for i in range(max_steps)})


def run_names(run_dirs: list[Path]) -> list[str]:
    """Each run's name on the page: its directory's name, with as many parent names as make the names distinct."""
    parts = [p.resolve().parts for p in run_dirs]
    for depth in range(1, max(len(p) for p in parts) + 1):
        names = ["/".join(p[-depth:]) for p in parts]
        if len(set(names)) == len(names):
            return names
    return [str(p) for p in run_dirs]


def runs_inside(folder: Path, depth: int = 3) -> list[Path]:
    """The run directories with token samples under `folder`, at most `depth` levels down, sorted; a run's own
    subdirectories are not searched."""
    found = []
    for child in sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".")):
        if samples.steps_written(child):
            found.append(child)
        elif depth > 1:
            found += runs_inside(child, depth - 1)
    return found


def load_run(run_dir: Path | str, steps: list[int] | None = None, max_steps: int = MAX_STEPS) -> dict:
    """A run directory's samples (the chosen steps) and the settings the page names (method, mu, seed, lr)."""
    run_dir = Path(run_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise ValueError(f"{run_dir} is a file, not a run directory: pass directories written by `entropy-rft train`")
    if not run_dir.is_dir():
        raise FileNotFoundError(
            f"run directory {run_dir} does not exist: pass directories written by `entropy-rft "
            "train` (or by EntropyGRPOTrainer's output_dir)"
        )
    available = samples.steps_written(run_dir)
    inside = [] if available else runs_inside(run_dir)
    if inside:  # a folder of runs (runs/, a demo's or a compare's directory): name them rather than fail on it
        shown = " ".join(str(d) for d in inside[:8]) + (" ..." if len(inside) > 8 else "")
        raise FileNotFoundError(
            f"{run_dir} is a folder of runs, not a run: it holds {len(inside)} with token samples "
            f"({shown}); pass the ones to show, e.g. `entropy-rft inspect "
            f"{' '.join(str(d) for d in inside[:3])}`"
        )
    if not available:
        raise FileNotFoundError(
            f"{run_dir} has no token samples ({samples.SAMPLES_DIR}/step-NNNNNN.json.gz): train "
            "with samples_every > 0 (the default is 10; `--set samples_every=1` samples every step)"
        )
    chosen = pick_steps(available, steps, max_steps)
    folder = run_dir / samples.SAMPLES_DIR
    records = {s: samples.read_record(folder / samples.file_name(s)) for s in chosen}
    config = {}
    if (run_dir / "config.yaml").exists():
        try:
            config = yaml.safe_load((run_dir / "config.yaml").read_text()) or {}
        except yaml.YAMLError:
            config = {}
    first = records[chosen[0]]
    settings = {
        k: config.get(k) for k in ("method", "mu", "max_frac", "seed", "lr", "steps") if isinstance(config, dict)
    }
    settings["method"] = settings.get("method") or first.get("method")
    return {
        "dir": str(run_dir),
        "settings": settings,
        "source": first.get("source", "trainer"),
        "steps": {str(s): r for s, r in records.items()},
        "available": available,
    }


def token_values(resp: dict, key: str) -> list[float | None]:
    """A written response's values of a statistic: its stored column, or for "push" -A S_c from its advantage (per
    response, or per token under GAE) and S_c (the page computes the same, page.js tokenValue)."""
    if key != "push":
        return resp.get(key, [])
    adv = resp.get("advantage_t") or [resp.get("advantage")] * len(resp["s_centered"])
    return [None if a is None or s is None else -a * s for a, s in zip(adv, resp["s_centered"])]


def page_data(runs: list[dict], names: list[str]) -> dict:
    """What the page embeds: the runs, the union of their steps, the statistics, and each step's colour scales
    (over every written token of every run at that step)."""
    steps = sorted({int(s) for run in runs for s in run["steps"]})
    scales: dict[str, dict[str, float]] = {}
    for step in steps:
        records = [run["steps"][str(step)] for run in runs if str(step) in run["steps"]]
        scales[str(step)] = {
            st["key"]: colour_scale(
                [
                    v
                    for rec in records
                    for g in rec["groups"]
                    for resp in g["responses"]
                    for v in token_values(resp, st["key"])
                ]
            )
            for st in STATISTICS
        }
    return {
        "runs": [{"name": name, **run} for name, run in zip(names, runs)],
        "steps": steps,
        "statistics": list(STATISTICS),
        "scales": scales,
        "scale_quantile": SCALE_QUANTILE,
    }


def embed_json(data: dict) -> str:
    """JSON for a <script type="application/json"> element: '<', '>' and '&' written as \\u escapes, so no text in
    the data can end the element or open a comment; JSON.parse reads the escapes back as the characters."""
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def render_page(data: dict, title: str) -> str:
    """The whole page: the template with its style, script, title and data inlined."""
    template = (ASSETS / "page.html").read_text()
    parts = {
        "/*STYLE*/": (ASSETS / "page.css").read_text(),
        "/*SCRIPT*/": (ASSETS / "page.js").read_text(),
        "__TITLE__": html.escape(title),
        "__DATA__": embed_json(data),
    }
    for marker in ("/*STYLE*/", "/*SCRIPT*/", "__DATA__"):
        if template.count(marker) != 1:
            raise RuntimeError(f"{ASSETS / 'page.html'} must hold {marker} exactly once")
    # one pass: text inserted for one marker (a title, a prompt in the data) is never searched for another
    return re.sub("|".join(map(re.escape, parts)), lambda m: parts[m.group(0)], template)


def build_page(
    run_dirs: list[Path | str],
    out: Path | str,
    *,
    steps: list[int] | None = None,
    max_steps: int = MAX_STEPS,
    title: str | None = None,
) -> Path:
    """Write the inspector page of these runs to `out` (written whole: a temporary file, then a rename)."""
    dirs = [Path(d) for d in run_dirs]
    if not dirs:
        raise ValueError("inspect needs at least one run directory")
    runs = [load_run(d, steps, max_steps) for d in dirs]
    size = sum(len(json.dumps(rec)) for run in runs for rec in run["steps"].values())
    if steps is None and size > MAX_DATA_BYTES:  # departure 1: thin every run's steps in proportion
        for run in runs:
            shown = [int(s) for s in run["steps"]]
            keep = pick_steps(shown, None, max(2, len(shown) * MAX_DATA_BYTES // size))
            run["steps"] = {str(s): run["steps"][str(s)] for s in keep}
    names = run_names(dirs)
    title = title or f"entropy-rft inspect: {', '.join(names)}"
    page = render_page(page_data(runs, names), title)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text(page, encoding="utf-8")
    tmp.replace(out)
    return out


def default_out(run_dirs: list[Path | str]) -> Path:
    """RUN_DIR/inspect.html for one run; for several, inspect.html in their nearest common directory."""
    dirs = [Path(d).resolve() for d in run_dirs]
    if len(dirs) == 1:
        return dirs[0] / "inspect.html"
    return Path(os.path.commonpath(dirs)) / "inspect.html"
