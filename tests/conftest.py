"""Shared fixtures. The tiny model is built once per test session, offline."""

from __future__ import annotations

import os

import pytest
from helpers.xdist_units import order, work_unit
from hypothesis import settings

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# Property tests draw the same examples on every run (a red CI is a regression, not a lucky
# draw); GYRE_HYPOTHESIS_RANDOM=1 (with GYRE_HYPOTHESIS_SCALE=10) searches afresh.
settings.register_profile("gyre", derandomize=True, print_blob=True)
settings.register_profile("explore", derandomize=False, print_blob=True)
settings.load_profile("explore" if os.environ.get("GYRE_HYPOTHESIS_RANDOM") == "1" else "gyre")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A tiny Qwen3 model + tokenizer directory (HF layout), built from a config."""
    from gyre.models.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"))


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


# ------------------------------------------------------------------ sharing the machine (xdist)
# scripts/test.sh runs the suite on 2 xdist workers (``-n 2 --dist loadgroup``). A work unit is a
# test module (its module fixtures are set up once, on one worker), except that the modules that
# run ``gyre run`` (a local Ray instance, its cells, the proxy, harnesses; fault tests that kill
# parts of it on heartbeat and probe deadlines) form one unit, "ray", so that at most one run
# goes at a time while the other worker goes through everything else. The unit is the longest,
# so it goes first; a few of its modules without deadlines form a "ray-beside" unit queued next,
# which the other worker starts with (tests/helpers/xdist_units.py).
# The units are computed from the node ids: xdist 3.8 applies ``xdist_group`` marks by
# rewriting ``item._nodeid``, which pytest 9 no longer reads, so marks would group nothing.
@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """``--dist loadgroup``: units from :func:`work_unit`, in collection order (the ray unit
    first, then the one beside it)."""
    if config.getoption("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ByUnit(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    config.option.loadscopereorder = False  # keep the order pytest_collection_modifyitems made
    return ByUnit(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On an xdist worker, the ray unit's tests first, then those beside it: the longest units
    start first."""
    if hasattr(config, "workerinput"):
        items.sort(key=lambda item: order(item.nodeid))
