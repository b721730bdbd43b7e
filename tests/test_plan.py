"""The plan is pure: what the sandbox will be, decided before any fork."""

from __future__ import annotations

import resource

from capsule import plan as planmod
from capsule import profiles, validation


def make(euid: int = 0, profile: str = "default", cgroup: bool = True, **fields):
    req = validation.validate({"command": ["true"], **fields})
    prof = profiles.load_profile(profile)
    return planmod.build_plan(req, prof, profiles.effective_limits(req, prof), euid=euid, egid=euid,
                              cgroup_available=cgroup)


def test_id_maps_root_and_rootless() -> None:
    assert make(euid=0).uid_map == "0 0 1\n1000 65534 1\n"
    assert make(euid=1234).uid_map == "1000 1234 1\n"
    assert make(euid=1234).rootless and not make(euid=0).rootless


def test_root_never_exposes_host_secrets() -> None:
    targets = {m.target for m in make().mounts}
    sources = {m.source for m in make().mounts if m.kind == "bind"}
    assert "/root" not in targets and "/home" not in targets
    assert not any(s and (s.startswith("/etc/shadow") or s.startswith("/root")) for s in sources)
    passwd = next(m for m in make().mounts if m.target == "/etc/passwd")
    assert b"sandbox:x:1000:1000" in passwd.content


def test_mount_order_and_masks() -> None:
    kinds = [(m.kind, m.target) for m in make().mounts]
    assert kinds.index(("proc", "/proc")) < kinds.index(("ro-self", "/proc/sys"))
    assert ("mask", "/proc/kcore") in kinds
    assert ("tmpfs", "/workspace") in kinds and ("tmpfs", "/tmp") in kinds


def test_network_flag() -> None:
    from capsule import _libc

    assert make().unshare_flags & _libc.CLONE_NEWNET


def test_environment_is_built_from_nothing(monkeypatch) -> None:
    monkeypatch.setenv("SECRET_TOKEN", "x")
    env = make(environment={"A": "1"}).env
    assert "SECRET_TOKEN" not in env and env["A"] == "1" and env["PATH"] == planmod.SANDBOX_PATH


def test_rlimits_lower_and_degrade() -> None:
    names = {r.name for r in make().rlimits}
    assert names == {"core", "nofile", "fsize"}
    degraded = {r.name: r.value for r in make(cgroup=False, resources={"cpu_time_ms": 1500}).rlimits}
    assert degraded["as"] == 256 << 20 and degraded["cpu"] == 2 and degraded["nproc"] == 100
    assert all(r.resource in (resource.RLIMIT_CORE, resource.RLIMIT_NOFILE, resource.RLIMIT_FSIZE) for r in make().rlimits)


def test_workdir_under_tmp_is_owned_by_the_sandbox_user() -> None:
    m = [m for m in make(isolation={"working_directory": "/tmp/work"}).mounts if m.target == "/tmp/work"]
    assert m and m[0].kind == "dir" and m[0].owned
