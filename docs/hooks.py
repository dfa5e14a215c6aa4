"""MkDocs hook: the pages that are generated from the code and the repository at build time, so they cannot drift.

- `<!-- generated: cli -->` in a page becomes every subcommand and option of `entropy_rft.commands.cli.build_parser()`:
  its
  option strings, metavar, default, choices and help text, read from the parser itself (nothing is copied).
- `<!-- generated: config -->` becomes every `TrainConfig` field with its type, default and help text, read from the
  dataclass fields and their metadata (`config._f`), grouped under the section comments of the class body.
- `benchmarks/study/study.md` and `benchmarks/gpu.md` are published as `evidence/study.md` and `evidence/gpu.md`,
  and the study's figures as `evidence/study/*.png`: the site shows the committed files, not copies of them.

The public API page uses mkdocstrings (`::: entropy_rft.module`), which reads the docstrings itself.
tests/test_docs.py imports this file to check that every option and field reaches the pages.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# the pages describe this checkout's code, whichever entropy_rft the environment has installed
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# site path -> repository path of the files published from outside docs/
PUBLISHED = {
    "evidence/study.md": "benchmarks/study/study.md",
    "evidence/gpu.md": "benchmarks/gpu.md",
    "evidence/avgk.md": "benchmarks/study_avgk/avgk.md",
    "changelog.md": "CHANGELOG.md",
    "evidence/avgk_overlap.md": "benchmarks/study_avgk/overlap_posthoc.md",
    "evidence/real_lm_dynamics.md": "benchmarks/real_lm_dynamics/results.md",
    "evidence/avgk_clean.md": "benchmarks/study_avgk_clean/avgk.md",
    "evidence/real_lm_study.md": "benchmarks/real_lm_study/study.md",
    "evidence/real_lm_warm.md": "benchmarks/real_lm_warm/study.md",
}
PUBLISHED_GLOBS = {
    "evidence/study": "benchmarks/study/*.png",
    "evidence/study_avgk": "benchmarks/study_avgk/*.png",
    "evidence/study_avgk_clean": "benchmarks/study_avgk_clean/*.png",
    "evidence/compare_engines": "benchmarks/compare_engines/*.png",
    "evidence/real_lm_dynamics": "benchmarks/real_lm_dynamics/*.png",
    "evidence/real_lm_study": "benchmarks/real_lm_study/*.png",
    "evidence/real_lm_warm": "benchmarks/real_lm_warm/*.png",
    "evidence/side_by_side": "benchmarks/side_by_side/*.png",
}


def _cell(text: str) -> str:
    """Text safe inside one cell of a Markdown table."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _code(text: str) -> str:
    return f"`{text}`" if "`" not in text else f"``{text}``"


# ---------------------------------------------------------------------------------------------------------------
# The command line


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """name -> subparser, in the order the parser lists them."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _default(action: argparse.Action) -> str:
    if action.required or not action.option_strings and action.nargs in ("+", "*", None):
        return "required" if action.option_strings or action.nargs in ("+", None) else ""
    if action.nargs == 0 or action.default in (None, argparse.SUPPRESS):
        return ""
    if action.default == [] or action.default is False:
        return ""
    value = action.default
    if isinstance(value, list):
        value = ",".join(str(v) for v in value)
    return _code(str(value))


def _usage(action: argparse.Action) -> str:
    if not action.option_strings:
        name = action.metavar or action.dest.upper()
        return _code(f"{name} [{name} ...]" if action.nargs == "+" else name)
    first = action.option_strings[0]
    if action.nargs == 0:
        shown = first
    else:
        metavar = action.metavar or (("{" + ",".join(action.choices) + "}") if action.choices else action.dest.upper())
        shown = f"{first} {metavar}" + (f" [{metavar} ...]" if action.nargs in ("+", "*") else "")
    others = ", ".join(_code(o) for o in action.option_strings[1:])
    return _code(shown) + (f" (also {others})" if others else "")


def _exclusive(parser: argparse.ArgumentParser) -> list[list[str]]:
    return [[a.option_strings[0] for a in g._group_actions] for g in parser._mutually_exclusive_groups]


def cli_markdown() -> str:
    """Every subcommand and option of the real parser as Markdown: one section and one table per subcommand."""
    from entropy_rft.commands.cli import RENAMED, build_parser

    parser = build_parser()
    lines = [f"`{parser.prog}` — {parser.description}.", ""]
    top = [a for a in parser._actions if a.option_strings and not isinstance(a, argparse._HelpAction)]
    if top:  # options of entropy-rft itself, before the subcommand
        lines += ["| option | default | what it does |", "|---|---|---|"]
        lines += [f"| {_usage(a)} | {_default(a)} | {_cell(a.help or '')} |" for a in top] + [""]
    for name, sub in subcommands(parser).items():
        lines += [f"## `{parser.prog} {name}`", "", (sub.description or "").rstrip(".") + ".", ""]
        lines += ["| option | default | what it does |", "|---|---|---|"]
        for action in sub._actions:
            if isinstance(action, argparse._HelpAction) or action.help == argparse.SUPPRESS:
                continue
            lines.append(f"| {_usage(action)} | {_default(action)} | {_cell(action.help or '')} |")
        lines.append("")
        for group in _exclusive(sub):
            lines.append("- " + " and ".join(_code(o) for o in group) + " exclude each other.")
        for old, new in RENAMED.get(name, {}).items():
            lines.append(f"- {_code(old)} is the old spelling of {_code(new)}: it still works, with a note.")
        if _exclusive(sub) or RENAMED.get(name):
            lines.append("")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------------
# The settings


def config_sections() -> list[tuple[str, list[str]]]:
    """(section title, field names) in the order of TrainConfig's body; the titles are its `# ...` comments."""
    from entropy_rft.config import TrainConfig

    names = {f.name for f in dataclasses.fields(TrainConfig)}
    sections: list[tuple[str, list[str]]] = [("", [])]
    for line in inspect.getsource(TrainConfig).splitlines():
        comment = re.match(r"^    # (.+)$", line)
        field = re.match(r"^    (\w+): ", line)
        if comment:
            sections.append((comment.group(1), []))
        elif field and field.group(1) in names:
            sections[-1][1].append(field.group(1))
    return [(title, fields) for title, fields in sections if fields]


def _field_default(f: dataclasses.Field) -> object:
    return f.default if f.default is not dataclasses.MISSING else f.default_factory()


def config_markdown() -> str:
    """Every TrainConfig field with its type, default and help text, in the sections of the class body."""
    from entropy_rft.config import TrainConfig

    by_name = {f.name: f for f in dataclasses.fields(TrainConfig)}
    lines = []
    for title, names in config_sections():
        lines += [
            f"## {title[0].upper() + title[1:] if title else 'Fields'}",
            "",
            "| field | type | default | help |",
            "|---|---|---|---|",
        ]
        for name in names:
            f = by_name[name]
            note = " *(bookkeeping)*" if f.metadata.get("bookkeeping") else ""
            lines.append(
                f"| {_code(name)}{note} | {_code(str(f.type))} | {_code(repr(_field_default(f)))} | "
                f"{_cell(f.metadata.get('help', ''))} |"
            )
        lines.append("")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------------
# The numbered departures of every module


def departures() -> list[tuple[str, str]]:
    """(module path, its docstring's departures block) for every module of the package that has one, read from the
    source files (nothing imported), so a new module's departures appear without an edit here. The block is the
    docstring's first line starting with "Departures" and what follows it up to the next paragraph that is not a
    numbered item or its continuation."""
    import ast

    out = []
    for path in sorted((ROOT / "entropy_rft").rglob("*.py")):
        doc = ast.get_docstring(ast.parse(path.read_text()), clean=True) or ""
        lines = doc.splitlines()
        start = next((i for i, line in enumerate(lines) if line.startswith("Departures")), None)
        if start is None:
            continue
        block = [lines[start]]
        for line in lines[start + 1 :]:
            if block[-1] == "" and line and not re.match(r"^(\d+\.|\s)", line):
                break
            block.append(line)
        out.append((path.relative_to(ROOT).as_posix(), "\n".join(block).strip()))
    return out


def departures_markdown() -> str:
    lines = []
    for path, block in departures():
        lines += [f"### `{path}`", "", "```text", block, "```", ""]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------------
# The metrics


def metrics_markdown() -> str:
    """Every key of metrics.jsonl from entropy_rft.metric_names.METRICS: name, meaning, unit, when logged, writers."""
    from entropy_rft.metric_names import METRICS

    lines = ["| key | meaning | unit | when logged | written by |", "|---|---|---|---|---|"]
    for m in METRICS:
        lines.append(
            f"| {_code(m.name)} | {_cell(m.meaning)} | {_cell(m.unit)} | {_cell(m.when)} | {', '.join(m.writers)} |"
        )
    return "\n".join(lines) + "\n"


GENERATORS = {
    "cli": cli_markdown,
    "config": config_markdown,
    "departures": departures_markdown,
    "metrics": metrics_markdown,
}
MARKER = re.compile(r"<!-- generated: (\w+) -->")


# ---------------------------------------------------------------------------------------------------------------
# Lists that follow a paragraph line: CommonMark (GitHub, the README) starts a list there, Python-Markdown (this site)
# folds it into the paragraph. The preprocessor gives the site CommonMark's reading, for the pages and for the
# docstrings mkdocstrings renders (tests/test_docs.py checks the built HTML for list markers left in a paragraph).

LIST_ITEM = re.compile(r"^( {0,3})([-*+]|\d{1,9}[.)])[ \t]+\S")


def blank_before_lists(lines: list[str]) -> list[str]:
    """The lines with a blank line inserted where a list item interrupts a paragraph (CommonMark: any bullet item, an
    ordered one only when it starts at 1), outside fenced code; items of a list already open are left alone."""
    out: list[str] = []
    fence, in_list, in_paragraph = None, False, False
    for line in lines:
        opening = re.match(r"^ {0,3}(`{3,}|~{3,})", line)
        if fence is None and opening:
            fence = opening.group(1)
        elif fence is not None:
            if re.match(rf"^ {{0,3}}{re.escape(fence[0])}{{{len(fence)},}}\s*$", line):
                fence = None
            out.append(line)
            continue
        item = LIST_ITEM.match(line)
        if not line.strip():
            in_list = in_paragraph = False
        elif item and not in_list:
            marker = item.group(2)
            if in_paragraph and (marker in "-*+" or marker[:-1] == "1"):
                out.append("")
                in_list = True
            elif not in_paragraph:
                in_list = True
        elif not line.startswith(("|", "#", "<", "    ", "\t")):
            in_paragraph = True
        out.append(line)
    return out


def lists_extension():
    """A Python-Markdown extension running blank_before_lists before the block parser (after fenced code is held
    aside by superfences and raw HTML by Python-Markdown)."""
    from markdown import Extension
    from markdown.preprocessors import Preprocessor

    class Lists(Preprocessor):
        def run(self, lines):
            return blank_before_lists(lines)

    class ListsAfterParagraphs(Extension):
        def extendMarkdown(self, md):
            md.preprocessors.register(Lists(md), "entropy_rft_lists", 19)

    return ListsAfterParagraphs()


# ---------------------------------------------------------------------------------------------------------------
# MkDocs events


def project() -> dict:
    """pyproject.toml's [project] table: the version and the URLs the site shows."""
    import tomllib

    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def on_config(config):
    config.markdown_extensions.append(lists_extension())
    meta = project()
    # the version and licence in every page's footer, from pyproject.toml (the version the package builds)
    config.copyright = f"entropy-rft {meta['version']} · {meta.get('license', {}).get('text', '')} licence"
    # the repository link in the header: pyproject.toml's [project.urls] Repository, else the clone's origin
    repository = meta.get("urls", {}).get("Repository") or origin_url()
    if repository and not config.repo_url:
        config.repo_url = repository
    return config


def origin_url(remote: str | None = None) -> str | None:
    """The web address of the clone's `origin` remote (git@host:o/r.git and https://host/o/r.git alike), or None
    where there is none; `remote` is the remote's URL as git stores it (read from git when not given)."""
    import subprocess

    if remote is None:
        try:
            done = subprocess.run(
                ["git", "-C", str(ROOT), "config", "--get", "remote.origin.url"],
                capture_output=True,
                text=True,
                timeout=10,
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        remote = done.stdout.strip() if done.returncode == 0 else ""
    ssh = re.match(r"^(?:ssh://)?git@([^:/]+)[:/](.+?)(?:\.git)?/?$", remote)
    if ssh:
        return f"https://{ssh.group(1)}/{ssh.group(2)}"
    web = re.match(r"^(https?://)(?:[^@/]+@)?(.+?)(?:\.git)?/?$", remote)
    return f"https://{web.group(2)}" if web else None


def on_files(files, config):
    from mkdocs.structure.files import File

    def publish(site_path: str, source: Path) -> None:
        files.append(File.generated(config, site_path, abs_src_path=str(source)))

    for site_path, repo_path in PUBLISHED.items():
        publish(site_path, ROOT / repo_path)
    for site_dir, pattern in PUBLISHED_GLOBS.items():
        for source in sorted(ROOT.glob(pattern)):
            publish(f"{site_dir}/{source.name}", source)
    return files


def on_page_markdown(markdown, page, config, files):
    def generate(match: re.Match) -> str:
        name = match.group(1)
        if name not in GENERATORS:
            raise ValueError(f"{page.file.src_uri}: unknown generated section {name!r}; known: {sorted(GENERATORS)}")
        return GENERATORS[name]()

    return MARKER.sub(generate, markdown)
