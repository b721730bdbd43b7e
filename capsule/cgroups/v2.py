"""cgroup v2 (the unified hierarchy, Documentation/admin-guide/cgroup-v2.rst).

Limits: memory.max with memory.swap.max=0 (swap is no way around the limit) and
memory.oom.group=1 (an OOM kill takes the whole sandbox, never half of it), pids.max,
cpu.max (quota per 100 ms period), cpu.weight. Figures: cpu.stat, memory.peak, pids.peak,
memory.events (oom_kill), pids.events (max), io.stat. Kill: cgroup.kill (5.14+).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Sequence

from .._libc import write_control_file
from ..plan import Plan
from . import OWN_PIDS, CgroupRun, Detected, Stats, owner_alive, rmdir_retry, run_name

PERIOD_US = 100_000


def _read(path: str) -> str:
    try:
        with open(path) as fh:
            return fh.read()
    except OSError:
        return ""


def _keyed(text: str) -> dict[str, int]:
    out = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if value.strip().isdigit():
            out[key] = int(value)
    return out


def cpu_weight(shares: int) -> int:
    """cpu_shares (v1 scale, default 1024) to cpu.weight (default 100, range 1..10000)."""
    return max(1, min(10000, round(shares * 100 / 1024)))


def _enable_controllers(parent: str, wanted: Sequence[str]) -> None:
    available = set(_read(os.path.join(parent, "cgroup.controllers")).split())
    enabled = set(_read(os.path.join(parent, "cgroup.subtree_control")).split())
    missing = [c for c in wanted if c in available and c not in enabled]
    if missing:
        write_control_file(os.path.join(parent, "cgroup.subtree_control"), " ".join("+" + c for c in missing))


class V2Run(CgroupRun):
    version = "v2"

    def __init__(self, path: str) -> None:
        self.path = path
        self.where = path

    @classmethod
    def create(cls, found: Detected, plan: Plan) -> V2Run:
        base = found.base
        wanted = [c for c in ("memory", "pids", "cpu", "io") if c in found.controllers]
        if not os.path.isdir(base):
            os.makedirs(base, exist_ok=True)
        _enable_controllers(os.path.dirname(base), wanted)
        _enable_controllers(base, wanted)
        _clean(base)
        path = os.path.join(base, run_name())
        os.mkdir(path)
        run = cls(path)
        try:
            lim = plan.limits
            write_control_file(f"{path}/memory.max", str(lim.memory_bytes))
            if os.path.exists(f"{path}/memory.swap.max"):
                write_control_file(f"{path}/memory.swap.max", "0")
            write_control_file(f"{path}/memory.oom.group", "1")
            write_control_file(f"{path}/pids.max", str(lim.max_pids + OWN_PIDS))
            quota = "max" if lim.cpu_quota is None else str(max(1000, int(lim.cpu_quota * PERIOD_US)))
            write_control_file(f"{path}/cpu.max", f"{quota} {PERIOD_US}")
            write_control_file(f"{path}/cpu.weight", str(cpu_weight(lim.cpu_shares)))
        except BaseException:
            run.remove()
            raise
        return run

    def add_pid(self, pid: int) -> None:
        write_control_file(f"{self.path}/cgroup.procs", str(pid))

    def cpu_time_ms(self) -> int:
        return _keyed(_read(f"{self.path}/cpu.stat")).get("usage_usec", 0) // 1000

    def kill(self) -> None:
        try:
            write_control_file(f"{self.path}/cgroup.kill", "1")
        except OSError:
            for pid in _read(f"{self.path}/cgroup.procs").split():  # kernels before 5.14
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def stats(self) -> Stats:
        cpu = _keyed(_read(f"{self.path}/cpu.stat"))
        events = _keyed(_read(f"{self.path}/memory.events"))
        pids_events = _keyed(_read(f"{self.path}/pids.events"))
        rbytes = wbytes = 0
        for line in _read(f"{self.path}/io.stat").splitlines():
            fields = dict(f.split("=", 1) for f in line.split()[1:] if "=" in f)
            rbytes += int(fields.get("rbytes", 0))
            wbytes += int(fields.get("wbytes", 0))
        peak = _read(f"{self.path}/memory.peak").strip()
        pids_peak = _read(f"{self.path}/pids.peak").strip()
        return Stats(
            source="cgroup-v2",
            cpu_time_ms=cpu.get("usage_usec", 0) // 1000,
            user_time_ms=cpu.get("user_usec", 0) // 1000,
            kernel_time_ms=cpu.get("system_usec", 0) // 1000,
            max_memory_bytes=int(peak) if peak.isdigit() else 0,
            io_bytes_read=rbytes, io_bytes_written=wbytes,
            pids_peak=max(0, int(pids_peak) - OWN_PIDS) if pids_peak.isdigit() else None,
            oom_kills=events.get("oom_kill", 0),
            pids_limit_hit=pids_events.get("max", 0) > 0,
            memory_limit_hit=events.get("max", 0) > 0 or events.get("oom_kill", 0) > 0,
        )

    def remove(self) -> None:
        self.kill()
        rmdir_retry(self.path)


def _clean(base: str) -> list[str]:
    removed: list[str] = []
    try:
        entries = os.listdir(base)
    except OSError:
        return removed
    for name in entries:
        path = os.path.join(base, name)
        if name.startswith("run-") and os.path.isdir(path) and not owner_alive(name, path):
            try:
                V2Run(path).remove()
                removed.append(path)
            except OSError:
                pass
    return removed


def clean_leftovers(found: Detected) -> list[str]:
    return _clean(found.base)
