"""Did the policy act? An execution's model calls, and the rule that drops it when none was answered.

A reward is evidence about the policy only if the harness saw at least one of
the policy's answers. When every model call failed (the endpoint refused the
connection, the proxy had no engine, each call ended in an error) the harness
worked blind, and scoring its workspace would train on (or report) a number
that measures the infrastructure. Such an execution is a *missing* assessment
(``MissingReason.model_unreachable``), dropped like any other missing one, never
a zero: the paper's rule for an assessment that did not happen.

The rule needs two counts per execution, :class:`ModelCalls`: calls *attempted*
and calls *answered* by the policy. Two sources, in order of trust:

- the proxy (``GET /admin/executions/{id}`` on its admin socket): it sees every
  call that carries the execution's key and writes a trace record for each one
  the policy answered. The runtime passes this to the executor as its
  ``calls`` hook, so every harness is covered, however it handles errors;
- the harness itself, for runs without a proxy (``gyre harness run --base-url``
  straight at an engine or at nothing): a harness that knows Gyre writes its
  counts as JSON to the file named by ``$GYRE_MODEL_CALLS_FILE`` (the reference
  agent and the synthetic harness do). A harness that writes nothing and has no
  proxy in front gives no evidence either way and is scored as before.

Zero attempts is not a failure: the oracle never calls the model, and a harness
that exits at once is scored like any other (usually 0). One answered call is
enough to score the execution as usual, even if later calls failed (the policy
acted; a harness timeout is scored the same way).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

# The environment variable naming the file a Gyre-aware harness writes its counts to.
CALLS_FILE_ENV = "GYRE_MODEL_CALLS_FILE"
CALLS_FILE_NAME = "model_calls.json"  # under the execution's artifacts/ folder


@dataclass(frozen=True)
class ModelCalls:
    """One execution's model calls, as the proxy or the harness counted them.

    A stdlib dataclass (pydantic validates it inside ``HarnessRun``): harness
    processes import this module, and their start-up must not pay for pydantic.
    """

    attempted: int = 0  # calls sent (the proxy: calls carrying the execution's key)
    answered: int = 0  # calls the policy answered (the proxy: trace records written)
    last_error: str = ""  # the last failure, for the missing assessment's detail
    source: Literal["proxy", "harness"] = "harness"

    @property
    def unreachable(self) -> bool:
        """Calls were made and the policy answered none of them."""
        return self.attempted > 0 and self.answered == 0

    def detail(self) -> str:
        """One line for ``Missing.detail``: counts, who counted, the last error."""
        s = "" if self.attempted == 1 else "s"
        where = "at the proxy" if self.source == "proxy" else "by the harness"
        msg = f"{self.attempted} model call{s} attempted, none answered by the policy ({where})"
        return f"{msg}: {self.last_error}" if self.last_error else msg


def _count(v: object) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ValueError(f"not a count: {v!r}")
    return v


def read_calls_file(path: str | Path) -> ModelCalls | None:
    """The counts a harness wrote, or ``None`` if it wrote none or an unreadable file."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        return ModelCalls(
            attempted=_count(data["attempted"]),
            answered=_count(data["answered"]),
            last_error=str(data.get("last_error", ""))[:500],
            source="harness",
        )
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None


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
        Path(tmp).write_text(json.dumps(body), encoding="utf-8")
        os.replace(tmp, target)
    except OSError:
        pass
