"""The command line's option types (entropy_rft/commands/cli/): each reads one option's text and raises
argparse.ArgumentTypeError, which argparse reports as `argument --opt: <message>` (exit code 2, one line). Options that
mirror a TrainConfig field are checked by the field's own rules (config.check_values)."""

from __future__ import annotations

import argparse
import math


def setting(field: str):
    """The option's text read and checked as TrainConfig.<field> is (one source of rules: config.check_values)."""

    def parse(text: str):
        from ..config import ConfigError, check_values

        try:
            return check_values(**{field: text})[field]
        except ConfigError as err:
            raise argparse.ArgumentTypeError(f"{err.problems[0][1]} (the rule of the config field {field})") from None

    parse.__name__ = field
    return parse


def whole(low: int):
    """A whole number >= low."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number >= {low}, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
        return value

    parse.__name__ = f"int>={low}"
    return parse


def positive(text: str) -> float:
    """A finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
    return value


def set_item(text: str) -> tuple[str, object]:
    """KEY=VALUE of --set: a known TrainConfig field and a YAML value of the field's type and range (`null` for None);
    rules across fields are checked once the whole config is built."""
    import yaml

    from ..config import ConfigError, check_values

    key, eq, raw = text.partition("=")
    key = key.strip()
    if not eq or not key:
        raise argparse.ArgumentTypeError(f"takes KEY=VALUE (e.g. --set lr=1e-5), got {text!r}")
    if not raw.strip():
        raise argparse.ArgumentTypeError(
            f"{key}= has no value; write {key}=VALUE ({key}=null for None where the field allows it)"
        )
    try:
        value = yaml.safe_load(raw)
    except yaml.YAMLError as err:
        raise argparse.ArgumentTypeError(
            f"{text!r}: the value is not YAML ({' '.join(str(err).split()[:8])}...); quote text, e.g. {key}='...'"
        ) from None
    from ..config import TrainConfig

    field = TrainConfig.__dataclass_fields__.get(key)
    if field is not None and str(field.type) in ("str", "str | None") and isinstance(value, (int, float)):
        value = raw.strip()  # a text field: out=5 names the directory 5 (YAML would read a number)
    try:
        value = check_values(**{key: value})[key]
    except ConfigError as err:
        raise argparse.ArgumentTypeError(
            f"{key}={raw}: {err.problems[0][1]} (`entropy-rft train --help-config` lists every field)"
        ) from None
    return key, value


def steps_list(text: str) -> list[int]:
    try:
        steps = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"takes comma-separated step numbers, e.g. 1,10,150; got {text!r}") from None
    if not steps or min(steps) < 1:
        raise argparse.ArgumentTypeError(f"takes step numbers >= 1, e.g. 1,10,150; got {text!r}")
    return steps


def _names(text: str, example: str) -> list[str]:
    """The non-empty comma-separated names of `text`; at least one."""
    names = [m.strip() for m in text.split(",") if m.strip()]
    if not names:
        raise argparse.ArgumentTypeError(f"names no method, got {text!r}; e.g. {example}")
    return names


def methods_list(text: str) -> list[str]:
    """Comma-separated method names, each known to the METHODS registry."""
    from ..core.methods import METHODS

    names = _names(text, "grpo,clip_b,clip_v")
    unknown = [m for m in names if m not in METHODS]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown method {unknown[0]!r}{METHODS.hint(unknown[0])}; known: {', '.join(METHODS.names())}"
        )
    return names


def entries_list(text: str) -> list[str]:
    """Comma-separated entry names of a demo config (checked against the config once it is read)."""
    return _names(text, "grpo,clip_b")


def mu_list(text: str) -> list[float]:
    """Comma-separated mu values, each under TrainConfig.mu's rule."""
    items = [x.strip() for x in text.split(",") if x.strip()]
    if not items:
        raise argparse.ArgumentTypeError(f"names no value, got {text!r}; e.g. 0.5,1,1.5")
    return [setting("mu")(x) for x in items]
