"""Test-only helpers, kept out of the ``gyre`` package (importable as ``helpers``:
``pythonpath = ["tests"]`` in pyproject's pytest section)."""
