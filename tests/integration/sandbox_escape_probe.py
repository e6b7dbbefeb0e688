"""Runs *inside* the sandbox as the harness: attempts every escape, writes report.json.

Stdlib only. Reads ``probe_cfg.json`` (written by tests/integration/test_sandbox_escapes.py)
from its working directory (the workspace) and writes ``report.json`` next to it:
``{attempt: {"escaped": bool, "detail": str}}``. Every attempt really tries (syscalls
through ctypes, not tools that give up before asking the kernel); ``escaped`` is true only
when the kernel let it through and the forbidden thing was actually reached.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import socket
import time
import urllib.request

MS_RDONLY, MS_REMOUNT, MS_BIND = 1, 32, 4096
MNT_DETACH = 2
CLONE_NEWNS, CLONE_NEWUSER = 0x00020000, 0x10000000

# Before anything else opens a file: which descriptors did the sandbox hand down?
INHERITED = []
for _fd in range(3, 256):
    try:
        os.fstat(_fd)
        INHERITED.append(_fd)
    except OSError:
        pass

libc = ctypes.CDLL(None, use_errno=True)
cfg = json.load(open("probe_cfg.json"))
report: dict[str, dict] = {}


def record(name: str, escaped: bool, detail: str) -> None:
    report[name] = {"escaped": bool(escaped), "detail": str(detail)[:500]}


def sys_ok(ret: int) -> tuple[bool, str]:
    return ret == 0, "ok" if ret == 0 else os.strerror(ctypes.get_errno())


def read(path: str) -> str | None:
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return None


def write(path: str, data: bytes = b"escaped\n") -> str:
    try:
        with open(path, "wb") as f:
            f.write(data)
        return "written"
    except OSError as e:
        return f"{type(e).__name__}: {e.strerror}"


# 0. No capability, not uid 0, nothing inherited.
status = dict(
    line.split(":\t", 1) for line in open("/proc/self/status").read().splitlines() if ":\t" in line
)
caps = {k: status[k].strip() for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")}
record(
    "capabilities",
    any(int(v, 16) for v in caps.values()) or os.getuid() == 0 or os.geteuid() == 0,
    f"uid={os.getuid()} {caps}",
)
record("inherited_fds", bool(INHERITED), f"open fds above 2 at start: {INHERITED}")
try:
    os.setuid(0)
    record("setuid_root", True, "setuid(0) succeeded")
except OSError as e:
    record("setuid_root", False, e.strerror)

# 1. Remount / (and a system dir) read-write, then write a host file.
outs = []
escaped = False
for target in ("/", "/usr", "/etc"):
    ok, why = sys_ok(libc.mount(None, target.encode(), None, MS_REMOUNT | MS_BIND, None))
    outs.append(f"remount {target} rw: {why}")
    escaped |= ok
for path in cfg["host_files"]:
    res = write(path)
    outs.append(f"write {path}: {res}")
    escaped |= res == "written"
record("remount_root_rw_and_write_host", escaped, "; ".join(outs))

# 2. Write into the host's home directly.
res = write(cfg["host_home_file"])
record("write_host_home", res == "written", res)

# 3. Unmount the task dir (and what covers it) to read the hidden tests.
outs = []
for p in (cfg["task_dir"], os.path.dirname(cfg["task_dir"])):
    outs.append(f"umount {p}: {sys_ok(libc.umount2(p.encode(), MNT_DETACH))[1]}")
secret = read(cfg["secret_path"])
record(
    "umount_task_dir_read_hidden_tests",
    secret is not None and cfg["secret"] in secret,
    "; ".join(outs) + f"; read: {'content' if secret else 'refused'}",
)

# 4. Lazily unmount the workspace (and its root) to see another execution's files.
outs = []
for p in (os.getcwd(), cfg["workspace_root"], os.path.dirname(cfg["workspace_root"])):
    outs.append(f"umount -l {p}: {sys_ok(libc.umount2(p.encode(), MNT_DETACH))[1]}")
other = read(cfg["other_secret_path"])
record(
    "umount_workspace_root_read_other_execution",
    other is not None and cfg["other_secret"] in other,
    "; ".join(outs) + f"; read: {'content' if other else 'refused'}",
)

# 5. Unmount /proc to see the host's processes.
ok, why = sys_ok(libc.umount2(b"/proc", MNT_DETACH))
pids = [int(e) for e in os.listdir("/proc") if e.isdigit()]
host = read(f"/proc/{cfg['host_pid']}/cmdline") or ""
record(
    "umount_proc_see_host_pids",
    cfg["token"] in host or len(pids) > 64,
    f"umount /proc: {why}; {len(pids)} pids visible: {sorted(pids)[:20]}",
)

# 6. Read the proxy's admin token from /proc (any process's cmdline or environ, or our own env).
found = []
for pid in pids:
    for what in ("cmdline", "environ"):
        if cfg["token"] in (read(f"/proc/{pid}/{what}") or ""):
            found.append(f"{pid}/{what}")
if any(cfg["token"] in v for v in os.environ.values()):
    found.append("own environment")
record("read_admin_token_from_proc", bool(found), f"found in: {found}" if found else "not found")


# 7. Host unix sockets: filesystem (under the host's home and /srv) and abstract.
def connect_unix(addr: str) -> tuple[bool, str]:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(3)
    try:
        s.connect(addr)
        data = s.recv(64)
        return True, f"connected, got {data!r}"
    except OSError as e:
        return False, f"{type(e).__name__}: {e.strerror}"
    finally:
        s.close()


for name, key in (
    ("unix_socket_host_home", "home_socket"),
    ("unix_socket_srv", "srv_socket"),
    ("unix_socket_abstract", "abstract_socket"),
):
    addr = cfg[key]
    if key == "abstract_socket":
        addr = "\0" + addr
    ok, why = connect_unix(addr)
    record(name, ok, why)

# 8. A loopback TCP port other than the proxy's (and the proxy itself: must work).
try:
    c = socket.create_connection(("127.0.0.1", cfg["other_port"]), timeout=3)
    c.close()
    record("tcp_loopback_other_port", True, "connected")
except OSError as e:
    record("tcp_loopback_other_port", False, f"{type(e).__name__}: {e.strerror}")
try:
    body = urllib.request.urlopen(cfg["proxy_url"], timeout=10).read().decode()
    report["proxy_reachable"] = {"ok": "proxy-says-hi" in body, "detail": body[:80]}
except OSError as e:
    report["proxy_reachable"] = {"ok": False, "detail": repr(e)}

# 9. A fresh user namespace (caps inside it) or mount namespace.
ok, why = sys_ok(libc.unshare(CLONE_NEWUSER))
record("unshare_user_namespace", ok, why)
ok, why = sys_ok(libc.unshare(CLONE_NEWNS))
record("unshare_mount_namespace", ok, why)

# 10. Fork bomb: how many processes can be started?
kids: list[int] = []
err = ""
try:
    for _ in range(cfg["fork_tries"]):
        pid = os.fork()
        if pid == 0:
            time.sleep(30)
            os._exit(0)
        kids.append(pid)
except OSError as e:
    err = f"{type(e).__name__}: {e.strerror}"
for k in kids:
    os.kill(k, signal.SIGKILL)
for k in kids:
    os.waitpid(k, 0)
record(
    "fork_bomb",
    len(kids) >= cfg["max_procs"],
    f"{len(kids)} children before: {err or 'no refusal'} (limit {cfg['max_procs']})",
)
report["fork_bomb"]["children"] = len(kids)

# 11. One file past the file size limit; /tmp past its size.
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of being killed
chunk = b"x" * (1 << 20)


def fill(path: str, limit: int) -> tuple[int, str]:
    n = 0
    try:
        with open(path, "wb") as f:
            while n < limit:
                f.write(chunk)
                f.flush()
                n += len(chunk)
    except OSError as e:
        return n, f"{type(e).__name__}: {e.strerror}"
    return n, "no refusal"


n, why = fill("big.bin", 4 * cfg["max_file_bytes"])
os.unlink("big.bin")
record("file_past_size_limit", n > cfg["max_file_bytes"], f"{n} bytes, then {why}")
total, why = 0, ""
for i in range(64):
    n, why = fill(f"/tmp/fill{i}", cfg["max_file_bytes"] // 2)
    total += n
    if why != "no refusal":
        break
record("tmp_past_tmpfs_size", total > cfg["tmpfs_bytes"], f"{total} bytes in /tmp, then {why}")


def fill_dir(d: str, tag: str) -> tuple[int, str]:
    total, why = 0, ""
    for i in range(64):
        n, why = fill(f"{d}/{tag}{i}", cfg["max_file_bytes"] // 2)
        total += n
        if why != "no refusal":
            break
    for i in range(64):
        try:
            os.unlink(f"{d}/{tag}{i}")
        except OSError:
            pass
    return total, why


# 12. /dev/shm (a tmpfs too) and /dev itself, past the tmpfs size.
total, why = fill_dir("/dev/shm", "fill")
record("dev_shm_past_tmpfs_size", total > cfg["tmpfs_bytes"], f"{total} bytes, then {why}")
total, why = fill_dir("/dev", "gyre-fill")
record("dev_past_tmpfs_size", total > cfg["tmpfs_bytes"], f"{total} bytes, then {why}")

# 13. A setuid/setgid file left in the workspace (the scorer copies it on the host).
try:
    with open("suid.bin", "wb") as f:
        f.write(b"#!/bin/sh\nid\n")
    os.chmod("suid.bin", 0o6777)
    record("setuid_file_kept", False, oct(os.stat("suid.bin").st_mode))
except OSError as e:
    record("setuid_file_kept", False, f"refused: {e}")
try:
    os.mkdir("suid.dir")
    os.chmod("suid.dir", 0o3777)
except OSError:
    pass

with open("report.json", "w") as f:
    json.dump(report, f, indent=1)
with open("answer.txt", "w") as f:
    f.write("42\n")
