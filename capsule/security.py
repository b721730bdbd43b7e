"""Privileges: parent-death signals, capabilities, no_new_privs, and the sandbox user.

Runs in the children. The order inside the workload (capsule.child) matters: the bounding set
can be dropped only while CAP_SETPCAP is held, so it goes first; setresuid from 0 to the
sandbox user then clears the permitted and effective sets (capabilities(7), "Effect of user ID
changes on capabilities"); an explicit capset clears what remains (rootless: the user
namespace's creator holds every capability whatever its uid).
"""

from __future__ import annotations

import os
import signal

import prctl

from . import _libc
from .errors import PrivilegeError

PR_CAPBSET_DROP = 24
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
CAP_FIELDS = ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")


def die_with_parent(expected_parent: int) -> None:
    """PR_SET_PDEATHSIG fires when the forking *thread* exits (prctl(2)): every fork of ours
    comes from a main thread. If the parent is already gone, go too."""
    prctl.set_pdeathsig(signal.SIGKILL)
    if os.getppid() != expected_parent:
        os._exit(1)


def set_dumpable(flag: bool) -> None:
    """A non-dumpable process's /proc files belong to root and it cannot be ptraced
    (proc(5), PR_SET_DUMPABLE): the sandbox's init and the supervisor hold pipes and the host
    environment that the workload must not read."""
    prctl.set_dumpable(flag)


def drop_bounding_set_in_child() -> None:
    last = int(open("/proc/sys/kernel/cap_last_cap").read())
    for cap in range(last + 1):
        try:
            _libc.prctl(PR_CAPBSET_DROP, cap)
        except OSError as exc:
            raise PrivilegeError(f"dropping capability {cap} from the bounding set: {exc.strerror}",
                                 stage="capabilities", errno=exc.errno) from None
    _libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL)


def become_sandbox_user_in_child(uid: int, gid: int, may_setgroups: bool) -> None:
    try:
        if may_setgroups:  # rootless: setgroups is denied in the namespace (user_namespaces(7))
            os.setgroups([])
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)
    except OSError as exc:
        raise PrivilegeError(f"switching to uid {uid}: {exc.strerror}", stage="user", errno=exc.errno) from None


def clear_capabilities_in_child() -> None:
    try:
        prctl.cap_inheritable.limit()
        prctl.cap_effective.limit()
        prctl.cap_permitted.limit()
    except OSError as exc:
        raise PrivilegeError(f"capset: {exc.strerror}", stage="capabilities", errno=exc.errno) from None


def set_no_new_privs_in_child() -> None:
    # prctl(2) PR_SET_NO_NEW_PRIVS: execve can no longer grant privileges (setuid bits, file
    # capabilities); required for an unprivileged seccomp filter too.
    prctl.set_no_new_privs(True)


def read_status_facts() -> dict[str, str]:
    """What /proc/self/status says of this process: capability sets, NoNewPrivs, Seccomp."""
    facts = {}
    with open("/proc/self/status") as fh:
        for line in fh:
            key, _, value = line.partition(":")
            if key in CAP_FIELDS or key in ("NoNewPrivs", "Seccomp"):
                facts[key] = value.strip()
    return facts


def verify_dropped(facts: dict[str, str]) -> None:
    """Fail closed: if any capability set is not empty, do not exec."""
    held = {k: facts.get(k) for k in CAP_FIELDS if int(facts.get(k, "1"), 16) != 0}
    if held:
        raise PrivilegeError(f"capabilities still held after dropping: {held}", stage="capabilities")
    if facts.get("NoNewPrivs") != "1":
        raise PrivilegeError("no_new_privs is not set", stage="no_new_privs")
