"""The plan: the complete, ordered description of one sandbox, computed before any fork.

Pure: it reads the host only to see which system directories exist and which are symlinks
(merged-/usr distributions), never changes anything. The child executes it step by step
(`capsule.child`); tests read it without privileges.
"""

from __future__ import annotations

import os
import resource
from dataclasses import dataclass, field

from . import _libc
from .errors import FilesystemError
from .models import ExecutionRequest, FileSpec
from .profiles import Limits, Profile

SANDBOX_UID = 1000
SANDBOX_GID = 1000
OVERFLOW_UID = 65534  # host uid the sandbox user maps to when capsule-run runs as root ("nobody")
SANDBOX_PATH = "/usr/local/bin:/usr/bin:/bin"
ROOT_TMPFS_BYTES = 1024 * 1024  # the sandbox's own / holds only mount points and /etc files

SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32")
# Files and directories of the host's /etc that programs need and that hold no secrets: the
# dynamic loader's cache, name-service config, time zone, locale, TLS roots, alternatives
# (Debian's /usr/bin/awk -> /etc/alternatives/awk), fonts and matplotlib's config.
ETC_ENTRIES = (
    "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "timezone", "locale.alias",
    "locale.conf", "default/locale", "alternatives", "ssl", "ca-certificates", "ca-certificates.conf",
    "mime.types", "fonts", "matplotlibrc", "os-release", "debian_version", "protocols", "services",
    "host.conf", "gai.conf", "python3", "python3.11", "python3.12", "inputrc", "bash.bashrc", "profile",
)
# /dev: the host nodes a program may expect (mknod is impossible in a user namespace).
DEV_NODES = ("null", "zero", "full", "random", "urandom", "tty")
DEV_LINKS = {"fd": "/proc/self/fd", "stdin": "/proc/self/fd/0", "stdout": "/proc/self/fd/1",
             "stderr": "/proc/self/fd/2", "ptmx": "pts/ptmx"}
# /proc entries a sandbox has no business reading (as container runtimes mask them).
PROC_MASKED_FILES = ("kcore", "keys", "timer_list", "sched_debug", "latency_stats", "kallsyms",
                     "sysrq-trigger", "kmsg", "config.gz")
PROC_MASKED_DIRS = ("acpi", "scsi", "asound", "irq", "bus", "fs", "driver")
PROC_READONLY = ("sys",)


@dataclass(frozen=True)
class Mount:
    """One step of building the root, in order. `target` is the path inside the sandbox."""

    kind: str  # bind | tmpfs | proc | dir | symlink | file | mask | ro-self | remount-ro
    target: str
    source: str | None = None  # bind: host path; symlink: link text
    readonly: bool = True
    options: str | None = None  # tmpfs data, e.g. "size=67108864,mode=1777"
    content: bytes = b""  # file
    mode: int = 0o755
    nodev: bool = True  # every mount is nosuid; nodev except the /dev node binds
    owned: bool = False  # dir: chown to the sandbox user (a working directory under /tmp)


@dataclass(frozen=True)
class Rlimit:
    name: str
    resource: int
    value: int  # soft and hard; only ever lowered (root's bounding set lacks CAP_SYS_RESOURCE)


@dataclass(frozen=True)
class Plan:
    execution_id: str
    profile: str
    argv: tuple[str, ...]
    env: dict[str, str]
    cwd: str
    stdin: bytes | None
    hostname: str
    share_network: bool
    unshare_flags: int
    rootless: bool
    host_uid: int
    host_gid: int
    sandbox_uid: int
    sandbox_gid: int
    mounts: tuple[Mount, ...]
    rlimits: tuple[Rlimit, ...]
    limits: Limits
    seccomp: str
    seccomp_action: str
    require: tuple[str, ...]
    seccomp_add: tuple[str, ...] = ()
    seccomp_remove: tuple[str, ...] = ()
    files: tuple[FileSpec, ...] = ()
    collect: tuple[str, ...] = ()
    max_collect_bytes: int = 0
    max_collect_files: int = 0
    session: str | None = None
    warnings: tuple[str, ...] = field(default=())

    @property
    def uid_map(self) -> str:
        return _id_map(self.rootless, self.sandbox_uid, self.host_uid)

    @property
    def gid_map(self) -> str:
        return _id_map(self.rootless, self.sandbox_gid, self.host_gid)


def _id_map(rootless: bool, inside: int, host: int) -> str:
    """user_namespaces(7): rootless, one line mapping our own id; as root, 0 stays root for the
    setup steps and the sandbox user becomes the host's unprivileged `nobody`."""
    if rootless:
        return f"{inside} {host} 1\n"
    if inside == 0:
        return "0 0 1\n"
    return f"0 0 1\n{inside} {OVERFLOW_UID} 1\n"


def _passwd(uid: int, gid: int) -> bytes:
    lines = ["root:x:0:0:root:/root:/bin/sh"]
    if uid != 0:
        lines.append(f"sandbox:x:{uid}:{gid}:capsule sandbox:/tmp:/bin/sh")
    lines.append("nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin")
    return ("\n".join(lines) + "\n").encode()


def _group(gid: int) -> bytes:
    lines = ["root:x:0:"]
    if gid != 0:
        lines.append(f"sandbox:x:{gid}:")
    lines.append("nogroup:x:65534:")
    return ("\n".join(lines) + "\n").encode()


def _host_entry(path: str, target: str) -> Mount | None:
    """A host path as it should appear: a symlink stays a symlink, else a read-only bind."""
    if os.path.islink(path):
        return Mount("symlink", target, source=os.readlink(path))
    if os.path.exists(path):
        return Mount("bind", target, source=path, readonly=True)
    return None


def _system_mounts(hostname: str, uid: int, gid: int, share_network: bool) -> list[Mount]:
    mounts = [m for d in SYSTEM_DIRS if (m := _host_entry(d, d)) is not None]
    mounts += [
        Mount("dir", "/etc"),
        Mount("file", "/etc/passwd", content=_passwd(uid, gid), mode=0o644),
        Mount("file", "/etc/group", content=_group(gid), mode=0o644),
        Mount("file", "/etc/hostname", content=f"{hostname}\n".encode(), mode=0o644),
        Mount("file", "/etc/hosts", content=f"127.0.0.1 localhost {hostname}\n::1 localhost\n".encode(), mode=0o644),
        Mount("file", "/etc/nsswitch.conf", content=b"passwd: files\ngroup: files\nhosts: files dns\n", mode=0o644),
    ]
    if share_network and os.path.exists("/etc/resolv.conf"):
        mounts.append(Mount("file", "/etc/resolv.conf", content=open("/etc/resolv.conf", "rb").read(), mode=0o644))
    else:
        mounts.append(Mount("file", "/etc/resolv.conf", content=b"", mode=0o644))
    for entry in ETC_ENTRIES:
        if "/" in entry:
            mounts.append(Mount("dir", "/etc/" + entry.rsplit("/", 1)[0]))
        if (m := _host_entry("/etc/" + entry, "/etc/" + entry)) is not None:
            mounts.append(m)
    # /dev: a small tmpfs with bound host nodes (nodev off for those alone), links, /dev/shm.
    mounts.append(Mount("tmpfs", "/dev", readonly=False, options="size=65536,mode=0755", nodev=False))
    mounts += [Mount("bind", f"/dev/{n}", source=f"/dev/{n}", readonly=False, nodev=False)
               for n in DEV_NODES if os.path.exists(f"/dev/{n}")]
    mounts += [Mount("symlink", f"/dev/{name}", source=text) for name, text in DEV_LINKS.items()]
    mounts.append(Mount("tmpfs", "/dev/shm", readonly=False, options="size=16777216,mode=1777"))
    # Rootless, the tmpfs belongs to the sandbox user: only read-only keeps it from adding nodes.
    mounts.append(Mount("remount-ro", "/dev", nodev=False))
    mounts.append(Mount("proc", "/proc"))
    mounts += [Mount("mask", f"/proc/{name}") for name in PROC_MASKED_FILES + PROC_MASKED_DIRS]
    mounts += [Mount("ro-self", f"/proc/{name}") for name in PROC_READONLY]
    return mounts


def _under(path: str, prefix: str) -> bool:
    return path == prefix or path.startswith(prefix + "/")


def build_plan(
    req: ExecutionRequest,
    profile: Profile,
    limits: Limits,
    *,
    euid: int | None = None,
    egid: int | None = None,
    session_dir: str | None = None,
    cgroup_available: bool = True,
) -> Plan:
    euid = os.geteuid() if euid is None else euid
    egid = os.getegid() if egid is None else egid
    rootless = euid != 0
    uid = 0 if profile.user == "root" else SANDBOX_UID
    gid = 0 if profile.user == "root" else SANDBOX_GID
    iso = req.isolation
    cwd = iso.working_directory
    share_network = iso.network  # allowed only where the profile grants it (checked before)

    flags = (_libc.CLONE_NEWUSER | _libc.CLONE_NEWNS | _libc.CLONE_NEWPID | _libc.CLONE_NEWIPC
             | _libc.CLONE_NEWUTS | _libc.CLONE_NEWCGROUP)
    if not share_network:
        flags |= _libc.CLONE_NEWNET

    mounts = _system_mounts(iso.hostname, uid, gid, share_network)
    # nr_inodes bounds what a million empty files would cost: inodes take memory, not blocks.
    tmpfs = f"size={limits.tmpfs_bytes},nr_inodes={max(1024, limits.tmpfs_bytes // 2048)}"
    mounts.append(Mount("tmpfs", "/tmp", readonly=False, options=f"{tmpfs},mode=1777"))
    if session_dir is not None:
        mounts.append(Mount("bind", cwd, source=session_dir, readonly=False))
    elif not _under(cwd, "/tmp"):
        mounts.append(Mount("tmpfs", cwd, readonly=False, options=f"{tmpfs},mode=0755,uid={uid},gid={gid}"))
    else:
        mounts.append(Mount("dir", cwd, mode=0o755, owned=True))

    # Host paths the request binds, parents before children. A read-only path already visible
    # through a system bind (/usr/share/...) needs no mount of its own.
    binds = [(p, p, True) for p in iso.readonly_paths if not any(_under(p, d) for d in SYSTEM_DIRS)]
    binds += [(p, p, False) for p in iso.writable_paths]
    binds += [(b.source, b.destination, b.readonly) for b in iso.bind_mounts]
    for source, target, readonly in sorted(binds, key=lambda b: b[1].count("/")):
        real = os.path.realpath(source)
        if not os.path.exists(real):
            raise FilesystemError(f"bind source {source!r} does not exist on the host", stage="plan", path=source)
        mounts.append(Mount("bind", target, source=real, readonly=readonly))

    rlimits = [Rlimit("core", resource.RLIMIT_CORE, 0), Rlimit("nofile", resource.RLIMIT_NOFILE, limits.max_open_files)]
    if limits.max_file_bytes is not None:
        rlimits.append(Rlimit("fsize", resource.RLIMIT_FSIZE, limits.max_file_bytes))
    if not cgroup_available:
        # Degraded (no cgroup, and the profile allows it): per-process rlimits stand in for the
        # group's limits. Weaker: RLIMIT_AS counts address space, not memory, per process.
        rlimits.append(Rlimit("as", resource.RLIMIT_AS, limits.memory_bytes))
        rlimits.append(Rlimit("nproc", resource.RLIMIT_NPROC, limits.max_pids))
        if limits.cpu_time_ms is not None:
            rlimits.append(Rlimit("cpu", resource.RLIMIT_CPU, max(1, -(-limits.cpu_time_ms // 1000))))

    env = {"PATH": SANDBOX_PATH, "HOME": "/tmp", "LANG": "C.UTF-8", "TMPDIR": "/tmp",
           "USER": "root" if uid == 0 else "sandbox"}
    env.update(profile.environment)
    env.update(req.environment)

    return Plan(
        execution_id=req.execution_id, profile=profile.name, argv=req.command, env=env, cwd=cwd,
        stdin=req.stdin, hostname=iso.hostname, share_network=share_network, unshare_flags=flags,
        rootless=rootless, host_uid=euid, host_gid=egid, sandbox_uid=uid, sandbox_gid=gid,
        mounts=tuple(mounts), rlimits=tuple(rlimits), limits=limits, seccomp=profile.seccomp,
        seccomp_action=profile.seccomp_action, require=profile.require, files=req.files,
        seccomp_add=profile.seccomp_add, seccomp_remove=profile.seccomp_remove,
        collect=req.collect, max_collect_bytes=profile.max_collect_bytes,
        max_collect_files=profile.max_collect_files, session=req.session,
    )
