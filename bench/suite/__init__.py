"""Named benchmark suites by subject (``python -m bench suite NAME``); see ``run.py``."""
