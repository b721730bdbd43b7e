"""Hostile commands: each ends with the right status within its timeout plus a small grace,
and leaves nothing behind."""

from __future__ import annotations

import os
import time

import pytest
from conftest import run, sh
from test_sandbox import _alive_with, _children

pytestmark = [pytest.mark.sandbox, pytest.mark.usefixtures("sandbox")]

GRACE_S = 5.0  # stop grace (2 s) plus setup and collection, generously; not a speed assertion


def timed(request: dict) -> tuple[dict, float]:
    t = time.monotonic()
    doc = run(request)
    return doc, time.monotonic() - t


def marker() -> str:
    return str(600000 + (os.getpid() * 7 + time.monotonic_ns()) % 99999)


def test_output_flood_on_both_streams() -> None:
    doc, took = timed({"command": ["sh", "-c", "yes out & yes err >&2; wait"], "resources": {"max_output_bytes": 65536},
                       "timeout_ms": 10000})
    assert doc["status"] == "killed" and doc["error"]["code"] == "E4003" and took < 10 + GRACE_S
    assert len(doc["stdout"]) <= 65536 and len(doc["stderr"]) <= 65536
    assert doc["stdout_truncated"] or doc["stderr_truncated"]


def test_closed_stdout_then_running_on_hits_the_timeout() -> None:
    m = marker()
    doc, took = timed({"command": ["sh", "-c", f"echo before; exec >&- 2>&-; sleep {m}"], "timeout_ms": 500})
    assert doc["status"] == "timeout" and doc["stdout"] == "before\n" and took < 0.5 + GRACE_S
    assert _alive_with(m) == []


def test_setsid_double_fork_does_not_escape() -> None:
    m = marker()
    doc = sh(f"setsid sh -c 'sleep {m} & sleep {m} &' ; echo parent-done")
    assert doc["status"] == "success" and doc["stdout"] == "parent-done\n"
    time.sleep(0.1)
    assert _alive_with(m) == []


def test_sigterm_ignoring_command_is_still_stopped() -> None:
    m = marker()
    doc, took = timed({"command": ["sh", "-c", f"trap '' TERM INT HUP; sleep {m}"], "timeout_ms": 300})
    assert doc["status"] == "timeout" and took < 0.3 + GRACE_S
    assert _alive_with(m) == []


def test_stopped_process_tree_at_timeout() -> None:
    m = marker()
    doc, took = timed({"command": ["sh", "-c", f"sleep {m} & kill -STOP $!; kill -STOP $$"], "timeout_ms": 300})
    assert doc["status"] == "timeout" and doc["error"]["code"] == "E3001" and took < 0.3 + GRACE_S
    assert _alive_with(m) == []


def test_filling_the_tmpfs_is_enospc_not_host_damage() -> None:
    doc = run({"command": ["sh", "-c", "head -c 100000000 /dev/zero > /tmp/fill; echo rc=$?; df -k /tmp | tail -1"],
               "resources": {"tmpfs_bytes": 8 << 20}})
    assert doc["status"] == "success" and "rc=1" in doc["stdout"]
    assert "No space left" in doc["stderr"]


def test_a_million_small_files_run_out_of_inodes() -> None:
    script = ("import os\nn = 0\ntry:\n    for n in range(1000000):\n        open(f'/tmp/f{n}', 'w').close()\n"
              "except OSError as e:\n    print('stopped', e.errno)\nelse:\n    print('all')\n")
    doc, took = timed({"command": ["python3", "-c", script], "timeout_ms": 20000})
    assert doc["status"] == "success" and doc["stdout"].startswith("stopped 28"), doc  # ENOSPC: nr_inodes
    assert took < 20 + GRACE_S


def test_huge_argv_is_refused_cleanly() -> None:
    doc = run({"command": ["true", *(["x" * 4096] * 999)]})
    # 4 MB of argv passes validation (1000 x 4096) but not the kernel's ARG_MAX: E3003, no crash.
    assert doc["status"] in ("error", "success")
    if doc["status"] == "error":
        assert doc["error"]["code"] == "E3003" and doc["error"]["details"]["errno"] == 7  # E2BIG


def test_huge_environment_is_refused_cleanly() -> None:
    env = {f"V{i}": "y" * 4096 for i in range(100)}
    doc = run({"command": ["sh", "-c", "echo ${#V99}"], "environment": env})
    assert doc["status"] == "success" and doc["stdout"] == "4096\n"


def test_planted_symlink_cannot_redirect_request_files() -> None:
    import uuid

    session = f"plant-{uuid.uuid4().hex[:8]}"
    sh("mkdir -p /tmp/x; ln -s /etc d; ln -s /etc/passwd f", session=session)
    doc = run({"command": ["true"], "session": session, "files": [{"path": "d/evil", "content": "x"}]})
    assert doc["status"] == "error" and doc["error"]["code"] == "E1003"
    doc = run({"command": ["cat", "/etc/passwd"], "session": session, "files": [{"path": "f", "content": "x"}]})
    assert doc["status"] == "error" and doc["error"]["code"] == "E6001"  # O_NOFOLLOW: ELOOP


def test_collect_never_follows_a_planted_symlink() -> None:
    doc = sh("ln -s /proc/1/environ env.txt; ln -s /etc out; echo ok > real.txt", collect=["*.txt", "out/*"])
    assert [f["path"] for f in doc["files"]] == ["real.txt"]


def test_nothing_left_after_hostile_runs() -> None:
    before = set(_children())
    for req in ({"command": ["sh", "-c", "yes & yes >&2 & sleep 9"], "timeout_ms": 200},
                {"command": ["sh", "-c", "trap '' TERM; kill -STOP $$"], "timeout_ms": 200}):
        run(req)
    time.sleep(0.1)
    assert set(_children()) == before
