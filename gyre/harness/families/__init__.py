"""Task families: tasks generated from a seed, with exact verifiers, for training real models.

A family turns ``(seed, split, n)`` into problems (:class:`Problem`) and scores a reply
against one (:func:`score`); :mod:`gyre.harness.families.write` writes them as Harbor task
folders that ``gyre run`` loads like any task set. The splits are disjoint by construction
(a problem's split is a function of its content, see :func:`split_of`), so a held-out
problem never appears in training, whatever the seeds.

Pure: no torch, no I/O, so a peer trainer (TRL in its own venv, ``bench/vs_trl/bench_vs_trl.py``)
imports the same prompts and the same reward function.
"""

from __future__ import annotations

from gyre.harness.families.base import Problem, Score, split_of
from gyre.harness.families.registry import FAMILIES, problems, score

__all__ = ["FAMILIES", "Problem", "Score", "problems", "score", "split_of"]
