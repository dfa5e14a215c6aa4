"""The package's layout holds its borders (issues 55 and 65): core/ imports nothing outside core/; train/ imports
neither commands/ nor integrations/, and only they import it; nothing outside commands/ imports it; the top level
holds at most 10 modules; the maps in docs/design.md and the README name the package as it is. Each border check
has a twin that plants a crossing and sees the check report it."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "entropy_rft"


def modules(folder: Path) -> set[str]:
    """Every module under folder, as a path relative to entropy_rft/ (__init__ and __main__ left out)."""
    return {p.relative_to(PKG).as_posix() for p in folder.rglob("*.py") if p.stem not in ("__init__", "__main__")}


def imported(path: Path, root: Path = ROOT) -> set[str]:
    """The entropy_rft modules (or packages) a file imports, function-level imports included, made absolute (root:
    the folder that holds the package)."""
    package = ".".join(path.relative_to(root).with_suffix("").parts[:-1])
    if path.stem == "__init__":
        package = ".".join(path.relative_to(root).parent.parts)
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


def settings_mismatches(protocol: type, settings: type) -> list[str]:
    """What `protocol` names of a run's settings that `settings` lacks or types otherwise (the annotations compared
    as written, methods by name)."""
    import typing

    want, have = typing.get_type_hints(protocol), typing.get_type_hints(settings)
    wrong = [f"{n}: {t} (settings: {have.get(n, 'missing')})" for n, t in want.items() if have.get(n) != t]
    methods = {n for n, v in vars(protocol).items() if callable(v) and not n.startswith("_")}
    return wrong + [f"{n}() missing" for n in sorted(methods) if not callable(getattr(settings, n, None))]


def test_core_names_what_it_reads_of_the_settings():
    """core/ does not import entropy_rft.config, so the controls say what they read of a run's settings in a
    Protocol (core.control.ControlSettings); TrainConfig holds each name with the same type."""
    from entropy_rft.config import TrainConfig
    from entropy_rft.core.control import ControlSettings

    assert not settings_mismatches(ControlSettings, TrainConfig)
    assert "method_overrides" in vars(ControlSettings) and "entropy_target" in ControlSettings.__annotations__


def test_the_settings_check_sees_a_missing_name_and_a_wrong_type():
    from typing import Protocol

    from entropy_rft.config import TrainConfig

    class Reads(Protocol):
        entropy_target: float | None
        entropy_coef: int  # TrainConfig: float
        entropy_temperature: float  # not a setting

        def method_overrides(self) -> dict: ...
        def knob(self) -> float: ...

    found = settings_mismatches(Reads, TrainConfig)
    assert found == [
        "entropy_coef: <class 'int'> (settings: <class 'float'>)",
        "entropy_temperature: <class 'float'> (settings: missing)",
        "knob() missing",
    ], found


def crossings(pkg: Path, folder: str, *, never: tuple[str, ...], only_from: tuple[str, ...]) -> set[str]:
    """The imports that cross `folder`'s border, as "file imports module" (function-level imports included): a file of
    pkg/folder importing a module under one of the folders `never`, or a file outside folder and outside the folders
    `only_from` importing a module under folder."""

    def under(module: str, folders: tuple[str, ...]) -> bool:
        return any(module == f"entropy_rft.{f}" or module.startswith(f"entropy_rft.{f}.") for f in folders)

    def file_in(path: Path, folders: tuple[str, ...]) -> bool:
        return path.relative_to(pkg).parts[0] in folders

    found = set()
    for path in pkg.rglob("*.py"):
        for module in imported(path, pkg.parent):
            inside = file_in(path, (folder,))
            if (inside and under(module, never)) or (
                not inside and not file_in(path, only_from) and under(module, (folder,))
            ):
                found.add(f"{path.relative_to(pkg).as_posix()} imports {module}")
    return found


# What each folder may import, and who may import it (issue 65). train/ is the built-in trainer's band: it sits
# below the command line and the engines' adapters, and above everything else of the package.
TRAIN = {"never": ("commands", "integrations"), "only_from": ("commands", "integrations")}
# commands/ holds what only the command line uses: nothing else of the package imports it, and it uses no adapter.
COMMANDS = {"never": ("integrations",), "only_from": ()}


def test_train_imports_neither_commands_nor_integrations_and_only_they_import_it():
    assert not crossings(PKG, "train", **TRAIN), sorted(crossings(PKG, "train", **TRAIN))


def test_commands_import_no_integration_and_nothing_else_imports_them():
    assert not crossings(PKG, "commands", **COMMANDS), sorted(crossings(PKG, "commands", **COMMANDS))


def test_the_top_level_holds_at_most_ten_modules():
    """What several folders share stays at the top; everything else lives in a folder. __init__.py is counted."""
    top = sorted(p.name for p in PKG.glob("*.py"))
    assert "__init__.py" in top and len(top) <= 10, top


def plant(tmp_path: Path, files: dict[str, str]) -> Path:
    """A stand-in package under tmp_path holding files (path relative to entropy_rft/ -> source); the real package
    is never written to."""
    pkg = tmp_path / "entropy_rft"
    for name, source in files.items():
        (pkg / name).parent.mkdir(parents=True, exist_ok=True)
        (pkg / name).write_text(source)
    return pkg


def test_the_train_border_check_sees_a_crossing_each_way(tmp_path):
    """The train/ check can fail: train/ importing the command line (relative, at module level) and run/ importing
    train/ (inside a function) are both reported; train/ importing run/, and commands/ importing train/, are not."""
    pkg = plant(
        tmp_path,
        {
            "train/step.py": "from ..commands.cli import main\nfrom ..run import stops\n",
            "run/record.py": "def f():\n    from ..train.step import Step\n",
            "commands/demo.py": "from entropy_rft.train.trainer import train\n",
        },
    )
    assert crossings(pkg, "train", **TRAIN) == {
        "train/step.py imports entropy_rft.commands.cli",
        "run/record.py imports entropy_rft.train.step",
    }


def test_the_commands_border_check_sees_a_crossing_each_way(tmp_path):
    """The commands/ check can fail: commands/ importing an adapter, and an adapter importing commands/ (the
    direction integrations/trl_countdown.py once took), are both reported; commands/ importing train/ is not."""
    pkg = plant(
        tmp_path,
        {
            "commands/cli/train.py": "from ...integrations import trl\nfrom ...train.trainer import train\n",
            "integrations/trl_countdown.py": "from ..commands.demo import run_config\n",
        },
    )
    assert crossings(pkg, "commands", **COMMANDS) == {
        "commands/cli/train.py imports entropy_rft.integrations",
        "integrations/trl_countdown.py imports entropy_rft.commands.demo",
    }


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
