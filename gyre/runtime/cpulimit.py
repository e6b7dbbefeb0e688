"""Hold a cell process to a fixed CPU share, so that on a CPU machine a cell is a device.

On a GPU cluster a cell owns its GPUs: when it idles (an Async training cell waiting for
rollouts, a rollout cell with empty slots), its compute is wasted, and no other cell can take
it. On a CPU machine with fewer cores than cells, cells share the cores, so an idle cell's
time silently goes to the others: Async's idle rollout cells cost it nothing, and Elastic's
training on several cells at once slows everything else down (harness launches, the proxy,
the one cell left serving). Comparing placements there measures the kernel's scheduler, not
the placements.

``run.cell.cpu_quota = q`` puts each cell actor (and every process it starts, a vLLM server
included) into a cgroup of its own held to ``q`` CPUs (CFS bandwidth control): a fixed
compute partition whose idle time is lost, as a GPU's is. The host (driver, proxy, harness
processes, Ray) keeps what the cells' quotas leave. Linux only; it needs write access to the
cgroup cpu controller (root, or a delegated cgroup). Both cgroup v1 (``/sys/fs/cgroup/cpu``)
and v2 (``cpu.max``) are handled; v1 was exercised on the development machines, v2 only on
a file tree in the tests.

Groups are named ``gyre/cell-<pid>`` and are removed once empty: each new confinement sweeps
its empty siblings (those of cells that have exited), and the driver sweeps at the end.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

PERIOD_US = 100_000  # CFS period: 100 ms (the kernel default)
CGROUP_ROOT = Path("/sys/fs/cgroup")
PARENT = "gyre"
SHARES_V1, WEIGHT_V2 = 262144, 10000  # the kernels' maxima (defaults 1024 and 100)


class CpuLimitError(RuntimeError):
    """The quota cannot be applied here; ``str(e)`` is one line that says why and what to do."""


@dataclass(frozen=True)
class Controller:
    """Where cell groups go: ``base`` is the cgroup directory holding ``gyre/``."""

    base: Path
    version: int  # 1 or 2

    def parent(self) -> Path:
        return self.base / PARENT


def find_controller(root: Path = CGROUP_ROOT) -> Controller:
    """The cgroup cpu controller under ``root``: v1's ``cpu`` hierarchy, else a v2 mount whose
    ``cgroup.controllers`` offers ``cpu``."""
    for v1 in (root / "cpu", root / "cpu,cpuacct"):
        if (v1 / "cpu.cfs_quota_us").exists():
            return Controller(v1, 1)
    ctl = root / "cgroup.controllers"
    if ctl.exists() and "cpu" in ctl.read_text().split():
        return Controller(root, 2)
    raise CpuLimitError(
        f"run.cell.cpu_quota: no cgroup cpu controller under {root} (Linux with cgroup v1 "
        "'cpu' or v2 'cpu'); drop the setting"
    )


def _write(path: Path, text: str) -> None:
    try:
        path.write_text(text)
    except OSError as e:
        raise CpuLimitError(
            f"run.cell.cpu_quota: cannot write {path} ({e.strerror or e}); it needs root or a "
            "delegated cgroup; drop the setting"
        ) from None


def _prepare_parent(c: Controller) -> Path:
    parent = c.parent()
    try:
        parent.mkdir(exist_ok=True)
    except OSError as e:
        raise CpuLimitError(
            f"run.cell.cpu_quota: cannot create {parent} ({e.strerror or e}); it needs root "
            "or a delegated cgroup; drop the setting"
        ) from None
    if c.version == 2:  # children of gyre/ get the cpu controller only if both levels enable it
        for d in (c.base, parent):
            ctl = d / "cgroup.subtree_control"
            if "cpu" not in ctl.read_text().split():
                _write(ctl, "+cpu")
    set_weight(parent, c.version)  # gyre/ competes with the machine's other tasks as one
    return parent


def sweep(c: Controller) -> int:
    """Remove empty cell groups (their cells have exited); returns how many went."""
    parent = c.parent()
    gone = 0
    if not parent.is_dir():
        return 0
    for d in parent.glob("cell-*"):
        try:
            d.rmdir()  # the kernel refuses a group that still has processes: that one stays
            gone += 1
        except OSError:
            pass
    return gone


def set_weight(group: Path, version: int) -> None:
    """The highest CFS weight: the quota is only a ceiling, and on a loaded machine a group of
    default weight got 0.19-0.37 of its 0.4 CPU (load 17-19) where this weight got 0.40. Cells
    ask for a fraction of the cores, so the weight never lets them take more than their quota."""
    if version == 1:
        _write(group / "cpu.shares", str(SHARES_V1))
    else:
        _write(group / "cpu.weight", str(WEIGHT_V2))


def set_quota(group: Path, cpus: float, version: int) -> None:
    quota = max(1000, round(cpus * PERIOD_US))  # the kernel's floor is 1 ms
    if version == 1:
        _write(group / "cpu.cfs_period_us", str(PERIOD_US))
        _write(group / "cpu.cfs_quota_us", str(quota))
    else:
        _write(group / "cpu.max", f"{quota} {PERIOD_US}")
    set_weight(group, version)


def confine(pid: int, cpus: float, c: Controller | None = None) -> Path:
    """Move process ``pid`` (all its threads, and every child it starts later) into a fresh
    group held to ``cpus`` CPUs. Returns the group's directory."""
    if cpus <= 0:
        raise CpuLimitError(f"run.cell.cpu_quota: must be > 0, got {cpus:g}")
    c = c or find_controller()
    parent = _prepare_parent(c)
    sweep(c)
    group = parent / f"cell-{pid}"
    group.mkdir(exist_ok=True)
    set_quota(group, cpus, c.version)
    _write(group / "cgroup.procs", str(pid))
    return group


def check(cpus: float, root: Path = CGROUP_ROOT) -> None:
    """Refuse at start what :func:`confine` would fail at inside a cell: no controller, no write
    access, or a quota above this machine's CPUs (nothing would be held back)."""
    have = os.cpu_count() or 1
    if cpus > have:
        raise CpuLimitError(
            f"run.cell.cpu_quota: {cpus:g} CPUs per cell is more than this machine's {have}"
        )
    c = find_controller(root)
    parent = _prepare_parent(c)
    probe = parent / f"probe-{os.getpid()}"
    try:
        probe.mkdir(exist_ok=True)
        set_quota(probe, cpus, c.version)
    except OSError as e:
        raise CpuLimitError(
            f"run.cell.cpu_quota: cannot create a cgroup under {parent} ({e.strerror or e}); "
            "it needs root or a delegated cgroup; drop the setting"
        ) from None
    finally:
        try:
            probe.rmdir()
        except OSError:
            pass


def throttled(group: Path) -> int | None:
    """How many CFS periods the group was held back in (both versions write ``nr_throttled``)."""
    try:
        for line in (group / "cpu.stat").read_text().splitlines():
            k, _, v = line.partition(" ")
            if k == "nr_throttled":
                return int(v)
    except (OSError, ValueError):
        return None
    return None
