"""Studies made with convseq: one sub-folder per question, each with its driver, report code,
figures and tests (studies/README.md lists them).

A study uses convseq (its modules and `python run.py`); convseq never imports a study. Run a
study's commands from the project folder, e.g. ``python -m studies.batching_annealing.driver``.
"""
