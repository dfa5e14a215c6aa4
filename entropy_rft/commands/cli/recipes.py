"""`entropy-rft recipes`: its options (add) and what it does (run)."""

from __future__ import annotations


def run(args) -> None:
    from ...config import RECIPES, read_yaml, shipped_recipes

    for name in shipped_recipes():
        data = read_yaml(RECIPES / f"{name}.yaml") or {}
        what = "demo-style (demo, compare, sweep)" if "methods" in data else f"method {data.get('method', 'grpo')}"
        model = data.get("model", (data.get("common") or {}).get("model", "countdown-tiny"))
        print(f"{name:45s} {what}, model {model}")


def add(command) -> None:
    """The `recipes` subcommand (no options)."""
    command(
        "recipes",
        "list the shipped recipes, which --config takes by name (e.g. --config paper/qwen2.5-7b-instruct_clip_b)",
        run,
    )
