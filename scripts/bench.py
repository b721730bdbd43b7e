#!/usr/bin/env python3
"""Benchmark capsule-run against baselines measured in the same run, on the same machine.

    python scripts/bench.py [--runs N]

Prints a Markdown table of median and p90 wall times (ms) for: /bin/true; `unshare -Urmpfn
--mount-proc true` (the kernel's floor for these namespaces); `capsule-run` (the CLI, a new
process per request, as an agent calls it); `capsule.execute()` in-process (what `batch` pays
per request); plus the seccomp filter's build and load time and the CLI's import time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import capsule
from capsule import seccomp

REQ = json.dumps({"command": ["true"]}).encode()
_script = os.path.join(os.path.dirname(sys.executable), "capsule-run")
CLI = [_script] if os.path.exists(_script) else [sys.executable, "-m", "capsule"]


def timed(fn, runs: int) -> list[float]:
    out = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t) * 1000)
    return out


def row(name: str, samples: list[float]) -> str:
    samples = sorted(samples)
    p90 = samples[int(len(samples) * 0.9) - 1]
    return f"| {name} | {statistics.median(samples):.1f} | {p90:.1f} | {len(samples)} |"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=30)
    args = ap.parse_args()
    n = args.runs

    def run_cli() -> None:
        proc = subprocess.run(CLI, input=REQ, capture_output=True)
        assert json.loads(proc.stdout)["status"] == "success", proc.stdout

    def run_lib() -> None:
        assert capsule.execute({"command": ["true"]}).status == "success"

    rows = [
        row("/bin/true", timed(lambda: subprocess.run(["/bin/true"]), n)),
        row("unshare -Urmpfn --mount-proc true", timed(lambda: subprocess.run(
            ["unshare", "-Urmpfn", "--mount-proc", "true"], check=True), n)),
        row("capsule-run (CLI, new process per request)", timed(run_cli, n)),
        row("capsule.execute() in-process (batch mode)", timed(run_lib, n)),
    ]
    print(f"host: {os.uname().release}, {os.cpu_count()} cores, euid {os.geteuid()}, "
          f"cgroup backend {capsule.api.__name__ and __import__('capsule.cgroups').cgroups.detect().version}\n")
    print("| command | median ms | p90 ms | runs |\n|---|---|---|---|")
    print("\n".join(rows))

    # Seccomp: compile (uncached) and load (in a forked child, as the workload does).
    builds, loads = [], []
    for _ in range(10):
        seccomp._CACHE.clear()
        t = time.perf_counter()
        built = seccomp.build_in_parent("default")
        builds.append((time.perf_counter() - t) * 1000)
        r, w = os.pipe()
        if (pid := os.fork()) == 0:
            import prctl

            prctl.set_no_new_privs(True)
            t = time.perf_counter()
            assert built is not None
            built.filter.load()
            os.write(w, f"{(time.perf_counter() - t) * 1000}".encode())
            os._exit(0)
        os.close(w)
        loads.append(float(os.read(r, 64)))
        os.close(r)
        os.waitpid(pid, 0)
    print(f"\nseccomp `default`: build {statistics.median(builds):.2f} ms, load {statistics.median(loads):.2f} ms (median of 10)")

    out = subprocess.run([sys.executable, "-X", "importtime", "-c", "import capsule.cli"], capture_output=True, text=True)
    total = [line for line in out.stderr.splitlines() if line.rstrip().endswith("| capsule.cli")]
    seccomp_lines = [line for line in out.stderr.splitlines() if "pyseccomp" in line]
    print(f"import capsule.cli: {total[-1].split('|')[1].strip() if total else '?'} us cumulative; "
          f"pyseccomp imported at CLI start: {'yes' if seccomp_lines else 'no'}")
    probe = "import time, ctypes.util; t = time.perf_counter(); {}; print((time.perf_counter() - t) * 1000)"
    plain = [float(subprocess.run([sys.executable, "-c", probe.format("import pyseccomp")], check=True,
                                  capture_output=True, text=True).stdout) for _ in range(5)]
    fast = [float(subprocess.run([sys.executable, "-c", "from capsule import seccomp; " + probe.format(
        "seccomp._pyseccomp()")], check=True, capture_output=True, text=True).stdout) for _ in range(5)]
    print(f"`import pyseccomp` in a fresh interpreter: {statistics.median(plain):.1f} ms as is, "
          f"{statistics.median(fast):.1f} ms with capsule's direct library lookup (no `ldconfig -p`)")

if __name__ == "__main__":
    main()
