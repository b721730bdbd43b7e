"""The protocol's data: ExecutionRequest (as validated) and ExecutionResponse (as sent).

Pure data, no kernel. A request field left out is `None` here: the profile fills it in
(`capsule.profiles.effective`), so a missing field and a default are never confused.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any


def utc_now() -> str:
    """RFC 3339 UTC with milliseconds, for `timestamps`."""
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass(frozen=True)
class BindMount:
    source: str
    destination: str
    readonly: bool = True


@dataclass(frozen=True)
class FileSpec:
    path: str  # relative to the working directory, no ".."
    content: bytes
    mode: int = 0o644


@dataclass(frozen=True)
class Resources:
    memory_bytes: int | None = None
    cpu_shares: int | None = None
    cpu_quota: float | None = None
    cpu_time_ms: int | None = None
    max_output_bytes: int | None = None
    max_pids: int | None = None
    max_file_bytes: int | None = None
    max_open_files: int | None = None
    tmpfs_bytes: int | None = None


@dataclass(frozen=True)
class Isolation:
    network: bool = False
    readonly_paths: tuple[str, ...] = ()
    writable_paths: tuple[str, ...] = ()
    working_directory: str = "/workspace"
    bind_mounts: tuple[BindMount, ...] = ()
    hostname: str = "capsule"


@dataclass(frozen=True)
class ExecutionRequest:
    command: tuple[str, ...]
    execution_id: str
    environment: dict[str, str] = field(default_factory=dict)
    stdin: bytes | None = None
    timeout_ms: int | None = None
    profile: str | None = None
    resources: Resources = Resources()
    isolation: Isolation = Isolation()
    files: tuple[FileSpec, ...] = ()
    collect: tuple[str, ...] = ()
    session: str | None = None


# Fields of the response in the order the protocol lists them; None values are left out.
RESPONSE_ORDER = (
    "execution_id", "status", "exit_code", "signal", "stdout", "stderr", "stdout_truncated",
    "stderr_truncated", "stdout_bytes", "stderr_bytes", "metrics", "limits_hit", "isolation",
    "files", "warnings", "timestamps", "error",
)


@dataclass
class ExecutionResponse:
    execution_id: str
    status: str
    timestamps: dict[str, str]
    exit_code: int | None = None
    signal: str | None = None
    stdout: str | None = None
    stderr: str | None = None
    stdout_truncated: bool | None = None
    stderr_truncated: bool | None = None
    stdout_bytes: int | None = None
    stderr_bytes: int | None = None
    metrics: dict[str, Any] | None = None
    limits_hit: list[str] | None = None
    isolation: dict[str, Any] | None = None
    files: list[dict[str, Any]] | None = None
    warnings: list[str] | None = None
    error: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        raw = dataclasses.asdict(self)
        return {k: raw[k] for k in RESPONSE_ORDER if raw.get(k) is not None}

    @property
    def cli_exit_status(self) -> int:
        """capsule-run's own exit status, as timeout(1) and env(1) do it (PROTOCOL.md section 1)."""
        if self.status == "success":
            return self.exit_code if self.exit_code is not None else 0
        if self.status == "timeout":
            return 124
        if self.status == "killed":
            signum = (self.error or {}).get("details", {}).get("signum", 9)
            return 128 + int(signum)
        code = (self.error or {}).get("code")
        if code == "E3003":
            return 126 if (self.error or {}).get("details", {}).get("reason") == "not executable" else 127
        return 125
