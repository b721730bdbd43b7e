"""Shared fixtures. Integration tests run real sandboxes; nothing here is mocked.

CAPSULE_TEST_STRICT=1 (set by .ci/run) turns every skip into a failure, except the skips
listed in ALLOWED_SKIPS: layers this kind of host truly cannot offer.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest
from hypothesis import settings

import capsule
from capsule import cgroups, host

# No example database: the checkout may not be writable (the rootless run), and CI starts fresh.
settings.register_profile("capsule", database=None)
settings.load_profile("capsule")

ROOT = os.geteuid() == 0
STRICT = os.environ.get("CAPSULE_TEST_STRICT") == "1"
CLI = [sys.executable, "-m", "capsule"]

# Skips that stay skips under CAPSULE_TEST_STRICT=1, by the reason's first words.
ALLOWED_SKIPS = (
    "cgroup v2 controllers are not on this host",  # hybrid v1 hosts: the v2 path runs on a v2 kernel
    "cgroup v1 is not on this host",  # pure v2 hosts
    "no cgroup for an unprivileged user here",  # rootless on a host without delegation
    "needs root",  # root-only checks, when the suite runs as the unprivileged user
    "needs an unprivileged run",
)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: Any) -> Any:
    outcome = yield
    report = outcome.get_result()
    if STRICT and report.skipped:
        reason = str(report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr)
        reason = reason.removeprefix("Skipped: ")
        if not any(reason.startswith(allowed) for allowed in ALLOWED_SKIPS):
            report.outcome = "failed"
            report.longrepr = f"unexpected skip under CAPSULE_TEST_STRICT=1: {reason}"


@pytest.fixture(autouse=True)
def _isolated_state(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    state = tmp_path_factory.mktemp("state")
    os.chmod(state, 0o755)
    monkeypatch.setenv("CAPSULE_STATE_DIR", str(state))
    monkeypatch.delenv("CAPSULE_CONFIG", raising=False)
    monkeypatch.chdir(tmp_path_factory.getbasetemp())


def userns_ok() -> bool:
    return host.user_namespaces()[0]


def cgroup_version() -> str:
    return cgroups.detect().version


@pytest.fixture
def sandbox() -> None:
    if not userns_ok():
        pytest.skip(f"user namespaces unavailable: {host.user_namespaces()[1]}")


def run(request: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    """One request through the library; the response as the JSON the CLI would print."""
    resp = capsule.execute(request, **kwargs)
    doc = json.loads(json.dumps(resp.to_dict()))
    doc["_exit"] = resp.cli_exit_status
    return doc


def cli(stdin: bytes, *args: str, timeout: float = 60) -> tuple[int, list[Any], str]:
    """The real CLI: (exit status, every JSON document on stdout, stderr)."""
    proc = subprocess.run([*CLI, *args], input=stdin, capture_output=True, timeout=timeout)
    docs = [json.loads(line) for line in proc.stdout.decode().splitlines() if line.strip()]
    return proc.returncode, docs, proc.stderr.decode(errors="replace")


def sh(script: str, **extra: Any) -> dict[str, Any]:
    return run({"command": ["sh", "-c", script], **extra})
