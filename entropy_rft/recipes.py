"""Recipe files: YAML read strictly (a key given twice is refused), the shipped recipes by name, and the two
shapes a file can have (a flat recipe of TrainConfig fields, or a demo-style file with `common` and `methods`).
config.py turns what these return into a TrainConfig."""

from __future__ import annotations

import warnings
from pathlib import Path

import yaml


class ConfigError(ValueError):
    """A TrainConfig value of the wrong type or out of range; the message names the field, the value and the fix.
    `problems` lists (field, what is wrong) for each bad field (field None for a rule across fields)."""

    def __init__(self, message: str, problems: list[tuple[str | None, str]] | None = None):
        super().__init__(message)
        self.problems = problems or [(None, message)]


class SettingWarning(UserWarning):
    """Settings that run but do little or nothing of what a run is for (an empty recipe, lr 0, a near-greedy
    temperature, groups of one); the command line shows each as one line."""


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice in one mapping (plain YAML keeps the last silently)."""


def _unique_mapping(loader, node, deep=False):
    seen = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise ConfigError(
                f"key {key!r} appears twice in one mapping (line {key_node.start_mark.line + 1}); "
                "YAML would silently keep the last: delete one of them"
            )
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _unique_mapping)


RECIPES = Path(__file__).parent / "configs"  # the shipped recipes, installed with the package


def shipped_recipes() -> list[str]:
    """Names of the shipped recipes (`paper/qwen2.5-7b-instruct_clip_b`), as --config takes them."""
    return sorted(str(p.relative_to(RECIPES).with_suffix("")) for p in RECIPES.rglob("*.yaml"))


def recipe_file(path: str | Path) -> Path:
    """--config's file: the path when it exists, else the shipped recipe of that name (with or without .yaml, or
    the README's entropy_rft/configs/... path of a clone), else the path as given (read_yaml names it)."""
    path = Path(path)
    if path.exists():
        return path
    name = str(path).removeprefix("entropy_rft/configs/").removesuffix(".yaml")
    shipped = RECIPES / f"{name}.yaml"
    return shipped if shipped.is_file() and ".." not in Path(name).parts else path


def read_yaml(path: str | Path):
    """A YAML file's content (a shipped recipe by name too); a missing file, bad YAML or a duplicate key raise naming
    the file."""
    path = recipe_file(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"config file {path} does not exist, nor is it a shipped recipe (`entropy-rft recipes` lists them)"
            if not path.exists()
            else f"config file {path} is a directory; pass a YAML file"
            if path.is_dir()
            else f"config file {path} is not a regular file (a device or pipe); pass a YAML file"
        )
    try:
        return yaml.load(path.read_text(), Loader=_UniqueKeyLoader)
    except yaml.YAMLError as err:
        raise ConfigError(
            f"{path} is not valid YAML ({' '.join(str(err).split())}); a recipe is a mapping of "
            "TrainConfig fields, one `key: value` a line"
        ) from None
    except ConfigError as err:
        raise ConfigError(f"{path}: {err}") from None


def _warn_if_empty(path, data):
    """data, or {} for a file that holds no settings (empty, or comments only), after a SettingWarning: the run
    would take every default without a word."""
    if data is None or data == {}:
        warnings.warn(
            SettingWarning(
                f"{path} holds no settings (an empty recipe): what the command line does not set takes its "
                "default (`entropy-rft train --help-config` lists them: 100 steps of 64 prompts x 16 responses)"
            ),
            stacklevel=3,
        )
        return {}
    return data


def is_multi_method(data) -> bool:
    """A demo-style file: `common` settings and a `methods` mapping of per-method settings."""
    return isinstance(data, dict) and "methods" in data and set(data) <= {"common", "methods"}


def read_recipe(path: str | Path | None) -> dict:
    """A flat recipe (a mapping of TrainConfig fields), {} for None. A demo-style file is refused naming the
    subcommands that take it."""
    if path is None:
        return {}
    data = _warn_if_empty(path, read_yaml(path))
    if is_multi_method(data):
        raise ConfigError(
            f"{path} is a demo-style file (`common` and `methods` sections, one run per method); "
            "`entropy-rft demo`, `compare` and `sweep` take it. A single run takes a flat recipe: one "
            "`key: value` per TrainConfig field (e.g. entropy_rft/configs/paper/*.yaml)"
        )
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a mapping of TrainConfig fields, got a {type(data).__name__}")
    return data


def read_spec(path: str | Path | None, default: str | Path | None = None) -> dict:
    """{'common': {...}, 'methods': {entry: {...}}} from a demo-style file or from a flat recipe (its fields become
    `common`, with no per-method entries); `default` is read when path is None."""
    path = path if path is not None else default
    if path is None:
        return {"common": {}, "methods": {}}
    data = _warn_if_empty(path, read_yaml(path))
    if not isinstance(data, dict):
        raise ConfigError(
            f"{path} must hold a mapping (a flat recipe, or `common` and `methods` sections), got a "
            f"{type(data).__name__}"
        )
    if not is_multi_method(data):
        if "common" in data:
            raise ConfigError(
                f"{path} has a `common` section but no `methods` mapping; a demo-style file needs "
                "both (`methods: {grpo: {method: grpo}}`), a flat recipe neither"
            )
        return {"common": data, "methods": {}}
    common, methods = data.get("common") or {}, data.get("methods") or {}
    if (
        not isinstance(common, dict)
        or not isinstance(methods, dict)
        or not all(isinstance(v, dict) or v is None for v in methods.values())
    ):
        raise ConfigError(
            f"{path}: `common` must be a mapping of TrainConfig fields and `methods` a mapping of "
            "entry names to such mappings"
        )
    return {"common": common, "methods": {k: v or {} for k, v in methods.items()}}
