"""Seccomp: syscall allowlists as data, built in the parent, loaded in the workload just before exec (only its rlimits follow).

Policies are lists of named groups (below). Every syscall outside the allowlist goes to the
supervisor as a *user notification* (seccomp_unotify(2)): the filter's listener fd is passed up
the control socket, and the supervisor answers each denied call with EPERM (`seccomp_action =
"errno"`) or kills the whole sandbox (`"kill"`), knowing exactly which call it was - no audit
log needed, as root or not. Two answers never reach the supervisor: `clone3` and other calls
newer than these lists fail with ENOSYS so that libc falls back to the old call (glibc starts
threads with clone3 and retries clone only on ENOSYS), and a non-native ABI (i386 `int 0x80`,
x32) kills the process outright (SECCOMP_RET_KILL_PROCESS: a SIGSYS death, E5001).

`import pyseccomp` runs ctypes.util.find_library twice, which forks `ldconfig -p` (~28 ms):
the import is lazy (only for a policy other than "off") and finds the two libraries directly.
"""

from __future__ import annotations

import contextlib
import ctypes.util
import errno
import fcntl
import glob
import os
import socket
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from .errors import InvalidConfig, SeccompError

# -------------------------------------------------------------------------------- the data

GROUPS: dict[str, tuple[str, ...]] = {
    "file_io": (
        "read", "write", "readv", "writev", "pread64", "pwrite64", "preadv", "pwritev", "preadv2",
        "pwritev2", "open", "openat", "close", "close_range", "creat", "lseek", "stat", "fstat", "lstat",
        "newfstatat", "statx", "statfs", "fstatfs", "access", "faccessat", "faccessat2", "readlink",
        "readlinkat", "getdents", "getdents64", "mkdir", "mkdirat", "rmdir", "unlink", "unlinkat",
        "rename", "renameat", "renameat2", "link", "linkat", "symlink", "symlinkat", "chmod", "fchmod",
        "fchmodat", "chown", "fchown", "lchown", "fchownat", "truncate", "ftruncate", "fsync",
        "fdatasync", "sync", "syncfs", "sync_file_range", "fallocate", "fadvise64", "readahead",
        "utime", "utimes", "utimensat", "futimesat", "getcwd", "chdir", "fchdir", "dup", "dup2", "dup3",
        "fcntl", "flock", "pipe", "pipe2", "sendfile", "splice", "tee", "copy_file_range", "umask",
        "select", "pselect6", "poll", "ppoll", "epoll_create", "epoll_create1", "epoll_ctl",
        "epoll_wait", "epoll_pwait", "epoll_pwait2", "eventfd", "eventfd2", "inotify_init",
        "inotify_init1", "inotify_add_watch", "inotify_rm_watch", "getxattr", "lgetxattr", "fgetxattr",
        "listxattr", "llistxattr", "flistxattr", "memfd_create",
    ),
    "memory": (
        "brk", "mmap", "munmap", "mremap", "mprotect", "madvise", "mlock", "munlock", "mincore",
        "msync", "membarrier", "get_mempolicy", "set_mempolicy", "mbind",
    ),
    "threads": (
        "futex", "set_robust_list", "get_robust_list", "set_tid_address", "rseq", "sched_yield",
        "sched_getaffinity", "sched_setaffinity", "sched_getparam", "sched_getscheduler",
        "sched_get_priority_max", "sched_get_priority_min", "gettid", "arch_prctl", "prctl",
    ),
    "signals": (
        "rt_sigaction", "rt_sigprocmask", "rt_sigreturn", "rt_sigsuspend", "rt_sigpending",
        "rt_sigtimedwait", "rt_sigqueueinfo", "rt_tgsigqueueinfo", "sigaltstack", "kill", "tgkill",
        "tkill", "signalfd", "signalfd4", "pause", "alarm", "restart_syscall",
    ),
    "time": (
        "clock_gettime", "clock_getres", "clock_nanosleep", "nanosleep", "gettimeofday", "time",
        "getitimer", "setitimer", "timer_create", "timer_settime", "timer_gettime", "timer_getoverrun",
        "timer_delete", "timerfd_create", "timerfd_settime", "timerfd_gettime", "times",
    ),
    "identity": (
        "getpid", "getppid", "getpgid", "getpgrp", "getsid", "getuid", "geteuid", "getgid", "getegid",
        "getresuid", "getresgid", "getgroups", "uname", "sysinfo", "getrlimit", "prlimit64",
        "getrusage", "getpriority", "capget", "getrandom", "ioprio_get", "getcpu",
    ),
    "exec": ("execve", "exit", "exit_group", "sendmsg"),  # sendmsg: the listener fd goes up after load
    "process": (
        "fork", "vfork", "clone", "execveat", "wait4", "waitid", "setpgid", "setsid", "setrlimit",
        "setpriority", "pidfd_open", "pidfd_send_signal",
    ),
    "sockets": (
        "socketpair", "bind", "listen", "accept", "accept4", "connect", "getsockname", "getpeername",
        "sendto", "recvfrom", "recvmsg", "sendmmsg", "recvmmsg", "shutdown", "getsockopt", "setsockopt",
    ),
    "ipc": ("shmget", "shmat", "shmdt", "shmctl", "semget", "semop", "semtimedop", "semctl", "msgget",
            "msgsnd", "msgrcv", "msgctl"),
}
# socket(2) by family: local and loopback-capable families by default, the rest with @network.
AF_UNIX, AF_INET, AF_INET6, AF_NETLINK = 1, 2, 10, 16
DEFAULT_SOCKET_FAMILIES = (AF_UNIX, AF_INET, AF_INET6, AF_NETLINK)
CLONE_THREAD = 0x00010000
TIOCSTI, TIOCLINUX = 0x5412, 0x541C  # ioctls that push input into (or steal) a terminal
PERSONALITY_QUERY = 0xFFFFFFFF

POLICIES: dict[str, tuple[str, ...]] = {
    # sh, coreutils, python3 with threads, subprocess, ctypes, numpy/pandas/matplotlib.
    "default": ("@file_io", "@memory", "@threads", "@signals", "@time", "@identity", "@exec", "@process",
                "@sockets", "@socket_local", "@ipc", "@ioctl", "@personality", "@fifo"),
    # One process doing computation: threads but no new processes, no sockets.
    "strict": ("@file_io", "@memory", "@threads", "@signals", "@time", "@identity", "@exec",
               "@clone_thread", "@ioctl", "@personality"),
}
# Conditional groups, built in code below: "@socket_local" (socket() for the families above),
# "@network" (socket() for any family), "@clone_thread" (clone() only with CLONE_THREAD),
# "@ioctl" (every ioctl but TIOCSTI/TIOCLINUX, compared in 32 bits), "@personality" (query only),
# "@fifo" (mknod/mknodat of named pipes only: device nodes stay refused).
CONDITIONAL = ("socket_local", "network", "clone_thread", "ioctl", "personality", "fifo")
S_IFMT, S_IFIFO = 0o170000, 0o010000

# Never allowed, whatever a profile says: each would let the command widen or leave its cell.
ALWAYS_DENIED = frozenset((
    "ptrace", "process_vm_readv", "process_vm_writev", "mount", "umount", "umount2", "pivot_root",
    "move_mount", "open_tree", "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr", "unshare",
    "setns", "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module", "bpf",
    "perf_event_open", "keyctl", "add_key", "request_key", "userfaultfd", "io_uring_setup",
    "io_uring_enter", "io_uring_register", "open_by_handle_at", "name_to_handle_at", "reboot", "swapon",
    "swapoff", "acct", "quotactl", "quotactl_fd", "chroot", "pidfd_getfd", "kcmp", "iopl", "ioperm",
    "syslog", "settimeofday", "clock_settime", "clock_adjtime", "adjtimex", "lookup_dcookie",
    "uselib", "vhangup", "personality_unrestricted",
))
# Newer than these lists: ENOSYS, so that libc falls back (never reported as a violation).
ENOSYS_CALLS = ("clone3", "openat2", "fchmodat2", "map_shadow_stack", "mseal", "futex_waitv", "futex_wake",
                "futex_wait", "futex_requeue", "cachestat", "statmount", "listmount", "process_mrelease",
                "memfd_secret", "set_mempolicy_home_node", "landlock_create_ruleset",
                "landlock_add_rule", "landlock_restrict_self", "lsm_get_self_attr", "lsm_set_self_attr",
                "lsm_list_modules")


def resolve_names(policy: str, add: tuple[str, ...] = (), remove: tuple[str, ...] = ()) -> list[str]:
    """The policy's entries ("name" or "@group") after a profile's additions and removals."""
    entries = [e for e in POLICIES[policy] if e not in remove]
    entries += [e for e in add if e not in entries]
    return entries


def check_profile_syscalls(add: tuple[str, ...], remove: tuple[str, ...], network: bool, file: str) -> None:
    """E1005 for a profile that adds what is always denied, or @network without network."""
    for entry in add + remove:
        name = entry[1:] if entry.startswith("@") else None
        if name is not None and name not in GROUPS and name not in CONDITIONAL:
            raise InvalidConfig(f"{file}: policy.seccomp_add/remove: unknown group {entry!r}", file=file)
    for entry in add:
        if entry in ALWAYS_DENIED:
            raise InvalidConfig(f"{file}: policy.seccomp_add: {entry!r} is always denied", file=file)
        if entry == "@network" and not network:
            raise InvalidConfig(f"{file}: policy.seccomp_add: @network needs policy.network = true", file=file)


# -------------------------------------------------------------------------------- building


@contextlib.contextmanager
def _fast_find_library() -> Iterator[None]:
    """ctypes.util.find_library forks `ldconfig -p`; the two sonames it looks for (libc,
    libseccomp) sit in the usual library directories. Fall back to the real search."""
    original = ctypes.util.find_library

    def find(name: str) -> str | None:
        for pattern in (f"/lib/*/lib{name}.so.[0-9]*", f"/usr/lib/*/lib{name}.so.[0-9]*",
                        f"/usr/lib64/lib{name}.so.[0-9]*", f"/lib64/lib{name}.so.[0-9]*"):
            hits = sorted(glob.glob(pattern), key=len)
            if hits:
                return os.path.basename(hits[0])
        return original(name)

    ctypes.util.find_library = find
    try:
        yield
    finally:
        ctypes.util.find_library = original


def _pyseccomp() -> Any:
    with _fast_find_library():
        import pyseccomp
    return pyseccomp


def _ioctl_cover(excluded: tuple[int, ...]) -> list[tuple[int, int]]:
    """(mask, value) pairs, masks within the low 32 bits, that together match every 32-bit
    ioctl command except `excluded`. The kernel reads the command as an unsigned int, so the
    upper 32 bits must not matter, and libseccomp allows one comparison per argument per rule:
    a prefix cover of the complement does it in ~32 masked-equality rules."""
    out: list[tuple[int, int]] = []

    def cover(prefix: int, depth: int) -> None:
        inside = [x for x in excluded if x >> (32 - depth) == prefix] if depth else list(excluded)
        if not inside:
            out.append((((1 << depth) - 1) << (32 - depth), prefix << (32 - depth)))
        elif depth < 32:
            cover(prefix << 1, depth + 1)
            cover((prefix << 1) | 1, depth + 1)

    cover(0, 0)
    return out


@dataclass
class BuiltFilter:
    name: str
    filter: Any  # pyseccomp.SyscallFilter, loaded in the child


_CACHE: dict[tuple[str, tuple[str, ...], tuple[str, ...]], BuiltFilter] = {}


def build_in_parent(policy: str, add: tuple[str, ...] = (), remove: tuple[str, ...] = ()) -> BuiltFilter | None:
    """Compile the policy before the fork (the library is unreachable after pivot_root)."""
    if policy == "off":
        return None
    key = (policy, add, remove)
    if key in _CACHE:
        return _CACHE[key]
    try:
        sc = _pyseccomp()
        f = sc.SyscallFilter(sc.NOTIFY)
        # A non-native ABI (i386 int 0x80, x32) is killed outright: its syscall numbers mean
        # other calls, and no allowlist here was written for them.
        f.set_attr(sc.Attr.ACT_BADARCH, sc.KILL_PROCESS)
        names: set[str] = set()
        for entry in resolve_names(policy, add, remove):
            group = entry[1:] if entry.startswith("@") else None
            if group in CONDITIONAL:
                _add_conditional(sc, f, group)
            else:
                names.update(GROUPS[group] if group else (entry,))
        for name in sorted(names - ALWAYS_DENIED):
            _add(sc, f, sc.ALLOW, name)
        for name in ENOSYS_CALLS:
            _add(sc, f, sc.ERRNO(errno.ENOSYS), name)
    except (OSError, RuntimeError) as exc:
        raise SeccompError(f"building seccomp policy {policy!r}: {exc}", stage="seccomp") from None
    built = BuiltFilter(policy, f)
    _CACHE[key] = built
    return built


def _add(sc: Any, f: Any, action: int, name: str, *args: Any) -> None:
    try:
        nr = sc.resolve_syscall(sc.Arch.NATIVE, name)
    except (OSError, RuntimeError, ValueError):
        return  # a name this libseccomp or architecture does not know
    if nr < 0:
        return  # a pseudo-syscall: not on this architecture
    f.add_rule(action, nr, *args)


def _add_conditional(sc: Any, f: Any, group: str) -> None:
    if group == "socket_local":
        for family in DEFAULT_SOCKET_FAMILIES:
            _add(sc, f, sc.ALLOW, "socket", sc.Arg(0, sc.EQ, family))
    elif group == "network":
        _add(sc, f, sc.ALLOW, "socket")
    elif group == "clone_thread":
        _add(sc, f, sc.ALLOW, "clone", sc.Arg(0, sc.MASKED_EQ, CLONE_THREAD, CLONE_THREAD))
    elif group == "ioctl":
        for mask, value in _ioctl_cover((TIOCSTI, TIOCLINUX)):
            _add(sc, f, sc.ALLOW, "ioctl", sc.Arg(1, sc.MASKED_EQ, mask, value))
    elif group == "fifo":
        _add(sc, f, sc.ALLOW, "mknod", sc.Arg(1, sc.MASKED_EQ, S_IFMT, S_IFIFO))
        _add(sc, f, sc.ALLOW, "mknodat", sc.Arg(2, sc.MASKED_EQ, S_IFMT, S_IFIFO))
    elif group == "personality":
        # Only the query and PER_LINUX: no ADDR_NO_RANDOMIZE (it would turn off ASLR).
        _add(sc, f, sc.ALLOW, "personality", sc.Arg(0, sc.EQ, 0))
        _add(sc, f, sc.ALLOW, "personality", sc.Arg(0, sc.EQ, PERSONALITY_QUERY))


# -------------------------------------------------------------------------------- child side


def load_in_child(built: BuiltFilter | None, ctl_fd: int) -> str:
    """Load the filter (no_new_privs is already set) and hand its listener fd to the supervisor.
    Returns the policy name for the isolation report."""
    if built is None:
        return "off"
    # Everything the hand-over needs is made before the load: once loaded, a call outside the
    # policy waits for the supervisor, which has no listener yet (socket.socket() alone would
    # probe the fd with getsockopt, which `strict` does not allow).
    sc = _pyseccomp()
    ctl = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM, 0, fileno=os.dup(ctl_fd))
    msg = b'{"event": "seccomp_listener"}\n'
    try:
        built.filter.load()
    except OSError as exc:
        raise SeccompError(f"seccomp_load: {exc.strerror or exc}", stage="seccomp", errno=exc.errno) from None
    listener = sc._libseccomp.seccomp_notify_fd(built.filter._filter)
    if listener < 0:
        raise SeccompError("the kernel gave no seccomp listener fd", stage="seccomp")
    socket.send_fds(ctl, [msg], [listener])
    os.close(listener)
    ctl.detach()
    os.close(ctl_fd)
    return built.name


# -------------------------------------------------------------------------------- parent side

SECCOMP_IOCTL_NOTIF_RECV = 0xC0502100  # _IOWR('!', 0, struct seccomp_notif), 80 bytes
SECCOMP_IOCTL_NOTIF_SEND = 0xC0182101  # _IOWR('!', 1, struct seccomp_notif_resp), 24 bytes
_NOTIF = struct.Struct("=QIIiIQ6Q")  # id, pid, flags, data.nr, data.arch, data.ip, data.args[6]
_RESP = struct.Struct("=QqiI")  # id, val, error, flags


@dataclass
class Violation:
    pid: int  # in the supervisor's PID namespace
    syscall: str
    nr: int


def receive_from_parent(listener: int) -> Violation | None:
    """One pending notification; None if its task already died (ENOENT)."""
    buf = bytearray(_NOTIF.size)
    try:
        fcntl.ioctl(listener, SECCOMP_IOCTL_NOTIF_RECV, buf, True)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.EINTR, errno.EAGAIN):
            return None
        raise
    nid, pid, _flags, nr, arch, *_ = _NOTIF.unpack(buf)
    try:
        name = _pyseccomp().resolve_syscall(arch, nr).decode()
    except Exception:
        name = f"syscall {nr}"
    _respond(listener, nid, -errno.EPERM)
    return Violation(pid=pid, syscall=name, nr=nr)


def _respond(listener: int, nid: int, error: int) -> None:
    try:
        fcntl.ioctl(listener, SECCOMP_IOCTL_NOTIF_SEND, bytearray(_RESP.pack(nid, 0, error, 0)), True)
    except OSError:
        pass  # the task died meanwhile
