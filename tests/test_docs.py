"""The user docs cannot rot silently: every relative link and anchor of README.md and docs/*.md resolves, and every
command block marked runnable (an `<!-- docs:run -->` line right before its fence) composes as written.

Commands that would train or sweep run with `--cfg job` (they compose and check the config, print it and stop);
`raystream data inspect` runs as is (it decodes nothing); the other subcommands compose their overrides, the step
they take before anything else. All in-process, so the file takes seconds.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from raystream import cli, config_tree
from raystream.config import compose

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RUN_MARK = "<!-- docs:run -->"
FENCE = re.compile(r"^```[^\n]*\n.*?^```[ \t]*$", re.M | re.S)
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def _prose(text: str) -> str:
    """The page without its fenced blocks and inline code (a link shown as code is not a link)."""
    return re.sub(r"`[^`\n]*`", "", FENCE.sub("", text))


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped (but `-` and `_`), spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(page: Path) -> set:
    text = FENCE.sub("", page.read_text())
    return {_slug(h) for h in re.findall(r"^#{1,6} (.+)$", text, re.M)}


def _links(page: Path):
    for target in LINK.findall(_prose(page.read_text())):
        if not re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto: are not checked offline
            yield target


def test_the_docs_exist_and_link_to_each_other():
    assert len(PAGES) >= 8 and all(p.stat().st_size for p in PAGES)
    readme_links = {Path(t.split("#")[0]).as_posix() for t in _links(ROOT / "README.md")}
    assert {f"docs/{p.name}" for p in PAGES[1:]} <= readme_links, "a docs page the README does not link"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_anchor_resolves(page):
    bad = []
    for target in _links(page):
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            bad.append(f"{target}: no file {dest}")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            bad.append(f"{target}: {dest.name} has no heading with anchor #{anchor}")
    assert not bad, f"{page.relative_to(ROOT)}: " + "; ".join(bad)


def _runnable_commands():
    """(page, line) for each command line of a block marked runnable."""
    out = []
    for page in PAGES:
        text = page.read_text()
        for block in re.findall(re.escape(RUN_MARK) + r"\n```[^\n]*\n(.*?)^```", text, re.M | re.S):
            for line in block.splitlines():
                argv = shlex.split(line, comments=True)
                if argv:
                    out.append((page, argv))
    return out


COMMANDS = _runnable_commands()


def test_there_are_runnable_blocks():
    assert len(COMMANDS) >= 10 and {p.name for p, _ in COMMANDS} >= {"README.md", "extending.md"}


@pytest.mark.parametrize("page,argv", COMMANDS, ids=[" ".join(a)[:70] for _, a in COMMANDS])
def test_each_runnable_command_composes_as_written(page, argv, monkeypatch, capsys):
    assert argv[0] == "raystream", f"{page.name}: a runnable block holds `{' '.join(argv)}`, not a raystream command"
    monkeypatch.chdir(ROOT)  # paths in the docs are relative to the checkout
    monkeypatch.setenv(config_tree.ENV, "")  # --config-dir adds to it; restored afterwards
    args = argv[1:]
    if args[0] in ("train", "sweep"):
        assert cli.main([*args, "--cfg", "job"]) == 0, capsys.readouterr().err
        assert "optimizer:" in capsys.readouterr().out
    elif args[:2] == ["data", "inspect"]:
        assert cli.main(args) == 0, capsys.readouterr().err
        assert capsys.readouterr().out.startswith('{"step": 0')
    else:
        parsed = cli._parser().parse_args(args)
        config_tree.add_user_dirs(getattr(parsed, "config_dir", []))
        compose(parsed.overrides)


def test_the_readme_is_a_front_door():
    """The README holds what a newcomer needs in five minutes: at most 200 lines, and a Status table whose cells are
    a line each (the figures, seeds and commands behind a row live on the page it links)."""
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 200, f"README.md has {len(text.splitlines())} lines; the front door holds 200"
    status = text.split("## Status", 1)[1].split("\n## ", 1)[0]
    rows = [r for r in status.splitlines() if r.startswith("|") and not r.startswith("|---")]
    assert len(rows) >= 5, "the Status table is missing"
    long = [c.strip() for r in rows for c in r.strip("|").split("|") if len(c.strip()) > 110]
    assert not long, f"Status cells longer than a line (110 characters): {long}"
    assert all("](docs/" in r for r in rows[1:]), "every Status row links the page with its details"


FIGURE = re.compile(r"(?<![\w.])-?\d+(?:,\d{3})*(?:\.\d+)?")
DATE = re.compile(r"\b\d{4}-\d{2}-\d{2}\b")


def _sections(page: Path) -> dict:
    """Each heading's anchor -> the page's text from that heading to the next one of its level or higher (fenced
    blocks belong to their section; a `#` line inside a fence is not a heading); "" -> the whole page."""
    lines, out, fenced, heads = page.read_text().splitlines(), {}, False, []
    for i, line in enumerate(lines):
        fenced ^= line.startswith("```")
        m = None if fenced else re.match(r"^(#{1,6}) (.+)$", line)
        if m:
            heads.append((i, len(m.group(1)), _slug(m.group(2))))
    for n, (i, level, slug) in enumerate(heads):
        end = next((j for j, lv, _ in heads[n + 1:] if lv <= level), len(lines))
        out[slug] = "\n".join(lines[i:end])
    out[""] = "\n".join(lines)
    return out


def _figures(cell: str) -> list:
    """The dates and numbers a cell states (a date whole, then the numbers of the rest)."""
    dates = DATE.findall(cell)
    return dates + FIGURE.findall(DATE.sub(" ", cell))


def status_problems(readme: str, root: Path) -> list:
    """What is wrong with a README's Status table: a blank line (or any non-row line) inside it, which cuts it in
    two, and each figure of a row's "at CPU scale" and "on a GPU" cells that none of the sections its row links
    states."""
    status = readme.split("## Status", 1)[1].split("\n## ", 1)[0].splitlines()
    rows = [i for i, line in enumerate(status) if line.startswith("|")]
    problems = [f"line {i} inside the Status table is not a row: {status[i]!r}"
                for i in range(rows[0], rows[-1] + 1) if not status[i].startswith("|")]
    for line in status[rows[0] + 2:rows[-1] + 1]:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 4:
            continue  # a non-row line, named above
        texts = []
        for target in LINK.findall(cells[3]):
            path, _, anchor = target.partition("#")
            page = root / path
            texts.append(_sections(page).get(anchor, "") if page.is_file() else "")
        missing = [f for f in _figures(cells[1] + " | " + cells[2]) if not any(f in t for t in texts)]
        if missing:
            problems.append(f"{cells[0]!r}: {missing} not in {LINK.findall(cells[3])}")
    return problems


def test_the_status_table_is_one_table_and_its_figures_are_where_its_rows_link():
    """The front door stays true: every figure of the Status table stands in the section its row links, and the
    table is one table (a blank line inside it renders the rows after it as a paragraph)."""
    assert status_problems((ROOT / "README.md").read_text(), ROOT) == []


def test_the_status_check_finds_a_cut_table_and_a_figure_its_page_does_not_state(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "r.md").write_text("# R\n\n## Cost\n\nMSE 0.0643 vs 0.0437 (2026-11-27).\n\n## Other\n\n0.0722\n")
    head = "## Status\n\n| claim | cpu | gpu | details |\n|---|---|---|---|\n"
    good = head + "| a | MSE 0.0643 vs 0.0437 | 2026-11-27 | [r](docs/r.md#cost) |\n"
    assert status_problems(good, tmp_path) == []
    stale = head + "| a | MSE 0.0722 vs 0.0437 | not run | [r](docs/r.md#cost) |\n"
    assert status_problems(stale, tmp_path) == ["'a': ['0.0722'] not in ['docs/r.md#cost']"]
    cut = good + "\n| b | 0.0643 | - | [r](docs/r.md#cost) |\n"
    assert [p.split(":")[0] for p in status_problems(cut, tmp_path)] == ["line 5 inside the Status table is not a row"]
