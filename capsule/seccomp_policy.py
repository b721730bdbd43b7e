"""Seccomp: placeholder until the allowlist lands (issue 4); reports "off" honestly."""

from __future__ import annotations

from .plan import Plan


def load_in_child(plan: Plan) -> str:
    return "off"
