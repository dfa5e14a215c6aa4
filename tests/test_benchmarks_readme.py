"""benchmarks/README.md is a complete map of benchmarks/ (issue 65): every script and every folder of records has a
row, every row names something that exists, and every page a row links to exists with the heading it links to. What
must be named is read from the directory, so a script or record folder added later fails the check until it has its
row. And every `python benchmarks/NAME.py WORD` a page or docstring gives names a subcommand NAME has."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
README = BENCH / "README.md"

ROW = re.compile(r"^\|\s*`([^`]+)`\s*\|", re.MULTILINE)  # a table row: its first cell's code span is the name
LINK = re.compile(r"\]\(([^)#\s]+)(?:#([^)\s]+))?\)")
SCRIPTS = ("*.py", "*.sh")
RECORDS = ("*.json", "*.jsonl")


def listed(text: str) -> list[str]:
    """The names the README's table rows give, relative to benchmarks/ (a folder ends in '/')."""
    return ROW.findall(text)


def required(bench: Path = BENCH) -> set[str]:
    """What the README must name, read from the directory: every file and folder at benchmarks/'s top level (this
    README aside), every script (*.py, *.sh) at any depth, and every folder one level below the top that holds records
    (*.json or *.jsonl anywhere under it)."""

    def skip(p: Path) -> bool:
        return any(part.startswith(".") or part == "__pycache__" for part in p.relative_to(bench).parts)

    top = {p.name + ("/" if p.is_dir() else "") for p in bench.iterdir() if not skip(p) and p.name != "README.md"}
    scripts = {p.relative_to(bench).as_posix() for pattern in SCRIPTS for p in bench.rglob(pattern) if not skip(p)}
    subfolders = {
        p.relative_to(bench).as_posix() + "/"
        for p in bench.glob("*/*")
        if p.is_dir() and not skip(p) and any(next(p.rglob(r), None) for r in RECORDS)
    }
    return top | scripts | subfolders


def unnamed(text: str, bench: Path = BENCH) -> set[str]:
    return required(bench) - set(listed(text))


def nonexistent(text: str, bench: Path = BENCH) -> set[str]:
    """Rows whose name is not in benchmarks/ (or names a folder that is a file, or the reverse)."""
    return {n for n in listed(text) if not ((bench / n).is_dir() if n.endswith("/") else (bench / n).is_file())}


def slug(heading: str) -> str:
    """The anchor MkDocs (Python-Markdown's toc) gives a heading; GitHub's is the same for these pages."""
    from markdown.extensions.toc import slugify

    return slugify(heading, "-")


def headings(page: Path) -> set[str]:
    out, fence = set(), False
    for line in page.read_text().splitlines():
        if re.match(r"^ {0,3}(```|~~~)", line):
            fence = not fence
        elif not fence and re.match(r"^#{1,6} ", line):
            out.add(slug(line.lstrip("#").strip()))
    return out


def broken_links(text: str, base: Path = BENCH) -> set[str]:
    """Links to a file that does not exist, or to a heading its page does not have."""
    pytest.importorskip("markdown")
    out = set()
    for target, anchor in LINK.findall(text):
        page = (base / target).resolve()
        if not page.exists():
            out.add(target)
        elif anchor and anchor not in headings(page):
            out.add(f"{target}#{anchor}")
    return out


def test_every_script_and_record_folder_of_benchmarks_has_a_row():
    """Every top-level file and folder of benchmarks/, every *.py and *.sh at any depth and every folder one level
    down holding *.json or *.jsonl records is a first-column name of a row of benchmarks/README.md."""
    missing = unnamed(README.read_text())
    assert not missing, f"benchmarks/README.md has no row for {sorted(missing)}"


def test_every_row_names_what_exists_once():
    """Each row's name is a file (or, ending in '/', a folder) under benchmarks/, and no name has two rows."""
    text = README.read_text()
    assert not nonexistent(text), f"benchmarks/README.md names {sorted(nonexistent(text))}, not in benchmarks/"
    names = listed(text)
    assert len(names) == len(set(names)), sorted({n for n in names if names.count(n) > 1})


def test_every_link_of_the_map_reaches_its_page_and_heading():
    """Each link of benchmarks/README.md (to docs/, the README or a record's page) names a file that exists, and its
    anchor, where it has one, is a heading of that page."""
    assert not broken_links(README.read_text())


def _first_row(text: str, kind) -> str:
    return next(n for n in listed(text) if kind(n))


KINDS = {
    "a top-level script": lambda n: "/" not in n and n.endswith(".py"),
    "a nested script": lambda n: n.count("/") > 1 and n.endswith(".py"),
    "a record folder": lambda n: n.count("/") == 1 and n.endswith("/"),
    "a folder of records one level down": lambda n: n.count("/") == 2 and n.endswith("/"),
    "a top-level file that is no script": lambda n: "/" not in n and n.endswith(".md"),
}


@pytest.mark.parametrize("kind", KINDS)
def test_the_check_fails_on_a_map_missing_a_row(kind):
    """The completeness check can fail: the README with the first row of each kind removed is reported missing
    exactly that name."""
    text = README.read_text()
    name = _first_row(text, KINDS[kind])
    cut = "\n".join(line for line in text.splitlines() if not line.startswith(f"| `{name}` |"))
    assert unnamed(cut) == {name}


def test_the_check_fails_on_a_row_naming_nothing():
    """A row for a script that does not exist, or for a file written as a folder, is reported."""
    text = README.read_text() + "| `no_such_script.py` | x | x | x |\n| `gpu.md/` | x | x | x |\n"
    assert nonexistent(text) == {"no_such_script.py", "gpu.md/"}


def test_the_check_fails_on_a_link_to_a_missing_page_or_heading():
    """A link to a page that does not exist, or to a heading its page lacks, is reported."""
    text = "[a](../docs/no_such_page.md) [b](../docs/evidence/index.md#no-such-heading) [c](gpu.md)"
    assert broken_links(text) == {"../docs/no_such_page.md", "../docs/evidence/index.md#no-such-heading"}


def test_what_must_be_named_is_read_from_the_directory(tmp_path):
    """A script or a record folder added to benchmarks/ must be named (nothing is a hard-coded list): a new script
    and a new folder of cell records are required, a subfolder holding no records and a __pycache__ are not."""
    bench = tmp_path / "benchmarks"
    (bench / "new_study" / "cells" / "grpo" / "seed0-abc").mkdir(parents=True)
    (bench / "new_study" / "cells" / "grpo" / "seed0-abc" / "cell.json").write_text("{}")
    (bench / "new_study" / "figures").mkdir()
    (bench / "new_study" / "figures" / "a.png").write_bytes(b"")
    (bench / "new_study" / "tools").mkdir()
    (bench / "new_study" / "tools" / "draw.sh").write_text("")
    (bench / "new_study.py").write_text("")
    (bench / "__pycache__").mkdir()
    (bench / "__pycache__" / "new_study.cpython-312.pyc").write_bytes(b"")
    (bench / "README.md").write_text("")
    assert required(bench) == {"new_study/", "new_study.py", "new_study/cells/", "new_study/tools/draw.sh"}
    text = "| `new_study/` | | | |\n| `new_study.py` | | | |\n| `new_study/cells/` | | | |\n"
    assert unnamed(text, bench) == {"new_study/tools/draw.sh"}


# A command a page or a docstring gives for a benchmark script with subcommands: `python benchmarks/NAME.py WORD`.
COMMAND = re.compile(r"python3?\s+benchmarks/(\w+\.py)[ \t]+([A-Za-z][\w-]*)")
SUBCOMMAND = re.compile(r"add_parser\(\s*\"([\w-]+)\"")


def subcommands(bench: Path = BENCH) -> dict[str, set[str]]:
    """Each benchmark script with argparse subcommands, and their names (its `add_parser` calls)."""
    out = {}
    for script in bench.glob("*.py"):
        text = script.read_text()
        if "add_subparsers" in text:
            out[script.name] = set(SUBCOMMAND.findall(text))
    return out


def unknown_commands(texts: dict[str, str], known: dict[str, set[str]]) -> list[tuple[str, str, str]]:
    """(where, script, word) for every command in `texts` whose word is not a subcommand of its script."""
    return [
        (where, script, word)
        for where, text in texts.items()
        for script, word in COMMAND.findall(text)
        if script in known and word not in known[script]
    ]


def command_texts() -> dict[str, str]:
    """Where commands are written: the pages, the records' READMEs, the scripts' and the package's docstrings."""
    pages = [*ROOT.glob("*.md"), *ROOT.glob("docs/**/*.md"), *BENCH.rglob("*.md")]
    paths = [*pages, *BENCH.glob("*.py"), *(ROOT / "entropy_rft").rglob("*.py"), ROOT / "Makefile"]
    return {p.relative_to(ROOT).as_posix(): p.read_text() for p in paths if p.is_file()}


def test_every_benchmark_command_the_docs_give_is_a_subcommand_of_its_script():
    known = subcommands()
    assert {"study.py", "real_lm_study.py", "real_lm_warm.py"} <= set(known)
    texts = command_texts()
    assert sum(len(COMMAND.findall(t)) for t in texts.values()) > 20  # the pages do give such commands
    assert unknown_commands(texts, known) == []


def test_the_command_check_finds_a_subcommand_the_script_lacks():
    known = {"s.py": {"run", "analyse"}}
    texts = {"a.md": "    python benchmarks/s.py run --jobs 2\n    python benchmarks/s.py check-split  # counts"}
    assert unknown_commands(texts, known) == [("a.md", "s.py", "check-split")]
    assert unknown_commands({"b.md": "import s  # benchmarks/s.py\nrun"}, known) == []
