"""Metric sinks: one JSON line per step in RUN_DIR/metrics.jsonl (always), TensorBoard and Weights & Biases as
options (imported only when asked for; W&B honours WANDB_MODE=offline)."""

from __future__ import annotations

import json
import math
from pathlib import Path

from .registry import Registry

SINKS: Registry = Registry("metric sink")


def _clean(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class JsonlSink:
    def __init__(self, run_dir: Path, config: dict):
        self.path = Path(run_dir) / "metrics.jsonl"
        self.file = open(self.path, "a", buffering=1)

    def log(self, metrics: dict) -> None:
        self.file.write(json.dumps({k: _clean(v) for k, v in metrics.items()}) + "\n")

    def close(self) -> None:
        self.file.close()


class TensorBoardSink:
    def __init__(self, run_dir: Path, config: dict):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as err:
            raise ImportError("the tensorboard sink needs `pip install tensorboard`") from err
        self.writer = SummaryWriter(str(Path(run_dir) / "tensorboard"))

    def log(self, metrics: dict) -> None:
        step = metrics.get("step", 0)
        for key, value in metrics.items():
            if isinstance(value, (int, float)) and key != "step":
                self.writer.add_scalar(key, value, step)

    def close(self) -> None:
        self.writer.close()


class WandbSink:
    def __init__(self, run_dir: Path, config: dict):
        try:
            import wandb
        except ImportError as err:
            raise ImportError("the wandb sink needs `pip install wandb` (set WANDB_MODE=offline to run without a server)") from err
        self.run = wandb.init(project="entropy-rft", dir=str(run_dir), config=config)

    def log(self, metrics: dict) -> None:
        self.run.log({k: v for k, v in metrics.items() if isinstance(v, (int, float))}, step=metrics.get("step"))

    def close(self) -> None:
        self.run.finish()


SINKS.register("jsonl", JsonlSink)
SINKS.register("tensorboard", TensorBoardSink)
SINKS.register("wandb", WandbSink)


class MetricLogger:
    """Fans one metrics dict out to every sink; JSONL is always on."""

    def __init__(self, run_dir: Path, config: dict, sinks: tuple[str, ...] = ()):
        names = ["jsonl"] + [s for s in sinks if s != "jsonl"]
        self.sinks = [SINKS.get(name)(run_dir, config) for name in names]

    def log(self, metrics: dict) -> None:
        for sink in self.sinks:
            sink.log(metrics)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()


def read_metrics(run_dir: Path | str) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
