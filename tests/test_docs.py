"""The markdown pages render: every table has as many cells in each row as in its header, and
every relative link points to a file that exists (and, with `#anchor`, to one of its headings).

Pages: README.md, CONTRIBUTING.md, CHANGELOG.md, docs/*.md and studies/**/*.md. Fenced code
blocks are left out of both checks. Each check lists every offender as `file:line: what`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parents[1]

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
SEPARATOR_CELL = re.compile(r"^\s*:?-+:?\s*$")
# [text](target "title") and ![alt](target); the text may span lines (code spans are blanked)
LINK = re.compile(r"!?\[([^\]]*)\]\(\s*<?([^)\s>]*)>?(?:\s+(?:\"[^\"]*\"|'[^']*'))?\s*\)")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)(?:\s+#+)?\s*$")
HTML_ANCHOR = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"", re.IGNORECASE)
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def pages() -> list[Path]:
    found = [ROOT / name for name in ("README.md", "CONTRIBUTING.md", "CHANGELOG.md")]
    found += sorted((ROOT / "docs").glob("*.md"))
    found += sorted((ROOT / "studies").rglob("*.md"))
    return [page for page in found if page.is_file()]


def prose_lines(text: str) -> list[str]:
    """The page's lines with every fenced code block (fences included) blanked."""
    lines = text.splitlines()
    out, fence = [], None
    for line in lines:
        match = FENCE.match(line)
        if fence is None and match:
            fence = match.group(1)
            out.append("")
        elif fence is not None:
            closing = line.strip()
            if closing.startswith(fence[0] * len(fence)) and set(closing) == {fence[0]}:
                fence = None
            out.append("")
        else:
            out.append(line)
    return out


def code_spans(text: str) -> list[tuple[int, int]]:
    """(start, end) of each code span: a run of n backticks up to the next run of exactly n."""
    spans, i = [], 0
    while i < len(text):
        if text[i] == "\\" and i + 1 < len(text) and text[i + 1] == "`":
            i += 2
            continue
        if text[i] != "`":
            i += 1
            continue
        j = i
        while j < len(text) and text[j] == "`":
            j += 1
        ticks = text[i:j]
        close = re.compile(r"(?<!`)" + ticks + r"(?!`)").search(text, j)
        if close is None:  # an unmatched run is literal text
            i = j
            continue
        spans.append((i, close.end()))
        i = close.end()
    return spans


def blank_code_spans(text: str) -> str:
    """`text` with every code span replaced by spaces (newlines kept), so offsets stay put."""
    chars = list(text)
    for start, end in code_spans(text):
        for k in range(start, end):
            if chars[k] != "\n":
                chars[k] = " "
    return "".join(chars)


def split_row(line: str) -> tuple[list[str], list[int]]:
    """A table row's cells, and the offsets of pipes that sit inside code spans unescaped.

    Cells split on pipes that are neither escaped (`\\|`) nor inside a code span. GitHub splits
    a row on every unescaped pipe, code span or not, so a pipe inside a code span must be
    written `\\|`; those pipes are returned apart, to be reported."""
    row = line.strip()
    spans = code_spans(row)
    inside = [False] * len(row)
    for start, end in spans:
        for k in range(start, end):
            inside[k] = True
    cuts, in_code_pipes = [], []
    for k, char in enumerate(row):
        if char != "|" or (k > 0 and row[k - 1] == "\\"):
            continue
        (in_code_pipes if inside[k] else cuts).append(k)
    pieces, last = [], 0
    for k in cuts:
        pieces.append(row[last:k])
        last = k + 1
    pieces.append(row[last:])
    if cuts and cuts[0] == 0:
        pieces = pieces[1:]
    if cuts and cuts[-1] == len(row) - 1:
        pieces = pieces[:-1]
    return [piece.strip() for piece in pieces], in_code_pipes


def is_separator(line: str) -> bool:
    if "-" not in line:
        return False
    cells, _ = split_row(line)
    return bool(cells) and all(SEPARATOR_CELL.match(cell) for cell in cells)


def has_pipe(line: str) -> bool:
    row = blank_code_spans(line)
    return bool(re.search(r"(?<!\\)\|", row))


@dataclass
class Offence:
    line: int  # 1-based
    what: str


def table_offences(text: str) -> list[Offence]:
    """Each table whose header, separator and body rows do not all have the same cell count."""
    lines = prose_lines(text)
    found: list[Offence] = []
    i = 0
    while i < len(lines) - 1:
        header, separator = lines[i], lines[i + 1]
        if not (has_pipe(header) and is_separator(separator)):
            i += 1
            continue
        want, _ = split_row(header)
        rows = [(i, "header", header), (i + 1, "separator", separator)]
        j = i + 2
        while j < len(lines) and lines[j].strip() and has_pipe(lines[j]):
            rows.append((j, "row", lines[j]))
            j += 1
        for k, kind, row in rows:
            cells, in_code = split_row(row)
            if len(cells) != len(want):
                found.append(
                    Offence(
                        k + 1,
                        f"table {kind} has {len(cells)} cells, its header (line {i + 1}) "
                        f"{len(want)}",
                    )
                )
            if in_code:
                found.append(
                    Offence(k + 1, "a pipe inside a code span splits the cell: write it \\|")
                )
        i = j
    return found


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its text lowercased, punctuation but - and _ dropped,
    spaces to -."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links and images: their text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = text.strip().lower()
    text = "".join(ch for ch in text if ch.isalnum() or ch in " -_")
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every anchor a page offers: its headings' slugs (repeats numbered -1, -2, ...) and HTML
    `<a name=...>` / `<a id=...>`."""
    seen: dict[str, int] = {}
    found = set()
    for line in prose_lines(text):
        match = HEADING.match(line)
        if match:
            base = slug(match.group(2))
            n = seen.get(base, 0)
            seen[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")
        found.update(HTML_ANCHOR.findall(line))
    return found


def link_offences(page: Path, text: str, anchors_of) -> list[Offence]:
    """Each relative link of `page` whose file does not exist, or whose #anchor is not one of
    the target's headings."""
    prose = blank_code_spans("\n".join(prose_lines(text)))
    found: list[Offence] = []
    for match in LINK.finditer(prose):
        target = match.group(2)
        if not target or SCHEME.match(target):  # http(s):, mailto: and other schemes
            continue
        line = prose.count("\n", 0, match.start()) + 1
        path_part, _, anchor = target.partition("#")
        path_part = unquote(path_part)
        if path_part:
            dest = (page.parent / path_part).resolve()
            if not dest.exists():
                found.append(Offence(line, f"link to {target}: no such file"))
                continue
        else:
            dest = page
        if anchor and dest.suffix == ".md" and dest.is_file():
            if unquote(anchor).lower() not in anchors_of(dest):
                found.append(Offence(line, f"link to {target}: no heading with that anchor"))
    return found


def report(offences: dict[Path, list[Offence]]) -> str:
    lines = [
        f"{page.relative_to(ROOT).as_posix()}:{o.line}: {o.what}"
        for page, found in offences.items()
        for o in found
    ]
    return f"{len(lines)} offender(s):\n" + "\n".join(lines)


def test_pages_are_found():
    names = {page.relative_to(ROOT).as_posix() for page in pages()}
    assert {"README.md", "CONTRIBUTING.md", "docs/benchmarks.md"} <= names
    assert any(name.startswith("studies/") for name in names)


def test_every_table_has_as_many_cells_in_each_row_as_in_its_header():
    offences = {}
    for page in pages():
        found = table_offences(page.read_text(encoding="utf-8"))
        if found:
            offences[page] = found
    assert not offences, report(offences)


def test_every_relative_link_points_to_an_existing_file_and_heading():
    cache: dict[Path, set[str]] = {}

    def anchors_of(path: Path) -> set[str]:
        if path not in cache:
            cache[path] = anchors(path.read_text(encoding="utf-8"))
        return cache[path]

    offences = {}
    for page in pages():
        found = link_offences(page, page.read_text(encoding="utf-8"), anchors_of)
        if found:
            offences[page] = found
    assert not offences, report(offences)


# The checkers themselves, on hand-made pages.


def test_a_table_with_a_missing_or_extra_cell_is_reported_with_its_line():
    page = "text\n\n| a | b | c |\n|---|---|\n| 1 | 2 | 3 |\n| 1 | 2 |\n"
    assert [(o.line, o.what.split(",")[0]) for o in table_offences(page)] == [
        (4, "table separator has 2 cells"),
        (6, "table row has 2 cells"),
    ]


def test_escaped_pipes_code_spans_and_fences_do_not_count_as_cells():
    page = (
        "| a | b |\n|:---|---:|\n| `x` | y \\| z |\n| [l](#a) | `p` |\n\n"
        "```\n| one |\n|---|---|\n```\n"
    )
    assert table_offences(page) == []


def test_an_unescaped_pipe_inside_a_code_span_in_a_table_is_reported():
    page = "| a | b |\n|---|---|\n| `x|y` | z |\n"
    assert [o.line for o in table_offences(page)] == [3]


def test_a_pipe_outside_any_table_is_not_a_table():
    assert table_offences("a | b\n\nsome text\n---\n") == []


@pytest.mark.parametrize(
    "heading, anchor",
    [
        ("## Optimisers (`conf/optim/`)", "optimisers-confoptim"),
        ("### task=generate", "taskgenerate"),
        (
            "## Against fairseq, like for like (`bench/bench_vs_fairseq.py train`)",
            "against-fairseq-like-for-like-benchbench_vs_fairseqpy-train",
        ),
        ("## Stopping on min_lr", "stopping-on-min_lr"),
        ("## [Linked](x.md) heading ##", "linked-heading"),
    ],
)
def test_heading_anchors_follow_githubs_slugs(heading, anchor):
    assert anchor in anchors(heading + "\n")


def test_repeated_headings_are_numbered():
    assert anchors("## Usage\n\n## Usage\n") == {"usage", "usage-1"}


def test_broken_links_and_anchors_are_reported_and_good_ones_are_not(tmp_path):
    (tmp_path / "other.md").write_text("# Other\n\n## Part two\n")
    page = tmp_path / "page.md"
    text = (
        "# Page\n\n[fine](other.md#part-two) [self](#page) [web](https://x.invalid/a.md)\n"
        "[gone](missing.md) [bad anchor](other.md#part-three)\n[split\ntext](#nowhere)\n"
        "`[code](missing.md)`\n\n```\n[fenced](missing.md)\n```\n"
    )
    page.write_text(text)
    found = link_offences(page, text, lambda path: anchors(path.read_text()))
    assert [(o.line, o.what) for o in found] == [
        (4, "link to missing.md: no such file"),
        (4, "link to other.md#part-three: no heading with that anchor"),
        (5, "link to #nowhere: no heading with that anchor"),
    ]
