"""cgroups: one interface for v2, v1 and none (placeholder until issue 3)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..plan import Plan


@dataclass
class Stats:
    cpu_time_ms: int = 0
    user_time_ms: int = 0
    kernel_time_ms: int = 0
    max_memory_bytes: int = 0
    io_bytes_read: int = 0
    io_bytes_written: int = 0
    pids_peak: int | None = None
    oom_kills: int = 0
    pids_limit_hit: bool = False
    source: str = "none"

    def as_metrics(self) -> dict[str, Any]:
        return {}


class CgroupRun:
    version = "none"

    def add_pid(self, pid: int) -> None: ...
    def kill(self) -> None: ...
    def cpu_time_ms(self) -> int:
        return 0
    def stats(self) -> Stats:
        return Stats()
    def remove(self) -> None: ...


def create_for_run(plan: Plan, warnings: list[str]) -> CgroupRun | None:
    return None


@dataclass
class Detected:
    version: str = "none"
    controllers: tuple[str, ...] = ()
    fix: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"version": self.version, "controllers": list(self.controllers), "fix": self.fix or None}


def detect() -> Detected:
    return Detected()
