"""Every raw libc call capsule-run makes, behind one module.

Each wrapper raises `OSError(errno, "<call>(<args>): <strerror>")`, so a failure names the
call that failed. Python 3.11 has no `os.unshare`, `mount` or `pivot_root`; ctypes reaches them.
Nothing here decides policy: callers turn an OSError into the E-code of their stage.
"""

from __future__ import annotations

import ctypes
import os

_libc = ctypes.CDLL(None, use_errno=True)

# <linux/sched.h>
CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000

# <linux/mount.h>
MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_NOATIME = 1024
MS_NODIRATIME = 2048
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
MS_RELATIME = 1 << 21
MNT_DETACH = 2


def _check(result: int, call: str) -> int:
    if result == -1:
        err = ctypes.get_errno()
        raise OSError(err, f"{call}: {os.strerror(err)}")
    return result


def write_control_file(path: str, text: str) -> None:
    """One write(2) to a kernel control file (uid_map, cgroup.procs, memory.max, ...): such
    files take a value per write, so no buffering, no truncation; errors carry the path."""
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, text.encode())
    except OSError as exc:
        exc.filename = path
        raise
    finally:
        os.close(fd)


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_NO_SYMLINKS = 0x04
SYS_OPENAT2 = 437  # the same on x86-64 and aarch64 (the unified syscall table)
AT_FDCWD = -100


def open_path_no_symlinks(path: str) -> int:
    """An O_PATH fd for `path`, refusing a symlink anywhere in it (openat2(2),
    RESOLVE_NO_SYMLINKS, Linux 5.6+). ELOOP means a component is a symlink; on an older kernel
    (ENOSYS) it falls back to O_NOFOLLOW, which checks the last component only."""
    how = _OpenHow(os.O_PATH | os.O_CLOEXEC, 0, RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)
    fd = _libc.syscall(SYS_OPENAT2, AT_FDCWD, path.encode(), ctypes.byref(how), ctypes.sizeof(how))
    if fd == -1 and ctypes.get_errno() == 38:  # ENOSYS
        return os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    return _check(fd, f"openat2({path!r}, RESOLVE_NO_SYMLINKS)")


def unshare(flags: int) -> None:
    _check(_libc.unshare(ctypes.c_int(flags)), f"unshare({flags:#x})")


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    _check(
        _libc.mount(
            source.encode() if source is not None else None,
            target.encode(),
            fstype.encode() if fstype is not None else None,
            ctypes.c_ulong(flags),
            data.encode() if data is not None else None,
        ),
        f"mount({source!r}, {target!r}, {fstype!r}, {flags:#x}, {data!r})",
    )


def umount2(target: str, flags: int) -> None:
    _check(_libc.umount2(target.encode(), ctypes.c_int(flags)), f"umount2({target!r}, {flags})")


def pivot_root(new_root: str, put_old: str) -> None:
    # glibc has no wrapper for pivot_root(2); SYS_pivot_root is 155 on x86-64, 41 on aarch64.
    nr = {"x86_64": 155, "aarch64": 41}[os.uname().machine]
    _check(_libc.syscall(nr, new_root.encode(), put_old.encode()), f"pivot_root({new_root!r}, {put_old!r})")


def sethostname(name: str) -> None:
    raw = name.encode()
    _check(_libc.sethostname(raw, ctypes.c_size_t(len(raw))), f"sethostname({name!r})")


def prctl(option: int, arg2: int = 0, arg3: int = 0, arg4: int = 0, arg5: int = 0) -> int:
    return _check(
        _libc.prctl(
            ctypes.c_int(option), ctypes.c_ulong(arg2), ctypes.c_ulong(arg3),
            ctypes.c_ulong(arg4), ctypes.c_ulong(arg5),
        ),
        f"prctl({option}, {arg2})",
    )
