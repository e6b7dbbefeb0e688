"""A Ray cluster of several nodes on this machine, owned by the test that starts it.

Each node is one ``ray start --block`` process in its own session (process group), with its
own ``--temp-dir`` and free ports for everything Ray binds, so it cannot clash with another
Ray instance on the machine (other tests, other users). Nodes share 127.0.0.1 and are told
apart by their Ray node id. ``stop()`` tears down only what this object started: SIGTERM to
each ``ray start`` (Ray then stops the node's processes), SIGKILL to each node's process
group after a grace period, and SIGKILL to any process still naming this cluster's temp dir
on its command line. A plain ``ray stop`` is never used: it would stop every Ray on the machine.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gyre.ports import free_ports

RAY = str(Path(sys.executable).with_name("ray"))


class RayNodes:
    def __init__(self) -> None:
        # a short path: Ray's unix sockets live below it (and sun_path holds ~107 bytes)
        self.temp = Path(tempfile.mkdtemp(prefix="gyre-ray-", dir="/tmp"))
        self.token = self.temp / "auth_token"
        self.token.write_text(secrets.token_hex(32))
        self.token.chmod(0o600)
        self._free = free_ports(24)  # every port of every node: distinct from one another
        self.gcs_port = self._port()
        self.address = ""  # host:port of the head's GCS, once started
        self.procs: list[subprocess.Popen] = []
        self.logs: list[Path] = []

    def _port(self) -> int:
        return self._free.pop()

    def env(self) -> dict[str, str]:
        """The environment of this cluster's nodes and of every driver that joins it: token
        authentication with this cluster's own token (never ~/.ray's, which others may share)."""
        return {
            **os.environ,
            "RAY_USAGE_STATS_ENABLED": "0",
            "PYTHONUNBUFFERED": "1",
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN_PATH": str(self.token),
        }

    def _ports(self) -> list[str]:
        return [
            *("--node-manager-port", str(self._port())),
            *("--object-manager-port", str(self._port())),
            *("--dashboard-agent-listen-port", str(self._port())),
            *("--dashboard-agent-grpc-port", str(self._port())),
            *("--runtime-env-agent-port", str(self._port())),
            *("--metrics-export-port", str(self._port())),
            *("--min-worker-port", "0", "--max-worker-port", "0"),  # the OS picks
        ]

    def start_node(
        self,
        *,
        head: bool,
        ip: str,
        num_cpus: int,
        resources: dict[str, float],
        timeout: float = 120,
    ) -> None:
        """Start one node on loopback address ``ip`` and wait until the cluster lists it.

        Not 127.0.0.1: ``ray start`` rewrites that one to the host's routable address; any
        other address of 127.0.0.0/8 stays on loopback as given."""
        argv = [
            RAY,
            "start",
            "--block",
            "--disable-usage-stats",
            "--node-ip-address",
            ip,
            "--temp-dir",
            str(self.temp),
            "--num-cpus",
            str(num_cpus),
            "--resources",
            json.dumps(resources),
            "--object-store-memory",
            str(200 * 1024 * 1024),
            *self._ports(),
        ]
        if head:
            self.address = f"{ip}:{self.gcs_port}"
            argv += [
                "--head",
                *("--port", str(self.gcs_port)),
                *("--ray-client-server-port", str(self._port())),
                *("--include-dashboard", "false"),
                *("--dashboard-port", str(self._port())),
            ]
        else:
            argv += ["--address", self.address]
        log = self.temp / f"node-{len(self.procs)}.log"
        self.logs.append(log)
        with open(log, "w") as f:
            self.procs.append(
                subprocess.Popen(
                    argv, stdout=f, stderr=subprocess.STDOUT, env=self.env(), start_new_session=True
                )
            )
        want = len(self.procs)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.procs[-1].poll() is not None:
                raise RuntimeError(f"ray start exited: {log.read_text()[-3000:]}")
            try:
                if len(self.nodes()) >= want:
                    return
            except (subprocess.SubprocessError, ValueError):
                pass
            time.sleep(1)
        raise RuntimeError(f"node {want} did not join in {timeout}s: {log.read_text()[-3000:]}")

    def nodes(self) -> list[dict]:
        """The live nodes (id and resources), asked from a separate driver process."""
        code = (
            "import json, sys, ray\n"
            "ray.init(address=sys.argv[1], log_to_driver=False, configure_logging=False)\n"
            "nodes = [n for n in ray.nodes() if n['Alive']]\n"
            "print(json.dumps([{'id': n['NodeID'], 'resources': n['Resources']} for n in nodes]))"
        )
        out = subprocess.run(
            [sys.executable, "-c", code, self.address],
            capture_output=True,
            text=True,
            timeout=60,
            env=self.env(),
            check=True,
        )
        return json.loads(out.stdout.strip().splitlines()[-1])

    def _own_pids(self) -> list[int]:
        """Processes that name this cluster's temp dir on their command line (raylet, GCS,
        agents) or in their environment (workers: they rename themselves ``ray::...`` and
        start their own session, but inherit RAY_AUTH_TOKEN_PATH from the raylet)."""
        mine, needle = [], str(self.temp).encode()
        for d in Path("/proc").iterdir():
            if not d.name.isdigit() or int(d.name) == os.getpid():
                continue
            for part in ("cmdline", "environ"):
                try:
                    if needle in (d / part).read_bytes():
                        mine.append(int(d.name))
                        break
                except OSError:
                    continue
        return mine

    def alive(self) -> list[int]:
        """What is left of this cluster: its process groups' members and its temp-dir processes."""
        left = set(self._own_pids())
        for p in self.procs:
            try:
                os.killpg(p.pid, 0)
                left.add(p.pid)
            except ProcessLookupError:
                pass
        return sorted(left)

    def stop(self, grace: float = 30.0) -> None:
        for p in reversed(self.procs):  # worker nodes first, the head last
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for p in self.procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for p in self.procs:  # what a node's processes left in its session
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()
        for pid in self._own_pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def cleanup(self) -> None:
        shutil.rmtree(self.temp, ignore_errors=True)
