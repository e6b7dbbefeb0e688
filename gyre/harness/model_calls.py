"""Did the policy act? An execution's model calls, and the rule that drops it when none was answered.

A reward is evidence about the policy only if the harness saw at least one of
the policy's answers. When every model call failed (the endpoint refused the
connection, the proxy had no engine, each call ended in an error) the harness
worked blind, and scoring its workspace would train on (or report) a number
that measures the infrastructure. Such an execution is a *missing* assessment
(``MissingReason.model_unreachable``), dropped like any other missing one, never
a zero: the paper's rule for an assessment that did not happen.

The rule needs two counts per execution, :class:`ModelCalls`: calls *attempted*
and calls *answered* by the policy. Only what the harness cannot forge may make
an execution missing (a missing one is dropped from its group, so a harness
that could declare itself "unreachable" would opt out of every zero it earns):

- the proxy (``GET /admin/executions/{id}`` on its admin socket) sees every
  call that carries the execution's key and writes a trace record for each one
  the policy answered. The runtime passes this to the executor as its
  ``calls`` hook. When every call failed *on the server's side* (the proxy's
  last error is an ``HTTP 5xx``: no engine, engine errors) the execution is
  missing and not scored;
- everything else is the harness's word: calls that failed for the client's
  reasons (``HTTP 4xx``, a client that went away before the answer: a harness
  can send a malformed request on purpose), or the counts a harness wrote to
  ``$GYRE_MODEL_CALLS_FILE`` (the reference agent and the synthetic harness do;
  the only evidence without a proxy, e.g. ``gyre harness run --base-url`` at a
  dead port). That word may only *add* information: the workspace is scored,
  and the execution becomes missing only if it scored above 0 (a blind success
  is not evidence about the policy); a zero stays a zero, with the report in
  its detail (:func:`decide`).

Zero attempts is not a failure: the oracle never calls the model, and a harness
that exits at once is scored like any other (usually 0). One answered call is
enough to score the execution as usual, even if later calls failed (the policy
acted; a harness timeout is scored the same way).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

# the harness's side, re-exported (harnesses import gyre.harness.calls_file itself)
from .calls_file import CALLS_FILE_ENV as CALLS_FILE_ENV
from .calls_file import CALLS_FILE_NAME as CALLS_FILE_NAME
from .calls_file import write_calls_file as write_calls_file
from .safe_read import UnsafeFile, printable, read_file  # stdlib only, like this module


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

    @property
    def server_failed(self) -> bool:
        """The proxy's last failure was its own or the engines' (HTTP 5xx), not the client's."""
        return self.source == "proxy" and self.last_error.startswith("HTTP 5")

    def detail(self) -> str:
        """One line for ``Missing.detail``: counts, who counted, the last error."""
        s = "" if self.attempted == 1 else "s"
        where = "at the proxy" if self.source == "proxy" else "by the harness"
        msg = f"{self.attempted} model call{s} attempted, none answered by the policy ({where})"
        return f"{msg}: {self.last_error}" if self.last_error else msg


# What the executor does with an execution's counts (decide): score it as usual; drop it
# unscored (the proxy saw the server fail every call); score it and drop it only if it
# scored above 0 (the harness's own word, which can never turn a zero into missing).
CallsVerdict = Literal["score", "drop", "drop_if_positive"]


def decide(
    proxy: ModelCalls | None, own: ModelCalls | None
) -> tuple[ModelCalls | None, CallsVerdict]:
    """The counts to record and what to do, from the proxy's counts (None: no proxy, or it
    could not be asked) and the harness's own file (None: none written); pure."""
    if proxy is not None and proxy.unreachable:
        return proxy, "drop" if proxy.server_failed else "drop_if_positive"
    if proxy is not None and proxy.attempted > 0:
        return proxy, "score"
    if own is not None and own.unreachable:
        return own, "drop_if_positive"
    return (own if own is not None else proxy), "score"


def _count(v: object) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= 10**9:
        raise ValueError(f"not a count: {v!r}")
    return v


def read_calls_file(path: str | Path) -> ModelCalls | None:
    """The counts a harness wrote, or ``None`` if it wrote none or an unreadable file.

    The file is the harness's: read without following a link, without blocking on
    a FIFO, at most 64 KiB (gyre.harness.safe_read); anything else reads as None.
    """
    return read_calls_report(path)[0]


CallTimes = tuple[float, float]  # time.monotonic() of the first call sent, the last answer


def _time(v: object) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < 1e12:
        return None
    return float(v)


def read_calls_report(path: str | Path) -> tuple[ModelCalls | None, CallTimes | None]:
    """:func:`read_calls_file`, and the harness's first-call and last-answer times when it
    wrote both (``write_calls_file``): the harness's word, used only for timings."""
    try:
        raw = read_file(path)
        if raw is None:
            return None, None
        data = json.loads(raw.decode("utf-8"))
        calls = ModelCalls(
            attempted=_count(data["attempted"]),
            answered=_count(data["answered"]),
            last_error=printable(str(data.get("last_error", ""))[:500]),
            source="harness",
        )
    except (UnsafeFile, ValueError, TypeError, KeyError, AttributeError, RecursionError):
        return None, None
    first, last = _time(data.get("first_call_at")), _time(data.get("last_answer_at"))
    return calls, (first, last) if first is not None and last is not None else None
