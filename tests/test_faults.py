"""Faults around the sandbox: capsule-run killed mid-run, unusable state, vanishing profiles,
a cgroup that cannot be made."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import CLI, cgroup_version, cli, run
from test_hostile import marker
from test_sandbox import _alive_with

from capsule import cgroups

pytestmark = pytest.mark.usefixtures("sandbox")


def _groups_of(pid: int) -> list[str]:
    found = cgroups.detect()
    roots = [found.base] if found.version == "v2" else [os.path.join(r, "capsule") for r in found.v1_roots.values()]
    return [n for r in roots if os.path.isdir(r) for n in os.listdir(r) if n.startswith(f"run-{pid}-")]


def test_sigkill_of_capsule_run_takes_the_sandbox_down_and_is_cleaned() -> None:
    m = marker()
    proc = subprocess.Popen([*CLI], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdin is not None
    proc.stdin.write(json.dumps({"command": ["sh", "-c", f"sleep {m} & sleep {m}"], "timeout_ms": 60000}).encode())
    proc.stdin.close()
    try:
        deadline = time.monotonic() + 20
        while len(_alive_with(m)) < 3 and time.monotonic() < deadline:  # sh and its two sleeps
            time.sleep(0.02)
        assert len(_alive_with(m)) == 3, f"the sandbox never started: {_alive_with(m)}"
    finally:
        proc.kill()
        proc.wait()
    gone_by = time.monotonic() + 1.0  # parent-death signals chain supervisor -> A -> B (PID 1)
    while _alive_with(m) and time.monotonic() < gone_by:
        time.sleep(0.02)
    assert _alive_with(m) == [], "sandbox processes outlived capsule-run by more than a second"
    if cgroup_version() != "none":
        run({"command": ["true"]})  # the next run collects what the killed one left
        assert _groups_of(proc.pid) == []


def test_sigterm_to_capsule_run_stops_the_sandbox_and_still_answers() -> None:
    m = marker()
    proc = subprocess.Popen([*CLI], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(json.dumps({"command": ["sleep", m], "timeout_ms": 60000}).encode())
    proc.stdin.close()
    try:
        deadline = time.monotonic() + 20
        while not _alive_with(m) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert _alive_with(m), "the sandbox never started"
        proc.send_signal(signal.SIGTERM)
        out = proc.stdout.read()
        proc.wait(timeout=10)
    finally:
        proc.kill()
    docs = [json.loads(line) for line in out.decode().splitlines()]
    assert len(docs) == 1 and docs[0]["error"]["code"] == "E6002" and proc.returncode == 143
    assert _alive_with(m) == [] and _groups_of(proc.pid) == []


def test_check_clean_collects_leftovers() -> None:
    if cgroup_version() == "none":
        pytest.skip("no cgroup for an unprivileged user here: nothing to collect")
    found = cgroups.detect()
    dead = "run-999999999-feedface0000"
    made = []
    roots = [found.base] if found.version == "v2" else [os.path.join(r, "capsule") for r in found.v1_roots.values()]
    for root in roots:
        os.makedirs(root, exist_ok=True)
        if not os.path.isdir(os.path.join(root, dead)):
            os.mkdir(os.path.join(root, dead))
            made.append(root)
    status, docs, _ = cli(b"", "check", "--clean")
    assert status == 0 and dead in " ".join(docs[0]["cleaned"])
    assert not any(os.path.isdir(os.path.join(r, dead)) for r in roots)


def test_unusable_state_dir_is_e6001(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CAPSULE_STATE_DIR", "/dev/null/state")
    doc = run({"command": ["true"], "session": "s1"})
    assert doc["status"] == "error" and doc["error"]["code"] == "E6001" and doc["_exit"] == 125
    assert "Not a directory" in doc["error"]["message"]
    assert run({"command": ["true"]})["status"] == "success"  # no session: no state needed


def test_full_state_dir_is_e6001(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a tiny tmpfs as a full state directory")
    full = tmp_path / "full"
    full.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4k,nr_inodes=1", "tmpfs", str(full)], check=True)
    try:
        monkeypatch.setenv("CAPSULE_STATE_DIR", str(full))
        doc = run({"command": ["true"], "session": "s1"})
        assert doc["status"] == "error" and doc["error"]["code"] == "E6001", doc
        assert "No space left" in doc["error"]["message"]
    finally:
        subprocess.run(["umount", str(full)], check=True)


def test_profile_that_vanishes_or_breaks_between_runs(tmp_path: Path) -> None:
    prof = tmp_path / "mine.toml"
    prof.write_text('extends = "default"\n[defaults]\ntimeout_ms = 5000\n')
    assert run({"command": ["true"], "profile": "mine"}, config=str(tmp_path))["status"] == "success"
    prof.write_text('extends = "default"\n[defaults\n')
    doc = run({"command": ["true"], "profile": "mine"}, config=str(tmp_path))
    assert doc["error"]["code"] == "E1005" and doc["error"]["details"]["line"] == 2
    prof.unlink()
    doc = run({"command": ["true"], "profile": "mine"}, config=str(tmp_path))
    assert doc["error"]["code"] == "E1004"


def test_cgroup_that_cannot_be_created_is_e2002_and_nothing_runs(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    flag = tmp_path / "ran"
    monkeypatch.setattr(cgroups, "detect", lambda: cgroups.Detected("v2", ("memory", "pids", "cpu"),
                                                                     base="/proc/no-such-dir/capsule"))
    doc = run({"command": ["sh", "-c", f"touch {flag}"]})
    assert doc["status"] == "error" and doc["error"]["code"] == "E2002" and doc["_exit"] == 125
    assert not flag.exists() and "stdout" not in doc
