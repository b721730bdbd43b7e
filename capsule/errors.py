"""Errors as types: each carries its protocol E-code, a status, and a hint that says how to fix it.

Every failure capsule-run can report is one of these classes (PROTOCOL.md section 4). The
supervisor turns them into the `error` object of a response; nothing else decides a code.
"""

from __future__ import annotations

from typing import Any


class CapsuleError(Exception):
    """Base of every reportable failure. `code` is the E-code, `status` the response status."""

    code = "E6003"
    status = "error"
    hint = ""

    def __init__(
        self,
        message: str,
        *,
        hint: str | None = None,
        stage: str | None = None,
        **details: Any,
    ) -> None:
        super().__init__(message)
        self.message = message
        if hint is not None:
            self.hint = hint
        self.details: dict[str, Any] = {k: v for k, v in details.items() if v is not None}
        if stage is not None:
            self.details["stage"] = stage

    def to_dict(self) -> dict[str, Any]:
        details = dict(self.details)
        if self.hint:
            details["hint"] = self.hint
        return {"code": self.code, "message": self.message, "details": details}


# E1xxx: the request or the policy files.
class RequestNotJSON(CapsuleError):
    code = "E1001"
    hint = "send one UTF-8 JSON object on stdin"


class InvalidField(CapsuleError):
    code = "E1002"
    hint = "see the ExecutionRequest table in docs/protocol.md"


class UnsafePath(CapsuleError):
    code = "E1003"
    hint = "use an absolute, normalised path outside the host's secret places"


class UnknownProfile(CapsuleError):
    code = "E1004"
    hint = "`capsule-run profiles` lists the profiles this host knows"


class InvalidConfig(CapsuleError):
    code = "E1005"
    hint = "fix the profile file at the line named in details"


class PolicyViolation(CapsuleError):
    code = "E1006"
    hint = "ask for less, or use a profile that grants it (`capsule-run profiles show NAME`)"


# E2xxx: setting up the sandbox on this host.
class NamespaceError(CapsuleError):
    code = "E2001"
    hint = (
        "enable unprivileged user namespaces: `sysctl -w user.max_user_namespaces=15000`; on "
        "Ubuntu 23.10+ also `sysctl -w kernel.apparmor_restrict_unprivileged_userns=0` (or an "
        "AppArmor profile for capsule-run); on Debian <= 11 `sysctl -w "
        "kernel.unprivileged_userns_clone=1`"
    )


class CgroupError(CapsuleError):
    code = "E2002"
    hint = "run as root, or give capsule-run a delegated cgroup v2 subtree (see `capsule-run check`)"


class SeccompError(CapsuleError):
    code = "E2003"
    hint = "the kernel must have CONFIG_SECCOMP_FILTER and libseccomp2 must be installed"


class FilesystemError(CapsuleError):
    code = "E2004"
    hint = "check that every bound path exists on the host and that the kernel allows pivot_root"


class PrivilegeError(CapsuleError):
    code = "E2005"
    hint = "the kernel must support PR_SET_NO_NEW_PRIVS and capability bounding-set drops"


class IdMapError(CapsuleError):
    code = "E2006"
    hint = (
        "writing /proc/PID/uid_map failed: on Ubuntu 23.10+ AppArmor withholds capabilities from unprivileged "
        "user namespaces (`sysctl -w kernel.apparmor_restrict_unprivileged_userns=0`, or an AppArmor profile "
        "with `userns,` for capsule-run); elsewhere check user.max_user_namespaces and SELinux policy"
    )


class RlimitError(CapsuleError):
    code = "E2007"
    hint = "a hard rlimit can only be lowered: raise the host's limit (ulimit -H) or ask for less"


class NetworkError(CapsuleError):
    code = "E2008"
    hint = "the kernel must support network namespaces (CONFIG_NET_NS)"


class LayerMissing(CapsuleError):
    code = "E2009"
    hint = "run `capsule-run check` for how to enable the layer, or use a profile that degrades"


# E3xxx and up: what happened to the command.
class WallTimeout(CapsuleError):
    code = "E3001"
    status = "timeout"


class CpuTimeout(CapsuleError):
    code = "E3002"
    status = "timeout"


class CommandNotStarted(CapsuleError):
    code = "E3003"
    hint = "command[0] must name an executable inside the sandbox (PATH is /usr/local/bin:/usr/bin:/bin)"


class CommandSignaled(CapsuleError):
    code = "E3004"
    status = "killed"


class MemoryLimit(CapsuleError):
    code = "E4001"
    status = "killed"


class OutputLimit(CapsuleError):
    code = "E4003"
    status = "killed"


class FileSizeLimit(CapsuleError):
    code = "E4004"
    status = "killed"


class SeccompKill(CapsuleError):
    code = "E5001"
    status = "killed"


class CommandRefused(CapsuleError):
    code = "E5002"


class IOFailure(CapsuleError):
    code = "E6001"
    hint = "check that the capsule state and temporary directories exist, are writable and not full"


class MonitorError(CapsuleError):
    code = "E6002"


class InternalError(CapsuleError):
    code = "E6003"
    hint = "this is a bug in capsule-run: please report it with the request"


# The child reports failures as (code, stage, errno, message); this maps a code back to its type.
BY_CODE: dict[str, type[CapsuleError]] = {
    cls.code: cls
    for cls in (
        RequestNotJSON, InvalidField, UnsafePath, UnknownProfile, InvalidConfig, PolicyViolation,
        NamespaceError, CgroupError, SeccompError, FilesystemError, PrivilegeError, IdMapError,
        RlimitError, NetworkError, LayerMissing, WallTimeout, CpuTimeout, CommandNotStarted,
        CommandSignaled, MemoryLimit, OutputLimit, FileSizeLimit, SeccompKill, CommandRefused,
        IOFailure, MonitorError, InternalError,
    )
}
