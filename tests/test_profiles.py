"""Profiles: shipped ones load, a request tightens but never loosens, broken files are E1005."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import cli

from capsule import profiles, validation
from capsule.errors import CapsuleError


def req(**fields):
    return validation.validate({"command": ["true"], **fields})


@pytest.mark.parametrize("name", ["default", "python", "strict"])
def test_shipped_profiles_load_with_a_description(name: str) -> None:
    prof = profiles.load_profile(name)
    assert prof.description
    assert prof.defaults["timeout_ms"] <= prof.ceilings["timeout_ms"]


def test_python_extends_default() -> None:
    prof = profiles.load_profile("python")
    assert prof.defaults["memory_bytes"] == 1 << 30
    assert prof.ceilings["memory_bytes"] == profiles.load_profile("default").ceilings["memory_bytes"]
    assert prof.environment["MPLBACKEND"] == "Agg" and prof.environment["LANG"] == "C.UTF-8"


def test_request_may_tighten() -> None:
    lim = profiles.effective_limits(req(timeout_ms=100, resources={"memory_bytes": 8 << 20}), profiles.load_profile("default"))
    assert lim.timeout_ms == 100 and lim.memory_bytes == 8 << 20


def test_defaults_fill_what_the_request_leaves_out() -> None:
    lim = profiles.effective_limits(req(), profiles.load_profile("strict"))
    assert lim.memory_bytes == 128 << 20 and lim.max_pids == 16 and lim.timeout_ms == 10_000


def test_request_may_not_loosen() -> None:
    with pytest.raises(CapsuleError) as exc:
        profiles.effective_limits(req(resources={"max_pids": 65}), profiles.load_profile("strict"))
    assert exc.value.code == "E1006"
    assert exc.value.details["field"] == "resources.max_pids" and exc.value.details["limit"] == 64


def test_policy_grants_are_needed(tmp_path: Path) -> None:
    with pytest.raises(CapsuleError) as exc:
        profiles.check_policy(req(isolation={"readonly_paths": ["/opt"]}), profiles.load_profile("strict"))
    assert exc.value.code == "E1006"
    (tmp_path / "open.toml").write_text(
        f'extends = "default"\n[policy]\nnetwork = true\nwritable_paths = ["{tmp_path}"]\n')
    prof = profiles.load_profile("open", str(tmp_path))
    profiles.check_policy(req(isolation={"network": True, "writable_paths": [str(tmp_path)]}), prof)


def test_command_policy_is_e5002(tmp_path: Path) -> None:
    (tmp_path / "py.toml").write_text('extends = "default"\n[policy]\ncommands = ["python3"]\n')
    prof = profiles.load_profile("py", str(tmp_path))
    profiles.check_policy(validation.validate({"command": ["/usr/bin/python3"]}), prof)
    with pytest.raises(CapsuleError) as exc:
        profiles.check_policy(req(), prof)
    assert exc.value.code == "E5002"


def test_broken_toml_names_file_and_line(tmp_path: Path) -> None:
    (tmp_path / "bad.toml").write_text('description = "x"\n[defaults]\ntimeout_ms = = 3\n')
    with pytest.raises(CapsuleError) as exc:
        profiles.load_profile("bad", str(tmp_path))
    assert exc.value.code == "E1005"
    assert exc.value.details["file"].endswith("bad.toml") and exc.value.details["line"] == 3


@pytest.mark.parametrize(("body", "key"), [
    ('[defaults]\nmemroy_bytes = 5\n', "defaults.memroy_bytes"),
    ('[defaults]\ntimeout_ms = "fast"\n', "defaults.timeout_ms"),
    ('[policy]\nseccomp = "none"\n', "policy.seccomp"),
    ('[policy]\nseccomp_add = ["ptrace"]\n', None),
    ('[policy]\nseccomp_add = ["@network"]\n', None),
    ('[defaults]\ntimeout_ms = 9000\n[ceilings]\ntimeout_ms = 100\n', "defaults.timeout_ms"),
    ('extends = "loop"\n', None),
])
def test_invalid_profile_content_is_e1005(tmp_path: Path, body: str, key: str | None) -> None:
    (tmp_path / "loop.toml").write_text(body)
    with pytest.raises(CapsuleError) as exc:
        profiles.load_profile("loop", str(tmp_path))
    assert exc.value.code == "E1005"
    if key:
        assert exc.value.details["key"] == key and exc.value.details["line"]


def test_search_path_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env_dir = tmp_path / "env"
    env_dir.mkdir()
    (env_dir / "default.toml").write_text('description = "from env"\n')
    monkeypatch.setenv("CAPSULE_CONFIG", str(env_dir))
    assert profiles.load_profile("default").description == "from env"
    flag_file = tmp_path / "capsule.toml"
    flag_file.write_text('[profiles.default]\ndescription = "from --config"\n')
    assert profiles.load_profile("default", str(flag_file)).description == "from --config"


def test_cli_profiles_list_and_show() -> None:
    status, docs, _ = cli(b"", "profiles")
    assert status == 0 and {p["name"] for p in docs[0]["profiles"]} >= {"default", "python", "strict"}
    status, docs, _ = cli(b"", "profiles", "show", "python")
    assert status == 0 and docs[0]["defaults"]["memory_bytes"] == 1 << 30 and docs[0]["defaults"]["max_output_bytes"]
    status, docs, _ = cli(b"", "profiles", "show", "nope")
    assert status == 125 and docs[0]["error"]["code"] == "E1004"


def test_broken_profile_via_cli_is_e1005(tmp_path: Path) -> None:
    (tmp_path / "default.toml").write_text("[[[")
    status, docs, _ = cli(json.dumps({"command": ["true"]}).encode(), "--config", str(tmp_path))
    assert status == 125 and docs[0]["error"]["code"] == "E1005" and docs[0]["error"]["details"]["line"] == 1
