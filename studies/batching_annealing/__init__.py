"""The batching x annealing x momentum study: why a token-batch, plateau-annealed run needs more
epochs (readings.md has its protocol, report and reading; docs/study.md the answer).

- `driver`: runs the arms (``python run.py experiment=multi30k_study ...``) to their own stop;
- `report`: the study report over the run folders (`runs` reads them, `effects` the
  decomposition, momentum and seed spread, `bootstrap` the paired bootstrap, `references` its
  test references, `markdown` the text, `figures` the three PNGs);
- `docs`: the report pasted into readings.md, its figures copied into docs/img/.
"""
