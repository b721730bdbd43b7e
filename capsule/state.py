"""Where capsule-run keeps its own state on the host (session workspaces, locks).

`/var/lib/capsule-run` as root, `$XDG_STATE_HOME/capsule-run` (default
`~/.local/state/capsule-run`) otherwise; `$CAPSULE_STATE_DIR` overrides both (tests use it).
A sandbox never sees this directory: requests that name it are refused (E1003).
"""

from __future__ import annotations

import os


def state_dir() -> str:
    override = os.environ.get("CAPSULE_STATE_DIR")
    if override:
        return os.path.abspath(override)
    if os.geteuid() == 0:
        return "/var/lib/capsule-run"
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(os.path.abspath(base), "capsule-run")


def sessions_dir() -> str:
    return os.path.join(state_dir(), "sessions")
