"""Weight snapshots a joining satellite pulls from the core.

The core's weights do not change during gradient accumulation, so the snapshot it
publishes at the start of a step is consistent for everyone who joins that step,
at any time. Pulling is one-sided (the core keeps computing while a satellite
reads), which is what the paper gets from RDMA reads.

:class:`FileWeightChannel` writes one safetensors file per policy version (atomic
rename; a reader never sees a half-written file); on one host put it under
/dev/shm. A Ray actor can implement the same two methods with the object store.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Protocol

import torch
from safetensors.torch import load_file, save_file

SNAPSHOTS_KEPT = 2
"""Weight snapshots a channel keeps (one model each): a satellite pulls the version of the step
it joined, and the core publishes the next version only after every participant has reduced, so
the current version plus one spare is enough."""


class WeightChannel(Protocol):
    def publish(self, version: int, params: dict[str, torch.Tensor]) -> None: ...
    def pull(self, version: int) -> dict[str, torch.Tensor]: ...


def named_params(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Parameters by name (tied weights once), detached, contiguous, on CPU."""
    return {n: p.detach().to("cpu").contiguous() for n, p in model.named_parameters()}


def load_params(model: torch.nn.Module, params: dict[str, torch.Tensor]) -> None:
    """Copy a :func:`named_params` snapshot into ``model`` (names must match exactly)."""
    own = dict(model.named_parameters())
    if set(own) != set(params):
        missing, extra = sorted(set(own) - set(params)), sorted(set(params) - set(own))
        raise ValueError(
            f"weight snapshot does not match the model: missing {missing[:5]}, unexpected {extra[:5]}"
        )
    with torch.no_grad():
        for n, p in own.items():
            p.copy_(params[n].to(p.device, p.dtype))


class FileWeightChannel:
    """One ``v{version}.safetensors`` per published version in ``root``; keeps the last ``keep``."""

    def __init__(
        self,
        root: str | Path,
        *,
        keep: int = SNAPSHOTS_KEPT,
        poll_s: float = 0.01,
        timeout_s: float = 600.0,
    ):
        self.root, self.keep, self.poll_s, self.timeout_s = Path(root), keep, poll_s, timeout_s
        self.root.mkdir(parents=True, exist_ok=True)

    def _path(self, version: int) -> Path:
        return self.root / f"v{version}.safetensors"

    def publish(self, version: int, params: dict[str, torch.Tensor]) -> None:
        tmp = self.root / f".v{version}.{os.getpid()}.tmp"
        save_file(params, str(tmp), metadata={"policy_version": str(version)})
        os.replace(tmp, self._path(version))
        for p in self.root.glob("v*.safetensors"):
            try:
                v = int(p.stem[1:])
            except ValueError:
                continue
            if v <= version - self.keep:
                p.unlink(missing_ok=True)

    def pull(self, version: int) -> dict[str, torch.Tensor]:
        path, t0 = self._path(version), time.monotonic()
        while not path.exists():
            if time.monotonic() - t0 > self.timeout_s:
                raise TimeoutError(
                    f"weights of policy version {version} never appeared in {self.root}"
                )
            time.sleep(self.poll_s)
        return load_file(str(path))


class MemoryWeightChannel:
    """In-process channel (one process): keeps the latest snapshots in a dict."""

    def __init__(self, keep: int = SNAPSHOTS_KEPT):
        self.keep = keep
        self._snap: dict[int, dict[str, torch.Tensor]] = {}

    def publish(self, version: int, params: dict[str, torch.Tensor]) -> None:
        self._snap[version] = {n: t.clone() for n, t in params.items()}
        for v in [v for v in self._snap if v <= version - self.keep]:
            del self._snap[v]

    def pull(self, version: int) -> dict[str, torch.Tensor]:
        return self._snap[version]
