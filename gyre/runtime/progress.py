"""Live progress of a run: a rich panel in a terminal, plain lines, JSON lines, or nothing.

The panel shows step i/n, the last reward, each cell's role, waterlevel against
capacity, executions running and queued, and an ETA from the mean step time.
"""

from __future__ import annotations

import json
import sys
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.live import Live

    from gyre.runtime.records import Records

_ROLE_MARK = {"rollout": "R", "training": "T", "to_training": ">T", "to_rollout": ">R"}


class Progress:
    def __init__(self, mode: str = "rich", total_steps: int = 0, *, quiet: bool = False):
        self.mode = "quiet" if quiet else mode
        if self.mode == "rich" and not sys.stderr.isatty():
            self.mode = "plain"
        self.total = total_steps
        self._live: Live | None = None
        self._last = 0.0
        self._last_step = -1

    def __enter__(self) -> Progress:
        if self.mode == "rich":
            from rich.console import Console
            from rich.live import Live

            live = self._live = Live(
                console=Console(stderr=True), refresh_per_second=4, transient=False
            )
            live.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._live is not None:
            self._live.__exit__(*exc)
            self._live = None

    def message(self, text: str) -> None:
        if self.mode == "json":
            print(json.dumps({"event": "message", "text": text}), flush=True)
        elif self.mode != "quiet":
            print(f"[gyre run] {text}", file=sys.stderr, flush=True)

    def snapshot(
        self, records: Records, policy, rows: list[dict[str, Any]], running: int, version: int
    ) -> dict[str, Any]:
        """``rows``: the run's metrics lines so far (every segment); ``running``: executions
        live now; ``version``: the trainer's."""
        st = policy.status()
        done = len(rows)
        elapsed = records.now()
        seg_steps = len(records.finished_steps)
        eta = elapsed / seg_steps * (self.total - done) if seg_steps else None
        return {
            "step": done,
            "steps": self.total,
            "reward": rows[-1].get("reward/mean") if rows else None,
            "roles": st["roles"],
            "waterlevel": st["waterlevel"],
            "capacity": st["capacity"],
            "running": running,
            "queued": st["queued"],
            "version": version,
            "elapsed_s": round(elapsed, 1),
            "eta_s": None if eta is None else round(eta, 1),
        }

    def update(
        self,
        records: Records,
        policy,
        rows: list[dict[str, Any]],
        *,
        running: int,
        version: int,
        force: bool = False,
    ) -> None:
        """Show the run's state (at most every 0.25 s, and at each new step)."""
        if self.mode == "quiet":
            return
        now = time.monotonic()
        steps = len(rows)
        new_step = steps != self._last_step
        if not force and not new_step and now - self._last < 0.25:
            return
        self._last = now
        s = self.snapshot(records, policy, rows, running, version)
        if self.mode == "json":
            if new_step or force:
                print(json.dumps({"event": "progress", **s}), flush=True)
        elif self.mode == "plain":
            if new_step or force:
                print(f"[gyre run] {self._line(s)}", file=sys.stderr, flush=True)
        elif self._live is not None:
            self._live.update(self._panel(s))
        self._last_step = steps

    @staticmethod
    def _line(s: dict[str, Any]) -> str:
        r = "-" if s["reward"] is None else f"{s['reward']:.3f}"
        eta = "-" if s["eta_s"] is None else f"{s['eta_s']:.0f}s"
        roles = " ".join(_ROLE_MARK.get(x, x) for x in s["roles"])
        return (
            f"step {s['step']}/{s['steps']}  reward {r}  cells [{roles}]  waterlevel {s['waterlevel']}/"
            f"{s['capacity']}  running {s['running']} queued {s['queued']}  elapsed {s['elapsed_s']:.0f}s "
            f"eta {eta}"
        )

    def _panel(self, s: dict[str, Any]):
        from rich.table import Table

        t = Table.grid(padding=(0, 2))
        t.add_row(
            "[bold]step[/]",
            f"{s['step']}/{s['steps']}",
            "[bold]reward[/]",
            "-" if s["reward"] is None else f"{s['reward']:.3f}",
            "[bold]version[/]",
            str(s["version"]),
        )
        t.add_row(
            "[bold]cells[/]",
            " ".join(_ROLE_MARK.get(x, x) for x in s["roles"]),
            "[bold]waterlevel[/]",
            f"{s['waterlevel']}/{s['capacity']}",
            "[bold]running/queued[/]",
            f"{s['running']}/{s['queued']}",
        )
        t.add_row(
            "[bold]elapsed[/]",
            f"{s['elapsed_s']:.0f}s",
            "[bold]eta[/]",
            "-" if s["eta_s"] is None else f"{s['eta_s']:.0f}s",
            "",
            "",
        )
        return t
