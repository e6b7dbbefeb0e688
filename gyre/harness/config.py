"""Typed configuration for the harness executor, its sandbox and its scorer.

Pydantic models so a controller (or a Ray actor) can build an executor from one
serialisable object, and the lead can nest these in the top-level config.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field


class SandboxConfig(BaseModel):
    """Bubblewrap settings.

    Read-only root, private /tmp and HOME (tmpfs), private pid/ipc/uts
    namespaces, every other execution's workspace and the task's hidden files
    covered by empty tmpfs mounts. Network: ``--unshare-net`` alone would cut
    the harness off from the proxy (a new namespace has its own loopback), so by
    default ("proxy-only") the proxy's port is bridged into the sandbox's
    loopback through a unix socket and nothing else is reachable; "shared" keeps
    the host's network namespace instead.
    """

    enabled: bool = False
    bwrap: str = "bwrap"
    # "shared": the host's network namespace (the harness reaches the proxy on loopback, but
    # also anything else the host can reach). "proxy-only": its own network namespace; the
    # proxy is bridged in through a unix socket (gyre.harness.netbridge), nothing else is reachable.
    network: Literal["shared", "proxy-only"] = "proxy-only"
    # Extra host paths to hide from the harness (covered by an empty tmpfs).
    hide_paths: list[Path] = Field(default_factory=list)
    # Extra read-only binds (src -> same path) for things under hidden trees.
    ro_binds: list[Path] = Field(default_factory=list)
    # The scorer needs no network at all, so it can run with --unshare-net.
    scorer_unshare_net: bool = True


class ScorerConfig(BaseModel):
    """How workspaces are assessed (the task's own tests, in a separate process)."""

    max_concurrency: int = 4
    # Python whose bin directory goes first on the verifier's PATH (pytest lives there).
    python: str = sys.executable
    max_log_bytes: int = 4 * 1024 * 1024
    sandbox: bool = True  # use bubblewrap for the verifier when the executor's sandbox is enabled
    keep_scratch: bool = False  # keep the scored copy (debugging a verifier)


class ExecutorConfig(BaseModel):
    """One executor: where workspaces live, how many harnesses run at once."""

    workspace_root: Path = Field(
        default_factory=lambda: Path(tempfile.gettempdir()) / "gyre-executions"
    )
    max_concurrency: int = 64
    # SIGTERM to the process group, then SIGKILL after this grace period.
    kill_grace_s: float = 2.0
    # Per stream (stdout, stderr). A harness that writes more is stopped (recorded as
    # ``log_limit``) and its workspace scored like a timeout's.
    max_log_bytes: int = 64 * 1024 * 1024
    keep_workspaces: bool = True
    # Default overall budget when a task does not state one: harness + verifier + this.
    overall_slack_s: float = 60.0
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig)
    scorer: ScorerConfig = Field(default_factory=ScorerConfig)
