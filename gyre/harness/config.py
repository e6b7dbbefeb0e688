"""Typed configuration for the harness executor, its sandbox and its scorer.

Pydantic models so a controller (or a Ray actor) can build an executor from one
serialisable object, and the lead can nest these in the top-level config.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class SandboxConfig(BaseModel):
    """Bubblewrap settings.

    Only the system directories and the tools it needs, read-only; private /tmp
    and HOME (sized tmpfs); private user/pid/ipc/uts namespaces, no capability,
    an unprivileged uid; the task's hidden files and other workspaces absent or
    covered by empty tmpfs mounts; bounded processes and disk (see
    ``gyre.harness.sandbox`` for the whole model). Network: ``--unshare-net`` alone would cut
    the harness off from the proxy (a new namespace has its own loopback), so by
    default ("proxy-only") the proxy's port is bridged into the sandbox's
    loopback through a unix socket and nothing else is reachable; "shared" keeps
    the host's network namespace instead.
    """

    model_config = ConfigDict(allow_inf_nan=False)  # an `inf` timeout is a mistake

    # On by default: a harness runs model-written commands. ``executor.sandbox = false`` (or
    # ``enabled = false``) is the explicit opt-out; with it on and bubblewrap missing or not
    # working, the executor refuses to start rather than run harnesses unconfined.
    enabled: bool = True
    bwrap: str = "bwrap"
    # "shared": the host's network namespace (the harness reaches the proxy on loopback, but
    # also anything else the host can reach). "proxy-only": its own network namespace; the
    # proxy is bridged in through a unix socket (gyre.harness.netbridge), nothing else is reachable.
    network: Literal["shared", "proxy-only"] = "proxy-only"
    # Extra host paths to hide from the harness (covered by an empty tmpfs).
    hide_paths: list[Path] = Field(default_factory=list)
    # Extra read-only binds (src -> same path) for things under hidden trees.
    ro_binds: list[Path] = Field(default_factory=list)
    # proxy-only: connections one harness may hold open to the proxy at once (more are closed
    # at once), so one execution cannot take the proxy's file descriptors from the others.
    max_proxy_connections: int = Field(default=64, ge=1)
    # The scorer needs no network at all, so it can run with --unshare-net.
    scorer_unshare_net: bool = True
    # The harness's (and verifier's) uid/gid inside the sandbox, and on the host when root
    # launches Gyre (an ordinary user's own uid is mapped onto it instead). Never 0.
    uid: int = Field(default=65534, gt=0)
    gid: int = Field(default=65534, gt=0)
    # RLIMIT_NPROC inside the sandbox's user namespace: processes + threads of this sandbox.
    max_procs: int = Field(default=1024, ge=16)
    # RLIMIT_FSIZE: the largest single file the harness can write.
    max_file_bytes: int = Field(default=2 << 30, gt=0)
    # Size of the /tmp and $HOME tmpfs (each; memory-backed).
    tmpfs_bytes: int = Field(default=1 << 30, gt=0)
    # The workspace's total size, checked every ``disk_check_s``: past it the harness is
    # stopped (``disk_limit``) and its workspace scored like a timeout's. 0: unchecked.
    max_workspace_bytes: int = Field(default=8 << 30, ge=0)
    # ... and its entries (files, directories, links: inodes cost no bytes). 0: unchecked.
    # Also bounds each check's walk (~2 s per 100k entries on a busy 2-core machine).
    max_workspace_files: int = Field(default=250_000, ge=0)
    disk_check_s: float = Field(default=1.0, gt=0)


class ScorerConfig(BaseModel):
    """How workspaces are assessed (the task's own tests, in a separate process)."""

    model_config = ConfigDict(allow_inf_nan=False)  # an `inf` timeout is a mistake

    max_concurrency: int = 4
    # Python whose bin directory goes first on the verifier's PATH (pytest lives there).
    python: str = sys.executable
    max_log_bytes: int = 4 * 1024 * 1024
    # Bubblewrap for the verifier whenever the executor's sandbox is enabled. Turning it off
    # alone is refused (see ExecutorConfig): only ``executor.sandbox = false`` turns both off.
    sandbox: bool = True
    keep_scratch: bool = False  # keep the scored copy (debugging a verifier)
    # Bounds of the scoring copy of a workspace (gyre.harness.safecopy): a workspace past
    # any of them is not run through the verifier and scores 0.
    max_copy_files: int = Field(default=200_000, gt=0)
    max_copy_bytes: int = Field(default=4 << 30, gt=0)
    max_copy_depth: int = Field(default=128, gt=0)


class ExecutorConfig(BaseModel):
    """One executor: where workspaces live, how many harnesses run at once."""

    model_config = ConfigDict(allow_inf_nan=False)  # an `inf` timeout is a mistake

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

    @field_validator("sandbox", mode="before")
    @classmethod
    def _sandbox_switch(cls, v: Any) -> Any:
        """``sandbox = false`` / ``true``: the whole section's switch, in one word."""
        return {"enabled": v} if isinstance(v, bool) else v

    @model_validator(mode="after")
    def _no_unconfined_verifier(self) -> ExecutorConfig:
        """A sandboxed harness with an unsandboxed verifier is worse than either: the verifier
        runs the harness's planted code (a ``pytest.py`` in the workspace) as the launcher."""
        if self.sandbox.enabled and not self.scorer.sandbox:
            raise ValueError(
                "executor.scorer.sandbox = false with executor.sandbox on runs the verifier "
                "unconfined on the harness's workspace (its planted code as you); set "
                "executor.sandbox = false to run with no sandbox at all"
            )
        return self
