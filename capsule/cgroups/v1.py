"""cgroup v1 (one hierarchy per controller), through cgroupspy's typed controller files.

cgroupspy knows memory, cpu and cpuacct; it has no pids or freezer controller, so two small
Controller subclasses add them. Facts of v1 that matter (DESIGN.md section 3): the OOM signal
is the `oom_kill` counter of memory.oom_control (memory.failcnt counts reclaim, not kills);
pids.max resets with the string "max"; the first attach of a process costs ~10 ms.
"""

from __future__ import annotations

import os
import signal
import time
from types import SimpleNamespace

from cgroupspy.controllers import Controller, CpuAcctController, CpuController, MemoryController
from cgroupspy.interfaces import BaseFileInterface, DictFile, IntegerFile, MultiLineIntegerFile
from cgroupspy.nodes import Node

from ..plan import Plan
from . import OWN_PIDS, CgroupRun, Detected, Stats, owner_alive, rmdir_retry, run_name

PERIOD_US = 100_000
USER_HZ = os.sysconf("SC_CLK_TCK")


class MaxOrIntegerFile(BaseFileInterface):
    """pids.max: an integer, or "max" for no limit (None here)."""

    def sanitize_get(self, value: str) -> int | None:
        return None if value == "max" else int(value)

    def sanitize_set(self, value: int | None) -> str:
        return "max" if value is None else str(int(value))


class PidsController(Controller):
    max = MaxOrIntegerFile("pids.max")
    current = IntegerFile("pids.current", readonly=True)
    events = DictFile("pids.events", readonly=True)


class FreezerController(Controller):
    state = BaseFileInterface("freezer.state")


# Registering them lets cgroupspy's own tree code know these hierarchies too.
Node.CONTROLLERS.setdefault(b"pids", PidsController)
Node.CONTROLLERS.setdefault(b"freezer", FreezerController)

CONTROLLER_TYPES: dict[str, type[Controller]] = {
    "memory": MemoryController, "cpu": CpuController, "cpuacct": CpuAcctController,
    "pids": PidsController, "freezer": FreezerController,
}


def _controller(name: str, path: str) -> Controller:
    # cgroupspy's controllers need only `node.full_path`. Its Node keeps names as bytes, which
    # its interfaces' file names are bytes too; trees.Tree() would walk every hierarchy: a plain
    # object with the run's path (as bytes) avoids that.
    return CONTROLLER_TYPES[name](SimpleNamespace(full_path=path.encode()))


class V1Run(CgroupRun):
    version = "v1"

    def __init__(self, paths: dict[str, str]) -> None:
        self.paths = paths  # controller -> this run's directory in that hierarchy
        self.ctl = {name: _controller(name, path) for name, path in paths.items() if name in CONTROLLER_TYPES}
        first = next(iter(paths.values()), "")
        self.where = f"v1 {','.join(paths)} {os.path.basename(first)}"

    @classmethod
    def create(cls, found: Detected, plan: Plan) -> V1Run:
        clean_leftovers(found)
        name = run_name()
        paths: dict[str, str] = {}
        run = cls({})
        try:
            for ctrl in ("memory", "pids", "cpu", "cpuacct", "freezer", "blkio"):
                root = found.v1_roots.get(ctrl)
                if root is None:
                    continue
                parent = os.path.join(root, "capsule")
                os.makedirs(parent, exist_ok=True)
                path = paths.setdefault(ctrl, os.path.join(parent, name))
                if not os.path.isdir(path):  # cpu and cpuacct may share one hierarchy
                    os.mkdir(path)
            run = cls(paths)
            lim = plan.limits
            mem = run.ctl["memory"]
            mem.limit_in_bytes = lim.memory_bytes
            if os.path.exists(mem.filepath(b"memory.memsw.limit_in_bytes")):
                mem.memsw_limit_in_bytes = lim.memory_bytes
            run.ctl["pids"].max = lim.max_pids + OWN_PIDS
            cpu = run.ctl["cpu"]
            cpu.cfs_period_us = PERIOD_US
            cpu.cfs_quota_us = -1 if lim.cpu_quota is None else max(1000, int(lim.cpu_quota * PERIOD_US))
            cpu.shares = max(2, lim.cpu_shares)
        except OSError:
            run.remove()
            raise
        return run

    def add_pid(self, pid: int) -> None:
        for path in dict.fromkeys(self.paths.values()):  # cpu and cpuacct may share a directory
            with open(os.path.join(path, "cgroup.procs"), "w") as fh:
                fh.write(str(pid))

    def cpu_time_ms(self) -> int:
        return int(self.ctl["cpuacct"].get_property(b"cpuacct.usage")) // 1_000_000

    def _procs(self) -> list[int]:
        pids: set[int] = set()
        for ctl in self.ctl.values():
            try:
                pids.update(MultiLineIntegerFile("cgroup.procs").sanitize_get(ctl.get_property(b"cgroup.procs")))
            except (OSError, ValueError):
                pass
        return sorted(pids)

    def kill(self) -> None:
        """Freeze, SIGKILL every member, thaw: nothing can fork away in between."""
        freezer = self.ctl.get("freezer")
        try:
            if freezer is not None:
                freezer.set_property(b"freezer.state", "FROZEN")
            for pid in self._procs():
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        except OSError:
            pass
        finally:
            if freezer is not None:
                try:
                    freezer.set_property(b"freezer.state", "THAWED")
                except OSError:
                    pass

    def stats(self) -> Stats:
        mem = self.ctl["memory"]
        acct = self.ctl["cpuacct"]
        ticks = {k: int(v) for k, v in (line.split() for line in acct.get_property(b"cpuacct.stat").splitlines())}
        oom = dict(line.split() for line in mem.get_property(b"memory.oom_control").splitlines())
        events = dict(line.split() for line in self.ctl["pids"].get_property(b"pids.events").splitlines())
        io = {"Read": 0, "Write": 0}
        blkio = self.paths.get("blkio")
        if blkio is not None:  # "MAJ:MIN Read N" lines, throttle layer: counted for every device
            try:
                with open(os.path.join(blkio, "blkio.throttle.io_service_bytes_recursive")) as fh:
                    for line in fh:
                        parts = line.split()
                        if len(parts) == 3 and parts[1] in io:
                            io[parts[1]] += int(parts[2])
            except OSError:
                pass
        pids_peak = None
        if os.path.exists(self.ctl["pids"].filepath(b"pids.peak")):
            pids_peak = max(0, int(self.ctl["pids"].get_property(b"pids.peak")) - OWN_PIDS)
        return Stats(
            source="cgroup-v1",
            cpu_time_ms=int(acct.get_property(b"cpuacct.usage")) // 1_000_000,
            user_time_ms=ticks.get("user", 0) * 1000 // USER_HZ,
            kernel_time_ms=ticks.get("system", 0) * 1000 // USER_HZ,
            max_memory_bytes=int(mem.get_property(b"memory.max_usage_in_bytes")),
            io_bytes_read=io["Read"], io_bytes_written=io["Write"],
            pids_peak=pids_peak,
            oom_kills=int(oom.get("oom_kill", 0)),
            pids_limit_hit=int(events.get("max", 0)) > 0,
            # failcnt counts the times usage hit the limit (and reclaim ran), not OOM kills.
            memory_limit_hit=int(mem.get_property(b"memory.failcnt")) > 0,
        )

    def remove(self) -> None:
        for _ in range(3):
            if not self._procs():
                break
            self.kill()
            time.sleep(0.01)
        for path in dict.fromkeys(self.paths.values()):
            rmdir_retry(path)


def clean_leftovers(found: Detected) -> list[str]:
    names: set[str] = set()
    for root in found.v1_roots.values():
        try:
            names.update(n for n in os.listdir(os.path.join(root, "capsule")) if n.startswith("run-"))
        except OSError:
            pass
    removed = []
    for name in sorted(names):
        first = next((os.path.join(r, "capsule", name) for r in found.v1_roots.values()
                      if os.path.isdir(os.path.join(r, "capsule", name))), None)
        if first is None or owner_alive(name, first):
            continue
        paths = {c: os.path.join(r, "capsule", name) for c, r in found.v1_roots.items()
                 if os.path.isdir(os.path.join(r, "capsule", name))}
        try:
            V1Run(paths).remove()
            removed.append(name)
        except OSError:
            pass
    return removed
