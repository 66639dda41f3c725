"""Copy the study's report into its readings page: the table, decomposition and plots, as written.

`python -m studies.batching_annealing.report` writes `outputs/study/study_report.md` and three
PNGs. This script puts that report's body between the two marker lines of
studies/batching_annealing/readings.md (its headings two levels down, under "### The report"; its
own title and image lines left out, since the page shows the figures itself), turns the study
folder's absolute path into the relative one, and copies the PNGs into docs/img/:

    python -m studies.batching_annealing.docs    # outputs/study -> readings.md beside this file
    python -m studies.batching_annealing.docs --study outputs/study --doc PAGE.md --img docs/img
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from .report import STUDY_FILES

ROOT = Path(__file__).resolve().parents[2]  # the project folder
START, END = "<!-- study_report.md -->", "<!-- /study_report.md -->"
# the report's own file names (its command writes them), so a renamed figure cannot go stale here
FIGURES = tuple(STUDY_FILES[kind] for kind in ("bleu", "lr", "bars"))


def report_body(report: str, study_dir: Path, relative_to: Path) -> str:
    """The report without its title and image lines, headings two levels down, paths relative."""
    lines = report.splitlines()
    if not lines or not lines[0].startswith("# "):
        raise ValueError("not a study report: its first line is not a '# ' title")
    body = []
    for line in lines[1:]:
        if line.startswith("!["):
            continue
        body.append("##" + line if line.startswith("#") else line)
    text = "\n".join(body).strip() + "\n"
    try:
        shown = study_dir.resolve().relative_to(relative_to.resolve()).as_posix()
    except ValueError:  # a study folder outside the repository keeps its absolute path
        return text
    return text.replace(str(study_dir.resolve()), shown)


def paste(doc: str, body: str, doc_name: str = "studies/batching_annealing/readings.md") -> str:
    """`doc` with everything between the marker lines replaced by `body`."""
    lines = doc.splitlines(keepends=True)
    try:
        i = next(k for k, line in enumerate(lines) if line.strip() == START)
        j = next(k for k, line in enumerate(lines) if line.strip() == END)
    except StopIteration:
        raise ValueError(
            f"{doc_name}: needs a line '{START}' and, below it, a line '{END}'; the report goes "
            "between them"
        ) from None
    if j < i:
        raise ValueError(f"{doc_name}: '{END}' comes before '{START}'")
    return "".join(lines[: i + 1]) + "\n" + body + "\n" + "".join(lines[j:])


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m studies.batching_annealing.docs", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--study", type=Path, default=ROOT / "outputs" / "study")
    parser.add_argument("--doc", type=Path, default=Path(__file__).with_name("readings.md"))
    parser.add_argument("--img", type=Path, default=ROOT / "docs" / "img")
    args = parser.parse_args()
    report = args.study / STUDY_FILES["markdown"]
    if not report.is_file():
        raise SystemExit(
            f"{report}: no study report; write it first with "
            f"python -m studies.batching_annealing.report --study {args.study}"
        )
    missing = [name for name in FIGURES if not (args.study / name).is_file()]
    if missing:
        raise SystemExit(f"{args.study}: missing {', '.join(missing)}; rerun the report")
    body = report_body(report.read_text(), args.study, ROOT)
    try:
        text = paste(args.doc.read_text(), body, str(args.doc))
    except ValueError as err:
        raise SystemExit(str(err)) from None
    args.doc.write_text(text)
    args.img.mkdir(parents=True, exist_ok=True)
    for name in FIGURES:
        shutil.copyfile(args.study / name, args.img / name)
    print(f"pasted {report} into {args.doc}; copied {len(FIGURES)} figures into {args.img}")


if __name__ == "__main__":
    main()
