"""The protocol's front door: every input, however broken, gets one JSON response."""

from __future__ import annotations

import json

import pytest
from conftest import cli

from capsule import validation
from capsule.errors import CapsuleError

MALFORMED: list[tuple[str, bytes, str, str | None]] = [
    ("empty stdin", b"", "E1001", None),
    ("whitespace only", b"  \n\t ", "E1001", None),
    ("binary garbage", bytes(range(256)) * 4, "E1001", None),
    ("invalid utf-8", b'{"command": ["\xff\xfe"]}', "E1001", None),
    ("truncated json", b'{"command": ["ls"', "E1001", None),
    ("top-level array", b'[{"command": ["ls"]}]', "E1001", None),
    ("top-level string", b'"ls"', "E1001", None),
    ("top-level null", b"null", "E1001", None),
    ("NaN", b'{"command": ["ls"], "timeout_ms": NaN}', "E1001", None),
    ("deep nesting", b'{"command": ["ls"], "environment": ' + b"[" * 100000 + b"]" * 100000 + b"}", "E1001", None),
    ("missing command", b"{}", "E1002", "command"),
    ("unknown field", b'{"command": ["ls"], "comand": 1}', "E1002", "comand"),
    ("unknown nested field", b'{"command": ["ls"], "resources": {"memory": 5}}', "E1002", "resources.memory"),
    ("command not a list", b'{"command": "ls"}', "E1002", "command"),
    ("empty command", b'{"command": []}', "E1002", "command"),
    ("empty argv item", b'{"command": ["ls", ""]}', "E1002", "command[1]"),
    ("NUL in argv", b'{"command": ["ls", "a\\u0000b"]}', "E1002", "command[1]"),
    ("argv item not string", b'{"command": ["ls", 3]}', "E1002", "command[1]"),
    ("lone surrogate", b'{"command": ["ls", "\\ud800"]}', "E1002", "command[1]"),
    ("timeout zero", b'{"command": ["ls"], "timeout_ms": 0}', "E1002", "timeout_ms"),
    ("timeout too big", b'{"command": ["ls"], "timeout_ms": 600001}', "E1002", "timeout_ms"),
    ("timeout float", b'{"command": ["ls"], "timeout_ms": 1.5}', "E1002", "timeout_ms"),
    ("timeout bool", b'{"command": ["ls"], "timeout_ms": true}', "E1002", "timeout_ms"),
    ("memory below 1 MiB", b'{"command": ["ls"], "resources": {"memory_bytes": 1000}}', "E1002", "resources.memory_bytes"),
    ("pids too many", b'{"command": ["ls"], "resources": {"max_pids": 1001}}', "E1002", "resources.max_pids"),
    ("output too big", b'{"command": ["ls"], "resources": {"max_output_bytes": 10485761}}', "E1002",
     "resources.max_output_bytes"),
    ("bad env name", b'{"command": ["ls"], "environment": {"1X": "a"}}', "E1002", "environment.1X"),
    ("env value not string", b'{"command": ["ls"], "environment": {"X": 1}}', "E1002", "environment.X"),
    ("bad execution_id", b'{"command": ["ls"], "execution_id": "a/b"}', "E1002", "execution_id"),
    ("duplicate key", b'{"command": ["ls"], "command": ["id"]}', "E1002", "command"),
    ("bind without source", b'{"command": ["ls"], "isolation": {"bind_mounts": [{"destination": "/x"}]}}', "E1002",
     "isolation.bind_mounts[0].source"),
    ("bad base64 stdin", b'{"command": ["ls"], "stdin": {"base64": "!!"}}', "E1002", "stdin.base64"),
    ("bad file mode", b'{"command": ["ls"], "files": [{"path": "a", "mode": "0999"}]}', "E1002", "files[0].mode"),
    ("setuid file mode", b'{"command": ["ls"], "files": [{"path": "a", "mode": 2541}]}', "E1002", "files[0].mode"),
    ("relative readonly path", b'{"command": ["ls"], "isolation": {"readonly_paths": ["etc"]}}', "E1003",
     "isolation.readonly_paths[0]"),
    ("dotdot path", b'{"command": ["ls"], "isolation": {"readonly_paths": ["/usr/../etc/shadow"]}}', "E1003",
     "isolation.readonly_paths[0]"),
    ("shadow", b'{"command": ["ls"], "isolation": {"readonly_paths": ["/etc/shadow"]}}', "E1003",
     "isolation.readonly_paths[0]"),
    ("whole etc", b'{"command": ["ls"], "isolation": {"readonly_paths": ["/etc"]}}', "E1003",
     "isolation.readonly_paths[0]"),
    ("root home", b'{"command": ["ls"], "isolation": {"bind_mounts": [{"source": "/root", "destination": "/r"}]}}',
     "E1003", "isolation.bind_mounts[0].source"),
    ("host root", b'{"command": ["ls"], "isolation": {"readonly_paths": ["/"]}}', "E1003", "isolation.readonly_paths[0]"),
    ("proc sys", b'{"command": ["ls"], "isolation": {"readonly_paths": ["/proc/sys"]}}', "E1003",
     "isolation.readonly_paths[0]"),
    ("bind over proc", b'{"command": ["ls"], "isolation": {"bind_mounts": [{"source": "/usr", "destination": "/proc"}]}}',
     "E1003", "isolation.bind_mounts[0].destination"),
    ("relative workdir", b'{"command": ["ls"], "isolation": {"working_directory": "work"}}', "E1003",
     "isolation.working_directory"),
    ("file escapes", b'{"command": ["ls"], "files": [{"path": "../x", "content": ""}]}', "E1003", "files[0].path"),
    ("absolute file", b'{"command": ["ls"], "files": [{"path": "/etc/x", "content": ""}]}', "E1003", "files[0].path"),
    ("collect escapes", b'{"command": ["ls"], "collect": ["../*"]}', "E1003", "collect[0]"),
    ("unknown profile", b'{"command": ["ls"], "profile": "nope"}', "E1004", None),
    ("over ceiling", b'{"command": ["ls"], "resources": {"memory_bytes": 8589934592}}', "E1006", "resources.memory_bytes"),
    ("network not granted", b'{"command": ["ls"], "isolation": {"network": true}}', "E1006", "isolation.network"),
    ("writable not granted", b'{"command": ["ls"], "isolation": {"writable_paths": ["/srv"]}}', "E1006",
     "isolation.writable_paths[0]"),
]


@pytest.mark.parametrize(("name", "raw", "code", "field"), MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_input_gets_one_json_error(name: str, raw: bytes, code: str, field: str | None) -> None:
    status, docs, stderr = cli(raw)
    assert len(docs) == 1, stderr
    doc = docs[0]
    assert doc["status"] == "error"
    assert doc["error"]["code"] == code, doc
    if field is not None:
        assert doc["error"]["details"]["field"] == field
    assert status == 125
    assert "Traceback" not in stderr
    assert doc["timestamps"]["started"] and doc["timestamps"]["completed"]
    assert doc["execution_id"]


def test_oversized_request_is_refused_without_reading_it_all() -> None:
    raw = b'{"command": ["ls"], "stdin": "' + b"a" * (validation.MAX_REQUEST_BYTES + 10) + b'"}'
    status, docs, _ = cli(raw)
    assert status == 125 and docs[0]["error"]["code"] == "E1001"


def test_fifty_megabyte_document_gets_one_response() -> None:
    raw = json.dumps({"command": ["true"], "environment": {"X": "a"}, "stdin": "b" * 50_000_000}).encode()
    status, docs, _ = cli(raw)
    assert len(docs) == 1 and docs[0]["error"]["code"] == "E1006"  # above max_stdin_bytes
    assert docs[0]["error"]["details"]["field"] == "stdin"


def test_execution_id_is_echoed_even_on_error() -> None:
    _, docs, _ = cli(b'{"command": [], "execution_id": "job-42"}')
    assert docs[0]["execution_id"] == "job-42"


def test_checks_run_in_protocol_order() -> None:
    # Both a shape error (E1002) and an unsafe path (E1003): the shape error is reported.
    raw = {"command": ["ls"], "timeout_ms": -1, "isolation": {"readonly_paths": ["/etc/shadow"]}}
    with pytest.raises(CapsuleError) as exc:
        validation.validate(raw)
    assert exc.value.code == "E1002"


def test_symlink_to_secret_is_refused(tmp_path) -> None:
    link = tmp_path / "innocent"
    link.symlink_to("/etc/shadow")
    with pytest.raises(CapsuleError) as exc:
        validation.check_host_path(str(link), "isolation.readonly_paths[0]")
    assert exc.value.code == "E1003"


def test_valid_request_round_trips() -> None:
    req = validation.validate({
        "command": ["python3", "-c", "print(1)"], "environment": {"A": "b"}, "stdin": {"base64": "aGk="},
        "timeout_ms": 5000, "execution_id": "x.1", "resources": {"memory_bytes": 64 << 20, "cpu_quota": 0.5},
        "isolation": {"hostname": "box", "readonly_paths": ["/opt"]},
        "files": [{"path": "d/a.py", "content": "cHJpbnQoMSk=", "encoding": "base64", "mode": "0755"}],
        "collect": ["*.png"],
    })
    assert req.stdin == b"hi"
    assert req.files[0].content == b"print(1)" and req.files[0].mode == 0o755
    assert req.resources.cpu_quota == 0.5


def test_cli_usage_error_is_json() -> None:
    status, docs, _ = cli(b"", "--no-such-flag")
    assert status == 125 and docs[0]["error"]["code"] == "E1002"
