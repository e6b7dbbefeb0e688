"""What one call does when engines fail: pure policy, no I/O (the pool does the waiting).

Three kinds of fault, three answers:

* **broken** (connection refused or reset, 5xx): transient. The call moves to another
  engine at once when one is up; otherwise it waits an exponentially growing, jittered
  delay and tries again. A call makes at most ``max_attempts`` failed attempts and
  starts none after ``budget_s`` from its first failure (unbounded, a dead engine is
  retried many times a second and the client's SDK then repeats the whole thing), and
  its 503 carries ``Retry-After`` so SDKs back off too.
* **silent** (no first data / nothing between chunks within the read timeouts: a
  frozen engine): handled like broken (the engine is declared failed and the call
  moves with its partial output), but a call that runs out of attempts this way is
  answered 504.
* **protocol violation** (a stream request answered with a plain body, data that is not
  the ``/generate`` JSON): not transient, never retried; 502 naming what was wrong,
  and the engine is marked suspect. The pool raises it as the engine client's own
  :class:`gyre.engine.client.EngineProtocolError`.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from gyre.proxy.errors import ApiError


class EngineBroke(Exception):
    """The attempt failed in a way another attempt may not (connection, 5xx)."""


class EngineSilent(EngineBroke):
    """The engine said nothing within a read timeout (frozen, or far too slow)."""


@dataclass(frozen=True)
class Backoff:
    max_attempts: int
    """Failed attempts one call may make (moves after a drain do not count)."""
    budget_s: float
    """No new attempt starts later than this after the call's first failure."""
    base_s: float = 0.25
    cap_s: float = 5.0

    def delay(self, failures: int, rng: random.Random) -> float:
        """Exponential in the failures so far, with jitter in [50%, 100%] ("equal jitter"): calls
        that failed together do not all come back at the same instant."""
        d = min(self.cap_s, self.base_s * 2 ** max(failures - 1, 0))
        return d * (0.5 + 0.5 * rng.random())


class CallFaults:
    """The failures of one call so far, and what to do next."""

    def __init__(self, policy: Backoff) -> None:
        self.policy = policy
        self.failures = 0
        self.first_at: float | None = None
        self.last_error = ""
        self.last_url = ""
        self.last_silent = False

    def note(self, url: str, err: Exception, now: float) -> None:
        self.failures += 1
        if self.first_at is None:
            self.first_at = now
        self.last_url = url
        self.last_error = str(err)
        self.last_silent = isinstance(err, EngineSilent)

    def next_delay(self, engine_is_up: bool, now: float, rng: random.Random) -> float:
        """Seconds to wait before the next attempt (0: go now); raises the final API error when
        the attempts or the time budget are spent."""
        if self.failures == 0:
            return 0.0
        if self.failures >= self.policy.max_attempts:
            raise self.give_up(now)
        d = 0.0 if engine_is_up else self.policy.delay(self.failures, rng)
        assert self.first_at is not None
        if now + d - self.first_at > self.policy.budget_s:
            raise self.give_up(now)
        return d

    def give_up(self, now: float) -> ApiError:
        spent = now - (self.first_at if self.first_at is not None else now)
        what = "did not answer in time" if self.last_silent else "failed"
        msg = (
            f"inference engine {what} ({self.failures} attempts over {spent:.1f} s; last: "
            f"{self.last_url}: {self.last_error[:200]})"
        )
        retry_after = str(max(1, math.ceil(self.policy.cap_s)))
        return ApiError(
            504 if self.last_silent else 503,
            msg,
            "overloaded",
            headers={"retry-after": retry_after},
        )


def protocol_error(url: str, what: str) -> ApiError:
    """502: the engine is not speaking the protocol; retrying the same request will not help."""
    return ApiError(
        502,
        f"inference engine {url} broke the /generate protocol: {what}",
        "server",
        code="engine_protocol_error",
    )
