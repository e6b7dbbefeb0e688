"""The harness's side of ``$GYRE_MODEL_CALLS_FILE``: write its model-call counts there.

Harness processes (the reference agent, the synthetic harness) import this module before
their first model call, so it imports only ``json`` and ``os``; what the counts decide is
:mod:`gyre.harness.model_calls`, which re-exports these names.
"""

from __future__ import annotations

import json
import os

# The environment variable naming the file a Gyre-aware harness writes its counts to.
CALLS_FILE_ENV = "GYRE_MODEL_CALLS_FILE"
CALLS_FILE_NAME = "model_calls.json"  # under the execution's artifacts/ folder


def write_calls_file(attempted: int, answered: int, last_error: str = "") -> None:
    """Harness side: write the counts where ``$GYRE_MODEL_CALLS_FILE`` says (no-op if unset).

    Written atomically (temp file + rename) so the executor never reads half a
    file, and before each call as well as after it, so a harness killed mid-call
    (harness timeout on a hanging endpoint) still leaves its attempt counted.
    Never raises: a harness must not fail because its report could not be written.
    """
    target = os.environ.get(CALLS_FILE_ENV)
    if not target:
        return
    body = {"attempted": attempted, "answered": answered, "last_error": last_error[:500]}
    tmp = f"{target}.tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(json.dumps(body))
        os.replace(tmp, target)
    except OSError:
        pass
