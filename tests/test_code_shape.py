"""The shape of the library's code (issue 44): functions short enough to read in one screen."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).parents[1] / "entropy_rft"
MAX_LINES = 80


def test_no_function_in_the_library_is_over_80_lines():
    """Every function and method in entropy_rft/, decorators excluded and its docstring included, spans at most 80
    lines as ruff format lays it out (a longer one is split into named steps, as step.apply_update was)."""
    long = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_LINES:
                    long.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.name}: {lines} lines")
    assert not long, "functions over 80 lines:\n" + "\n".join(long)
    assert sum(1 for _ in PACKAGE.rglob("*.py")) > 40  # the walk saw the package
