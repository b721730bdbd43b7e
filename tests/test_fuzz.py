"""Property-based bad input (hypothesis): whatever arrives, exactly one JSON response with a
valid E-code, never a traceback, never a hang, nothing written outside the sandbox."""

from __future__ import annotations

import json
import os

import pytest
from conftest import cli
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import capsule
from capsule.errors import BY_CODE

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)

VALID = {
    "command": ["true"], "environment": {"A": "b"}, "timeout_ms": 5000, "execution_id": "fz",
    "resources": {"memory_bytes": 64 << 20, "max_pids": 10, "cpu_quota": 0.5},
    "isolation": {"network": False, "working_directory": "/workspace", "hostname": "fz",
                  "readonly_paths": ["/opt"], "bind_mounts": [{"source": "/opt", "destination": "/data"}]},
    "files": [{"path": "a.txt", "content": "x", "mode": 420}], "collect": ["*.txt"],
}
FIELDS = ["command", "environment", "stdin", "timeout_ms", "execution_id", "profile", "resources",
          "isolation", "files", "collect", "session", "resources.memory_bytes", "resources.max_pids",
          "resources.cpu_quota", "isolation.network", "isolation.readonly_paths", "isolation.hostname",
          "isolation.bind_mounts", "isolation.working_directory"]
HOSTILE_PATHS = ["..", "/..", "/tmp/../etc/shadow", "/proc/self/root", "/proc/self/root/etc/shadow", "relative",
                 "/" + "a" * 5000, "/etc//shadow", "/etc/./shadow", "/tmp/x\x00y", "", "/", "/var/lib/capsule-run/x",
                 "/sys/fs/cgroup", "/dev/sda", "~root", "/root/.ssh"]


def _no_side_effects(resp: capsule.ExecutionResponse) -> dict:
    doc = resp.to_dict()
    json.dumps(doc)  # serialisable
    assert doc["status"] in ("success", "error", "timeout", "killed")
    if doc["status"] != "success":
        assert doc["error"]["code"] in BY_CODE
    return doc


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(json_values)
def test_any_json_value_gets_a_response(value: object) -> None:
    doc = _no_side_effects(capsule.execute(json.dumps(value).encode()))
    if not isinstance(value, dict):
        assert doc["error"]["code"] == "E1001"
    else:
        assert doc["status"] in ("error", "success")


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=300))
def test_any_bytes_get_a_response(raw: bytes) -> None:
    doc = _no_side_effects(capsule.execute(raw))
    assert doc["status"] in ("error", "success")


def _set(doc: dict, dotted: str, value: object) -> dict:
    out = json.loads(json.dumps(doc))
    node = out
    *parents, last = dotted.split(".")
    for p in parents:
        node = node[p]
    node[last] = value
    return out


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(FIELDS), json_values)
def test_one_wrong_field_is_an_e1xxx_naming_it(field: str, value: object) -> None:
    req = _set(VALID, field, value)
    resp = capsule.execute(req, profile="default")
    doc = _no_side_effects(resp)
    if doc["status"] == "error" and doc["error"]["code"] in ("E1002", "E1003") and "field" in doc["error"]["details"]:
        top = field.split(".", maxsplit=1)[0]
        assert doc["error"]["details"]["field"].startswith(top), (field, doc["error"])


@settings(max_examples=100, deadline=None)
@given(st.sampled_from(["command", "environment", "execution_id", "isolation.hostname", "isolation.working_directory",
                        "collect", "session", "profile"]), st.text(max_size=10))
def test_nul_bytes_anywhere_are_refused(field: str, text: str) -> None:
    bad = text + "\x00" + text
    value: object = bad
    if field in ("command", "collect"):
        value = [bad]
    elif field == "environment":
        value = {"A": bad}
    req = _set(VALID, field, value)
    doc = _no_side_effects(capsule.execute(req))
    assert doc["status"] == "error" and doc["error"]["code"] in ("E1002", "E1003", "E1004"), doc


# Inside the sandbox, /root/.ssh or /var/lib/capsule-run are just empty places of its own
# tmpfs root: as a destination or working directory only malformed or system paths are refused.
MALFORMED_INSIDE = {"..", "/..", "/tmp/../etc/shadow", "/proc/self/root", "/proc/self/root/etc/shadow", "relative",
                    "/" + "a" * 5000, "/etc//shadow", "/etc/./shadow", "/tmp/x\x00y", "", "/", "/sys/fs/cgroup",
                    "/dev/sda", "~root"}


@pytest.mark.parametrize("path", HOSTILE_PATHS)
def test_hostile_paths_are_refused(path: str) -> None:
    cases = [("readonly_paths", {"isolation": {"readonly_paths": [path]}}),
             ("bind source", {"isolation": {"bind_mounts": [{"source": path, "destination": "/d"}]}})]
    if path in MALFORMED_INSIDE:
        cases += [("bind destination", {"isolation": {"bind_mounts": [{"source": "/opt", "destination": path}]}}),
                  ("workdir", {"isolation": {"working_directory": path}})]
    for field, req in cases:
        doc = _no_side_effects(capsule.execute({"command": ["true"], **req}))
        assert doc["status"] == "error" and doc["error"]["code"] in ("E1002", "E1003"), (field, path, doc)


def test_cli_and_api_agree_on_garbage() -> None:
    for raw in (b"\xff\xfe", b"[]", b'{"command": ["x"], "bogus": 1}', b"{" * 5000):
        status, docs, stderr = cli(raw)
        assert len(docs) == 1 and status == 125 and "Traceback" not in stderr
        assert docs[0]["error"]["code"] == capsule.execute(raw).to_dict()["error"]["code"]


def test_fuzzing_wrote_nothing_on_the_host(tmp_path_factory: pytest.TempPathFactory) -> None:
    # Every request above ran with the cwd in pytest's temp root: no file may have appeared
    # there beyond pytest's own directories.
    base = tmp_path_factory.getbasetemp()
    strays = [p for p in os.listdir(base) if not p.startswith(".") and not os.path.isdir(os.path.join(base, p))]
    assert strays == []
