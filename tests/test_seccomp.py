"""Seccomp and privileges, black-box: one forbidden thing per request, its exact outcome asserted."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest
from conftest import ROOT, cgroup_version, run

from capsule import seccomp

pytestmark = [pytest.mark.sandbox, pytest.mark.usefixtures("sandbox")]

# A Python probe: call one raw syscall with the given args, print "ok <ret>" or "errno <n>".
SYSCALL = """
import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
args = [int(a, 0) for a in sys.argv[2:]]
libc.syscall.restype = ctypes.c_long
r = libc.syscall(ctypes.c_long(int(sys.argv[1])), *[ctypes.c_long(a) for a in args])
print("ok", r) if r >= 0 else print("errno", ctypes.get_errno())
"""

# x86-64 syscall numbers (the probes run on the native ABI).
NR = {"ptrace": 101, "mount": 165, "unshare": 272, "keyctl": 250, "bpf": 321, "io_uring_setup": 425,
      "perf_event_open": 298, "process_vm_readv": 310, "clone3": 435, "ioctl": 16, "add_key": 248,
      "userfaultfd": 323, "setns": 308, "kexec_load": 246, "init_module": 175}

ERRNO_PROFILE = 'extends = "default"\n[policy]\nseccomp_action = "errno"\n'
KILL_PROFILE = 'extends = "default"\n[policy]\nseccomp_action = "kill"\n'


@pytest.fixture(scope="module", autouse=True)
def _x86_64() -> None:
    if os.uname().machine != "x86_64":
        pytest.skip("the probes use x86-64 syscall numbers")


def syscall(name: str, *args: int, profile: str | None = None, config: str | None = None) -> dict:
    req = {"command": ["python3", "-c", SYSCALL, str(NR[name]), *map(str, args)]}
    return run(req, profile=profile, config=config)


@pytest.fixture
def profiles_dir(tmp_path: Path) -> str:
    (tmp_path / "errno.toml").write_text(ERRNO_PROFILE)
    (tmp_path / "kill.toml").write_text(KILL_PROFILE)
    return str(tmp_path)


FORBIDDEN = [
    ("ptrace", (16, 1, 0, 0)),  # PTRACE_ATTACH to the sandbox's init, a sibling of ours
    ("mount", (0, 0, 0, 0)),
    ("unshare", (0x10000000,)),  # CLONE_NEWUSER
    ("keyctl", (0, 0)),
    ("add_key", (0, 0, 0, 0, 0)),
    ("bpf", (0, 0, 0)),
    ("io_uring_setup", (1, 0)),
    ("perf_event_open", (0, 0, -1, -1, 0)),
    ("process_vm_readv", (1, 0, 0, 0, 0, 0)),
    ("userfaultfd", (0,)),
    ("setns", (0, 0)),
    ("kexec_load", (0, 0, 0, 0)),
    ("init_module", (0, 0, 0)),
]


@pytest.mark.parametrize(("name", "args"), FORBIDDEN, ids=[f[0] for f in FORBIDDEN])
def test_forbidden_call_fails_with_eperm_under_errno_action(name: str, args: tuple, profiles_dir: str) -> None:
    doc = syscall(name, *args, profile="errno", config=profiles_dir)
    assert doc["status"] == "success" and doc["stdout"] == "errno 1\n", doc
    assert "seccomp" in doc["limits_hit"] and any(name in w for w in doc["warnings"])


@pytest.mark.parametrize(("name", "args"), FORBIDDEN[:6], ids=[f[0] for f in FORBIDDEN[:6]])
def test_forbidden_call_kills_and_is_named_under_kill_action(name: str, args: tuple, profiles_dir: str) -> None:
    doc = syscall(name, *args, profile="kill", config=profiles_dir)
    assert doc["status"] == "killed" and doc["error"]["code"] == "E5001", doc
    assert doc["error"]["details"]["syscall"] == name
    assert doc["signal"] == "SIGSYS" and doc["_exit"] == 159 and "seccomp" in doc["limits_hit"]


def test_named_pipes_but_no_device_nodes() -> None:
    doc = run({"command": ["sh", "-c", "mkfifo /tmp/p && echo fifo-ok; mknod /tmp/n c 1 3 2>/dev/null || echo nodev"]})
    assert doc["stdout"] == "fifo-ok\nnodev\n" and any("mknodat" in w for w in doc["warnings"]), doc


def test_clone3_is_enosys_so_threads_fall_back() -> None:
    doc = syscall("clone3", 0, 0)
    assert doc["stdout"] == "errno 38\n" and "seccomp" not in doc["limits_hit"]


def test_tiocsti_is_denied_even_with_upper_bits_set(profiles_dir: str) -> None:
    # stdin is /dev/null: an allowed ioctl fails with ENOTTY (25), a denied one with EPERM (1).
    assert syscall("ioctl", 0, 0x5401, 0)["stdout"] == "errno 25\n"  # TCGETS: allowed
    assert syscall("ioctl", 0, 0x5412, 0, profile="errno", config=profiles_dir)["stdout"] == "errno 1\n"
    assert syscall("ioctl", 0, 0x541C, 0, profile="errno", config=profiles_dir)["stdout"] == "errno 1\n"
    assert syscall("ioctl", 0, 0x100005412, 0, profile="errno", config=profiles_dir)["stdout"] == "errno 1\n"


def test_ioctl_cover_matches_all_but_the_excluded() -> None:
    rules = seccomp._ioctl_cover((0x5412, 0x541C))

    def allowed(cmd: int) -> bool:
        return any(cmd & m == v for m, v in rules)

    assert not allowed(0x5412) and not allowed(0x541C) and not allowed(0xFFFF00005412 & 0xFFFFFFFF)
    assert all(allowed(c) for c in (0, 0x5401, 0x5411, 0x5413, 0x541B, 0x541D, 0xFFFFFFFF, 0x80045430))


@pytest.fixture(scope="module")
def probes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("gcc") is None:
        pytest.skip("gcc is needed to build the C probes")
    d = tmp_path_factory.mktemp("probes")
    (d / "int80.c").write_text(
        "int main(void){long r; __asm__ volatile(\"int $0x80\":\"=a\"(r):\"a\"(20L)); return r > 0 ? 0 : 3;}\n")
    (d / "suid.c").write_text(
        "#include <stdio.h>\n#include <unistd.h>\nint main(void){int r = setuid(0);"
        " printf(\"euid=%d uid=%d setuid=%d\\n\", (int)geteuid(), (int)getuid(), r); return 0;}\n")
    for name in ("int80", "suid"):
        subprocess.run(["gcc", "-O0", "-o", str(d / name), str(d / f"{name}.c")], check=True)
    os.chmod(d, 0o755)
    os.chmod(d.parent, 0o755)
    if ROOT:
        os.chown(d / "suid", 0, 0)
        os.chmod(d / "suid", 0o4755)
    return d


def _probe(probes: Path, name: str, **kwargs: object) -> dict:
    return run({"command": [f"/opt/probes/{name}"],
                "isolation": {"bind_mounts": [{"source": str(probes), "destination": "/opt/probes"}]}}, **kwargs)


def test_32bit_syscall_through_int80_is_killed(probes: Path) -> None:
    doc = _probe(probes, "int80")
    assert doc["status"] == "killed" and doc["error"]["code"] == "E5001" and doc["signal"] == "SIGSYS", doc
    assert doc["error"]["details"].get("syscall") is None and "non-native" in doc["error"]["details"]["syscall_unknown"]


def test_x32_abi_syscall_is_refused() -> None:
    # getpid through the x32 ABI (__X32_SYSCALL_BIT | 39): libseccomp's x86-64 filter treats
    # it as a foreign architecture and the kernel kills (SECCOMP_RET_KILL_PROCESS).
    doc = run({"command": ["python3", "-c", SYSCALL, str(0x40000000 | 39)]})
    assert doc["status"] == "killed" and doc["error"]["code"] == "E5001" and doc["signal"] == "SIGSYS", doc


def test_setuid_root_binary_cannot_regain_root(probes: Path) -> None:
    if not ROOT:
        pytest.skip("needs root to make a setuid-root probe")
    assert os.stat(probes / "suid").st_mode & stat.S_ISUID
    doc = _probe(probes, "suid")
    assert doc["status"] == "success" and doc["stdout"].startswith("euid=1000 uid=1000 setuid=-1"), doc


def test_proc_sys_is_read_only() -> None:
    doc = run({"command": ["sh", "-c", "{ echo 1 > /proc/sys/kernel/ns_last_pid; } 2>&1; echo rc=$?"]})
    assert "rc=0" not in doc["stdout"] and "Read-only" in doc["stdout"], doc["stdout"]


def test_other_process_memory_is_unreadable() -> None:
    doc = run({"command": ["sh", "-c", "head -c 16 /proc/1/mem >/dev/null 2>&1; echo rc=$?; cat /proc/1/environ 2>&1 | head -c 80"]})
    assert doc["stdout"].startswith("rc=1") and "Permission denied" in doc["stdout"], doc["stdout"]


def test_status_shows_no_privileges_and_a_filter() -> None:
    doc = run({"command": ["cat", "/proc/self/status"]})
    status = dict(line.split(":", 1) for line in doc["stdout"].splitlines() if ":" in line)
    for key in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert int(status[key].strip(), 16) == 0, key
    assert status["NoNewPrivs"].strip() == "1" and status["Seccomp"].strip() == "2"
    assert doc["isolation"]["seccomp"] == "default" and doc["isolation"]["no_new_privs"] is True


def test_mounts_are_nosuid_and_nodev_but_dev_nodes() -> None:
    doc = run({"command": ["cat", "/proc/self/mountinfo"]})
    for line in doc["stdout"].splitlines():
        fields = line.split()
        point, opts = fields[4], fields[5]
        if point.startswith("/dev/") and point.split("/")[2] in ("null", "zero", "full", "random", "urandom", "tty"):
            assert "nosuid" in opts
            continue
        assert "nosuid" in opts, line
        if point not in ("/dev",):
            assert "nodev" in opts, line


def test_python_threads_and_subprocess_run_under_default() -> None:
    script = ("import threading, subprocess\nout = []\n"
              "ts = [threading.Thread(target=out.append, args=(i,)) for i in range(8)]\n"
              "[t.start() for t in ts]; [t.join() for t in ts]\n"
              "sub = subprocess.run(['sh', '-c', 'echo sub'], capture_output=True, text=True).stdout.strip()\n"
              "print(sorted(out) == list(range(8)), sub)\n"
              "import ctypes; print(ctypes.CDLL(None).getpid() > 0)\n")
    doc = run({"command": ["python3", "-c", script]})
    assert doc["status"] == "success" and doc["stdout"] == "True sub\nTrue\n", doc
    assert doc["limits_hit"] == []


def test_numpy_pandas_matplotlib_save_a_png() -> None:
    script = ("import numpy as np, pandas as pd, matplotlib\nmatplotlib.use('Agg')\nimport matplotlib.pyplot as plt\n"
              "df = pd.DataFrame({'x': np.arange(10), 'y': np.arange(10) ** 2})\n"
              "df.plot(x='x', y='y'); plt.savefig('plot.png'); print(df['y'].sum())\n")
    doc = run({"command": ["python3", "-c", script], "collect": ["*.png"]}, profile="python")
    assert doc["status"] == "success" and doc["stdout"] == "285\n", doc.get("stderr", doc)
    import base64

    assert base64.b64decode(doc["files"][0]["content_base64"]).startswith(b"\x89PNG")
    assert doc["isolation"]["seccomp"] == "default"


@pytest.fixture
def strict(tmp_path: Path) -> dict:
    """`strict` itself where this host gives a cgroup; else (rootless without delegation, where
    `strict` rightly answers E2009) the same policy without the cgroup requirement."""
    if cgroup_version() != "none":
        return {"profile": "strict"}
    (tmp_path / "strict-nocg.toml").write_text('extends = "strict"\n[policy]\nrequire = ["userns", "seccomp"]\n')
    return {"profile": "strict-nocg", "config": str(tmp_path)}


def test_strict_forbids_fork_and_sockets_but_computes(strict: dict) -> None:
    doc = run({"command": ["python3", "-c", "import os; os.fork()"]}, **strict)
    assert doc["status"] == "killed" and doc["error"]["code"] == "E5001"
    assert doc["error"]["details"]["syscall"] in ("clone", "fork", "vfork")
    doc = run({"command": ["python3", "-c", "import socket; socket.socket()"]}, **strict)
    assert doc["error"]["code"] == "E5001" and doc["error"]["details"]["syscall"] == "socket"
    doc = run({"command": ["python3", "-c", "print(sum(i * i for i in range(10 ** 5)))"]}, **strict)
    assert doc["status"] == "success" and doc["stdout"] == "333328333350000\n" and doc["isolation"]["seccomp"] == "strict"


def test_strict_allows_threads(strict: dict) -> None:
    script = "import threading\nt = threading.Thread(target=print, args=('t',)); t.start(); t.join()\n"
    doc = run({"command": ["python3", "-c", script]}, **strict)
    assert doc["status"] == "success" and doc["stdout"] == "t\n", doc


def test_seccomp_off_only_where_a_profile_says(tmp_path: Path) -> None:
    (tmp_path / "open.toml").write_text('extends = "default"\n[policy]\nseccomp = "off"\n')
    doc = run({"command": ["grep", "Seccomp:", "/proc/self/status"]}, profile="open", config=str(tmp_path))
    assert doc["stdout"].split() == ["Seccomp:", "0"] and doc["isolation"]["seccomp"] == "off"


def test_always_denied_cannot_be_added_by_a_profile() -> None:
    from capsule.errors import InvalidConfig

    with pytest.raises(InvalidConfig):
        seccomp.check_profile_syscalls(("ptrace",), (), False, "x.toml")
    assert "ptrace" not in {n for names in seccomp.GROUPS.values() for n in names}


def test_everyday_tools_need_nothing_the_default_policy_denies() -> None:
    script = (Path(__file__).parent / "data" / "everyday.sh").read_text()
    doc = run({"command": ["sh", "-c", script], "timeout_ms": 60000}, profile="python")
    assert doc["status"] == "success" and doc["stdout"].endswith("python ok\nall-ok\n"), doc.get("stderr", doc)
    assert "seccomp" not in doc["limits_hit"] and not [w for w in doc.get("warnings", []) if "seccomp" in w]
