"""The package's layout holds its borders (issue 55): core/ imports nothing outside core/, the flat layout's module
names import as the moved modules, and the maps in docs/design.md and the README name the package as it is."""

import ast
import importlib
import re
from pathlib import Path

import pytest

import entropy_rft

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "entropy_rft"


def modules(folder: Path) -> set[str]:
    """Every module under folder, as a path relative to entropy_rft/ (__init__ and __main__ left out)."""
    return {p.relative_to(PKG).as_posix() for p in folder.rglob("*.py") if p.stem not in ("__init__", "__main__")}


def imported(path: Path) -> set[str]:
    """The entropy_rft modules (or packages) a file imports, function-level imports included, made absolute."""
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    if path.stem == "__init__":
        package = ".".join(path.relative_to(ROOT).parent.parts)
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
                found |= {f"{target}.{a.name}" if not node.module else target for a in node.names}
            elif node.module and node.module.split(".")[0] == "entropy_rft":
                found.add(node.module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "entropy_rft"}
    return found


def test_core_imports_nothing_outside_core():
    outside = {
        f"{p.relative_to(PKG).as_posix()} imports {m}"
        for p in (PKG / "core").glob("*.py")
        for m in imported(p)
        if not m.startswith("entropy_rft.core")
    }
    assert not outside, sorted(outside)


def test_the_import_check_sees_an_import_outside_core(tmp_path):
    """The check above can fail: a relative import that leaves core/ is read as the module it names."""
    fake = PKG / "core" / "_layout_probe.py"
    try:
        fake.write_text("def f():\n    from ..train.trainer import train\n    from . import masks\n")
        assert imported(fake) == {"entropy_rft.train.trainer", "entropy_rft.core.masks"}
    finally:
        fake.unlink()


@pytest.mark.parametrize("old, new", sorted(entropy_rft.MOVED.items()))
def test_a_flat_layout_name_imports_the_moved_module(old, new):
    assert not (PKG / (old.split(".", 1)[1] + ".py")).exists()  # one file, under its new name
    assert importlib.import_module(old) is importlib.import_module(new)


def test_an_old_class_path_unpickles_as_the_moved_class():
    """Older runs' trainer_state.pt pickled classes under the flat layout's module paths."""
    import pickle

    from entropy_rft.core.control import MuControl as cls

    blob = pickle.dumps(cls, protocol=0).replace(  # protocol 0 writes the path as text
        b"entropy_rft.core.control", b"entropy_rft.control"
    )
    assert b"entropy_rft.control" in blob
    assert pickle.loads(blob) is cls


def design_map() -> set[str]:
    """The modules and folders docs/design.md's architecture block names, as paths relative to entropy_rft/: an
    entry's indentation says its folder (two spaces a level); a folder below the top (commands/cli/) lists its modules
    in its description."""
    text = (ROOT / "docs" / "design.md").read_text()
    block = text.split("```text\nentropy_rft/\n", 1)[1].split("```", 1)[0]
    named: set[str] = set()
    folder = {1: ""}  # depth -> the folder an entry at that depth is in
    listing = None  # a nested folder whose description lists its modules
    for line in block.splitlines():
        indent = len(line) - len(line.lstrip(" "))
        first = line.split()[0] if line.strip() else ""
        if indent in (2, 4) and (first.endswith(".py") or first.endswith("/")):
            depth = indent // 2
            path = folder[depth] + first
            named.add(path)
            if first.endswith("/"):
                folder[depth + 1] = path
            listing = path if first.endswith("/") and depth > 1 else None
            line = line.split(first, 1)[1]
        if listing:
            named |= {listing + name for name in re.findall(r"\b\w+\.py\b", line)}
    return named


def test_the_design_map_names_every_module_and_nothing_else():
    named = design_map()
    real = modules(PKG)
    folders = {p.relative_to(PKG).as_posix() + "/" for p in PKG.rglob("*") if p.is_dir() and any(p.glob("*.py"))}
    assert real - named == set(), "modules missing from docs/design.md's map"
    assert {n for n in named if n.endswith(".py")} - real == set(), "docs/design.md names modules that do not exist"
    assert folders - {n for n in named if n.endswith("/")} == set(), "folders missing from docs/design.md's map"


def test_the_readme_layout_names_what_exists_and_every_folder():
    text = (ROOT / "README.md").read_text()
    block = text.split("## Layout", 1)[1].split("```text\n", 1)[1].split("```", 1)[0]
    paths, folder = set(), ""
    for line in block.splitlines()[1:]:
        first = line.split()[0] if line.strip() else ""
        if line.startswith("  ") and not line.startswith("   "):  # an entry: a folder, or top-level modules
            folder = first if first.endswith("/") else ""
            line = line.split(first, 1)[1] if folder else line
            paths.add(folder)
        tokens = re.findall(r"(?<![\w/])(\w+(?:\.py|/))", line)
        paths |= {folder + t for t in tokens}
    missing = {p for p in paths if not (PKG / p).exists()}
    assert not missing, f"the README's layout names {sorted(missing)}"
    top = {p.name + "/" for p in PKG.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert top - paths == set(), "folders missing from the README's layout"


def test_the_flat_layouts_command_module_still_runs():
    """`python -m entropy_rft.cli` (scripts written for the flat layout) runs the command line: a moved package stays
    a package, so its __main__ is found."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "entropy_rft.cli", "--version"], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("entropy-rft ")
