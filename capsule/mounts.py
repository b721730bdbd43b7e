"""Building the sandbox's root filesystem, in child B (PID 1 of the new namespaces).

The sequence follows bubblewrap's: make every mount private; mount a scratch tmpfs on /tmp
(in this mount namespace only) and pivot into it, so the host tree sits at /oldroot and every
bind source, /tmp paths included, is reached through it; build the new root as a tmpfs at
/newroot; then `pivot_root(".", ".")` into it and detach the old root (pivot_root(2), NOTES:
"new_root and put_old may be the same directory"). Finally the root itself becomes read-only.
"""

from __future__ import annotations

import os
import stat

from . import _libc
from .errors import FilesystemError
from .plan import ROOT_TMPFS_BYTES, Mount, Plan

OLD = "/oldroot"
NEW = "/newroot"

# statvfs(3) f_flag bits -> the mount(2) flags a read-only remount must repeat. In a user
# namespace the kernel locks these on a bind of a more privileged mount (mount_namespaces(7),
# "locked mounts"): leaving one out of the remount is EPERM.
_LOCKED = ((os.ST_NOSUID, _libc.MS_NOSUID), (os.ST_NODEV, _libc.MS_NODEV), (os.ST_NOEXEC, _libc.MS_NOEXEC),
           (os.ST_NOATIME, _libc.MS_NOATIME), (os.ST_NODIRATIME, _libc.MS_NODIRATIME),
           (os.ST_RELATIME, _libc.MS_RELATIME))


def _fail(step: str, exc: OSError) -> FilesystemError:
    return FilesystemError(f"{step}: {exc.strerror or exc}", stage="mount", errno=exc.errno, step=step)


def _remount(target: str, readonly: bool, nodev: bool) -> None:
    st = os.statvfs(target)
    flags = _libc.MS_BIND | _libc.MS_REMOUNT | _libc.MS_NOSUID
    flags |= _libc.MS_RDONLY if readonly else 0
    flags |= _libc.MS_NODEV if nodev else 0
    for bit, flag in _LOCKED:
        if st.f_flag & bit:
            flags |= flag
    _libc.mount(None, target, None, flags)


def _make_mountpoint(target: str, as_file: bool) -> None:
    os.makedirs(os.path.dirname(target), mode=0o755, exist_ok=True)
    if as_file:
        if not os.path.lexists(target):
            os.close(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644))
    else:
        os.makedirs(target, mode=0o755, exist_ok=True)


def _apply(m: Mount, plan: Plan) -> None:
    target = NEW + m.target
    if m.kind == "dir":
        _make_mountpoint(target, as_file=False)
        if m.owned:
            os.chown(target, plan.sandbox_uid, plan.sandbox_gid)
    elif m.kind == "symlink":
        os.makedirs(os.path.dirname(target), mode=0o755, exist_ok=True)
        os.symlink(m.source or "", target)
    elif m.kind == "file":
        os.makedirs(os.path.dirname(target), mode=0o755, exist_ok=True)
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, m.mode)
        try:
            os.write(fd, m.content)
        finally:
            os.close(fd)
    elif m.kind == "tmpfs":
        _make_mountpoint(target, as_file=False)
        flags = _libc.MS_NOSUID | (_libc.MS_NODEV if m.nodev else 0)
        _libc.mount("tmpfs", target, "tmpfs", flags, m.options)
    elif m.kind == "bind":
        # The plan resolved and checked the source; mount exactly that object. If a component
        # became a symlink since (a swap under our feet), openat2 refuses, and the bind goes
        # through the fd's magic link, so nothing is looked up by name a second time.
        fd = _libc.open_path_no_symlinks(OLD + (m.source or ""))
        try:
            _make_mountpoint(target, as_file=not stat.S_ISDIR(os.fstat(fd).st_mode))
            _libc.mount(f"{OLD}/proc/self/fd/{fd}", target, None, _libc.MS_BIND | _libc.MS_REC)
        finally:
            os.close(fd)
        _remount(target, m.readonly, m.nodev)
    elif m.kind == "proc":
        # Only a process inside the new PID namespace may mount its proc (pid_namespaces(7)).
        _make_mountpoint(target, as_file=False)
        _libc.mount("proc", target, "proc", _libc.MS_NOSUID | _libc.MS_NODEV | _libc.MS_NOEXEC)
    elif m.kind == "ro-self":
        if os.path.exists(target):
            _libc.mount(target, target, None, _libc.MS_BIND | _libc.MS_REC)
            _remount(target, readonly=True, nodev=True)
    elif m.kind == "remount-ro":
        _remount(target, readonly=True, nodev=m.nodev)
    elif m.kind == "mask":
        if os.path.isdir(target):
            _libc.mount("tmpfs", target, "tmpfs", _libc.MS_RDONLY | _libc.MS_NOSUID | _libc.MS_NODEV, "size=0,mode=0555")
        elif os.path.exists(target):
            _libc.mount(OLD + "/dev/null", target, None, _libc.MS_BIND)
            _remount(target, readonly=True, nodev=True)
    else:  # pragma: no cover - the plan only makes the kinds above
        raise ValueError(f"unknown mount kind {m.kind!r}")


def build_root_in_child(plan: Plan) -> None:
    """Runs in child B, with CAP_SYS_ADMIN over its own mount namespace. Raises FilesystemError."""
    step = "make / private"
    try:
        # mount_namespaces(7): without MS_PRIVATE our mounts would propagate to the host.
        _libc.mount(None, "/", None, _libc.MS_REC | _libc.MS_PRIVATE)
        step = "scratch tmpfs on /tmp"
        _libc.mount("capsule-scratch", "/tmp", "tmpfs", _libc.MS_NOSUID | _libc.MS_NODEV, "size=65536,mode=0700")
        os.mkdir("/tmp" + OLD)
        os.mkdir("/tmp" + NEW)
        step = "pivot_root into the scratch tmpfs"
        os.chdir("/tmp")
        _libc.pivot_root("/tmp", "/tmp" + OLD)
        os.chdir("/")
        step = "new root tmpfs"
        _libc.mount("capsule-root", NEW, "tmpfs", _libc.MS_NOSUID | _libc.MS_NODEV, f"size={ROOT_TMPFS_BYTES},mode=0755")
        for m in plan.mounts:
            step = f"{m.kind} {m.target}" + (f" from {m.source}" if m.kind == "bind" else "")
            _apply(m, plan)
        step = "pivot_root into the new root"
        os.chdir(NEW)
        _libc.pivot_root(".", ".")
        # The old root is now stacked on top of "."; detaching it drops the host tree.
        _libc.umount2(".", _libc.MNT_DETACH)
        os.chdir("/")
        step = "read-only root"
        _remount("/", readonly=True, nodev=True)
    except OSError as exc:
        raise _fail(step, exc) from None

