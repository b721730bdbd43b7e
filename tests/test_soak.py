"""The short soak that runs in CI: 48 sandboxes, 8 at a time, every kind of ending, then a
search for leftovers. `make soak` runs the long one (500)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.sandbox, pytest.mark.usefixtures("sandbox")]
SCRIPT = os.path.join(os.path.dirname(__file__), "..", "scripts", "soak.py")


def test_short_soak_has_no_failures_and_leaves_nothing() -> None:
    proc = subprocess.run([sys.executable, SCRIPT, "--runs", "48", "--parallel", "8"], capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "0 failed" in proc.stdout
