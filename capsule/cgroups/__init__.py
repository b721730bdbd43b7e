"""cgroups: one interface, three backends (v2, v1, none), chosen by what the host really offers.

Detection reads the mount table and `cgroup.controllers`, never the mere presence of a mount:
a hybrid host (these machines) has a cgroup2 mount with no controllers in it, and its memory,
cpu and pids controllers in v1 hierarchies. Every run gets its own group, `run-<pid>-<id>`,
under a parent of capsule-run's own (`capsule/`); the supervisor pid in the name lets a later
run or `capsule-run check --clean` collect what a SIGKILLed capsule-run left behind.

    backend = detect()            # Detected(version, controllers, base paths, fix)
    run = create_for_run(plan, warnings)   # limits written before anything runs in it
    run.add_pid(pid); run.cpu_time_ms(); run.kill(); run.stats(); run.remove()
"""

from __future__ import annotations

import functools
import os
import re
import time
from dataclasses import dataclass, field
from typing import Any

from ..errors import CgroupError
from ..plan import Plan

REQUIRED = ("memory", "pids", "cpu")
# capsule-run's own two processes live in the group too (A, outside the PID namespace, and B,
# its PID 1). `max_pids` counts the command's processes and threads, so the group gets two more,
# and `pids_peak` is reported without them.
OWN_PIDS = 2


@dataclass
class Stats:
    """Figures for the whole sandbox, read before the group is removed."""

    source: str
    cpu_time_ms: int = 0
    user_time_ms: int = 0
    kernel_time_ms: int = 0
    max_memory_bytes: int = 0
    io_bytes_read: int = 0
    io_bytes_written: int = 0
    pids_peak: int | None = None
    oom_kills: int = 0
    pids_limit_hit: bool = False
    memory_limit_hit: bool = False  # the group reached its limit (reclaim), OOM or not

    def as_metrics(self) -> dict[str, Any]:
        return {
            "cpu_time_ms": self.cpu_time_ms, "user_time_ms": self.user_time_ms,
            "kernel_time_ms": self.kernel_time_ms, "max_memory_bytes": self.max_memory_bytes,
            "io_bytes_read": self.io_bytes_read, "io_bytes_written": self.io_bytes_written,
            "pids_peak": self.pids_peak, "oom_kills": self.oom_kills, "source": self.source,
        }


class CgroupRun:
    """One run's group. Subclasses: v2.V2Run, v1.V1Run."""

    version = "none"
    where = ""  # for logs: the group's path (v2) or its parent hierarchies (v1)

    def add_pid(self, pid: int) -> None:
        raise NotImplementedError

    def cpu_time_ms(self) -> int:
        raise NotImplementedError

    def kill(self) -> None:
        raise NotImplementedError

    def stats(self) -> Stats:
        raise NotImplementedError

    def remove(self) -> None:
        raise NotImplementedError


@dataclass
class Detected:
    version: str = "none"  # "v2" | "v1" | "none"
    controllers: tuple[str, ...] = ()
    base: str = ""  # v2: the parent group; v1: unused
    v1_roots: dict[str, str] = field(default_factory=dict)  # controller -> hierarchy mount point
    fix: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"version": self.version, "controllers": list(self.controllers),
                "parent": self.base or {k: os.path.join(v, "capsule") for k, v in self.v1_roots.items()} or None,
                "fix": self.fix or None}


def _mounts() -> list[tuple[str, str, set[str]]]:
    """(mount point, fstype, super options) of every cgroup mount (proc_pid_mountinfo(5))."""
    found = []
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            left, _, right = line.partition(" - ")
            fstype, _, opts = right.split()[:3]
            if fstype in ("cgroup", "cgroup2"):
                mnt = left.split()[4].replace("\\040", " ")
                found.append((mnt, fstype, set(opts.split(","))))
    return found


def _own_v2_path() -> str:
    with open("/proc/self/cgroup") as fh:
        for line in fh:
            if line.startswith("0::"):
                return line[3:].strip()
    return "/"


def _read(path: str) -> str:
    with open(path) as fh:
        return fh.read()


def _v2_candidate(mnt: str) -> tuple[str, str]:
    """(parent path for our groups, fix text). Root: <mount>/capsule. Rootless: a delegated
    systemd user subtree (user@UID.service), or $CAPSULE_CGROUP_PARENT."""
    if os.environ.get("CAPSULE_CGROUP_PARENT"):
        return os.environ["CAPSULE_CGROUP_PARENT"], ""
    if os.geteuid() == 0:
        return os.path.join(mnt, "capsule"), ""
    own = _own_v2_path()
    match = re.search(rf"^(.*/user@{os.geteuid()}\.service)(/|$)", own)
    fix = ("run capsule-run under a delegated cgroup: `systemd-run --user --scope -p Delegate=yes capsule-run ...`, "
           "or set CAPSULE_CGROUP_PARENT to a cgroup v2 directory you own")
    if match and os.access(mnt + match.group(1), os.W_OK):
        return os.path.join(mnt + match.group(1), "capsule"), ""
    return "", fix


@functools.lru_cache(maxsize=1)
def detect() -> Detected:
    mounts = _mounts()
    for mnt, fstype, _ in mounts:
        if fstype != "cgroup2":
            continue
        try:
            controllers = tuple(_read(os.path.join(mnt, "cgroup.controllers")).split())
        except OSError:
            continue
        if all(c in controllers for c in REQUIRED):
            base, fix = _v2_candidate(mnt)
            if base:
                return Detected("v2", controllers, base=base)
            return Detected("none", controllers, fix=fix)
    roots: dict[str, str] = {}
    for mnt, fstype, opts in mounts:
        if fstype == "cgroup":
            for name in ("memory", "pids", "cpu", "cpuacct", "freezer", "blkio"):
                if name in opts:
                    roots.setdefault(name, mnt)
    if all(c in roots for c in REQUIRED) and "cpuacct" in roots:
        if os.geteuid() == 0 or all(os.access(r, os.W_OK) for r in roots.values()):
            return Detected("v1", tuple(sorted(roots)), v1_roots=roots)
        return Detected("none", tuple(sorted(roots)),
                        fix="cgroup v1 needs root here: run capsule-run as root, or move the host to cgroup v2")
    return Detected("none", fix="mount cgroup2 with the memory, pids and cpu controllers (or v1 hierarchies)")


def run_name() -> str:
    return f"run-{os.getpid()}-{os.urandom(6).hex()}"


def owner_alive(name: str, path: str) -> bool:
    """Is the supervisor that made group `run-<pid>-...` (at `path`) still alive? A pid that
    exists but started after the group was made is a recycled one: the owner is gone."""
    match = re.match(r"run-(\d+)-", name)
    if not match:
        return True  # not ours to judge
    pid = int(match.group(1))
    if pid == os.getpid():
        return True
    try:
        with open(f"/proc/{pid}/stat") as fh:
            start_ticks = int(fh.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/stat") as fh:
            btime = next(int(line.split()[1]) for line in fh if line.startswith("btime"))
        started = btime + start_ticks / os.sysconf("SC_CLK_TCK")
        return started <= os.stat(path).st_mtime + 1
    except (OSError, StopIteration, ValueError, IndexError):
        return False


def rmdir_retry(path: str, attempts: int = 50) -> None:
    """A group can be removed only once its last process is reaped; killed processes take a
    moment to leave (EBUSY)."""
    for _ in range(attempts):
        try:
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError as exc:
            if exc.errno != 16:  # EBUSY
                raise
            time.sleep(0.01)
    os.rmdir(path)


def create_for_run(plan: Plan, warnings: list[str]) -> CgroupRun | None:
    """The run's group with every limit written, or None where the host has none (the
    profile already decided that degrading is allowed: host.check_layers)."""
    found = detect()
    try:
        if found.version == "v2":
            from .v2 import V2Run

            return V2Run.create(found, plan)
        if found.version == "v1":
            from .v1 import V1Run

            return V1Run.create(found, plan)
    except OSError as exc:
        raise CgroupError(f"creating the run's cgroup: {exc.strerror} ({exc.filename})",
                          stage="cgroup", errno=exc.errno) from None
    return None


def clean_leftovers() -> list[str]:
    """Remove groups whose capsule-run is gone (SIGKILLed mid-run), killing what is inside."""
    found = detect()
    if found.version == "v2":
        from .v2 import clean_leftovers as clean
    elif found.version == "v1":
        from .v1 import clean_leftovers as clean
    else:
        return []
    return clean(found)
