"""What test modules import from each other: ``from support.waiting import wait_for``.

Fixtures stay in conftest.py (``from conftest import`` is ambiguous beside
tests/core/conftest.py); helpers live here, one module per concern.
pytest puts tests/ on ``sys.path`` (``pythonpath`` in pyproject.toml), so
``support`` is found the same way whether pytest starts in the repository's
root (``pytest tests/unit/test_x.py``) or in tests/ (``make test``).
"""
