"""Real sandboxes, black-box: a request that tries one thing, a hard assertion on the answer.

Each assertion fails if the layer it checks is missing. Runs as root and, in CI, again as an
unprivileged user (make test does both).
"""

from __future__ import annotations

import base64
import json
import os
import time
import uuid

import pytest
from conftest import ROOT, cli, run, sh

pytestmark = [pytest.mark.sandbox, pytest.mark.usefixtures("sandbox")]


def test_echo_succeeds_with_full_isolation_report() -> None:
    doc = run({"command": ["echo", "hi"]})
    assert doc["status"] == "success" and doc["exit_code"] == 0 and doc["stdout"] == "hi\n"
    iso = doc["isolation"]
    for ns in ("user_ns", "pid_ns", "mount_ns", "net_ns", "ipc_ns", "uts_ns", "cgroup_ns"):
        assert iso[ns] is True, ns
    assert iso["root"] == "pivot_root" and iso["rootless"] is (not ROOT)
    assert iso["no_new_privs"] is True and iso["capabilities"] == "none"
    assert doc["metrics"]["setup_time_ms"] >= 0 and doc["metrics"]["source"] in ("rusage", "cgroup-v1", "cgroup-v2")
    assert doc["_exit"] == 0


def test_exit_code_is_passed_through() -> None:
    doc = sh("exit 7")
    assert doc["status"] == "success" and doc["exit_code"] == 7 and doc["_exit"] == 7


def test_host_environment_does_not_leak(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CAPSULE_TEST_SECRET", "hunter2")
    doc = run({"command": ["env"], "environment": {"MINE": "yes"}})
    assert "hunter2" not in doc["stdout"] and "CAPSULE_TEST_SECRET" not in doc["stdout"]
    env = dict(line.split("=", 1) for line in doc["stdout"].splitlines())
    assert env["MINE"] == "yes" and env["PATH"] == "/usr/local/bin:/usr/bin:/bin" and env["HOME"] == "/tmp"
    assert set(env) <= {"MINE", "PATH", "HOME", "LANG", "TMPDIR", "USER", "PWD", "SHLVL", "_"}


def test_only_stdio_is_open() -> None:
    doc = run({"command": ["ls", "/proc/self/fd"]})
    # ls itself opens one fd for the directory it lists.
    fds = sorted(int(x) for x in doc["stdout"].split())
    assert fds[:3] == [0, 1, 2] and len(fds) <= 4, fds


def test_pid_namespace_hides_the_host() -> None:
    doc = sh("echo $$; ls /proc | grep -c '^[0-9]'")
    own_pid, visible = (int(x) for x in doc["stdout"].split())
    assert own_pid <= 3, own_pid  # PID 1 is the sandbox's init
    assert visible <= 4, visible  # init, sh, ls, grep


def test_ps_sees_only_the_sandbox() -> None:
    doc = run({"command": ["ps", "-e", "-o", "pid=,comm="]})
    if doc.get("error", {}).get("code") == "E3003":
        pytest.skip("procps is not installed")
    lines = doc["stdout"].splitlines()
    assert len(lines) <= 3, lines
    assert all(int(line.split()[0]) < 10 for line in lines)


@pytest.mark.parametrize("path", ["/etc/shadow", "/root", "/home", "/var/lib/capsule-run", "/sys/kernel"])
def test_secrets_are_not_reachable(path: str) -> None:
    doc = sh(f"ls -la {path} 2>&1 || cat {path} 2>&1; echo status=$?")
    assert doc["status"] == "success"
    assert "No such file" in doc["stdout"], doc["stdout"]


def test_capsule_state_dir_is_not_reachable() -> None:
    state = os.environ["CAPSULE_STATE_DIR"]
    doc = sh(f"ls {state} 2>&1; echo rc=$?")
    assert "rc=0" not in doc["stdout"]


@pytest.mark.parametrize("path", ["/usr/evil", "/etc/evil", "/evil", "/bin/evil", "/proc/evil", "/dev/evil"])
def test_writing_outside_workdir_and_tmp_fails(path: str) -> None:
    doc = sh(f"echo x > {path} 2>&1; echo rc=$?")
    assert "rc=0" not in doc["stdout"], doc["stdout"]
    assert not os.path.exists(path)


def test_workdir_and_tmp_are_writable() -> None:
    doc = sh("pwd; echo a > f && cat f; echo b > /tmp/g && cat /tmp/g")
    assert doc["stdout"] == "/workspace\na\nb\n"


def test_only_loopback_and_no_route_out() -> None:
    doc = sh("cat /proc/net/dev | tail -n +3 | cut -d: -f1 | tr -d ' '")
    assert doc["stdout"].split() == ["lo"]
    script = (
        "import socket\n"
        "s = socket.socket(); s.settimeout(2)\n"
        "try:\n    s.connect(('1.1.1.1', 80)); print('connected')\n"
        "except OSError as e:\n    print('refused', e.errno)\n"
        "u = socket.socket(); u.bind(('127.0.0.1', 0)); u.listen(); print('lo ok')\n"
    )
    doc = run({"command": ["python3", "-c", script]})
    assert "connected" not in doc["stdout"] and "refused 101" in doc["stdout"] and "lo ok" in doc["stdout"], doc


def test_hostname_is_the_sandboxes() -> None:
    assert sh("hostname")["stdout"] == "capsule\n"
    assert run({"command": ["hostname"], "isolation": {"hostname": "box-1"}})["stdout"] == "box-1\n"


def test_stdin_is_empty_unless_given() -> None:
    assert run({"command": ["cat"]})["stdout"] == ""
    assert run({"command": ["cat"], "stdin": "hello"})["stdout"] == "hello"
    data = bytes(range(256)) * 1000
    doc = run({"command": ["sh", "-c", "wc -c"], "stdin": {"base64": base64.b64encode(data).decode()}})
    assert doc["stdout"].strip() == str(len(data))


def _alive_with(marker: str) -> list[int]:
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as fh:
                    if marker.encode() in fh.read():
                        found.append(int(pid))
            except OSError:
                pass
    return found


def test_timeout_kills_background_jobs_and_keeps_output() -> None:
    marker = str(700000 + os.getpid() % 99999)
    doc = sh(f"echo started; sleep {marker} & sleep {marker}; echo never", timeout_ms=500)
    assert doc["status"] == "timeout" and doc["error"]["code"] == "E3001" and doc["_exit"] == 124
    assert "wall_time" in doc["limits_hit"]
    assert doc["stdout"] == "started\n"
    assert doc["error"]["details"]["timeout_ms"] == 500 and doc["error"]["details"]["elapsed_ms"] >= 500
    assert _alive_with(marker) == []


def test_command_exit_kills_what_it_left_running() -> None:
    marker = str(800000 + os.getpid() % 99999)
    doc = sh(f"sleep {marker} & echo done")
    assert doc["status"] == "success" and doc["stdout"] == "done\n"
    assert _alive_with(marker) == []


def test_output_cap_stops_yes() -> None:
    doc = run({"command": ["yes"], "resources": {"max_output_bytes": 1024}})
    assert doc["status"] == "killed" and doc["error"]["code"] == "E4003"
    assert len(doc["stdout"]) == 1024 and doc["stdout_truncated"] is True and doc["stdout_bytes"] > 1024
    assert "output" in doc["limits_hit"] and doc["_exit"] == 137


def test_both_streams_captured_separately() -> None:
    doc = sh("echo out; echo err >&2")
    assert doc["stdout"] == "out\n" and doc["stderr"] == "err\n"
    assert doc["stdout_bytes"] == 4 and doc["stderr_truncated"] is False


def test_command_not_found_and_not_executable() -> None:
    doc = run({"command": ["no-such-command"]})
    assert doc["status"] == "error" and doc["error"]["code"] == "E3003" and doc["_exit"] == 127
    assert doc["error"]["details"]["reason"] == "not found"
    doc = run({"command": ["./x"], "files": [{"path": "x", "content": "data", "mode": "0644"}]})
    assert doc["error"]["code"] == "E3003" and doc["_exit"] == 126


def test_signal_death_is_e3004() -> None:
    doc = sh("kill -SEGV $$")
    assert doc["status"] == "killed" and doc["signal"] == "SIGSEGV" and doc["error"]["code"] == "E3004"
    assert doc["_exit"] == 128 + 11


def test_files_in_and_collect_out() -> None:
    doc = run({
        "command": ["sh", "-c", "cat in/a.txt; mkdir -p out/deep; echo r > out/deep/r.csv; ln -s /etc/passwd out/l.csv; ./run.sh"],
        "files": [{"path": "in/a.txt", "content": "hello\n"},
                  {"path": "run.sh", "content": "#!/bin/sh\necho ran\n", "mode": "0755"}],
        "collect": ["out/**/*.csv", "*.sh"],
    })
    assert doc["stdout"] == "hello\nran\n"
    files = {f["path"]: f for f in doc["files"]}
    assert set(files) == {"out/deep/r.csv", "run.sh"}  # the symlink is never followed
    assert base64.b64decode(files["out/deep/r.csv"]["content_base64"]) == b"r\n"


def test_collected_name_that_is_not_utf8_still_gives_valid_json() -> None:
    status, docs, _ = cli(json.dumps({"command": ["sh", "-c", "touch \"$(printf '\\377x.txt')\""],
                                      "collect": ["*.txt"]}).encode())
    assert status == 0 and docs[0]["files"][0]["path"] == "\ufffdx.txt"


def test_unicode_line_separators_in_output_do_not_split_json_lines() -> None:
    status, docs, _ = cli(json.dumps({"command": ["printf", "a\u2028b\u0085c\u2029d"]}).encode(), "--stream")
    assert status == 0 and docs[-1]["event"] == "result" and docs[-1]["stdout"] == "a\u2028b\u0085c\u2029d"


def test_open_files_limit_leaves_the_sandbox_able_to_start() -> None:
    # Three fds: the sandbox still starts the command (the limit is set last); the dynamic
    # loader then has no fd left for libc, which is the command's own business.
    doc = run({"command": ["sh", "-c", "ulimit -n"], "resources": {"max_open_files": 3}})
    assert doc["status"] == "success" and doc["exit_code"] == 127 and "libc" in doc["stderr"], doc
    doc = run({"command": ["sh", "-c", "ulimit -n"], "resources": {"max_open_files": 8}})
    assert doc["status"] == "success" and doc["stdout"] == "8\n", doc


def test_request_files_larger_than_max_file_bytes_are_not_a_limit_hit() -> None:
    doc = run({"command": ["wc", "-c", "a"], "files": [{"path": "a", "content": "x" * 1000}],
               "resources": {"max_file_bytes": 10}})
    assert doc["stdout"] == "1000 a\n" and doc["limits_hit"] == []


def test_collect_respects_the_byte_budget(tmp_path) -> None:
    (tmp_path / "small.toml").write_text('extends = "default"\n[policy]\nmax_collect_bytes = 10\n')
    doc = run({"command": ["sh", "-c", "head -c 100 /dev/zero > a.bin"], "collect": ["*.bin"]}, profile="small", config=str(tmp_path))
    assert doc["files"][0]["size"] == 100 and doc["files"][0]["truncated"] is True
    assert len(base64.b64decode(doc["files"][0]["content_base64"])) == 10


def test_readonly_bind_and_writable_bind(tmp_path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "in.txt").write_text("input")
    os.chmod(tmp_path, 0o755)
    os.chmod(data, 0o777)
    doc = run({"command": ["sh", "-c", "cat /data/in.txt; echo x > /data/new 2>&1 || echo ro"],
               "isolation": {"bind_mounts": [{"source": str(data), "destination": "/data"}]}})
    assert doc["stdout"] == "input" + "ro\n" and not (data / "new").exists()
    (tmp_path / "rw.toml").write_text(f'extends = "default"\n[policy]\nwritable_paths = ["{tmp_path}"]\n')
    doc = run({"command": ["sh", "-c", "echo out > /data/new && echo ok"],
               "isolation": {"bind_mounts": [{"source": str(data), "destination": "/data", "readonly": False}]}},
              profile="rw", config=str(tmp_path))
    assert doc["stdout"] == "ok\n" and (data / "new").read_text() == "out\n"


def test_busy_session_waits_then_times_out() -> None:
    import fcntl

    from capsule import state

    name = f"busy-{uuid.uuid4().hex[:8]}"
    assert run({"command": ["true"], "session": name})["status"] == "success"
    with open(os.path.join(state.sessions_dir(), f"{name}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another run of the session holds it
        doc = run({"command": ["true"], "session": name, "timeout_ms": 300})
        status, docs, _ = cli(b"", "sessions", "rm", name)  # in use: refused, not deleted under the run
        assert status == 125 and docs[0]["error"]["code"] == "E6001"
    assert doc["status"] == "timeout" and doc["error"]["code"] == "E3001" and doc["limits_hit"] == ["wall_time"]
    assert doc["_exit"] == 124


def test_sessions_keep_files_between_runs() -> None:
    name = f"s-{uuid.uuid4().hex[:8]}"
    assert run({"command": ["sh", "-c", "echo 1 > state"], "session": name})["status"] == "success"
    assert run({"command": ["cat", "state"], "session": name})["stdout"] == "1\n"
    status, docs, _ = cli(b"", "sessions", "list")
    assert name in docs[0]["sessions"]
    status, docs, _ = cli(b"", "sessions", "rm", name)
    assert docs[0]["removed"] is True


def test_cli_end_to_end_and_exit_status() -> None:
    status, docs, _ = cli(json.dumps({"command": ["sh", "-c", "exit 3"]}).encode())
    assert status == 3 and docs[0]["status"] == "success"
    status, docs, _ = cli(json.dumps({"command": ["sleep", "5"], "timeout_ms": 200}).encode())
    assert status == 124 and docs[0]["status"] == "timeout"


def test_pretty_and_request_file(tmp_path) -> None:
    path = tmp_path / "req.json"
    path.write_text(json.dumps({"command": ["echo", "x"]}))
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "capsule", "--pretty", "--request", str(path)], capture_output=True)
    assert proc.returncode == 0 and proc.stdout.startswith(b"{\n  ") and json.loads(proc.stdout)["stdout"] == "x\n"


def test_stream_mode_emits_events_then_result() -> None:
    status, docs, _ = cli(json.dumps({"command": ["sh", "-c", "echo a; echo b >&2"]}).encode(), "--stream")
    events = [d["event"] for d in docs]
    assert events[0] == "started" and events[-1] == "result" and {"stdout", "stderr"} <= set(events)
    assert docs[-1]["stdout"] == "a\n" and status == 0


def test_batch_mode_answers_each_line_in_order() -> None:
    lines = [json.dumps({"command": ["echo", str(i)], "execution_id": f"b{i}"}) for i in range(3)]
    status, docs, _ = cli(("\n".join(lines[:2]) + "\nnot json\n" + lines[2] + "\n").encode(), "batch")
    assert [d["execution_id"] for d in docs[:2]] == ["b0", "b1"] and docs[3]["execution_id"] == "b2"
    assert docs[2]["error"]["code"] == "E1001" and docs[3]["stdout"] == "2\n"


def _mounts() -> str:
    with open("/proc/self/mountinfo") as fh:
        return "".join(sorted(fh))


def test_nothing_left_behind() -> None:
    before_mounts, before_tmp = _mounts(), sorted(os.listdir("/tmp"))
    children_before = set(_children())
    for req in ({"command": ["true"]}, {"command": ["sleep", "9"], "timeout_ms": 100},
                {"command": ["yes"], "resources": {"max_output_bytes": 10}}, {"command": ["nope"]}):
        run(req)
    time.sleep(0.1)
    assert _mounts() == before_mounts
    assert sorted(os.listdir("/tmp")) == before_tmp
    assert set(_children()) == children_before


def _children() -> list[int]:
    me = str(os.getpid())
    out = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/stat") as fh:
                    if fh.read().rsplit(")", 1)[1].split()[1] == me:
                        out.append(int(pid))
            except OSError:
                pass
    return out


def test_check_reports_the_host() -> None:
    status, docs, _ = cli(b"", "check")
    doc = docs[0]
    assert status == 0 and doc["user_namespaces"]["ok"] is True and doc["pivot_root"] is True
    assert doc["root"] is ROOT and doc["profiles"]["default"]["runs"] is True
    assert doc["cgroup"]["version"] in ("v1", "v2", "none")


def test_root_inside_only_where_the_profile_asks(tmp_path) -> None:
    assert run({"command": ["id", "-u"]})["stdout"] == "1000\n"
    (tmp_path / "rootish.toml").write_text('extends = "default"\n[policy]\nuser = "root"\n')
    doc = run({"command": ["sh", "-c", "id -u; grep CapEff /proc/self/status; echo x > /etc/x 2>&1 || echo ro"]},
              profile="rootish", config=str(tmp_path))
    assert doc["stdout"].splitlines() == ["0", "CapEff:\t0000000000000000", "ro"], doc["stdout"]
    assert doc["isolation"]["capabilities"] == "none"


def test_network_only_where_the_profile_grants_it(tmp_path) -> None:
    (tmp_path / "net.toml").write_text('extends = "default"\n[policy]\nnetwork = true\n')
    doc = run({"command": ["sh", "-c", "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '"],
               "isolation": {"network": True}}, profile="net", config=str(tmp_path))
    with open("/proc/net/dev") as fh:
        host = sorted(line.split(":")[0].strip() for line in fh.readlines()[2:])
    assert sorted(doc["stdout"].split()) == host and doc["isolation"]["net_ns"] is False


def test_bind_source_swapped_for_a_symlink_after_planning_is_refused(tmp_path) -> None:
    """The plan resolves a source; if a component becomes a symlink before the mount (a swap),
    the mount is refused instead of following it."""
    import dataclasses
    import time as _time

    from capsule import profiles, validation
    from capsule.models import utc_now
    from capsule.plan import build_plan
    from capsule.supervisor import Run

    real = tmp_path / "real"
    real.mkdir()
    os.chmod(tmp_path, 0o755)
    req = validation.validate({"command": ["ls", "/data"],
                               "isolation": {"bind_mounts": [{"source": str(real), "destination": "/data"}]}})
    prof = profiles.load_profile("default")
    plan = build_plan(req, prof, profiles.effective_limits(req, prof))
    swapped = tmp_path / "swapped"
    swapped.symlink_to("/usr")  # what an attacker would put in place of the checked directory
    mounts = tuple(dataclasses.replace(m, source=str(swapped)) if m.target == "/data" else m for m in plan.mounts)
    resp = Run(dataclasses.replace(plan, mounts=mounts), started=utc_now(), t0=_time.monotonic()).execute()
    assert resp.status == "error" and resp.error is not None and resp.error["code"] == "E2004", resp.to_dict()
    assert "symlink" in resp.error["message"] or "Too many levels" in resp.error["message"]
