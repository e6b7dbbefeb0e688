"""Ray's start-up notice about token authentication stays out of Gyre's output.

In a subprocess: Ray binds its log handler to the stderr of the moment it is imported."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytest.importorskip("ray")

PROG = """
import logging, sys
from gyre.cli_errors import RAY_AUTH_LOGGER, quiet_third_party
from ray._private.authentication import authentication_token_setup as setup
assert setup.logger is logging.getLogger(RAY_AUTH_LOGGER)  # the logger the notice goes through
if sys.argv[1] == "quiet":
    quiet_third_party()
setup._warn_token_auth_enabled()  # what ray.init calls on a local start
setup.logger.error("a real error")
"""


@pytest.mark.parametrize("mode", ["quiet", "loud"])
def test_token_auth_notice_is_not_printed(mode):
    p = subprocess.run(
        [sys.executable, "-c", PROG, mode], capture_output=True, text=True, timeout=120
    )
    assert p.returncode == 0, p.stderr
    assert ("Token authentication is enabled" in p.stderr) == (mode == "loud")
    assert "a real error" in p.stderr  # errors still come through
