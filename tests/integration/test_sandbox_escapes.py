"""Escape suite: a hostile harness inside ``--sandbox`` (proxy-only) tries every way out.

The probe (sandbox_escape_probe.py) runs as the harness of a real execution (the
executor, its bridge, bwrap, confine) and really attempts each escape with syscalls:
remount ``/`` read-write and write host files, unmount the task dir for the hidden
tests, lazily unmount the workspace root for another execution's files, unmount
``/proc`` for the host's processes, read an admin token from ``/proc``, connect to
host unix sockets (under the host's home, under ``/srv``, abstract), reach another
loopback port, create user/mount namespaces, setuid(0), fork-bomb, write past the
file and tmpfs limits; a second execution fills its workspace past the quota.

It runs twice: Gyre launched by root (this machine and CI), and Gyre launched by an
unprivileged user (``setpriv`` to 65534, with the system Python and the venv's
packages), skipped with the reason when that cannot be arranged. Every attempt must
be refused in both; the proxy must still be reachable.
"""

from __future__ import annotations

import http.server
import json
import os
import secrets
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest

from gyre.harness.sandbox import bwrap_available

sys.path.insert(0, str(Path(__file__).parent))
from test_harness_util import make_task

pytestmark = pytest.mark.skipif(
    bwrap_available() is None, reason="bubblewrap (bwrap) is not installed: no sandbox to escape"
)

PROBE = Path(__file__).with_name("sandbox_escape_probe.py")
ATTEMPTS = [
    "capabilities",
    "inherited_fds",
    "setuid_root",
    "remount_root_rw_and_write_host",
    "write_host_home",
    "umount_task_dir_read_hidden_tests",
    "umount_workspace_root_read_other_execution",
    "umount_proc_see_host_pids",
    "read_admin_token_from_proc",
    "unix_socket_host_home",
    "unix_socket_srv",
    "unix_socket_abstract",
    "tcp_loopback_other_port",
    "unshare_user_namespace",
    "unshare_mount_namespace",
    "fork_bomb",
    "file_past_size_limit",
    "tmp_past_tmpfs_size",
    "dev_shm_past_tmpfs_size",
    "dev_past_tmpfs_size",
]
# + "workspace_past_quota" (its own execution): len(ATTEMPTS) + 1 attempts per launcher.
MAX_PROCS, MAX_FILE, TMPFS, QUOTA = 64, 8 << 20, 16 << 20, 32 << 20
UNPRIV_UID = 65534
SYSTEM_PY = "/usr/bin/python3"

# Runs the real executor (as root, or as the unprivileged user): argv[1] is a JSON job.
DRIVER = r"""
import asyncio, json, sys
from pathlib import Path
from gyre.harness.config import ExecutorConfig, SandboxConfig
from gyre.harness.execution import ExecutionSpec
from gyre.harness.executor import HarnessExecutor
from gyre.harness.profiles import HarnessProfile
from gyre.harness.task import load_task

job = json.loads(Path(sys.argv[1]).read_text())
cfg = ExecutorConfig(
    workspace_root=Path(job["workspace_root"]),
    sandbox=SandboxConfig(enabled=True, network="proxy-only", **job["sandbox"]),
)

async def main():
    async with HarnessExecutor(cfg) as ex:
        r = await ex.run(ExecutionSpec(
            execution_id=job["id"], task=load_task(job["task"]),
            profile=HarnessProfile(name="probe", command=job["command"]),
            base_url=job["proxy_url"], api_key="k"))
    err = Path(r.harness.stderr_path)
    print(json.dumps({"workspace": r.workspace, "stop": r.harness.stop, "error": r.harness.error,
                      "assessment": r.assessment.model_dump(mode="json"),
                      "stderr": err.read_text()[-2000:] if err.is_file() else ""}))

asyncio.run(main())
"""


class _Proxy(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b"proxy-says-hi"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a: object) -> None:
        pass


def _serve_unix(addr: str, stop: threading.Event) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(addr)
    if not addr.startswith("\0"):
        os.chmod(addr, 0o777)  # permissions are not what must stop the harness
    s.listen()
    s.settimeout(0.2)

    def loop() -> None:
        while not stop.is_set():
            try:
                c, _ = s.accept()
            except OSError:
                continue
            c.sendall(b"HOST-SOCKET")
            c.close()

    threading.Thread(target=loop, daemon=True).start()
    return s


def _sockdir(parent: Path, tag: str) -> Path | None:
    try:
        d = parent / f".gyre-escape-{tag}"
        d.mkdir(mode=0o755)
        return d
    except OSError:
        return None


@pytest.fixture(scope="module")
def host():
    """Everything outside the sandbox the probe goes after; torn down afterwards."""
    tag = secrets.token_hex(4)
    base = Path(tempfile.mkdtemp(prefix="gyre-escape-", dir="/tmp"))
    base.chmod(0o755)  # the unprivileged launcher reads the task and probe from here
    stop = threading.Event()
    made: list[Path] = [base]
    socks: list[socket.socket] = []
    home = Path.home()
    home_dir = _sockdir(home, tag) or _sockdir(base, tag + "-home")
    srv_dir = _sockdir(Path("/srv"), tag) or _sockdir(base, tag + "-srv")
    made += [d for d in (home_dir, srv_dir) if d is not None]
    abstract = f"gyre-escape-{tag}"
    for addr in (str(home_dir / "s.sock"), str(srv_dir / "s.sock"), "\0" + abstract):
        socks.append(_serve_unix(addr, stop))
    proxy = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Proxy)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    other = socket.socket()
    other.bind(("127.0.0.1", 0))
    other.listen()
    token = f"ADMIN-TOKEN-{secrets.token_hex(8)}"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(600)", "--admin-token", token],
        env={**os.environ, "GYRE_ADMIN_TOKEN": token},
    )
    secret = f"HIDDEN-{tag}"
    task_dir = make_task(base / "tasks", secret=secret)
    repo = task_dir / "environment" / "repo"
    shutil.copy(PROBE, repo / "sandbox_escape_probe.py")
    for p in [base / "tasks", *base.joinpath("tasks").rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    host_files = [f"/usr/gyre-escape-{tag}", f"/etc/gyre-escape-{tag}", f"/gyre-escape-{tag}"]
    yield {
        "base": base,
        "tag": tag,
        "task_dir": str(task_dir),
        "secret": secret,
        "secret_path": str(task_dir / "tests" / "secret.txt"),
        "token": token,
        "host_pid": holder.pid,
        "host_files": host_files,
        "host_home_file": str(home / f".gyre-escape-{tag}.txt"),
        "home_socket": str(home_dir / "s.sock"),
        "srv_socket": str(srv_dir / "s.sock"),
        "abstract_socket": abstract,
        "other_port": other.getsockname()[1],
        "proxy_url": f"http://127.0.0.1:{proxy.server_address[1]}",
        "max_procs": MAX_PROCS,
        "max_file_bytes": MAX_FILE,
        "tmpfs_bytes": TMPFS,
        "fork_tries": 4 * MAX_PROCS,
    }
    stop.set()
    holder.kill()
    holder.wait()
    proxy.shutdown()
    other.close()
    for s in socks:
        s.close()
    for d in made:
        shutil.rmtree(d, ignore_errors=True)


def _launch(host: dict, who: str, eid: str, command: list[str], sandbox: dict) -> dict:
    """Run one execution through the real executor, launched by ``who`` ("root" or "user")."""
    runs = host["base"] / f"runs-{who}"
    runs.mkdir(exist_ok=True)
    # Another execution's files, next to the probe's workspace.
    other = runs / f"other-{eid}" / "workspace"
    other.mkdir(parents=True)
    (other / "secret.txt").write_text(f"OTHER-{host['tag']}")
    job = {
        "workspace_root": str(runs),
        "task": host["task_dir"],
        "id": eid,
        "command": command,
        "proxy_url": host["proxy_url"],
        "sandbox": sandbox,
    }
    jf = host["base"] / f"job-{who}-{eid}.json"
    jf.write_text(json.dumps(job))
    driver = host["base"] / "driver.py"
    driver.write_text(DRIVER)
    if who == "root":
        argv, env = [sys.executable, str(driver), str(jf)], dict(os.environ)
    else:
        for p in (runs, runs / f"other-{eid}", other):
            os.chown(p, UNPRIV_UID, UNPRIV_UID)
        pythonpath = _user_pythonpath(host["base"])
        argv = [
            "setpriv",
            f"--reuid={UNPRIV_UID}",
            f"--regid={UNPRIV_UID}",
            "--clear-groups",
            SYSTEM_PY,
            str(driver),
            str(jf),
        ]
        env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": pythonpath, "HOME": "/tmp"}
    p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    out["other_secret_path"] = str(other / "secret.txt")
    return out


# What the driver imports from the venv (gyre.harness.executor and friends).
_DRIVER_PACKAGES = (
    "pydantic",
    "pydantic_core",
    "typing_extensions.py",
    "annotated_types",
    "typing_inspection",
    "numpy",
    "numpy.libs",
)
_pythonpath: dict[str, str] = {}


def _user_pythonpath(base: Path) -> str:
    """PYTHONPATH for the unprivileged driver: the checkout and the venv themselves when that
    user can read them, else a readable copy of what the driver imports (a CI clone under a
    0700 ``/root`` is not readable by uid 65534)."""
    if "p" in _pythonpath:
        return _pythonpath["p"]
    site = next(Path(sys.prefix).glob("lib/python3*/site-packages"))
    repo_root = Path(__import__("gyre").__file__).resolve().parent.parent
    direct = f"{repo_root}:{site}"
    probe = subprocess.run(
        ["setpriv", f"--reuid={UNPRIV_UID}", f"--regid={UNPRIV_UID}", "--clear-groups"]
        + [SYSTEM_PY, "-c", "import gyre.harness.executor"],
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": direct, "HOME": "/tmp"},
        capture_output=True,
    )
    if probe.returncode == 0 and not os.environ.get("GYRE_ESCAPE_STAGE"):  # (set: test staging)
        _pythonpath["p"] = direct
        return direct
    staged = base / "py"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(repo_root / "gyre", staged / "gyre", ignore=ignore)
    for name in _DRIVER_PACKAGES:
        src = site / name
        if src.is_dir():
            shutil.copytree(src, staged / name, ignore=ignore)
        elif src.is_file():
            shutil.copy(src, staged / name)
    for p in [staged, *staged.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644 | (p.stat().st_mode & 0o111))
    _pythonpath["p"] = str(staged)
    return str(staged)


def _probe(host: dict, who: str) -> dict:
    cfg = dict(host)
    cfg.pop("base")
    runs = host["base"] / f"runs-{who}"
    cfg["workspace_root"] = str(runs)
    cfg["other_secret"] = f"OTHER-{host['tag']}"
    cfg["other_secret_path"] = str(runs / "other-probe" / "workspace" / "secret.txt")
    repo = Path(host["task_dir"]) / "environment" / "repo"
    (repo / "probe_cfg.json").write_text(json.dumps(cfg))
    (repo / "probe_cfg.json").chmod(0o644)
    py = sys.executable if who == "root" else SYSTEM_PY
    res = _launch(
        host,
        who,
        "probe",
        [py, "sandbox_escape_probe.py"],
        {"max_procs": MAX_PROCS, "max_file_bytes": MAX_FILE, "tmpfs_bytes": TMPFS},
    )
    rep = Path(res["workspace"]) / "report.json"
    assert rep.is_file(), f"the probe wrote no report: {res}"
    report = json.loads(rep.read_text())
    ws = Path(res["workspace"])
    report["_modes"] = {
        n: os.lstat(p).st_mode
        for n, p in (
            ("suid.bin", ws / "suid.bin"),
            ("suid.dir", ws / "suid.dir"),
            ("exec_dir", ws.parent),
            ("workspace_root", ws.parent.parent),
        )
        if os.path.lexists(p)
    }
    report["_host_files_written"] = [
        f for f in [*host["host_files"], host["host_home_file"]] if os.path.exists(f)
    ]
    return report


def _unprivileged_unavailable() -> str | None:
    if os.geteuid() != 0:
        return "the suite is not run as root: cannot switch to another user"
    if shutil.which("setpriv") is None:
        return "setpriv (util-linux) is not installed"
    if not os.access(SYSTEM_PY, os.X_OK):
        return f"no system Python at {SYSTEM_PY} for the unprivileged launcher"
    site = next(Path(sys.prefix).glob("lib/python3*/site-packages"), None)
    if site is None:
        return "no site-packages in this venv"
    ver = subprocess.run(
        [SYSTEM_PY, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    if ver != "{}.{}".format(*sys.version_info[:2]):
        return f"system Python {ver} cannot load this venv's packages ({sys.version_info[:2]})"
    return None


@pytest.fixture(scope="module")
def reports(host) -> dict:
    """The probe's report per launcher: "root", and "user" (unprivileged), or why not run."""
    if os.geteuid() != 0:  # an ordinary user runs the suite: that user is the only launcher
        return {"root": None, "user": _probe(host, "root")}  # ("root" = run as this process)
    why = _unprivileged_unavailable()
    out = {"root": _probe(host, "root"), "user": why or _probe(host, "user")}
    if os.environ.get("GYRE_ESCAPE_REPORT"):  # every attempt's outcome, for the record
        Path(os.environ["GYRE_ESCAPE_REPORT"]).write_text(json.dumps(out, indent=1))
    return out


def _report(reports: dict, who: str) -> dict:
    r = reports[who]
    if r is None:
        pytest.skip("not run as root: the root launcher cannot be exercised")
    if isinstance(r, str):
        pytest.skip(f"unprivileged launcher unavailable: {r}")
    return r


@pytest.mark.slow
@pytest.mark.parametrize("who", ["root", "user"])
@pytest.mark.parametrize("attempt", ATTEMPTS)
def test_escape_is_refused(reports, attempt, who):
    r = _report(reports, who)
    assert attempt in r, f"the probe did not run {attempt}: {sorted(r)}"
    assert not r[attempt]["escaped"], f"{who}: {attempt} ESCAPED: {r[attempt]['detail']}"


@pytest.mark.slow
@pytest.mark.parametrize("who", ["root", "user"])
def test_proxy_still_reachable_and_no_host_file_written(reports, who):
    r = _report(reports, who)
    assert r["proxy_reachable"]["ok"], r["proxy_reachable"]
    assert r["_host_files_written"] == []
    # The limits are real, not vacuous: the fork bomb was stopped by the kernel, near the limit.
    assert MAX_PROCS // 2 < r["fork_bomb"]["children"] < MAX_PROCS, r["fork_bomb"]


@pytest.mark.slow
@pytest.mark.parametrize("who", ["root", "user"])
def test_no_setid_bits_or_open_modes_left_on_the_host(reports, who):
    """A setuid/setgid file the harness made is not setuid on the host (kept workspace, and so
    the scoring copy); execution folders are closed to other users (0700)."""
    modes = _report(reports, who)["_modes"]
    assert set(modes) == {"suid.bin", "suid.dir", "exec_dir", "workspace_root"}, modes
    for name, mode in modes.items():
        assert mode & 0o7077 == 0, f"{who}: {name} is {stat.filemode(mode)} ({oct(mode)})"


@pytest.mark.slow
@pytest.mark.parametrize("who", ["root", "user"])
def test_workspace_past_quota_is_stopped(host, who):
    if who == "user" and (why := _unprivileged_unavailable()):
        pytest.skip(f"unprivileged launcher unavailable: {why}")
    if who == "root" and os.geteuid() != 0:
        pytest.skip("not run as root")
    py = sys.executable if who == "root" else SYSTEM_PY
    writer = (
        "import os\n"
        "c = b'x' * (1 << 20)\n"
        "for i in range(2048):\n"  # 2 GiB in 1 MiB files (each under RLIMIT_FSIZE)
        "    open('f' + str(i), 'wb').write(c)\n"  # (no braces: profiles are templates)
    )
    res = _launch(
        host,
        who,
        "quota",
        [py, "-c", writer],
        {"max_workspace_bytes": QUOTA, "disk_check_s": 0.2, "max_file_bytes": MAX_FILE},
    )
    used = sum(f.stat().st_size for f in Path(res["workspace"]).iterdir() if f.name.startswith("f"))
    assert res["stop"] == "disk_limit", res
    assert QUOTA < used < 1 << 30, used  # stopped well before its 2 GiB


@pytest.mark.slow
@pytest.mark.parametrize("who", ["root", "user"])
def test_workspace_past_file_quota_is_stopped(host, who):
    """Empty files cost no bytes but inodes: the entry count is a quota too."""
    if who == "user" and (why := _unprivileged_unavailable()):
        pytest.skip(f"unprivileged launcher unavailable: {why}")
    if who == "root" and os.geteuid() != 0:
        pytest.skip("not run as root")
    py = sys.executable if who == "root" else SYSTEM_PY
    writer = (
        "import os\n"
        "os.mkdir('m')\n"
        "for i in range(400000):\n"
        "    os.close(os.open('m/' + str(i), os.O_CREAT | os.O_WRONLY, 0o600))\n"
    )
    res = _launch(
        host,
        who,
        "files",
        [py, "-c", writer],
        {"max_workspace_files": 5000, "disk_check_s": 0.2},
    )
    made = len(os.listdir(Path(res["workspace"]) / "m"))
    assert res["stop"] == "disk_limit", res
    assert 5000 < made < 400000, made  # stopped well before its 400k
