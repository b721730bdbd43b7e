"""Resource limits and accounting. Unit tests of the v2 backend against a fake cgroupfs tree,
and real behaviour tests on whichever backend this host offers (v1 here; v2 on a pure-v2
kernel: see README, "Testing on a cgroup v2 host")."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from conftest import ROOT, cgroup_version, run

from capsule import cgroups, profiles, validation
from capsule.cgroups import v2
from capsule.plan import build_plan

# ------------------------------------------------------------------ v2 against a fake tree


def _fake_v2(tmp_path: Path) -> Path:
    root = tmp_path / "cgroup"
    root.mkdir()
    (root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (root / "cgroup.subtree_control").write_text("")
    return root


def _plan(**resources):
    req = validation.validate({"command": ["true"], "resources": resources})
    prof = profiles.load_profile("default")
    return build_plan(req, prof, profiles.effective_limits(req, prof))


class FakeDir:
    """mkdir in a fake cgroupfs does not create the interface files: make them as the kernel would."""

    @staticmethod
    def populate(path: Path) -> None:
        for name, text in {
            # Interface files we write start empty: a regular file, unlike cgroupfs, keeps old bytes.
            "memory.max": "", "memory.swap.max": "", "memory.oom.group": "", "pids.max": "",
            "cpu.max": "", "cpu.weight": "", "cgroup.procs": "", "cgroup.kill": "",
            "cpu.stat": "usage_usec 1500000\nuser_usec 1000000\nsystem_usec 500000\n",
            "memory.peak": "104857600\n", "pids.peak": "7\n",
            "memory.events": "low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n", "pids.events": "max 2\n",
            "io.stat": "8:0 rbytes=4096 wbytes=8192 rios=1 wios=2\n",
            "cgroup.controllers": "cpu io memory pids", "cgroup.subtree_control": "",
        }.items():
            (path / name).write_text(text)


def test_v2_writes_every_limit_before_anything_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = _fake_v2(tmp_path)
    real_mkdir = os.mkdir

    def mkdir(path, mode=0o777):
        real_mkdir(path, mode)
        FakeDir.populate(Path(path))

    monkeypatch.setattr(os, "mkdir", mkdir)
    found = cgroups.Detected("v2", ("cpu", "io", "memory", "pids"), base=str(root / "capsule"))
    run_ = v2.V2Run.create(found, _plan(memory_bytes=64 << 20, max_pids=20, cpu_quota=0.5, cpu_shares=2048))
    path = Path(run_.path)
    assert path.parent == root / "capsule" and path.name.startswith(f"run-{os.getpid()}-")
    assert (path / "memory.max").read_text() == str(64 << 20)
    assert (path / "memory.swap.max").read_text() == "0"
    assert (path / "memory.oom.group").read_text() == "1"
    assert (path / "pids.max").read_text() == "22"  # the command's 20, plus capsule-run's A and B
    assert (path / "cpu.max").read_text() == "50000 100000"
    assert (path / "cpu.weight").read_text() == "200"
    assert (root / "cgroup.subtree_control").read_text() == "+memory +pids +cpu +io"
    run_.add_pid(4242)
    assert (path / "cgroup.procs").read_text() == "4242"
    stats = run_.stats()
    assert (stats.cpu_time_ms, stats.user_time_ms, stats.kernel_time_ms) == (1500, 1000, 500)
    assert stats.max_memory_bytes == 100 << 20 and stats.pids_peak == 5 and stats.oom_kills == 1
    assert stats.pids_limit_hit and stats.memory_limit_hit and (stats.io_bytes_read, stats.io_bytes_written) == (4096, 8192)
    assert stats.source == "cgroup-v2"
    assert run_.cpu_time_ms() == 1500
    run_.kill()
    assert (path / "cgroup.kill").read_text() == "1"


def test_v2_detection_needs_the_controllers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = _fake_v2(tmp_path)
    monkeypatch.setattr(cgroups, "_mounts", lambda: [(str(root), "cgroup2", {"rw"})])
    cgroups.detect.cache_clear()
    try:
        if ROOT:
            assert cgroups.detect().version == "v2"
        (root / "cgroup.controllers").write_text("cpu io\n")  # the hybrid case: cgroup2 without memory/pids
        cgroups.detect.cache_clear()
        assert cgroups.detect().version == "none"
    finally:
        cgroups.detect.cache_clear()


def test_cpu_weight_scale() -> None:
    assert v2.cpu_weight(1024) == 100 and v2.cpu_weight(1) == 1 and v2.cpu_weight(10000) == 977


def test_leftover_of_a_dead_supervisor_is_collected(tmp_path: Path) -> None:
    base = tmp_path / "capsule"
    base.mkdir()
    dead = base / "run-999999999-abc"  # pid beyond pid_max: its owner is gone
    dead.mkdir()
    (dead / "cgroup.procs").write_text("")
    mine = base / f"run-{os.getpid()}-abc"
    mine.mkdir()
    # rmdir of a fake group fails on its files: empty it as the kernel's rmdir would.
    (dead / "cgroup.procs").unlink()
    removed = v2._clean(str(base))
    assert removed == [str(dead)] and mine.exists()


# ------------------------------------------------------------------ real limits on this host


@pytest.fixture
def real_cgroup(sandbox: None) -> str:
    version = cgroup_version()
    if version == "none":
        if not ROOT:
            pytest.skip("no cgroup for an unprivileged user here (no delegated v2 subtree)")
        pytest.fail("running as root, but no cgroup backend was detected")
    return version


def test_memory_limit_is_an_oom_kill(real_cgroup: str) -> None:
    doc = run({"command": ["python3", "-c", "x = bytearray(200 * 1024 * 1024)"],
               "resources": {"memory_bytes": 64 << 20}})
    assert doc["status"] == "killed" and doc["error"]["code"] == "E4001" and doc["_exit"] == 137
    assert "memory" in doc["limits_hit"] and doc["metrics"]["oom_kills"] >= 1
    assert 48 << 20 <= doc["metrics"]["max_memory_bytes"] <= 72 << 20, doc["metrics"]
    assert doc["error"]["details"]["memory_bytes"] == 64 << 20


def test_a_limit_too_small_for_the_sandbox_itself_is_still_e4001(real_cgroup: str) -> None:
    doc = run({"command": ["true"], "resources": {"memory_bytes": 1 << 20}})
    assert doc["status"] == "killed" and doc["error"]["code"] == "E4001" and doc["_exit"] == 137, doc
    assert "before the command started" in doc["error"]["message"]


def test_peak_memory_counts_a_large_allocation(real_cgroup: str) -> None:
    doc = run({"command": ["python3", "-c", "x = bytearray(100 * 1024 * 1024); print(len(x))"]})
    assert doc["status"] == "success" and doc["metrics"]["max_memory_bytes"] >= 100 * 1024 * 1024


def _host_process_count() -> int:
    return sum(1 for p in os.listdir("/proc") if p.isdigit())


def test_fork_bomb_is_contained(real_cgroup: str) -> None:
    before = _host_process_count()
    bomb = "import os, time\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        time.sleep(0.01)\n"
    doc = run({"command": ["python3", "-c", bomb], "timeout_ms": 2000, "resources": {"max_pids": 20}})
    assert doc["status"] == "timeout" and doc["error"]["code"] == "E3001"
    assert "pids" in doc["limits_hit"], doc["limits_hit"]
    assert doc["metrics"]["pids_peak"] is None or doc["metrics"]["pids_peak"] <= 20
    time.sleep(0.2)
    assert _host_process_count() <= before + 5


def _busy(seconds: float) -> str:
    return f"import time\nt = time.process_time()\nwhile time.process_time() - t < {seconds}: pass\n"


def test_cpu_time_of_a_busy_second(real_cgroup: str) -> None:
    doc = run({"command": ["python3", "-c", _busy(1.0)]})
    assert doc["status"] == "success"
    assert 950 <= doc["metrics"]["cpu_time_ms"] <= 1150, doc["metrics"]


def test_cpu_time_covers_every_child(real_cgroup: str) -> None:
    script = ("import os\n" + _busy(0.0) + "for _ in range(4):\n    if os.fork() == 0:\n"
              "        t = time.process_time()\n        while time.process_time() - t < 0.5: pass\n        os._exit(0)\n"
              "for _ in range(4): os.wait()\n")
    doc = run({"command": ["python3", "-c", script], "resources": {"cpu_quota": 2.0}})
    assert doc["status"] == "success", doc
    assert doc["metrics"]["cpu_time_ms"] >= 1900, doc["metrics"]


def test_cpu_quota_slows_a_busy_loop(real_cgroup: str) -> None:
    doc = run({"command": ["python3", "-c", _busy(1.0)], "resources": {"cpu_quota": 0.5}})
    assert doc["status"] == "success"
    # Half a core: a second of CPU cannot take less than ~2 s of wall time. (Only the lower
    # bound is asserted: it fails without the quota, and a busy host cannot make it flake.)
    assert doc["metrics"]["wall_time_ms"] >= 1.7 * min(doc["metrics"]["cpu_time_ms"], 1000), doc["metrics"]


def test_cpu_time_limit_is_e3002(real_cgroup: str) -> None:
    doc = run({"command": ["python3", "-c", "while True: pass"], "resources": {"cpu_time_ms": 500}, "timeout_ms": 10000})
    assert doc["status"] == "timeout" and doc["error"]["code"] == "E3002" and doc["_exit"] == 124
    assert "cpu_time" in doc["limits_hit"] and doc["metrics"]["cpu_time_ms"] >= 500


def test_one_pid_is_enough_for_one_process(real_cgroup: str) -> None:
    doc = run({"command": ["true"], "resources": {"max_pids": 1}})
    assert doc["status"] == "success" and doc["limits_hit"] == []
    assert doc["metrics"]["pids_peak"] in (None, 1)
    doc = run({"command": ["sh", "-c", "true & wait"], "resources": {"max_pids": 1}})
    assert "pids" in doc["limits_hit"]


def test_metrics_source_and_isolation_say_cgroup(real_cgroup: str) -> None:
    doc = run({"command": ["true"]})
    assert doc["metrics"]["source"] == f"cgroup-{real_cgroup}" and doc["isolation"]["cgroup"] == real_cgroup
    assert doc["metrics"]["pids_peak"] is None or doc["metrics"]["pids_peak"] >= 1


def _leftover_groups() -> list[str]:
    found = cgroups.detect()
    roots = [found.base] if found.version == "v2" else [os.path.join(r, "capsule") for r in found.v1_roots.values()]
    return [n for r in roots if os.path.isdir(r) for n in os.listdir(r) if n.startswith("run-")]


def test_no_cgroup_is_left_after_many_endings(real_cgroup: str) -> None:
    requests = [
        {"command": ["python3", "-c", "x = bytearray(100 << 20)"], "resources": {"memory_bytes": 32 << 20}},
        {"command": ["sleep", "5"], "timeout_ms": 50},
        {"command": ["true"]},
        {"command": ["sh", "-c", "exit 3"]},
    ]
    endings = set()
    for i in range(100):
        doc = run(requests[i % len(requests)])
        endings.add(doc["status"])
    assert endings == {"killed", "timeout", "success"}
    assert _leftover_groups() == []


def test_file_size_limit_is_e4004(sandbox: None) -> None:
    doc = run({"command": ["dd", "if=/dev/zero", "of=big", "bs=100000", "count=20"],
               "resources": {"max_file_bytes": 1000000}})
    assert doc["status"] == "killed" and doc["error"]["code"] == "E4004" and "file_size" in doc["limits_hit"]
    assert doc["signal"] == "SIGXFSZ" and doc["_exit"] == 128 + 25


def test_file_size_limit_survived_is_still_reported(sandbox: None) -> None:
    # Python ignores SIGXFSZ: the write fails with EFBIG and the command goes on.
    script = "try:\n    open('big', 'wb').write(b'0' * 2000000)\nexcept OSError as e:\n    print(e.errno)\n"
    doc = run({"command": ["python3", "-c", script], "resources": {"max_file_bytes": 1000000}})
    assert doc["status"] == "success" and doc["stdout"] == "27\n" and "file_size" in doc["limits_hit"]


def test_open_files_limit(sandbox: None) -> None:
    doc = run({"command": ["sh", "-c", "ulimit -n; ulimit -c"], "resources": {"max_open_files": 64}})
    assert doc["stdout"].split() == ["64", "0"]


def test_strict_profile_fails_without_cgroup_when_degrading_is_not_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cgroups, "detect", lambda: cgroups.Detected("none", fix="x"))
    doc = run({"command": ["true"], "profile": "strict"})
    assert doc["status"] == "error" and doc["error"]["code"] == "E2009" and doc["_exit"] == 125
    doc = run({"command": ["true"]})
    assert doc["status"] == "success" and doc["isolation"]["cgroup"] == "none"
    assert any("degraded" in w for w in doc["warnings"]) and doc["metrics"]["source"] == "rusage"
