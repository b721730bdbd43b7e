"""The parent side of one run: fork, place, map, watch, stop, collect, classify.

    1. session lock, cgroup with its limits (created and written before anything runs in it)
    2. pipes, control socket; flush stdio; fork child A (capsule.child)
    3. A placed in the cgroup -> A unshares -> uid/gid maps written from here -> A forks B
       (PID 1), whose pid is pinned with a pidfd so a kill can never hit a recycled pid
    4. one select loop until the sandbox is gone: stdout/stderr with per-stream caps, stdin,
       the report pipe (EOF = exec), the control socket (B's exit report), the wall-clock
       deadline on a monotonic clock and the cgroup's CPU time
    5. stop = SIGUSR1 to B (it kills every process, collects files and reports), SIGKILL to B
       and cgroup.kill after a grace; reap A with wait4 (rusage)
    6. figures read from the cgroup BEFORE it is removed; the ending classified
No thread is ever started here: unshare(CLONE_NEWUSER) refuses a multi-threaded caller, and the
long-lived `batch` process forks for every run.
"""

from __future__ import annotations

import codecs
import errno
import fcntl
import json
import logging
import os
import resource
import select
import selectors
import signal
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import prctl

from . import _libc, cgroups, child, seccomp, state
from .errors import (
    BY_CODE,
    CapsuleError,
    CommandSignaled,
    CpuTimeout,
    FileSizeLimit,
    IdMapError,
    InternalError,
    IOFailure,
    MemoryLimit,
    OutputLimit,
    SeccompKill,
    WallTimeout,
)
from .models import ExecutionResponse, utc_now
from .plan import Plan

EventSink = Callable[[dict[str, Any]], None]
log = logging.getLogger("capsule")

SETUP_TIMEOUT_S = 15.0  # unshare, maps, mounts, files: far less in practice
STOP_GRACE_S = 2.0  # from "stop" (SIGUSR1 to B) to SIGKILL
POLL_S = 0.05  # how often the cgroup's CPU time and memory events are read while running


@dataclass
class _Stream:
    name: str
    cap: int
    data: bytearray = field(default_factory=bytearray)
    total: int = 0
    eof: bool = False
    decoder: Any = field(default_factory=lambda: codecs.getincrementaldecoder("utf-8")("replace"))

    def feed(self, chunk: bytes) -> bool:
        """Keep the head up to the cap; True when the cap is passed."""
        self.total += len(chunk)
        room = self.cap - len(self.data)
        if room > 0:
            self.data += chunk[:room]
        return self.total > self.cap

    @property
    def truncated(self) -> bool:
        return self.total > len(self.data)


class Run:
    def __init__(self, plan: Plan, *, started: str, t0: float, on_event: EventSink | None = None,
                 warnings: list[str] | None = None) -> None:
        self.plan = plan
        self.started = started
        self.t0 = t0
        self.on_event = on_event
        self.warnings = list(warnings or [])
        self.limits_hit: list[str] = []
        self.stop_reason: str | None = None
        self.ready: dict[str, Any] | None = None
        self.setup_error: CapsuleError | None = None
        self.exit_report: dict[str, Any] | None = None
        self.exec_at: float | None = None
        self.ended_at: float | None = None
        self.pid_a = 0
        self.pidfd_b: int | None = None
        self.cgroup: cgroups.CgroupRun | None = None
        self.listener: int | None = None  # the seccomp user-notification fd, once C sends it
        self.violations: list[seccomp.Violation] = []  # the first few, for the error details
        self.denied: dict[str, int] = {}  # every denied call, counted by name
        self.stdin_w: int | None = None

    # ------------------------------------------------------------------ lifecycle
    def execute(self) -> ExecutionResponse:
        lock_fd = self._lock_session() if self.plan.session else None
        # Not dumpable while we hold the sandbox's pipes and listener: no same-uid process
        # (a rootless sandbox's user is ours) may ptrace us or open our /proc fds (proc(5)).
        was_dumpable = prctl.get_dumpable()
        prctl.set_dumpable(False)
        try:
            self.cgroup = cgroups.create_for_run(self.plan, self.warnings)
            log.info("%s: profile %s, cgroup %s, seccomp %s, %s", self.plan.execution_id, self.plan.profile,
                     self.cgroup.where if self.cgroup else "none",
                     self.plan.seccomp, "rootless" if self.plan.rootless else "as root")
            try:
                self._fork_and_supervise()
            except CapsuleError as exc:  # setup broke before the loop; classified with the rest
                self.setup_error = self.setup_error or exc
            finally:
                stats = self._cgroup_stats_and_remove()
            return self._respond(stats)
        finally:
            prctl.set_dumpable(was_dumpable)
            if lock_fd is not None:
                os.close(lock_fd)

    def _cgroup_stats_and_remove(self) -> cgroups.Stats | None:
        """Figures first (they vanish with the group), then the group. Neither failure may
        cost the caller the response: say it in `warnings` instead."""
        if self.cgroup is None:
            return None
        stats = None
        try:
            stats = self.cgroup.stats()
        except (OSError, ValueError) as exc:
            self.warnings.append(f"cgroup figures unreadable ({exc}); metrics fall back to rusage")
        try:
            self.cgroup.remove()
        except OSError as exc:
            self.warnings.append(f"cgroup not removed ({exc}); `capsule-run check --clean` collects it")
        return stats

    def _lock_session(self) -> int:
        """Two runs of one session never run at once: the second waits, up to its timeout."""
        path = os.path.join(state.sessions_dir(), f"{self.plan.session}.lock")
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise IOFailure(f"session lock {path}: {exc.strerror}", stage="session", errno=exc.errno) from None
        deadline = time.monotonic() + self.plan.limits.timeout_ms / 1000
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return fd
            except BlockingIOError:
                if time.monotonic() > deadline:
                    os.close(fd)
                    raise WallTimeout(f"session {self.plan.session!r} stayed busy for the whole timeout",
                                      timeout_ms=self.plan.limits.timeout_ms, session=self.plan.session) from None
                time.sleep(0.02)

    def _fork_and_supervise(self) -> None:
        plan = self.plan
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        rep_r, rep_w = os.pipe()
        in_r, in_w = os.pipe() if plan.stdin is not None else (None, None)
        ctl_parent, ctl_child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        fds = child.ChildFds(ctl=ctl_child.fileno(), report_w=rep_w, stdin_r=in_r, stdout_w=out_w, stderr_w=err_w)
        sfilter = seccomp.build_in_parent(plan.seccomp, plan.seccomp_add, plan.seccomp_remove)
        sys.stdout.flush()
        sys.stderr.flush()
        supervisor_pid = os.getpid()
        pid = os.fork()
        if pid == 0:
            ctl_parent.close()
            for fd in (out_r, err_r, rep_r, in_w):
                if fd is not None:
                    os.close(fd)
            child.sandbox_in_child_a(plan, fds, supervisor_pid, sfilter)  # never returns
        self.pid_a = pid
        ctl_child.close()
        for fd in (out_w, err_w, rep_w, in_r):
            if fd is not None:
                os.close(fd)
        ctl = ctl_parent
        self.stdin_w = in_w  # _loop closes it once everything is written; None from then on
        try:
            self._handshake(ctl, rep_r)
            self._loop(ctl, out_r, err_r, rep_r)
        finally:
            self._kill_hard()
            _, _status, usage = os.wait4(self.pid_a, 0)
            self.rusage = usage
            self.ended_at = self.ended_at or time.monotonic()
            ctl.close()
            for fd in (out_r, err_r, rep_r, self.stdin_w):
                if fd is not None:
                    os.close(fd)
            if self.pidfd_b is not None:
                os.close(self.pidfd_b)
            if self.listener is not None:
                os.close(self.listener)

    # ------------------------------------------------------------------ setup
    def _read_ctl(self, ctl: socket.socket, rep_r: int) -> dict[str, Any] | None:
        """One message from A during setup; None if A died (its report then says why)."""
        ctl.settimeout(SETUP_TIMEOUT_S)
        buf = b""
        try:
            while not buf.endswith(b"\n"):
                chunk = ctl.recv(1)
                if not chunk:
                    return None
                buf += chunk
        except ConnectionResetError:
            return None
        except TimeoutError:
            raise InternalError("the sandbox did not answer during setup", stage="setup") from None
        return dict(json.loads(buf))

    def _setup_failed(self, rep_r: int) -> CapsuleError:
        self._kill_hard()  # A (and B) may still be alive; the report pipe closes when they die
        os.set_blocking(rep_r, True)
        for line in _read_all(rep_r).splitlines():
            self._on_report_line(line)
        return self.setup_error or InternalError("the sandbox exited during setup without a report", stage="setup")

    def _handshake(self, ctl: socket.socket, rep_r: int) -> None:
        if self.cgroup is not None:
            self.cgroup.add_pid(self.pid_a)  # before A unshares: the cgroup namespace roots here
        ctl.sendall(b"placed\n")
        if (msg := self._read_ctl(ctl, rep_r)) is None or msg.get("event") != "unshared":
            raise self._setup_failed(rep_r)
        try:
            self._write_id_maps()
        except OSError as exc:
            ctl.sendall(b"abort\n")
            raise IdMapError(f"{exc.strerror} ({exc.filename})", stage="idmap", errno=exc.errno) from None
        ctl.sendall(b"go\n")
        if (msg := self._read_ctl(ctl, rep_r)) is None or msg.get("event") != "init":
            raise self._setup_failed(rep_r)
        # A has not reaped B (it waits for our ack), so this pid is still B's.
        self.pidfd_b = os.pidfd_open(int(msg["pid"]))
        ctl.sendall(b"ack\n")

    def _write_id_maps(self) -> None:
        """user_namespaces(7): an unprivileged writer must deny setgroups before gid_map, and may
        map only its own ids; as root we map 0 and the sandbox user (see plan._id_map)."""
        proc = f"/proc/{self.pid_a}"
        if self.plan.rootless:
            _libc.write_control_file(f"{proc}/setgroups", "deny")
        _libc.write_control_file(f"{proc}/uid_map", self.plan.uid_map)
        _libc.write_control_file(f"{proc}/gid_map", self.plan.gid_map)

    # ------------------------------------------------------------------ running
    def _loop(self, ctl: socket.socket, out_r: int, err_r: int, rep_r: int) -> None:
        plan = self.plan
        streams = {out_r: _Stream("stdout", plan.limits.max_output_bytes),
                   err_r: _Stream("stderr", plan.limits.max_output_bytes)}
        self.streams = streams
        sel = selectors.DefaultSelector()
        for fd in (out_r, err_r, rep_r):
            os.set_blocking(fd, False)
            sel.register(fd, selectors.EVENT_READ)
        ctl.setblocking(False)
        sel.register(ctl, selectors.EVENT_READ)
        stdin_view = memoryview(plan.stdin or b"")
        if self.stdin_w is not None:
            os.set_blocking(self.stdin_w, False)
            sel.register(self.stdin_w, selectors.EVENT_WRITE)
        ctl_buf = b""
        ctl_eof = report_eof = False
        hard_kill_at: float | None = None
        drain_deadline: float | None = None
        timeout_s = plan.limits.timeout_ms / 1000
        setup_deadline = time.monotonic() + SETUP_TIMEOUT_S

        while True:
            now = time.monotonic()
            deadline = setup_deadline if self.exec_at is None else self.exec_at + timeout_s
            wake = [deadline - now, POLL_S if self.cgroup is not None else 0.5]
            if hard_kill_at is not None:
                wake.append(hard_kill_at - now)
            for key, _ in sel.select(max(min(wake), 0)):
                fd = key.fd
                if fd in streams:
                    stream = streams[fd]
                    try:
                        chunk = os.read(fd, 65536)
                    except BlockingIOError:
                        continue
                    if not chunk:
                        stream.eof = True
                        sel.unregister(fd)
                        continue
                    self._mark_started()  # output means exec happened, even before we saw the report's EOF
                    if stream.feed(chunk) and "output" not in self.limits_hit:
                        self.limits_hit.append("output")
                        self._stop("output")
                    if self.on_event is not None:
                        self.on_event({"event": stream.name, "data": stream.decoder.decode(chunk)})
                elif fd == rep_r:
                    chunk = os.read(fd, 65536)
                    if chunk:
                        for line in chunk.splitlines():
                            self._on_report_line(line)
                        continue
                    report_eof = True
                    sel.unregister(fd)
                    if self.setup_error is None and self.ready is not None:
                        self._mark_started()
                elif fd == self.listener:
                    self._on_seccomp_notification(sel)
                elif fd == ctl.fileno():
                    try:
                        chunk, passed, _, _ = socket.recv_fds(ctl, 1 << 20, 1)
                    except BlockingIOError:
                        continue
                    except ConnectionResetError:  # the peer died with our bytes unread (OOM)
                        chunk, passed = b"", []
                    for extra in passed:  # only C sends one: its seccomp listener
                        if self.listener is None:
                            self.listener = extra
                            sel.register(extra, selectors.EVENT_READ)
                        else:
                            os.close(extra)
                    if not chunk:
                        ctl_eof = True
                        sel.unregister(ctl)
                        continue
                    ctl_buf += chunk
                    while b"\n" in ctl_buf:
                        line, ctl_buf = ctl_buf.split(b"\n", 1)
                        msg = json.loads(line)
                        if msg.get("event") == "exit":
                            self.exit_report = msg
                            self.ended_at = time.monotonic()
                elif fd == self.stdin_w:
                    try:
                        stdin_view = stdin_view[os.write(fd, stdin_view[:65536]):]
                    except BlockingIOError:
                        continue
                    except OSError:  # EPIPE: the command closed its stdin
                        stdin_view = memoryview(b"")
                    if not stdin_view:
                        sel.unregister(fd)
                        os.close(fd)
                        self.stdin_w = None

            now = time.monotonic()
            if self.setup_error is not None and report_eof and self.stop_reason is None:
                self._stop("setup")
            if self.stop_reason is None and now >= deadline:
                if self.exec_at is not None:
                    self.limits_hit.append("wall_time")
                self._stop("wall_time" if self.exec_at is not None else "setup_time")
            if self.cgroup is not None and self.stop_reason is None and self.exec_at is not None:
                cpu_limit = plan.limits.cpu_time_ms
                if cpu_limit is not None and self.cgroup.cpu_time_ms() > cpu_limit:
                    self.limits_hit.append("cpu_time")
                    self._stop("cpu_time")
            if self.stop_reason is not None and hard_kill_at is None:
                hard_kill_at = now + STOP_GRACE_S
            if hard_kill_at is not None and now >= hard_kill_at:
                self._kill_hard()
            gone = self.exit_report is not None or ctl_eof
            if gone and drain_deadline is None:
                drain_deadline = now + STOP_GRACE_S
                self.ended_at = self.ended_at or now
            if gone and all(s.eof for s in streams.values()) and (report_eof or self.exit_report):
                break
            if drain_deadline is not None and now >= drain_deadline:
                break  # every process of the sandbox is gone; a pipe still open is not ours
        sel.close()

    def _on_report_line(self, line: bytes) -> None:
        if not line.strip():
            return
        msg = json.loads(line)
        if msg.get("event") == "ready":
            self.ready = msg
        elif msg.get("event") == "error" and self.setup_error is None:
            cls = BY_CODE.get(msg.get("code", ""), InternalError)
            details = dict(msg.get("details") or {})
            err = cls(msg.get("message", "setup failed"), **details)
            self.setup_error = err

    def _mark_started(self) -> None:
        if self.exec_at is None:
            self.exec_at = time.monotonic()
            if self.on_event is not None:
                self.on_event({"event": "started", "execution_id": self.plan.execution_id})

    def _on_seccomp_notification(self, sel: selectors.BaseSelector) -> None:
        """A denied call is waiting in the kernel for our answer (seccomp_unotify(2))."""
        assert self.listener is not None
        poller = select.poll()
        poller.register(self.listener, select.POLLIN)
        revents = dict(poller.poll(0)).get(self.listener, 0)
        if not revents & select.POLLIN:  # POLLHUP: no task uses the filter any more
            sel.unregister(self.listener)
            return
        violation = seccomp.receive_from_parent(self.listener)  # answers EPERM
        if violation is None:
            return
        if len(self.violations) < 16:
            self.violations.append(violation)
        self.denied[violation.syscall] = self.denied.get(violation.syscall, 0) + 1
        if "seccomp" not in self.limits_hit:
            self.limits_hit.append("seccomp")
        if self.plan.seccomp_action == "kill":
            try:
                os.kill(violation.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self._stop("seccomp")

    def _stop(self, reason: str) -> None:
        """Ask B to kill every process and report (it still collects files)."""
        if self.stop_reason is not None:
            return
        self.stop_reason = reason
        if self.pidfd_b is not None:
            try:
                signal.pidfd_send_signal(self.pidfd_b, signal.SIGUSR1)
            except ProcessLookupError:
                pass

    def _kill_hard(self) -> None:
        if self.cgroup is not None:
            self.cgroup.kill()
        if self.pidfd_b is not None:
            try:
                signal.pidfd_send_signal(self.pidfd_b, signal.SIGKILL)
            except ProcessLookupError:
                pass
        elif self.pid_a:
            try:
                os.kill(self.pid_a, signal.SIGKILL)  # not reaped yet: the pid is still A's
            except ProcessLookupError:
                pass

    # ------------------------------------------------------------------ response
    def _metrics(self, stats: cgroups.Stats | None) -> dict[str, Any]:
        end = self.ended_at or time.monotonic()
        usage: resource.struct_rusage = self.rusage
        exec_at = self.exec_at or end
        metrics: dict[str, Any] = {
            "wall_time_ms": int((end - exec_at) * 1000),
            "cpu_time_ms": int((usage.ru_utime + usage.ru_stime) * 1000),
            "user_time_ms": int(usage.ru_utime * 1000),
            "kernel_time_ms": int(usage.ru_stime * 1000),
            "max_memory_bytes": usage.ru_maxrss * 1024,
            "io_bytes_read": usage.ru_inblock * 512,
            "io_bytes_written": usage.ru_oublock * 512,
            "pids_peak": None,
            "oom_kills": None,
            "setup_time_ms": int((exec_at - self.t0) * 1000),
            "source": "rusage",
        }
        if stats is not None:
            metrics.update(stats.as_metrics())
        return metrics

    def _classify(self, stats: cgroups.Stats | None) -> tuple[str, CapsuleError | None, int | None, str | None]:
        """(status, error, exit_code, signal name) of this run."""
        timeout_ms = self.plan.limits.timeout_ms
        elapsed_ms = int(((self.ended_at or time.monotonic()) - (self.exec_at or self.t0)) * 1000)
        if stats is not None and stats.oom_kills and self.exec_at is None:
            # An OOM kill during setup explains whatever broken setup report came with it.
            return self._oom(stats, " before the command started (the sandbox's own init needs a few MB of the limit)")
        if self.setup_error is not None:
            return "error", self.setup_error, None, None
        if self.stop_reason == "setup_time":
            return "error", InternalError(f"the sandbox's setup did not finish within {SETUP_TIMEOUT_S:.0f} s",
                                          stage="setup"), None, None
        if self.stop_reason == "wall_time":
            return "timeout", WallTimeout(f"the command ran past its {timeout_ms} ms timeout",
                                          timeout_ms=timeout_ms, elapsed_ms=elapsed_ms), None, None
        if self.stop_reason == "cpu_time":
            limit = self.plan.limits.cpu_time_ms
            return "timeout", CpuTimeout(f"the sandbox used more than {limit} ms of CPU time",
                                         cpu_time_ms=limit), None, None
        if self.stop_reason == "seccomp" and self.violations:
            first = self.violations[0]
            return "killed", SeccompKill(
                f"the command called {first.syscall}, which the {self.plan.seccomp!r} seccomp policy forbids; "
                "the sandbox was stopped", syscall=first.syscall, syscall_nr=first.nr, signum=int(signal.SIGSYS),
            ), None, "SIGSYS"
        if self.stop_reason == "output":
            cap = self.plan.limits.max_output_bytes
            return "killed", OutputLimit(f"output passed max_output_bytes ({cap}) and the command was stopped",
                                         max_output_bytes=cap, signum=9), None, "SIGKILL"
        if stats is not None and stats.oom_kills:
            return self._oom(stats, " and was killed")
        status = (self.exit_report or {}).get("wait_status")
        if status is None:
            return "error", InternalError("the sandbox's init ended without reporting the command's status",
                                          stage="supervise"), None, None
        if os.WIFEXITED(status):
            return "success", None, os.WEXITSTATUS(status), None
        signum = os.WTERMSIG(status)
        name = signal.Signals(signum).name if signum in signal.Signals.__members__.values() else f"SIG{signum}"
        if signum == signal.SIGXCPU or (signum == signal.SIGKILL and self.cgroup is None
                                          and plan_cpu_limited(self.plan, self.rusage)):
            self.limits_hit.append("cpu_time")
            limit = self.plan.limits.cpu_time_ms
            return "timeout", CpuTimeout(f"the command used more than {limit} ms of CPU time (RLIMIT_CPU)",
                                         cpu_time_ms=limit), None, None
        if signum == signal.SIGXFSZ:
            self.limits_hit.append("file_size")
            return "killed", FileSizeLimit(f"the command wrote past max_file_bytes ({self.plan.limits.max_file_bytes})",
                                           max_file_bytes=self.plan.limits.max_file_bytes, signum=signum), None, name
        if signum == signal.SIGSYS and self.ready and self.ready.get("seccomp", "off") != "off":
            # Only the filter's bad-architecture action kills by itself; every other denial
            # comes through the listener and is named there.
            self.limits_hit.append("seccomp")
            return "killed", SeccompKill("the command made a system call of a non-native ABI (i386 int 0x80 or "
                                         "x32), which the filter kills outright", signum=signum, syscall=None,
                                         syscall_unknown="non-native ABI: the kernel kills before any report"), None, name
        return "killed", CommandSignaled(f"the command died of {name}", signal=name, signum=signum), None, name

    def _oom(self, stats: cgroups.Stats, when: str) -> tuple[str, CapsuleError | None, int | None, str | None]:
        self.limits_hit.append("memory")
        limit = self.plan.limits.memory_bytes
        return "killed", MemoryLimit(f"the sandbox ran out of its {limit} bytes of memory{when}", memory_bytes=limit,
                                     max_memory_bytes=stats.max_memory_bytes, signum=9), None, "SIGKILL"

    def _isolation(self) -> dict[str, Any] | None:
        if self.ready is None:
            return None
        flags = self.plan.unshare_flags

        facts = self.ready.get("status", {})
        caps = {k: facts.get(k, "?") for k in ("CapEff", "CapPrm", "CapInh", "CapBnd", "CapAmb")}
        return {
            "user_ns": bool(flags & _libc.CLONE_NEWUSER), "pid_ns": bool(flags & _libc.CLONE_NEWPID),
            "mount_ns": bool(flags & _libc.CLONE_NEWNS), "net_ns": bool(flags & _libc.CLONE_NEWNET),
            "ipc_ns": bool(flags & _libc.CLONE_NEWIPC), "uts_ns": bool(flags & _libc.CLONE_NEWUTS),
            "cgroup_ns": bool(flags & _libc.CLONE_NEWCGROUP), "root": "pivot_root",
            "cgroup": self.cgroup.version if self.cgroup else "none",
            "seccomp": self.ready.get("seccomp", "off"),
            "no_new_privs": facts.get("NoNewPrivs") == "1",
            "capabilities": "none" if all(set(v) == {"0"} for v in caps.values()) else caps,
            "rootless": self.plan.rootless,
        }

    def _respond(self, stats: cgroups.Stats | None) -> ExecutionResponse:
        status, error, exit_code, signame = self._classify(stats)
        log.info("%s: %s%s, setup %.1f ms, ran %.1f ms", self.plan.execution_id, status,
                 f" {error.code}" if error else f" exit {exit_code}",
                 ((self.exec_at or self.t0) - self.t0) * 1000,
                 ((self.ended_at or time.monotonic()) - (self.exec_at or self.t0)) * 1000)
        if (self.exit_report or {}).get("file_size_hit") and "file_size" not in self.limits_hit:
            self.limits_hit.append("file_size")
        if self.denied:
            denied = ", ".join(f"{name} (x{n})" for name, n in self.denied.items())
            self.warnings.append(f"seccomp denied: {denied}")
        if stats is not None and stats.pids_limit_hit and "pids" not in self.limits_hit:
            self.limits_hit.append("pids")
        if stats is not None and (stats.oom_kills or stats.memory_limit_hit) and "memory" not in self.limits_hit:
            self.limits_hit.append("memory")
        started = self.ready is not None and (self.setup_error is None or self.setup_error.code == "E3003")
        resp = ExecutionResponse(
            execution_id=self.plan.execution_id, status=status,
            timestamps={"started": self.started, "completed": utc_now()},
            exit_code=exit_code, signal=signame, isolation=self._isolation(),
            warnings=self.warnings or None, error=error.to_dict() if error else None,
        )
        if started and self.setup_error is None:
            out, err = self.streams.values()
            resp.stdout = out.data.decode("utf-8", "replace")
            resp.stderr = err.data.decode("utf-8", "replace")
            resp.stdout_truncated, resp.stderr_truncated = out.truncated, err.truncated
            resp.stdout_bytes, resp.stderr_bytes = out.total, err.total
            resp.metrics = self._metrics(stats)
            resp.limits_hit = self.limits_hit
            files = (self.exit_report or {}).get("files")
            if files:
                resp.files = files
        return resp


def plan_cpu_limited(plan: Plan, usage: resource.struct_rusage) -> bool:
    """Without a cgroup, RLIMIT_CPU's hard limit ends the command with SIGKILL: was it that?"""
    limit = plan.limits.cpu_time_ms
    return limit is not None and (usage.ru_utime + usage.ru_stime) * 1000 >= limit


def _read_all(fd: int) -> bytes:
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError as exc:
            if exc.errno == errno.EINTR:
                continue
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)
