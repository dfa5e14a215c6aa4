"""The shape of the package's code, read from its syntax tree (issue 55's before/after figures).

Printed: the modules in each folder of entropy_rft/ (every .py file, __init__.py included), the functions and methods
that take more than 8 and more than 10 parameters (self and cls not counted; *args and **kwargs count one each), and
the longest function (decorators left out, its docstring in, lines as ruff format lays them out). Triton kernels
(functions decorated with triton.jit, called or not) are counted apart, "plus K Triton kernels": a kernel's
parameters are its launch ABI (each pointer, stride and constexpr the launch passes), not a signature to group into
objects, so the figures over 8 and over 10 are those of ordinary functions. Nothing is imported or run, so it reads
any checkout:

    python benchmarks/code_shape.py [--package entropy_rft] [--list]
"""

from __future__ import annotations

import argparse
import ast
from collections import Counter
from pathlib import Path


def parameters(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """The parameters a caller can pass: positional, keyword-only, *args and **kwargs; self and cls left out."""
    a = node.args
    names = [p.arg for p in a.posonlyargs + a.args]
    count = len(names) + len(a.kwonlyargs) + (a.vararg is not None) + (a.kwarg is not None)
    return count - (1 if names and names[0] in ("self", "cls") else 0)


def triton_kernel(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """Decorated with triton.jit (`@triton.jit` or `@triton.jit(...)`)."""
    return any(ast.unparse(d.func if isinstance(d, ast.Call) else d) == "triton.jit" for d in node.decorator_list)


def functions(package: Path):
    """(module path, function name, line, parameters, lines, Triton kernel) for every function and method of the
    package."""
    for path in sorted(package.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                rel = path.relative_to(package.parent).as_posix()
                lines = node.end_lineno - node.lineno + 1
                yield rel, node.name, node.lineno, parameters(node), lines, triton_kernel(node)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--package", default=str(Path(__file__).resolve().parents[1] / "entropy_rft"))
    parser.add_argument("--list", action="store_true", help="list the functions over 8 parameters")
    args = parser.parse_args()
    package = Path(args.package)
    folders = Counter(p.parent.relative_to(package.parent).as_posix() + "/" for p in package.rglob("*.py"))
    print(f"modules: {sum(folders.values())}")
    for folder, n in sorted(folders.items()):
        print(f"  {folder:<28} {n}")
    rows = list(functions(package))
    over = {}  # limit -> "N" for ordinary functions, with "(plus K Triton kernels...)" when any kernel is over it
    for limit, note in ((8, ""), (10, ", whose parameters are their launch ABI")):
        kernels = sum(r[3] > limit and r[5] for r in rows)
        plus = f" (plus {kernels} Triton kernel{'s' if kernels > 1 else ''}{note})" if kernels else ""
        over[limit] = f"{sum(r[3] > limit and not r[5] for r in rows)}{plus}"
    print(f"functions: {len(rows)}; over 8 parameters: {over[8]}; over 10: {over[10]}")
    if args.list:  # ordinary functions first, then the kernels
        for rel, name, line, n, _, kernel in sorted((r for r in rows if r[3] > 8), key=lambda r: (r[5], -r[3])):
            print(f"  {n:>3}  {rel}:{line} {name}{' (Triton kernel)' if kernel else ''}")
    rel, name, line, _, lines, _ = max(rows, key=lambda r: r[4])
    print(f"largest function: {rel}:{line} {name}, {lines} lines")


if __name__ == "__main__":
    main()
