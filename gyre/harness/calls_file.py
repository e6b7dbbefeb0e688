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


def write_calls_file(
    attempted: int,
    answered: int,
    last_error: str = "",
    *,
    first_call_at: float | None = None,
    last_answer_at: float | None = None,
) -> None:
    """Harness side: write the counts where ``$GYRE_MODEL_CALLS_FILE`` says (no-op if unset).

    Written atomically (temp file + rename) so the executor never reads half a
    file, and before each call as well as after it, so a harness killed mid-call
    (harness timeout on a hanging endpoint) still leaves its attempt counted.
    Never raises: a harness must not fail because its report could not be written.
    ``first_call_at`` / ``last_answer_at``: ``time.monotonic()`` when the first call was
    sent and the last answer came (the host's clock: the sandbox shares it), from which the
    executor records the time around the calls (``Timings.first_call_s``).
    """
    target = os.environ.get(CALLS_FILE_ENV)
    if not target:
        return
    body: dict[str, object] = {
        "attempted": attempted,
        "answered": answered,
        "last_error": last_error[:500],
    }
    if first_call_at is not None:
        body["first_call_at"] = first_call_at
    if last_answer_at is not None:
        body["last_answer_at"] = last_answer_at
    tmp = f"{target}.tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(json.dumps(body))
        os.replace(tmp, target)
    except OSError:
        pass
