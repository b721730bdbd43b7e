#!/usr/bin/env python3
"""Soak: many sandboxes, several at a time, every kind of ending; then look for leftovers.

    python scripts/soak.py [--runs 500] [--parallel 8]

Each run is a real `capsule-run` process (as agents call it), cycling through success,
timeout, OOM, output flood, fork bomb and seccomp kill; every response is checked against the
outcome its kind must have. A second phase runs the same mix in-process through
`capsule.execute()` (the `batch` path) and checks that process's open descriptors. Afterwards
nothing of capsule-run may remain: no process, mount, cgroup, or file in /tmp. Exits 1 on any
failure. Figures (runs per second, failures) are printed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import capsule
from capsule import cgroups

CLI = [sys.executable, "-m", "capsule"]
KILL_PROFILE = 'extends = "default"\n[policy]\nseccomp_action = "kill"\n'
BOMB = "import os, time\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        time.sleep(0.01)\n"


def kinds(cgroup: bool) -> list[tuple[str, dict, set[tuple[str, str | None]]]]:
    """(name, request, acceptable (status, code) pairs)."""
    out = [
        ("success", {"command": ["sh", "-c", "echo ok"]}, {("success", None)}),
        ("timeout", {"command": ["sleep", "30"], "timeout_ms": 200}, {("timeout", "E3001")}),
        ("output", {"command": ["yes"], "resources": {"max_output_bytes": 4096}}, {("killed", "E4003")}),
        ("seccomp", {"command": ["python3", "-c", "import ctypes; ctypes.CDLL(None).ptrace(16, 1, 0, 0)"],
                     "profile": "kill"}, {("killed", "E5001")}),
        ("forkbomb", {"command": ["python3", "-c", BOMB], "timeout_ms": 1000, "resources": {"max_pids": 16}},
         {("timeout", "E3001")}),
    ]
    if cgroup:  # without a cgroup, RLIMIT_AS makes the allocation fail instead of an OOM kill
        out.append(("oom", {"command": ["python3", "-c", "x = bytearray(300 << 20)"],
                            "resources": {"memory_bytes": 48 << 20}}, {("killed", "E4001")}))
    return out


def outcome(doc: dict) -> tuple[str, str | None]:
    return doc.get("status", "?"), (doc.get("error") or {}).get("code")


def cgroup_leftovers() -> list[str]:
    found = cgroups.detect()
    roots = [found.base] if found.version == "v2" else [os.path.join(r, "capsule") for r in found.v1_roots.values()]
    return [os.path.join(r, n) for r in roots if os.path.isdir(r) for n in os.listdir(r) if n.startswith("run-")]


def processes_with(marker: str) -> list[int]:
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


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=500)
    ap.add_argument("--parallel", type=int, default=8)
    args = ap.parse_args()

    config = tempfile.mkdtemp(prefix="capsule-soak-")
    with open(os.path.join(config, "kill.toml"), "w") as fh:
        fh.write(KILL_PROFILE)
    mix = kinds(cgroups.detect().version != "none")
    with open("/proc/self/mountinfo") as fh:
        mounts_before = sorted(fh)
    tmp_before = set(os.listdir("/tmp"))
    failures: list[str] = []
    seen: Counter[str] = Counter()

    def one(i: int) -> None:
        name, req, ok = mix[i % len(mix)]
        req = {**req, "execution_id": f"soak-{i}"}
        proc = subprocess.run([*CLI, "--config", config], input=json.dumps(req).encode(), capture_output=True, timeout=120)
        lines = proc.stdout.decode().splitlines()
        try:
            doc = json.loads(lines[0]) if len(lines) == 1 else {}
        except json.JSONDecodeError:
            doc = {}
        got = outcome(doc)
        seen[f"{name}:{got[0]}/{got[1]}"] += 1
        if got not in ok or doc.get("execution_id") != f"soak-{i}":
            failures.append(f"run {i} ({name}): got {got}, stdout {proc.stdout[:300]!r}, stderr {proc.stderr[-300:]!r}")

    t = time.monotonic()
    with ThreadPoolExecutor(args.parallel) as pool:
        list(pool.map(one, range(args.runs)))
    cli_s = time.monotonic() - t

    # Phase 2: the same mix in this one process, as `batch` serves it; count our descriptors.
    fds_before = len(os.listdir("/proc/self/fd"))
    t = time.monotonic()
    inproc = max(len(mix), args.runs // 5)
    for i in range(inproc):
        name, req, ok = mix[i % len(mix)]
        doc = capsule.execute(req, config=config).to_dict()
        seen[f"in-process {name}:{outcome(doc)[0]}/{outcome(doc)[1]}"] += 1
        if outcome(doc) not in ok:
            failures.append(f"in-process run {i} ({name}): got {outcome(doc)}")
    lib_s = time.monotonic() - t
    fds_after = len(os.listdir("/proc/self/fd"))

    time.sleep(0.5)
    with open("/proc/self/mountinfo") as fh:
        if sorted(fh) != mounts_before:
            failures.append("the host's mount table changed")
    if cgroup_leftovers():
        failures.append(f"cgroups left behind: {cgroup_leftovers()[:5]}")
    stray = set(os.listdir("/tmp")) - tmp_before - {os.path.basename(config)}
    if stray:
        failures.append(f"new entries in /tmp: {sorted(stray)[:5]}")
    if fds_after != fds_before:
        failures.append(f"open descriptors of the in-process caller: {fds_before} -> {fds_after}")
    if processes_with("sleep 30") or processes_with("ptrace(16"):
        failures.append("sandbox processes survived")
    for path in os.listdir(config):
        os.unlink(os.path.join(config, path))
    os.rmdir(config)

    print(json.dumps(dict(sorted(seen.items())), indent=1))
    print(f"CLI phase: {args.runs} runs, {args.parallel} at a time, {cli_s:.1f} s, {args.runs / cli_s:.1f} runs/s")
    print(f"in-process phase: {inproc} runs, one at a time, {lib_s:.1f} s, {inproc / lib_s:.1f} runs/s")
    print(f"cgroup backend: {cgroups.detect().version}; leftovers: none found" if not failures else "")
    for f in failures[:20]:
        print("FAIL:", f)
    print(f"{args.runs + inproc - len(failures)} passed, {len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
