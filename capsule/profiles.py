"""Profiles: the operator's policy, in TOML, and how a request is merged under it.

A profile sets a default for every request field and a ceiling no request may pass; a request
may tighten, never loosen (E1006). What widens the sandbox (network, writable host paths,
seccomp off) exists only where the profile grants it. Search path, first match wins
(PROTOCOL.md section 5): --config PATH, $CAPSULE_CONFIG, ./capsule.toml,
$XDG_CONFIG_HOME/capsule-run/, /etc/capsule-run/, then the profiles shipped in this package.

A directory holds one profile per NAME.toml; a single file holds `[profiles.NAME]` tables.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, field, replace
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

from .errors import CommandRefused, InvalidConfig, PolicyViolation, UnknownProfile
from .models import ExecutionRequest
from .validation import RESOURCE_RANGES, check_host_path

PACKAGE_PROFILES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "profiles")
LIMIT_FIELDS = ("timeout_ms", "cpu_quota", *RESOURCE_RANGES)
SECCOMP_POLICIES = ("default", "strict", "off")
LAYERS = ("userns", "cgroup", "seccomp")


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    source: str
    defaults: dict[str, Any]
    ceilings: dict[str, Any]
    network: bool = False
    writable_paths: tuple[str, ...] = ()  # host prefixes a request may bind writable
    readonly_binds: bool = True
    seccomp: str = "default"
    seccomp_action: str = "errno"  # "errno" (EPERM) or "kill"
    require: tuple[str, ...] = ()  # layers whose absence is E2009 instead of a warning
    user: str = "sandbox"  # "sandbox" (uid 1000 inside) or "root"
    commands: tuple[str, ...] = ()  # allowed command[0] (basename); empty: any
    seccomp_add: tuple[str, ...] = ()  # syscalls or "@group"s added to the policy
    seccomp_remove: tuple[str, ...] = ()
    environment: dict[str, str] = field(default_factory=dict)
    max_stdin_bytes: int = 16 * 1024 * 1024
    max_collect_bytes: int = 32 * 1024 * 1024
    max_collect_files: int = 100

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "description": self.description, "source": self.source,
            "defaults": self.defaults, "ceilings": self.ceilings,
            "policy": {
                "network": self.network, "writable_paths": list(self.writable_paths),
                "readonly_binds": self.readonly_binds, "seccomp": self.seccomp,
                "seccomp_action": self.seccomp_action, "seccomp_add": list(self.seccomp_add),
                "seccomp_remove": list(self.seccomp_remove), "require": list(self.require), "user": self.user,
                "commands": list(self.commands), "max_stdin_bytes": self.max_stdin_bytes,
                "max_collect_bytes": self.max_collect_bytes, "max_collect_files": self.max_collect_files,
            },
            "environment": self.environment,
        }


# ------------------------------------------------------------------------------ search path


def search_path(config: str | None = None) -> list[str]:
    paths = []
    if config:
        paths.append(config)
    if os.environ.get("CAPSULE_CONFIG"):
        paths.append(os.environ["CAPSULE_CONFIG"])
    paths.append(os.path.abspath("capsule.toml"))
    xdg = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    paths += [os.path.join(xdg, "capsule-run"), "/etc/capsule-run", PACKAGE_PROFILES]
    return paths


def _read_toml(path: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except tomllib.TOMLDecodeError as exc:
        match = re.search(r"at line (\d+)", str(exc))
        raise InvalidConfig(f"{path}: {exc}", file=path, line=int(match.group(1)) if match else None) from None
    except OSError as exc:
        raise InvalidConfig(f"{path}: cannot be read: {exc.strerror}", file=path) from None


def _raw_profiles_in(path: str) -> dict[str, tuple[str, dict[str, Any]]]:
    """{name: (file, table)} for every profile at one search-path entry."""
    found: dict[str, tuple[str, dict[str, Any]]] = {}
    if os.path.isdir(path):
        for entry in sorted(os.listdir(path)):
            if entry.endswith(".toml"):
                file = os.path.join(path, entry)
                found[entry[:-5]] = (file, _read_toml(file))
    elif os.path.isfile(path):
        doc = _read_toml(path)
        tables = doc.get("profiles", {})
        if not isinstance(tables, dict) or set(doc) - {"profiles"}:
            raise InvalidConfig(f"{path}: a config file holds only [profiles.NAME] tables", file=path)
        for name, table in tables.items():
            found[name] = (path, table)
    return found


def _find_raw(name: str, config: str | None) -> tuple[str, dict[str, Any]]:
    for path in search_path(config):
        if os.path.isdir(path):
            file = os.path.join(path, f"{name}.toml")
            if os.path.isfile(file):
                return file, _read_toml(file)
        elif os.path.isfile(path):
            raw = _raw_profiles_in(path)
            if name in raw:
                return raw[name]
    raise UnknownProfile(f"unknown profile {name!r}", profile=name, known=list_profiles(config))


def list_profiles(config: str | None = None) -> list[str]:
    names: set[str] = set()
    for path in search_path(config):
        try:
            names.update(_raw_profiles_in(path))
        except InvalidConfig:
            continue  # a broken file is reported when its profile is used
    return sorted(names)


# ------------------------------------------------------------------------------ parsing


def _line_of(file: str, key: str) -> int | None:
    try:
        with open(file, encoding="utf-8", errors="replace") as fh:
            for number, line in enumerate(fh, 1):
                if re.match(rf"\s*\"?{re.escape(key)}\"?\s*=", line) or line.strip() == f"[{key}]":
                    return number
    except OSError:
        pass
    return None


def _config_error(file: str, key: str, message: str) -> InvalidConfig:
    return InvalidConfig(f"{file}: {key}: {message}", file=file, line=_line_of(file, key.rsplit(".", maxsplit=1)[-1]), key=key)


_POLICY_TYPES: dict[str, type | tuple[type, ...]] = {
    "network": bool, "writable_paths": list, "readonly_binds": bool, "seccomp": str,
    "seccomp_action": str, "require": list, "user": str, "commands": list,
    "max_stdin_bytes": int, "max_collect_bytes": int, "max_collect_files": int, "seccomp_add": list,
    "seccomp_remove": list,
}


def _limits_table(file: str, section: str, table: Any) -> dict[str, Any]:
    if not isinstance(table, dict):
        raise _config_error(file, section, "must be a table")
    out = {}
    for key, value in table.items():
        if key not in LIMIT_FIELDS:
            raise _config_error(file, f"{section}.{key}", f"unknown limit (known: {', '.join(LIMIT_FIELDS)})")
        number_ok = isinstance(value, (int, float)) if key == "cpu_quota" else isinstance(value, int)
        if isinstance(value, bool) or not number_ok or value < 0:
            raise _config_error(file, f"{section}.{key}", "must be a non-negative number")
        out[key] = value
    return out


def _build(name: str, config: str | None, seen: tuple[str, ...] = ()) -> Profile:
    if name in seen:
        raise InvalidConfig(f"profile {name!r} extends itself: {' -> '.join(seen + (name,))}")
    file, raw = _find_raw(name, config)
    if not isinstance(raw, dict):
        raise _config_error(file, name, "must be a table")
    unknown = set(raw) - {"description", "extends", "defaults", "ceilings", "policy", "environment"}
    if unknown:
        key = sorted(unknown)[0]
        raise _config_error(file, key, "unknown key (known: description, extends, defaults, ceilings, policy, environment)")
    parent = _build(raw["extends"], config, seen + (name,)) if "extends" in raw else None
    defaults = dict(parent.defaults) if parent else {}
    ceilings = dict(parent.ceilings) if parent else {}
    defaults.update(_limits_table(file, "defaults", raw.get("defaults", {})))
    ceilings.update(_limits_table(file, "ceilings", raw.get("ceilings", {})))
    for key, value in defaults.items():
        if key in ceilings and value > ceilings[key]:
            raise _config_error(file, f"defaults.{key}", f"default {value} is above the ceiling {ceilings[key]}")
    policy = raw.get("policy", {})
    if not isinstance(policy, dict):
        raise _config_error(file, "policy", "must be a table")
    for key, value in policy.items():
        expected = _POLICY_TYPES.get(key)
        if expected is None:
            raise _config_error(file, f"policy.{key}", f"unknown policy (known: {', '.join(_POLICY_TYPES)})")
        if not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
            raise _config_error(file, f"policy.{key}", f"must be of type {expected.__name__}")  # type: ignore[union-attr]
    checks = {
        "seccomp": SECCOMP_POLICIES, "seccomp_action": ("errno", "kill"), "user": ("sandbox", "root"),
    }
    for key, allowed in checks.items():
        if key in policy and policy[key] not in allowed:
            raise _config_error(file, f"policy.{key}", f"must be one of {', '.join(allowed)}")
    for layer in policy.get("require", []):
        if layer not in LAYERS:
            raise _config_error(file, "policy.require", f"unknown layer {layer!r} (known: {', '.join(LAYERS)})")
    env = raw.get("environment", {})
    if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
        raise _config_error(file, "environment", "must be a table of strings")
    base = parent or Profile(name=name, description="", source=file, defaults={}, ceilings={})
    lists = {k: tuple(policy[k]) for k in ("writable_paths", "require", "commands", "seccomp_add", "seccomp_remove")
             if k in policy}
    from .seccomp import check_profile_syscalls

    check_profile_syscalls(lists.get("seccomp_add", base.seccomp_add), lists.get("seccomp_remove", base.seccomp_remove),
                           bool(policy.get("network", base.network)), file)
    scalars = {k: v for k, v in policy.items() if k not in lists}
    changes: dict[str, Any] = {**scalars, **lists}
    return replace(
        base, name=name, source=file, description=str(raw.get("description", base.description)),
        defaults=defaults, ceilings=ceilings, environment={**base.environment, **env}, **changes,
    )


def load_profile(name: str, config: str | None = None) -> Profile:
    return _build(name, config)


# ------------------------------------------------------------------------------ merging


@dataclass(frozen=True)
class Limits:
    """The effective limits of one run: the request's values, or the profile's defaults."""

    timeout_ms: int
    memory_bytes: int
    cpu_shares: int
    cpu_quota: float | None
    cpu_time_ms: int | None
    max_output_bytes: int
    max_pids: int
    max_file_bytes: int | None
    max_open_files: int
    tmpfs_bytes: int


BUILTIN_DEFAULTS: dict[str, Any] = {
    "timeout_ms": 30_000, "memory_bytes": 256 * 1024 * 1024, "cpu_shares": 1024, "cpu_quota": 1.0,
    "cpu_time_ms": None, "max_output_bytes": 1024 * 1024, "max_pids": 100, "max_file_bytes": None,
    "max_open_files": 1024, "tmpfs_bytes": 64 * 1024 * 1024,
}


def effective_limits(req: ExecutionRequest, profile: Profile) -> Limits:
    """Merge a request under its profile. E1006 where the request asks past a ceiling."""
    values: dict[str, Any] = {}
    asked = {"timeout_ms": req.timeout_ms, **{k: getattr(req.resources, k) for k in (*RESOURCE_RANGES, "cpu_quota")}}
    for key in LIMIT_FIELDS:
        value = asked[key]
        ceiling = profile.ceilings.get(key)
        if value is None:
            value = profile.defaults.get(key, BUILTIN_DEFAULTS[key])
        elif ceiling is not None and value > ceiling:
            field = key if key == "timeout_ms" else f"resources.{key}"
            raise PolicyViolation(
                f"{field}: {value} is above the {profile.name!r} profile's ceiling of {ceiling}",
                field=field, limit=ceiling, profile=profile.name,
            )
        values[key] = value
    if values["cpu_quota"] is not None and values["cpu_quota"] > (os.cpu_count() or 1):
        values["cpu_quota"] = float(os.cpu_count() or 1)
    return Limits(**values)


def check_policy(req: ExecutionRequest, profile: Profile) -> None:
    """E1006 for what the request asks that the profile does not grant; E5002 for its command."""
    iso = req.isolation

    def deny(field: str, message: str, limit: Any = None) -> PolicyViolation:
        return PolicyViolation(f"{field}: {message} (profile {profile.name!r})", field=field, limit=limit, profile=profile.name)

    if iso.network and not profile.network:
        raise deny("isolation.network", "network access is not granted", limit=False)
    if req.stdin is not None and len(req.stdin) > profile.max_stdin_bytes:
        raise deny("stdin", f"{len(req.stdin)} bytes is above max_stdin_bytes", limit=profile.max_stdin_bytes)
    writable = [(f"isolation.writable_paths[{i}]", p) for i, p in enumerate(iso.writable_paths)]
    writable += [(f"isolation.bind_mounts[{i}].source", b.source) for i, b in enumerate(iso.bind_mounts) if not b.readonly]
    for name, path in writable:
        real = os.path.realpath(path)
        if not any(real == p or real.startswith(p.rstrip("/") + "/") for p in profile.writable_paths):
            raise deny(name, f"{path!r} may not be bound writable", limit=list(profile.writable_paths))
    if not profile.readonly_binds:
        readonly = [(f"isolation.readonly_paths[{i}]", p) for i, p in enumerate(iso.readonly_paths)]
        readonly += [(f"isolation.bind_mounts[{i}].source", b.source) for i, b in enumerate(iso.bind_mounts) if b.readonly]
        if readonly:
            raise deny(readonly[0][0], "host paths may not be bound", limit=False)
    for path in profile.writable_paths:
        check_host_path(path, "policy.writable_paths")
    if profile.commands and os.path.basename(req.command[0]) not in profile.commands:
        raise CommandRefused(
            f"command {req.command[0]!r} is not allowed by profile {profile.name!r}",
            field="command[0]", allowed=list(profile.commands), profile=profile.name,
        )
