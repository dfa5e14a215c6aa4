"""Metric sinks: one JSON line per step in RUN_DIR/metrics.jsonl (always), TensorBoard and Weights & Biases as
options (imported only when asked for; W&B honours WANDB_MODE=offline).

A run that starts at step S (0, or a checkpoint's step on resume) first cuts what the sinks hold after S, so a run
killed between checkpoints and resumed logs each step once (entropy_rft/run/rundir.py opens the sinks only once the run
is committed to start, and metrics.jsonl last of them):
1. metrics.jsonl keeps its lines with step <= S (rewritten atomically; a torn last line is dropped);
2. TensorBoard purges the events after S (SummaryWriter's purge_step);
3. W&B resumes the same run id (kept in RUN_DIR/wandb_run_id); W&B itself refuses steps at or below the last one it
   holds, so steps S+1.. that the killed run had logged keep their first values there (W&B cannot rewind a run
   without its server-side `resume_from`, which offline mode lacks).
"""

from __future__ import annotations

import json
import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from .core.registry import Registry

SINKS: Registry = Registry("metric sink")


class SinkError(ValueError):
    """A metric sink that cannot start here (e.g. W&B without credentials); the message says how to fix it."""


def _clean(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class JsonlSink:
    def __init__(self, run_dir: Path, config: dict, start_step: int = 0):
        self.path = Path(run_dir) / "metrics.jsonl"
        if self.path.exists():
            lines, _ = _complete_rows(self.path)  # a cut-off last line is dropped: its step comes again
            kept = [line for n, line in lines if _row(self.path, n, line)["step"] <= start_step]
            tmp = self.path.with_name(".metrics.jsonl.tmp")
            tmp.write_text("".join(line + "\n" for line in kept))
            os.replace(tmp, self.path)
        self.file = open(self.path, "a", buffering=1)

    def log(self, metrics: dict) -> None:
        self.file.write(json.dumps({k: _clean(v) for k, v in metrics.items()}) + "\n")

    def close(self) -> None:
        self.file.close()


class TensorBoardSink:
    def __init__(self, run_dir: Path, config: dict, start_step: int = 0):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as err:
            raise ImportError("the tensorboard sink needs `pip install tensorboard`") from err
        self.writer = SummaryWriter(str(Path(run_dir) / "tensorboard"), purge_step=start_step + 1)

    def log(self, metrics: dict) -> None:
        step = metrics.get("step", 0)
        for key, value in metrics.items():
            if isinstance(value, (int, float)) and key != "step":
                self.writer.add_scalar(key, value, step)

    def close(self) -> None:
        self.writer.close()


class WandbSink:
    def __init__(self, run_dir: Path, config: dict, start_step: int = 0):
        try:
            import wandb
        except ImportError as err:
            raise ImportError(
                "the wandb sink needs `pip install wandb` (set WANDB_MODE=offline to run without a server)"
            ) from err
        id_file = Path(run_dir) / "wandb_run_id"
        try:
            if start_step > 0 and id_file.exists():
                self.run = wandb.init(
                    project="entropy-rft",
                    dir=str(run_dir),
                    config=config,
                    id=id_file.read_text().strip(),
                    resume="allow",
                )
            else:
                self.run = wandb.init(project="entropy-rft", dir=str(run_dir), config=config)
        except Exception as err:  # W&B's own errors (no API key, no server) have no common base class
            raise SinkError(
                f"the wandb sink could not start a W&B run ({type(err).__name__}: {err}); log in with "
                "`wandb login`, set WANDB_MODE=offline to log locally, or drop wandb from sinks"
            ) from err
        if not (start_step > 0 and id_file.exists()):
            id_file.write_text(self.run.id)

    def log(self, metrics: dict) -> None:
        self.run.log({k: v for k, v in metrics.items() if isinstance(v, (int, float))}, step=metrics.get("step"))

    def close(self) -> None:
        self.run.finish()


SINKS.register("jsonl", JsonlSink)
SINKS.register("tensorboard", TensorBoardSink)
SINKS.register("wandb", WandbSink)


class MetricLogger:
    """Fans one metrics dict out to every sink; JSONL is always on. The extra sinks open first and metrics.jsonl
    last, so a sink that fails to open (W&B without an API key) leaves metrics.jsonl as it was; the sinks already
    opened are closed again."""

    def __init__(self, run_dir: Path, config: dict, sinks: tuple[str, ...] = (), start_step: int = 0):
        names = [s for s in dict.fromkeys(sinks) if s != "jsonl"] + ["jsonl"]
        self.sinks = []
        try:
            for name in names:
                self.sinks.append(SINKS.get(name)(run_dir, config, start_step))
        except BaseException:
            self.close()
            raise

    def log(self, metrics: dict) -> None:
        for sink in self.sinks:
            sink.log(metrics)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()


def _complete_rows(path: Path) -> tuple[list[tuple[int, str]], int | None]:
    """((line number, text) of the JSON lines of a metrics file, the number of a last line cut by a kill mid-write or
    None): a last line with no final newline that does not parse is left out."""
    text = path.read_text(errors="replace")
    lines = text.split("\n")
    cut = None
    if lines and lines[-1].strip():  # no final newline: written whole only if it parses
        try:
            json.loads(lines[-1])
        except json.JSONDecodeError:
            cut, lines = len(lines), lines[:-1]
    return [(n, line) for n, line in enumerate(lines, 1) if line.strip()], cut


def _row(path: Path, n: int, line: str) -> dict:
    """Line n of a metrics file as a row; anything else raises ValueError naming the file and line."""
    try:
        row = json.loads(line)
    except json.JSONDecodeError as err:
        raise ValueError(
            f"{path}:{n} is not a JSON line ({err.msg}); the file is damaged: delete that line (a "
            "resumed run logs the steps after its checkpoint again)"
        ) from None
    if not isinstance(row, dict) or not isinstance(row.get("step"), int):
        raise ValueError(
            f"{path}:{n} is not a metrics row (a JSON object with an integer 'step'); the file is "
            "damaged: delete that line (a resumed run logs the steps after its checkpoint again)"
        )
    return row


@dataclass(frozen=True)
class Metrics:
    """A run's metrics.jsonl as every reader takes it (read_metrics_file): train --resume (record.first_gap), a
    finished run's summary, report, compare and inspect, so a damaged record reads the same everywhere."""

    path: Path
    rows: list[dict]  # every complete line, in order
    cut_line: int | None  # a last line cut off mid-write (no final newline, not JSON), left out of rows

    def cut_off(self, step: int | None = None) -> str | None:
        """The one line naming a cut-off last line (and `step`, the step it lacks: by default the one after the last
        complete row), or None."""
        if self.cut_line is None:
            return None
        step = step if step is not None else (self.rows[-1]["step"] + 1 if self.rows else 1)
        return (
            f"{self.path}:{self.cut_line} is cut off (a crash while it was written?), so step {step} has no "
            "metrics line"
        )


def read_metrics_file(run_dir: Path | str) -> Metrics:
    """The one reader of a run's metrics.jsonl: its complete rows and a cut-off last line, named, not read (a killed
    run); any other line that is not a JSON object raises ValueError naming the file and line."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        raise FileNotFoundError(f"{run_dir} has no metrics.jsonl: pass a run directory written by `entropy-rft train`")
    lines, cut = _complete_rows(path)
    return Metrics(path, [_row(path, n, line) for n, line in lines], cut)


def read_metrics(run_dir: Path | str, *, warn: bool = True) -> list[dict]:
    """Every step's metrics of a run directory (read_metrics_file's rows); a cut-off last line is left out with a
    warning naming it on stderr (warn=False: silently, for a caller that says it itself)."""
    metrics = read_metrics_file(run_dir)
    cut = metrics.cut_off()
    if cut and warn:
        n = len(metrics.rows)
        print(f"entropy-rft: warning: {cut}; read as the {n} line{'s' * (n != 1)} before it", file=sys.stderr)
    return metrics.rows


# what an engine adapter (TRL, verl) writes beside metrics.jsonl: which engine, method and loss it watched or ran
ENGINE_RUN_FILE = "entropy_rft_run.json"


def write_engine_run(run_dir: Path | str, about: dict) -> None:
    """RUN_DIR/entropy_rft_run.json: the engine's settings that `entropy-rft report` names (source, method, the
    engine's loss, lr, group size, probe_every, ...), so its table says what was watched."""
    path = Path(run_dir)
    path.mkdir(parents=True, exist_ok=True)
    (path / ENGINE_RUN_FILE).write_text(json.dumps(about, indent=1, default=str) + "\n")
