"""The in-sandbox side: three processes, each a checklist of named steps.

    supervisor (host) ─fork→ A ─unshare(user, mnt, pid, net, ipc, uts, cgroup)
                             A ─fork→ B  = PID 1 of the new PID namespace: root fs, hostname,
                                           lo up; reaps, forwards signals, collects files
                                       B ─fork→ C = the workload: stdio, privileges, files,
                                                    fds, no_new_privs, seccomp, rlimits, exec

Every failure before exec goes down the report pipe (CLOEXEC) as one JSON line
`{"event": "error", "code", "message", "details"}`; C's last line before exec is
`{"event": "ready", ...}` with what /proc/self/status says of it. EOF on that pipe means C
exec'd (or everyone died). B sends `{"event": "exit", "wait_status", "files"}` on the control
socket when C is gone. Nothing here may return into the caller's code: each process ends in
os._exit. Everything used here is imported before the first fork (after pivot_root the host's
Python library is no longer reachable, DESIGN.md section 2).
"""

from __future__ import annotations

import base64
import errno
import json
import os
import re
import resource
import signal
import stat
import traceback
from dataclasses import dataclass
from typing import Any

from . import mounts, network, seccomp, security
from ._libc import sethostname, unshare
from .errors import (
    CapsuleError,
    CommandNotStarted,
    IdMapError,
    InternalError,
    IOFailure,
    NamespaceError,
    NetworkError,
    UnsafePath,
)
from .limits import apply_rlimits_in_child
from .plan import Plan


@dataclass
class ChildFds:
    """The descriptors the children inherit. Python makes new fds non-inheritable (PEP 446)."""

    ctl: int  # control socket, child end
    report_w: int  # report pipe, write end (CLOEXEC)
    stdin_r: int | None  # None: /dev/null inside the sandbox
    stdout_w: int
    stderr_w: int


def _send(fd: int, message: dict[str, Any]) -> None:
    data = (json.dumps(message) + "\n").encode()
    while data:
        data = data[os.write(fd, data):]


def _report_error(fds: ChildFds, exc: BaseException) -> None:
    if isinstance(exc, CapsuleError):
        message = {"event": "error", "code": exc.code, "message": exc.message, "details": exc.details}
    else:
        where = traceback.extract_tb(exc.__traceback__)[-1] if exc.__traceback__ else None
        message = {
            "event": "error", "code": InternalError.code, "message": f"{type(exc).__name__}: {exc}",
            "details": {"stage": "child", "where": f"{where.filename}:{where.lineno}" if where else None},
        }
    try:
        _send(fds.report_w, message)
    except OSError:
        pass


def _read_line(fd: int) -> str:
    buf = b""
    while not buf.endswith(b"\n"):
        chunk = os.read(fd, 64)
        if not chunk:
            break
        buf += chunk
    return buf.decode().strip()


# ------------------------------------------------------------------------------- child A


def sandbox_in_child_a(plan: Plan, fds: ChildFds, supervisor_pid: int, sfilter: seccomp.BuiltFilter | None) -> None:
    """Child A: unshare the namespaces, wait for the id maps, fork B, mirror B's exit."""
    code = 1
    try:
        security.die_with_parent(supervisor_pid)
        os.setsid()  # out of the caller's process group: a ^C to capsule-run is ours to forward
        if _read_line(fds.ctl) != "placed":  # in the cgroup before anything else happens
            raise InternalError("the supervisor went away before the sandbox started", stage="cgroup")
        try:
            # One unshare for all: CLONE_NEWUSER first in the kernel's order, so the others
            # are owned by the new user namespace (user_namespaces(7)).
            unshare(plan.unshare_flags)
        except OSError as exc:
            raise NamespaceError(f"{exc.strerror} ({exc})", stage="unshare", errno=exc.errno) from None
        # The supervisor is not dumpable, and we inherited that: our /proc files would belong
        # to root, and an unprivileged supervisor could not write our id maps (proc(5)).
        security.set_dumpable(True)
        _send(fds.ctl, {"event": "unshared"})
        if _read_line(fds.ctl) != "go":
            raise IdMapError("the supervisor could not write the id maps", stage="idmap")
        security.set_dumpable(False)
        pid_b = os.fork()
        if pid_b == 0:
            init_in_child_b(plan, fds, sfilter)  # never returns
        _send(fds.ctl, {"event": "init", "pid": pid_b})
        _read_line(fds.ctl)  # "ack": B's pid is known (and pinned by a pidfd) upstream
        for fd in (fds.report_w, fds.stdin_r, fds.stdout_w, fds.stderr_w):
            if fd is not None:
                os.close(fd)
        _, status = os.waitpid(pid_b, 0)
        code = os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)
    except BaseException as exc:
        _report_error(fds, exc)
    finally:
        os._exit(code & 0xFF)


# ------------------------------------------------------------------------------- child B


class _Collect:
    """Glob patterns in the working directory: `*` and `?` stay within one path component,
    `**` crosses them. Symlinks are never followed (the walk and the open both refuse them)."""

    def __init__(self, patterns: tuple[str, ...]) -> None:
        self.regexes = [re.compile(self._translate(p)) for p in patterns]

    @staticmethod
    def _translate(pattern: str) -> str:
        out, i = "", 0
        while i < len(pattern):
            if pattern.startswith("**/", i):
                out, i = out + "(?:.*/)?", i + 3
            elif pattern.startswith("**", i):
                out, i = out + ".*", i + 2
            elif pattern[i] == "*":
                out, i = out + "[^/]*", i + 1
            elif pattern[i] == "?":
                out, i = out + "[^/]", i + 1
            else:
                out, i = out + re.escape(pattern[i]), i + 1
        return out + r"\Z"

    def matches(self, relpath: str) -> bool:
        return any(r.match(relpath) for r in self.regexes)


def collect_files_in_child(plan: Plan) -> list[dict[str, Any]]:
    if not plan.collect:
        return []
    matcher = _Collect(plan.collect)
    found: list[str] = []
    for dirpath, dirnames, filenames in os.walk(plan.cwd, followlinks=False):
        dirnames.sort()
        for name in sorted(filenames):
            rel = os.path.relpath(os.path.join(dirpath, name), plan.cwd)
            if matcher.matches(rel):
                found.append(rel)
    budget = plan.max_collect_bytes
    files = []
    for rel in found[: plan.max_collect_files]:
        try:
            fd = os.open(os.path.join(plan.cwd, rel), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            continue  # a symlink (ELOOP) or a vanished file
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                continue
            data = os.read(fd, max(budget, 0)) if budget > 0 else b""
            budget -= len(data)
        finally:
            os.close(fd)
        shown = rel.encode("utf-8", "surrogateescape").decode("utf-8", "replace")  # names need not be UTF-8
        files.append({"path": shown, "size": st.st_size, "content_base64": base64.b64encode(data).decode(),
                      "truncated": len(data) < st.st_size})
    return files


def file_size_reached_in_child(plan: Plan, max_entries: int = 20000) -> bool:
    """Did a write reach RLIMIT_FSIZE? A process that ignores SIGXFSZ (Python does) survives
    with EFBIG, leaving a file of exactly the limit's size: look for one where it can write.
    (A request's own `files` larger than the limit are written before the limit is set.)"""
    limit = plan.limits.max_file_bytes
    if limit is None:
        return False
    seen = 0
    for top in dict.fromkeys((plan.cwd, "/tmp")):
        for dirpath, _dirs, filenames in os.walk(top, followlinks=False):
            for name in filenames:
                seen += 1
                if seen > max_entries:
                    return False
                try:
                    if os.lstat(os.path.join(dirpath, name)).st_size == limit:
                        return True
                except OSError:
                    pass
    return False


def init_in_child_b(plan: Plan, fds: ChildFds, sfilter: seccomp.BuiltFilter | None) -> None:
    """Child B, PID 1 of the sandbox: build the world, start C, reap everything, report."""
    try:
        security.die_with_parent(os.getppid())
        security.set_dumpable(False)
        sethostname(plan.hostname)
        if not plan.share_network:
            try:
                network.loopback_up_in_child()
            except OSError as exc:
                raise NetworkError(f"bringing up lo: {exc.strerror}", stage="network", errno=exc.errno) from None
        mounts.build_root_in_child(plan)

        pid_c = os.fork()
        if pid_c == 0:
            workload_in_child_c(plan, fds, sfilter)  # never returns
        for fd in (fds.report_w, fds.stdin_r, fds.stdout_w, fds.stderr_w):
            if fd is not None:
                os.close(fd)

        # PID 1 gets only the signals it has handlers for (pid_namespaces(7)): forward the
        # polite ones to the command; SIGUSR1 from the supervisor means "stop everything".
        def forward(signum: int, _frame: object) -> None:
            try:
                os.kill(pid_c, signum)
            except ProcessLookupError:
                pass

        def stop_all(_signum: int, _frame: object) -> None:
            try:
                os.kill(-1, signal.SIGKILL)
            except ProcessLookupError:
                pass

        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT):
            signal.signal(sig, forward)
        signal.signal(signal.SIGUSR1, stop_all)

        wait_status = None
        while True:
            try:
                pid, status = os.waitpid(-1, 0)
            except ChildProcessError:
                break
            if pid == pid_c:
                wait_status = status
                # The sandbox lives exactly as long as its command: kill what it left behind.
                stop_all(0, None)
        files = collect_files_in_child(plan)
        _send(fds.ctl, {"event": "exit", "wait_status": wait_status, "files": files,
                        "file_size_hit": file_size_reached_in_child(plan)})
        os._exit(0)
    except BaseException as exc:
        _report_error(fds, exc)
        os._exit(1)


# ------------------------------------------------------------------------------- child C


def _write_request_files_in_child(plan: Plan) -> None:
    for i, spec in enumerate(plan.files):
        path = os.path.join(plan.cwd, spec.path)
        parent = plan.cwd
        for part in spec.path.split("/")[:-1]:
            parent = os.path.join(parent, part)
            if os.path.islink(parent):
                raise UnsafePath(f"files[{i}].path: {part!r} is a symlink", field=f"files[{i}].path")
            if not os.path.isdir(parent):
                os.mkdir(parent, 0o755)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, spec.mode)
        except OSError as exc:
            raise IOFailure(f"files[{i}]: writing {spec.path!r}: {exc.strerror}", stage="files",
                            field=f"files[{i}].path", errno=exc.errno) from None
        try:
            view = memoryview(spec.content)
            while view:
                view = view[os.write(fd, view):]
            os.fchmod(fd, spec.mode)
        except OSError as exc:
            raise IOFailure(f"files[{i}]: writing {spec.path!r}: {exc.strerror}", stage="files",
                            field=f"files[{i}].path", errno=exc.errno) from None
        finally:
            os.close(fd)


def _exec_in_child(plan: Plan, fds: ChildFds) -> None:
    try:
        os.execvpe(plan.argv[0], list(plan.argv), plan.env)
    except OSError as exc:
        not_found = exc.errno in (errno.ENOENT, errno.ENOTDIR)
        raise CommandNotStarted(
            f"{plan.argv[0]!r}: {exc.strerror}", stage="exec", errno=exc.errno,
            reason="not found" if not_found else "not executable",
        ) from None


def workload_in_child_c(plan: Plan, fds: ChildFds, sfilter: seccomp.BuiltFilter | None) -> None:
    """Child C: the workload. Each step narrows what the command may do; seccomp and then the rlimits come last."""
    try:
        security.die_with_parent(1)
        os.setsid()
        # stdio: the request's stdin (or /dev/null), the capture pipes.
        stdin = fds.stdin_r if fds.stdin_r is not None else os.open("/dev/null", os.O_RDONLY)
        os.dup2(stdin, 0)
        os.dup2(fds.stdout_w, 1)
        os.dup2(fds.stderr_w, 2)
        # Privileges: bounding set while CAP_SETPCAP is held, then the user, then the rest.
        security.drop_bounding_set_in_child()
        if os.getuid() != plan.sandbox_uid or os.getgid() != plan.sandbox_gid:
            security.become_sandbox_user_in_child(plan.sandbox_uid, plan.sandbox_gid, not plan.rootless)
        security.clear_capabilities_in_child()
        _write_request_files_in_child(plan)
        os.chdir(plan.cwd)
        # Every fd but stdio closes (before RLIMIT_NOFILE shrinks the range to look at); the
        # report pipe is CLOEXEC and closes at exec.
        keep = sorted({0, 1, 2, fds.report_w, fds.ctl})  # ctl is CLOEXEC: the seccomp listener goes up it
        top = max(resource.getrlimit(resource.RLIMIT_NOFILE)[1], os.sysconf("SC_OPEN_MAX"))
        top = min(top, 1 << 20)
        for low, high in zip(keep, keep[1:] + [top], strict=True):
            os.closerange(low + 1, high)
        # Python ignores SIGPIPE and SIGXFSZ; a child inherits ignored signals across execve.
        for sig in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGUSR1, signal.SIGTERM, signal.SIGINT,
                    signal.SIGHUP, signal.SIGQUIT):
            signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, [])
        security.set_no_new_privs_in_child()
        policy = seccomp.load_in_child(sfilter, fds.ctl)  # from here on, only allowed calls
        facts = security.read_status_facts()
        security.verify_dropped(facts)
        _send(fds.report_w, {"event": "ready", "status": facts, "seccomp": policy})
        # rlimits last: RLIMIT_NOFILE may leave no room for the fds the steps above open
        # (prlimit64 is in every policy).
        apply_rlimits_in_child(plan.rlimits)
        _exec_in_child(plan, fds)
    except BaseException as exc:
        _report_error(fds, exc)
    os._exit(127)
