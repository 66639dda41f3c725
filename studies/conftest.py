"""Fixtures the studies' tests borrow from the project's tests (`tests/training_utils.py`).

pytest imports this file as `studies.conftest`, with the project folder on `sys.path` (studies/
is a package), so `tests.` helpers import as they do in tests/.
"""

from tests.training_utils import tiny_data  # noqa: F401  (a tiny corpus and its data-bin)
