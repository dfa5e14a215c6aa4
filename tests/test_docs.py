"""The documentation: every fenced code block of docs/**/*.md and README.md runs or is validated, and the generated
reference pages list every command-line option and every TrainConfig field (rules: docs/contributing.md).

- An unmarked block runs on the CPU with the shipped policy, the blocks of one page in order in one fresh directory:
  bash line by line (`entropy-rft ...` through cli.main in this process, any other line through bash), python
  executed, yaml built into a TrainConfig (a flat recipe).
- A block whose title starts with "needs" or "long" (```bash title="needs a GPU"```) is validated only: bash -n, each
  `entropy-rft ...` line parsed by the real parser, compile() for python, a YAML load for yaml.
- A `text` block is not code and is not checked. Any other unmarked language fails: it can be neither run nor
  validated here.
- An unmarked block that needs a GPU (CUDA, a hub model, vLLM, accelerate or DeepSpeed, bf16 in TRL, a paper-scale
  recipe trained for real: GPU_SIGNS) fails before it runs: it must be marked, so that a machine with a GPU cannot
  hide that a CPU user cannot follow it. A block marked "needs a GPU..." has its CPU twin beside it: the block
  before or after it (text blocks aside) is unmarked, so it runs here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import os
import re
import shlex
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted((ROOT / "docs").rglob("*.md")) + [ROOT / "README.md"]
# what a page's directory sees of the repository: the recipes and examples that blocks name by relative path
LINKED = ("entropy_rft", "examples", "benchmarks")
SHELL = {"bash", "sh", "shell"}
FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})([^`]*)$")
# what only a GPU runs (or only a machine with the hub and a GPU): CUDA, hub models, vLLM, multi-GPU launchers
GPU_SIGNS = re.compile(
    r"cuda|\bbf16=True|--engine[ =]vllm|engine: vllm|accelerate launch|torchrun|deepspeed|"
    r"nvidia-smi|[\"' ](Qwen|meta-llama|mistralai|deepseek-ai|google)/[\w.-]+",
    re.IGNORECASE,
)


@dataclasses.dataclass
class Block:
    page: str
    line: int  # 1-based line of the opening fence
    lang: str
    title: str
    text: str

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def marked(self) -> bool:
        return self.title.startswith(("needs", "long"))


def blocks(markdown: str, page: str) -> list[Block]:
    """The fenced code blocks of a Markdown text, with their language and title (CommonMark's fence rules: a
    closing fence is the same character, at least as long, with nothing after it)."""
    out, lines, i = [], markdown.splitlines(), 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        fence, info = opening.group(1), opening.group(2).strip()
        title = re.search(r'title="([^"]*)"', info)
        body, j = [], i + 1
        while j < len(lines) and not re.match(rf"^ {{0,3}}{fence[0]}{{{len(fence)},}}\s*$", lines[j]):
            body.append(lines[j])
            j += 1
        out.append(
            Block(page, i + 1, info.split()[0] if info else "", title.group(1) if title else "", "\n".join(body))
        )
        i = j + 1
    return out


def commands(script: str) -> list[str]:
    """The logical lines of a shell block: backslash continuations joined, blank and comment-only lines dropped."""
    out = []
    for line in script.replace("\\\n", " ").splitlines():
        if shlex.split(line, comments=True):
            out.append(line)
    return out


def parse_cli(argv: list[str], where: str) -> None:
    """Parse `entropy-rft ARGS` with the real parser; fail naming the block when argparse refuses it."""
    from entropy_rft.commands.cli import build_parser

    try:
        build_parser().parse_args(argv)
    except SystemExit as stop:
        if stop.code not in (0, None):
            pytest.fail(f"{where}: `entropy-rft {shlex.join(argv)}` is refused by the parser (exit {stop.code})")


def validate(block: Block) -> None:
    """The checks of a block that does not run here."""
    if block.lang in SHELL:
        check = subprocess.run(["bash", "-n"], input=block.text, text=True, capture_output=True)
        assert check.returncode == 0, f"{block.where}: bash -n: {check.stderr.strip()}"
        for line in commands(block.text):
            argv = shlex.split(line, comments=True)
            if argv[0] == "entropy-rft":
                parse_cli(argv[1:], block.where)
    elif block.lang == "python":
        compile(block.text, block.where, "exec")
    elif block.lang == "yaml":
        yaml.safe_load(block.text)
    else:
        pytest.fail(
            f"{block.where}: a {block.lang or 'plain'!r} block can be neither run nor validated; use bash, "
            "python or yaml, or text for what is not code"
        )


def run(block: Block) -> None:
    """Run an unmarked block in the current directory (the page's)."""
    if block.lang in SHELL:
        validate(block)  # a syntax error fails before anything runs
        from entropy_rft.commands.cli import main

        for line in commands(block.text):
            argv = shlex.split(line, comments=True)
            if argv[0] == "entropy-rft":
                try:
                    main(argv[1:])
                except SystemExit as stop:
                    if stop.code not in (0, None):
                        pytest.fail(f"{block.where}: `{line.strip()}` exited with {stop.code}")
            else:
                done = subprocess.run(["bash", "-c", line], capture_output=True, text=True)
                assert done.returncode == 0, f"{block.where}: `{line.strip()}` exited {done.returncode}: {done.stderr}"
    elif block.lang == "python":
        exec(compile(block.text, block.where, "exec"), {"__name__": "__docs__"})
    elif block.lang == "yaml":
        from entropy_rft.config import TrainConfig

        recipe = yaml.safe_load(block.text)
        assert isinstance(recipe, dict), f"{block.where}: an unmarked yaml block must be a flat recipe"
        TrainConfig(**recipe)
    else:
        validate(block)  # fails with the reason


def needs_gpu(block: Block) -> str | None:
    """What in an unmarked block needs a GPU (module docstring), or None."""
    sign = GPU_SIGNS.search(block.text)
    if sign:
        return sign.group(0).strip()
    if "GRPOConfig(" in block.text and "bf16=False" not in block.text:
        return "GRPOConfig without bf16=False (TRL's default bf16 needs a GPU)"
    for line in block.text.splitlines():
        if (
            re.search(r"entropy-rft (train|eval|filter)\b", line)
            and re.search(
                r"configs/(paper|one_gpu)/|"
                r"--config (paper|one_gpu)/",
                line,
            )
            and "--dry-run" not in line
        ):
            return "a paper-scale recipe trained or evaluated for real (--dry-run runs it on the CPU)"
    return None


def check_twins(found: list[Block]) -> None:
    """Each block marked "needs a GPU..." has an unmarked block beside it: its CPU twin."""
    code = [b for b in found if b.lang != "text"]
    for i, block in enumerate(code):
        if block.title.startswith("needs a GPU"):
            beside = [code[j] for j in (i - 1, i + 1) if 0 <= j < len(code)]
            if not any(not b.marked for b in beside):
                pytest.fail(
                    f"{block.where}: a GPU-only block needs its CPU twin beside it (an unmarked block just "
                    "before or after it)"
                )


def check_page(markdown: str, page: str, directory: Path) -> None:
    """Every block of one page, in order, in `directory` (the repository's recipes and examples linked into it)."""
    import torch

    for name in LINKED:
        if not (directory / name).exists():
            (directory / name).symlink_to(ROOT / name)
    threads = torch.get_num_threads()
    # The blocks' model is the 0.8M-parameter shipped policy: one thread does its tiny matmuls as fast, and on a
    # shared, busy machine it avoids OpenMP threads waiting on each other (measured: 5 ms per linear call, 9x slower)
    torch.set_num_threads(1)
    found = blocks(markdown, page)
    check_twins(found)
    with contextlib.chdir(directory), contextlib.ExitStack() as restore:
        restore.callback(torch.set_num_threads, threads)
        for block in found:
            if block.lang == "text":
                continue
            if not block.marked and needs_gpu(block):
                pytest.fail(
                    f"{block.where}: needs a GPU ({needs_gpu(block)}) but is not marked: give it a title "
                    '"needs a GPU ..." and a CPU twin beside it'
                )
            try:
                validate(block) if block.marked else run(block)
            except Exception as err:  # any error of a block's code is that block's failure
                pytest.fail(f"{block.where}: {type(err).__name__}: {err}")


def clipped_tokens(run: Path) -> tuple[float, int]:
    """(the largest clip_frac of the run's steps, tokens struck through in its token samples)."""
    import json

    from entropy_rft import samples

    fracs = [json.loads(line)["clip_frac"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    rows = [r for rec in samples.read_samples(run).values() for g in rec["groups"] for r in g["responses"]]
    return max(fracs), sum(len(r["kept"]) - sum(r["kept"]) for r in rows)


def watched_run(run: Path) -> None:
    """The watch page's CPU run answers its prompts and writes what inspect and report read."""
    import json

    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [1, 2, 3] and min(m["reward_mean"] for m in lines) > 0.1, lines
    assert (run / "inspect.html").exists()


# what a page's example claims to show, checked on what its blocks wrote (issue 43: examples that show what they claim)
CLAIMS = {
    "README.md": lambda d: all(n > 0 for n in clipped_tokens(d / "runs/readme")),  # Clip_B clips tokens
    "docs/getting-started.md": lambda d: all(n > 0 for n in clipped_tokens(d / "runs/first")),
    "docs/watch.md": lambda d: watched_run(d / "runs/watched"),
}


@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_code_block_of_the_page_runs_or_is_marked_and_validated(page, tmp_path):
    """Property: each block of the page runs as written (unmarked) or passes its language's validation (marked);
    where the page claims what its example shows (CLAIMS), the run its blocks wrote shows it."""
    name = page.relative_to(ROOT).as_posix()
    check_page(page.read_text(), name, tmp_path)
    if name in CLAIMS:
        assert CLAIMS[name](tmp_path) is not False, f"{name}: its example does not show what the page says"


# ---------------------------------------------------------------------------------------------------------------
# The checker itself: a failing block must fail it


@pytest.mark.parametrize(
    "markdown",
    [
        "```bash\nentropy-rft train --steps 0\n```\n",  # refused value, unmarked: runs and fails
        "```bash\nfalse\n```\n",  # any failing shell line
        "```python\nraise RuntimeError('stale example')\n```\n",  # python that raises
        "```yaml\nno_such_field: 1\n```\n",  # a recipe key TrainConfig does not have
        '```bash title="needs a GPU"\nentropy-rft train --stepz 2\n```\n',  # marked, but the parser refuses it
        '```bash title="needs verl"\nif then fi\n```\n',  # marked, but not shell
        '```python title="needs a GPU"\ndef broken(:\n```\n',  # marked, but not python
        "```toml\na = 1\n```\n",  # unmarked language that cannot run here
        "```bash\nentropy-rft eval --model Qwen/Qwen2.5-7B-Instruct\n```\n",  # a hub model, unmarked
        "```python\nGRPOConfig(output_dir='x')\n```\n",  # TRL's bf16 default, unmarked
        "```bash\nentropy-rft train --config paper/qwen3-4b-base_grpo\n```\n",  # a paper recipe for real, unmarked
        "```bash\nentropy-rft eval --device cuda\n```\n",  # CUDA, unmarked
        '```bash title="needs a GPU"\nentropy-rft --version\n```\n',  # a GPU block without a CPU twin
    ],
    ids=[
        "cli-refused",
        "shell-fails",
        "python-raises",
        "yaml-unknown-key",
        "marked-cli-refused",
        "marked-bash-syntax",
        "marked-python-syntax",
        "unknown-language",
        "unmarked-hub-model",
        "unmarked-trl-bf16",
        "unmarked-paper-recipe",
        "unmarked-cuda",
        "gpu-block-without-twin",
    ],
)
def test_a_failing_block_fails_the_check(markdown, tmp_path):
    """Property: the checker is not vacuous: each kind of broken block makes it fail, naming the block."""
    with pytest.raises(pytest.fail.Exception, match="synthetic.md:1"):
        check_page(markdown, "synthetic.md", tmp_path)


def test_passing_blocks_pass_and_text_is_skipped(tmp_path):
    """Property: valid blocks of each kind pass, and a text block is never run."""
    markdown = (
        "```text\nentropy-rft train --stepz nonsense\n```\n"
        '```bash title="long: minutes of CPU"\nentropy-rft compare --methods grpo,clip_b --seeds 3\n```\n'
        '```python title="needs a GPU"\nimport torch\n```\n'
        "```bash\nentropy-rft train --config paper/qwen3-4b-base_grpo --dry-run --help\n```\n"  # its twin
        "```yaml\nmethod: clip_b\nmu: 1.5\n```\n"
        "```bash\necho ok > made.txt\n```\n"
    )
    check_page(markdown, "synthetic.md", tmp_path)
    assert (tmp_path / "made.txt").read_text() == "ok\n"


def test_fences_are_parsed_as_commonmark():
    """Property: language, title, body and line are read from the fence; a longer fence holds a shorter one."""
    found = blocks('a\n````markdown\n```bash\nx\n```\n````\n\n```bash title="needs a GPU"\nmake demo\n```\n', "p")
    assert [(b.lang, b.title, b.line) for b in found] == [("markdown", "", 2), ("bash", "needs a GPU", 8)]
    assert found[0].text == "```bash\nx\n```" and found[1].marked


# ---------------------------------------------------------------------------------------------------------------
# The generated reference


def hooks():
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_cli_reference_lists_every_subcommand_and_option():
    """Property: every subcommand of the parser, and every option string of each, is on the generated page."""
    import argparse

    from entropy_rft.commands.cli import build_parser

    h = hooks()
    page = h.cli_markdown()
    parser = build_parser()
    subs = h.subcommands(parser)
    assert len(subs) >= 11
    for action in parser._actions:  # entropy-rft's own options (before the subcommand), listed above the sections
        if action.option_strings and not isinstance(action, argparse._HelpAction):
            assert f"`{action.option_strings[0]}" in page.split("\n## ", 1)[0], action.option_strings
    for name, sub in subs.items():
        section = page.split(f"## `entropy-rft {name}`", 1)[1].split("\n## ", 1)[0]
        for action in sub._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            for option in action.option_strings or [action.metavar or action.dest.upper()]:
                assert f"`{option}" in section, f"{name} {option} missing from the CLI reference"
            if action.help:
                assert " ".join(action.help.split())[:40].replace("|", "\\|") in section


def test_the_settings_reference_lists_every_field_with_type_default_and_help():
    """Property: every TrainConfig field appears once, in its row with its type, default and help."""
    from entropy_rft.config import TrainConfig

    page = hooks().config_markdown()
    for f in dataclasses.fields(TrainConfig):
        rows = [r for r in page.splitlines() if r.startswith(f"| `{f.name}`")]
        assert len(rows) == 1, f.name
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        assert f"`{f.type}`" in rows[0] and f"`{default!r}`" in rows[0], rows[0]
        assert " ".join(f.metadata["help"].split())[:40].replace("|", "\\|") in rows[0]


def test_every_generated_marker_names_a_generator_and_the_reference_pages_have_theirs():
    """Property: a page cannot ask for a section nobody generates, and the reference pages are generated."""
    h = hooks()
    used = {m for page in (ROOT / "docs").rglob("*.md") for m in h.MARKER.findall(page.read_text())}
    assert used <= set(h.GENERATORS), used - set(h.GENERATORS)
    assert "<!-- generated: cli -->" in (ROOT / "docs/reference/cli.md").read_text()
    assert "<!-- generated: config -->" in (ROOT / "docs/reference/config.md").read_text()
    assert "<!-- generated: departures -->" in (ROOT / "docs/design.md").read_text()
    modules = dict(h.departures())
    assert (
        modules["entropy_rft/core/masks.py"].startswith("Departures")
        and "\n1. " in modules["entropy_rft/core/masks.py"]
    )


def test_the_readme_is_a_landing_page():
    """Property: the README stays at most 150 lines (issue 33), with its one picture present."""
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 150
    assert "](docs/inspect.png)" in text and (ROOT / "docs/inspect.png").exists()


def test_the_changelog_starts_with_this_release():
    """Property: CHANGELOG.md's first release heading is the version pyproject.toml builds."""
    import tomllib

    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    releases = re.findall(r"^## \[([^\]]+)\]", (ROOT / "CHANGELOG.md").read_text(), flags=re.M)
    assert releases and releases[0] == version, (releases[:1], version)


# ---------------------------------------------------------------------------------------------------------------
# The built site: what renders wrong without failing `mkdocs build --strict`


class _Html(HTMLParser):
    """The text of every <p> outside <pre>, and every inline <code> span, of one page."""

    def __init__(self):
        super().__init__()
        self.paragraphs, self.codes, self._para, self._code, self._pre = [], [], None, None, 0

    def handle_starttag(self, tag, attrs):
        if tag == "p":
            self._para = []
        elif tag == "pre":
            self._pre += 1
        elif tag == "code" and not self._pre:
            self._code = []

    def handle_endtag(self, tag):
        if tag == "p" and self._para is not None:
            self.paragraphs.append("".join(self._para))
            self._para = None
        elif tag == "pre":
            self._pre -= 1
        elif tag == "code" and self._code is not None:
            self.codes.append("".join(self._code))
            self._code = None

    def handle_data(self, data):
        if self._code is not None:
            self._code.append(data)
        elif self._para is not None and not self._pre:
            self._para.append(data)


LIST_IN_PARAGRAPH = re.compile(r"\n[ \t]*([-*+]|\d{1,9}[.)])[ \t]+\S")
# our own top-level folders: a path under one of them, with a file extension, must exist in the repository
OWN_PATH = re.compile(
    r"(?:entropy_rft|tests|benchmarks|docs)/[\w./-]*\.(?:py|md|jsonl|json|yaml|png|txt|html|js|css)\b"
)
NOT_IN_REPO = re.compile(r"shared/notes|shared/oracles|\bDESIGN\.md")


def rendering_defects(html: str, page: str) -> list[str]:
    """A list marker left inside a paragraph (a list Python-Markdown did not start), a citation of a file the
    repository does not hold."""
    parser = _Html()
    parser.feed(html)
    out = [
        f"{page}: list marker inside a paragraph: {p.strip()[:80]!r}"
        for p in parser.paragraphs
        if LIST_IN_PARAGRAPH.search(p)
    ]
    for code in parser.codes:
        for path in OWN_PATH.findall(code):
            if not (ROOT / path).exists():
                out.append(f"{page}: cites {path}, which the repository does not hold")
    out += [
        f"{page}: cites {m.group(0)}, which is not in the repository"
        for m in NOT_IN_REPO.finditer(" ".join(parser.paragraphs + parser.codes))
    ]
    return out


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site as `make docs` builds it (--strict), into a temporary directory."""
    pytest.importorskip("mkdocs")
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return out


@pytest.mark.slow
def test_the_built_site_renders_every_list_and_cites_only_what_the_repository_holds(site):
    """Property: no page of the built site (the API page's docstrings included) leaves a list marker inside a
    paragraph or cites a file outside the repository."""
    pages = [p for p in site.rglob("*.html") if not p.relative_to(site).as_posix().startswith(("assets/", "search/"))]
    assert len(pages) > 20
    defects = [d for p in pages for d in rendering_defects(p.read_text(), p.relative_to(site).as_posix())]
    assert defects == []


@pytest.mark.slow
def test_the_site_shows_the_version_the_changelog_and_every_metric(site):
    """Property: every page's footer names the version pyproject.toml builds; the CHANGELOG and the metrics reference
    are pages, the latter with every key of metric_names.METRICS."""
    import tomllib

    from entropy_rft.metric_names import METRICS

    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert f"entropy-rft {version}" in (site / "index.html").read_text()
    assert "Changelog" in (site / "changelog" / "index.html").read_text()
    metrics = (site / "reference" / "metrics" / "index.html").read_text()
    assert all(f"<code>{m.name}</code>" in metrics for m in METRICS)


@pytest.mark.parametrize(
    "html, found",
    [
        ("<p>Steps:\n- one\n- two</p>", "list marker inside a paragraph"),
        ("<p>Departures:\n1. first</p>", "list marker inside a paragraph"),
        ("<p>see <code>entropy_rft/no_such_module.py</code></p>", "cites entropy_rft/no_such_module.py"),
        ("<p>(shared/notes/streaming-token-stats.md)</p>", "cites shared/notes"),
        ("<p>Beyond DESIGN.md's layout</p>", "cites DESIGN.md"),
    ],
)
def test_the_rendering_check_finds_each_defect(html, found):
    """Property: the check is not vacuous: each kind of defect is reported."""
    assert any(found in d for d in rendering_defects(html, "p.html"))
    assert (
        rendering_defects(
            "<ul><li>one</li></ul><p>a - b and 2. c <code>entropy_rft/commands/cli/__init__.py</code></p>", "p"
        )
        == []
    )


def test_a_list_after_a_paragraph_line_is_given_its_blank_line():
    """Property: blank_before_lists starts a list where CommonMark does (any bullet; an ordered item only at 1) and
    leaves fenced code, open lists and other lines alone."""
    h = hooks()
    assert h.blank_before_lists(["Text:", "- a", "- b"]) == ["Text:", "", "- a", "- b"]
    assert h.blank_before_lists(["Text:", "1. a", "2. b"]) == ["Text:", "", "1. a", "2. b"]
    assert h.blank_before_lists(["in 2026", "2. not a list"]) == ["in 2026", "2. not a list"]
    assert h.blank_before_lists(["- a", "  more", "- b"]) == ["- a", "  more", "- b"]
    assert h.blank_before_lists(["```", "x", "- y", "```"]) == ["```", "x", "- y", "```"]


def test_the_repository_link_is_the_clones_origin_as_a_web_address():
    """Property: an ssh or https remote becomes the https address the site's header links to (no credentials kept);
    anything else (a local path) gives no link."""
    h = hooks()
    assert h.origin_url("git@github.com:owner/entropy-rft.git") == "https://github.com/owner/entropy-rft"
    assert h.origin_url("https://user:token@github.com/owner/entropy-rft.git") == "https://github.com/owner/entropy-rft"
    assert h.origin_url("ssh://git@gitlab.com/group/entropy-rft") == "https://gitlab.com/group/entropy-rft"
    assert h.origin_url("/srv/git/entropy-rft") is None and h.origin_url("") is None
