"""The study's docs command (`python -m studies.batching_annealing.docs`): the study report pasted
into docs/study.md between its markers."""

from __future__ import annotations

import sys

import pytest

from studies.batching_annealing import docs as study_docs

REPORT = """# Study report: {study}

2 arms.

| arm | epochs |
|---|---|
| tok_plateau_s1 | 46 |

## Where the extra epochs come from

Bootstrap references {study}/refs.txt.

![validation BLEU by training minutes](study_bleu_minutes.png)
"""

DOC = """# The study

## Results

### The report

<!-- study_report.md -->
old table
<!-- /study_report.md -->

![validation BLEU](img/study_bleu_minutes.png)

## Reading
"""


def test_report_body_drops_title_and_images_and_moves_headings_down(tmp_path):
    study = tmp_path / "outputs" / "study"
    body = study_docs.report_body(REPORT.format(study=study), study, tmp_path)
    assert "Study report" not in body and "![" not in body
    assert "#### Where the extra epochs come from" in body.splitlines()
    assert "references outputs/study/refs.txt." in body  # absolute -> relative to the repository
    assert body == (
        "2 arms.\n\n| arm | epochs |\n|---|---|\n| tok_plateau_s1 | 46 |\n\n"
        "#### Where the extra epochs come from\n\nBootstrap references outputs/study/refs.txt.\n"
    )


def test_report_body_refuses_a_file_that_is_not_a_report(tmp_path):
    with pytest.raises(ValueError, match="not a study report"):
        study_docs.report_body("| arm |\n", tmp_path, tmp_path)


def test_paste_replaces_only_what_lies_between_the_markers_and_twice_is_once():
    once = study_docs.paste(DOC, "new table\n")
    assert "old table" not in once and "new table" in once
    before, after = DOC.split(study_docs.START)[0], DOC.split(study_docs.END)[1]
    assert once.startswith(before) and once.endswith(after)
    assert study_docs.paste(once, "new table\n") == once


def test_paste_names_the_doc_when_a_marker_is_missing():
    with pytest.raises(ValueError, match=r"docs/x\.md: needs a line '<!-- study_report\.md -->'"):
        study_docs.paste("# nothing here\n", "t\n", "docs/x.md")
    backwards = f"{study_docs.END}\n{study_docs.START}\n"
    with pytest.raises(ValueError, match="comes before"):
        study_docs.paste(backwards, "t\n")


def test_main_pastes_and_copies_the_figures(tmp_path, monkeypatch, capsys):
    study, doc, img = tmp_path / "study", tmp_path / "study.md", tmp_path / "img"
    study.mkdir()
    (study / "study_report.md").write_text(REPORT.format(study=study))
    for i, name in enumerate(study_docs.FIGURES):
        (study / name).write_bytes(bytes([i]) * 10)
    doc.write_text(DOC)
    argv = ["docs.py", "--study", str(study), "--doc", str(doc), "--img", str(img)]
    monkeypatch.setattr(sys, "argv", argv)
    study_docs.main()
    text = doc.read_text()
    assert "| tok_plateau_s1 | 46 |" in text and "old table" not in text
    assert [(img / n).read_bytes() for n in study_docs.FIGURES] == [
        bytes([i]) * 10 for i in range(3)
    ]
    assert "copied 3 figures" in capsys.readouterr().out


def test_main_without_a_report_says_how_to_write_one(tmp_path, monkeypatch):
    argv = ["docs.py", "--study", str(tmp_path), "--doc", str(tmp_path / "d.md")]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit, match=r"python -m studies\.batching_annealing\.report --study"):
        study_docs.main()
