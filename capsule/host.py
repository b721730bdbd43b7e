"""What this host offers, probed without changing it; `capsule-run check` prints it.

Probes fork a throwaway child to try a namespace for real (a sysctl can say yes while AppArmor
says no), and cache the answer for the life of the process.
"""

from __future__ import annotations

import fcntl
import functools
import os
import shutil
from typing import Any

from . import _libc, cgroups, state
from .errors import IOFailure, LayerMissing, NamespaceError
from .plan import OVERFLOW_UID
from .profiles import Profile, list_profiles, load_profile


@functools.lru_cache(maxsize=1)
def user_namespaces() -> tuple[bool, str]:
    """The whole dance a sandbox needs: a child unshares, we write its id maps, it mounts.
    unshare alone can succeed where the rest fails: Ubuntu 23.10+ lets an unprivileged process
    create a user namespace but AppArmor then withholds its capabilities."""
    flags = _libc.CLONE_NEWUSER | _libc.CLONE_NEWNS | _libc.CLONE_NEWPID | _libc.CLONE_NEWNET
    go_r, go_w = os.pipe()
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(go_w)
        os.close(ready_r)
        try:
            _libc.unshare(flags)
            os.write(ready_w, b"u")
            if os.read(go_r, 1) != b"g":
                os._exit(3)
            _libc.mount(None, "/", None, _libc.MS_REC | _libc.MS_PRIVATE)
            _libc.mount("tmpfs", "/tmp", "tmpfs", 0, "size=4k")
            os._exit(0)
        except OSError as exc:
            os.write(ready_w, b"e" + str(exc).encode()[:400])
            os._exit(1)
    os.close(go_r)
    os.close(ready_w)
    first = os.read(ready_r, 512)
    error = ""
    if first[:1] == b"u":
        try:
            uid, gid = os.geteuid(), os.getegid()
            if uid != 0:
                with open(f"/proc/{pid}/setgroups", "w") as fh:
                    fh.write("deny")
            with open(f"/proc/{pid}/uid_map", "w") as fh:
                fh.write(f"0 {uid} 1\n")
            with open(f"/proc/{pid}/gid_map", "w") as fh:
                fh.write(f"0 {gid} 1\n")
            os.write(go_w, b"g")
        except OSError as exc:
            error = f"writing the id maps: {exc.strerror}"
            os.write(go_w, b"x")
    else:
        error = first[1:].decode(errors="replace") or "the probe died"
    os.close(go_w)
    error = error or os.read(ready_r, 512)[1:].decode(errors="replace")
    os.close(ready_r)
    _, status = os.waitpid(pid, 0)
    ok = os.waitstatus_to_exitcode(status) == 0 and not error
    return ok, "" if ok else (error or "mounting in the new namespace failed")


@functools.lru_cache(maxsize=1)
def seccomp_available() -> bool:
    with open("/proc/self/status") as fh:
        return any(line.startswith("Seccomp:") for line in fh)


def check_layers(profile: Profile) -> list[str]:
    """Fail with E2009 for a missing layer the profile requires; else a warning for each.
    User namespaces are not probed here (a fork per run): without them the sandbox cannot be
    built at all, and its own unshare or id-map step fails closed with E2001/E2006 and a hint."""
    warnings: list[str] = []
    missing = []
    if cgroups.detect().version == "none":
        missing.append(("cgroup", "no usable cgroup (v2 or v1): memory, pids and CPU are limited by rlimits only"))
    if profile.seccomp != "off" and not seccomp_available():
        missing.append(("seccomp", "the kernel has no seccomp filter support"))
    for layer, text in missing:
        if layer in profile.require:
            raise LayerMissing(f"profile {profile.name!r} requires {layer}: {text}", layer=layer,
                               profile=profile.name)
        warnings.append(f"degraded: {text}")
    return warnings


def session_dir_for(name: str, *, rootless: bool) -> str:
    """The session's workspace on the host, owned by the host uid the sandbox user maps to."""
    path = os.path.join(state.sessions_dir(), name)
    try:
        os.makedirs(state.sessions_dir(), mode=0o700, exist_ok=True)
        if not os.path.isdir(path):
            os.mkdir(path, 0o700)
            if not rootless:
                os.chown(path, OVERFLOW_UID, OVERFLOW_UID)
    except OSError as exc:
        raise IOFailure(f"session directory {path}: {exc.strerror}", stage="session", errno=exc.errno) from None
    return path


def list_sessions() -> list[str]:
    try:
        return sorted(e for e in os.listdir(state.sessions_dir()) if not e.endswith(".lock"))
    except FileNotFoundError:
        return []


def remove_session(name: str) -> bool:
    """Delete a session's workspace, unless a run of it holds its lock right now."""
    path = os.path.join(state.sessions_dir(), name)
    if not os.path.isdir(path):
        return False
    try:
        lock = os.open(path + ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise IOFailure(f"session lock {path}.lock: {exc.strerror}", stage="session", errno=exc.errno) from None
    try:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise IOFailure(f"session {name!r} is in use by a running sandbox", stage="session",
                            hint="wait for the run to end, then remove it") from None
        shutil.rmtree(path)
        os.unlink(path + ".lock")
    finally:
        os.close(lock)
    return True


def report(config: str | None = None) -> dict[str, Any]:
    """`capsule-run check`: what this host offers, which profiles can run, how to fix the rest."""
    userns_ok, userns_why = user_namespaces()
    cg = cgroups.detect()
    fixes = []
    if not userns_ok:
        fixes.append(NamespaceError.hint)
    if cg.version == "none":
        fixes.append(cg.fix or "run as root, or get a delegated cgroup v2 subtree")
    # pivot_root and the rest of the setup are probed the only honest way: one real sandbox.
    probe: dict[str, Any] = {"ok": False}
    if userns_ok:
        from .api import execute

        resp = execute({"command": ["true"], "timeout_ms": 10_000}, config=config).to_dict()
        probe = {"ok": resp["status"] == "success" and (resp.get("isolation") or {}).get("root") == "pivot_root",
                 "error": resp.get("error")}
    profiles: dict[str, Any] = {}
    for name in list_profiles(config):
        try:
            prof = load_profile(name, config)
            warnings = check_layers(prof)
            profiles[name] = {"runs": True, "warnings": warnings}
        except Exception as exc:
            profiles[name] = {"runs": False, "error": str(exc), "hint": getattr(exc, "hint", "")}
    return {
        "root": os.geteuid() == 0,
        "kernel": os.uname().release,
        "user_namespaces": {"ok": userns_ok, "error": userns_why or None},
        "pivot_root": probe["ok"],
        "sandbox_probe": probe,
        "seccomp": seccomp_available(),
        "cgroup": cg.as_dict(),
        "state_dir": state.state_dir(),
        "profiles": profiles,
        "fixes": fixes,
    }
