"""A wall-clock bound on a chat-template render, in whatever thread runs it.

A model folder is not trusted, and its chat template is a program: two nested
``range(100000)`` loops (each within Jinja's sandbox limit) kept ``gyre proxy`` rendering at
start with no end. Counting operations in the sandbox cannot bound it (a loop over a string
or a list calls nothing the sandbox sees), and a render abandoned in a thread would burn a
core forever. So one watchdog thread raises :class:`RenderTimedOut` in the thread whose render
passed its deadline (``PyThreadState_SetAsyncExc``: delivered between two bytecodes, which a
Jinja loop is made of), and the render ends there. A render that finishes first disarms it;
an exception that was sent but not yet delivered is cancelled under the same lock, so it never
lands in other code.
"""

from __future__ import annotations

import ctypes
import itertools
import threading
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class RenderTimedOut(BaseException):
    """Raised inside a render that passed its deadline. A BaseException so that no
    ``except Exception`` in the template engine or its callers can swallow it."""


def _send(thread_id: int, exc: type[BaseException] | None) -> None:
    ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(thread_id), ctypes.py_object(exc) if exc is not None else None
    )


class _Watchdog:
    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._armed: dict[int, tuple[float, int]] = {}  # token -> (deadline, thread id)
        self._fired: set[int] = set()
        self._tokens = itertools.count()
        self._thread: threading.Thread | None = None

    def arm(self, seconds: float) -> int:
        with self._cv:
            token = next(self._tokens)
            self._armed[token] = (time.monotonic() + seconds, threading.get_ident())
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="gyre-render-bound")
                self._thread.daemon = True
                self._thread.start()
            self._cv.notify()
            return token

    def disarm(self, token: int) -> bool:
        """True when the deadline passed (the exception was sent: raised by now, or cancelled)."""
        with self._cv:
            self._armed.pop(token, None)
            if token not in self._fired:
                return False
            self._fired.discard(token)
            _send(threading.get_ident(), None)  # sent but not delivered yet: cancel it
            return True

    def _run(self) -> None:
        with self._cv:
            while True:
                now = time.monotonic()
                for token, (deadline, tid) in list(self._armed.items()):
                    if deadline <= now:
                        del self._armed[token]
                        self._fired.add(token)
                        _send(tid, RenderTimedOut)
                nxt = min((d for d, _ in self._armed.values()), default=None)
                self._cv.wait(None if nxt is None else max(nxt - now, 0.001))


_WATCHDOG = _Watchdog()


def within(seconds: float | None, fn: Callable[[], T]) -> T:
    """``fn()``, or :class:`RenderTimedOut` once it has run ``seconds`` (None: no bound)."""
    if seconds is None:
        return fn()
    token = _WATCHDOG.arm(seconds)
    fired = False
    try:
        try:
            return fn()
        finally:
            fired = _WATCHDOG.disarm(token)
    except RenderTimedOut:
        fired = True
        raise
    finally:
        if fired:
            _WATCHDOG.disarm(token)  # delivered before disarm ran: forget the token
