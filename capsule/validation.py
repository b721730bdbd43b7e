"""Request validation: bytes in, an ExecutionRequest out, or the first E1001/E1002/E1003 error.

Checks run in the protocol's order (PROTOCOL.md section 2): E1001 (not a JSON object), then
E1002 (shape, types, ranges) over the whole request, then E1003 (path safety). Policy (E1004,
E1006) is the profile's business, in `capsule.profiles`. `details.field` is always the
dotted path of the offending field, e.g. `isolation.bind_mounts[0].source`.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import re
from collections.abc import Callable
from typing import Any

from .errors import InvalidField, RequestNotJSON, UnsafePath
from .models import BindMount, ExecutionRequest, FileSpec, Isolation, Resources
from .state import state_dir

MAX_REQUEST_BYTES = 64 * 1024 * 1024
MiB = 1024 * 1024

_ID_RE = re.compile(r"[A-Za-z0-9._-]{1,64}")
_ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_HOSTNAME_RE = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]{0,62})(\.[A-Za-z0-9]([A-Za-z0-9-]{0,62}))*")
_OCTAL_RE = re.compile(r"0?o?[0-7]{1,4}")

# Host paths a request may never bind, nor bind a directory above (binding /etc would expose
# /etc/shadow). The capsule state directory is added at check time (it depends on the user).
FORBIDDEN_HOST_PATHS = (
    "/etc/shadow", "/etc/shadow-", "/etc/gshadow", "/etc/gshadow-", "/etc/sudoers",
    "/etc/sudoers.d", "/etc/ssh", "/root", "/proc", "/sys", "/dev", "/boot", "/run",
    "/var/run", "/var/lib/capsule-run",
)
# Places inside the sandbox that capsule-run builds itself; nothing may be bound over them.
RESERVED_SANDBOX_PATHS = ("/proc", "/sys", "/dev", "/etc", "/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32")


# ---------------------------------------------------------------------------------- parsing


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON (RFC 8259)")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if key in obj:
            raise InvalidField(f"duplicate key {key!r}: a request must not say a field twice", field=key)
        obj[key] = value
    return obj


def parse_request_bytes(raw: bytes) -> dict[str, Any]:
    """Decode one request document. E1001 for anything that is not one JSON object."""
    if len(raw) > MAX_REQUEST_BYTES:
        raise RequestNotJSON(f"request is larger than {MAX_REQUEST_BYTES} bytes", limit_bytes=MAX_REQUEST_BYTES)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RequestNotJSON(f"request is not UTF-8: {exc.reason} at byte {exc.start}") from None
    if not text.strip():
        raise RequestNotJSON("request is empty: send one JSON object on stdin")
    try:
        obj = json.loads(text, parse_constant=_reject_constant, object_pairs_hook=_no_duplicates)
    except RecursionError:
        raise RequestNotJSON("request is nested too deeply") from None
    except json.JSONDecodeError as exc:
        raise RequestNotJSON(f"request is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except ValueError as exc:
        raise RequestNotJSON(f"request is not valid JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise RequestNotJSON(f"request must be a JSON object, not {_json_type(obj)}")
    return obj


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


# ------------------------------------------------------------------------ shape (E1002)


def _bad(field: str, message: str) -> InvalidField:
    return InvalidField(f"{field}: {message}", field=field)


def _obj(value: Any, field: str, allowed: set[str]) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _bad(field, f"must be an object, not {_json_type(value)}")
    for key in value:
        if key not in allowed:
            name = f"{field}.{key}" if field else key
            raise InvalidField(f"unknown field {name!r}", field=name, allowed=sorted(allowed))
    return value


def _int(value: Any, field: str, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad(field, f"must be an integer, not {_json_type(value)}")
    if not lo <= value <= hi:
        raise _bad(field, f"must be between {lo} and {hi}, got {value}")
    return value


def _number(value: Any, field: str, lo: float, hi: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _bad(field, f"must be a number, not {_json_type(value)}")
    if not lo <= value <= hi:
        raise _bad(field, f"must be between {lo} and {hi}, got {value}")
    return float(value)


def _bool(value: Any, field: str) -> bool:
    if not isinstance(value, bool):
        raise _bad(field, f"must be true or false, not {_json_type(value)}")
    return value


def _str(value: Any, field: str, *, max_len: int = 4096, allow_empty: bool = False) -> str:
    if not isinstance(value, str):
        raise _bad(field, f"must be a string, not {_json_type(value)}")
    if not value and not allow_empty:
        raise _bad(field, "must not be empty")
    if len(value) > max_len:
        raise _bad(field, f"is longer than {max_len} characters")
    if "\x00" in value:
        raise _bad(field, "contains a NUL byte")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise _bad(field, "is not valid Unicode (a lone surrogate)") from None
    return value


def _list(value: Any, field: str, max_items: int, min_items: int = 0) -> list[Any]:
    if not isinstance(value, list):
        raise _bad(field, f"must be an array, not {_json_type(value)}")
    if not min_items <= len(value) <= max_items:
        raise _bad(field, f"must have {min_items} to {max_items} items, has {len(value)}")
    return value


def _pattern(value: Any, field: str, regex: re.Pattern[str], what: str) -> str:
    text = _str(value, field, max_len=253)
    if not regex.fullmatch(text):
        raise _bad(field, f"must be {what}")
    return text


def _decode_blob(value: Any, field: str, encoding: str = "utf-8") -> bytes:
    if encoding == "base64":
        if not isinstance(value, str):
            raise _bad(field, f"must be a base64 string, not {_json_type(value)}")
        try:
            return base64.b64decode(value.encode("ascii"), validate=True)
        except (binascii.Error, UnicodeEncodeError):
            raise _bad(field, "is not valid base64") from None
    if not isinstance(value, str):
        raise _bad(field, f"must be a string, not {_json_type(value)}")
    return value.encode("utf-8", "surrogatepass")


def _mode(value: Any, field: str) -> int:
    if isinstance(value, str) and _OCTAL_RE.fullmatch(value):
        value = int(value.replace("o", ""), 8)
    mode = _int(value, field, 0, 0o7777) if not isinstance(value, str) else None
    if mode is None:
        raise _bad(field, "must be an integer or an octal string such as \"0755\"")
    if mode & 0o7000:
        raise _bad(field, "setuid, setgid and sticky bits are not allowed")
    return mode


# Each resources field: (low, high). Ceilings beyond these come from the profile (E1006).
RESOURCE_RANGES: dict[str, tuple[int, int]] = {
    "memory_bytes": (MiB, 1 << 50),
    "cpu_shares": (1, 10000),
    "cpu_time_ms": (1, 24 * 3600 * 1000),
    "max_output_bytes": (0, 10 * MiB),
    "max_pids": (1, 1000),
    "max_file_bytes": (1, 1 << 50),
    "max_open_files": (3, 1 << 20),
    "tmpfs_bytes": (MiB, 1 << 40),
}


def _resources(value: Any) -> Resources:
    obj = _obj(value, "resources", set(RESOURCE_RANGES) | {"cpu_quota"})
    kwargs: dict[str, Any] = {}
    for name, (lo, hi) in RESOURCE_RANGES.items():
        if name in obj:
            kwargs[name] = _int(obj[name], f"resources.{name}", lo, hi)
    if "cpu_quota" in obj:
        kwargs["cpu_quota"] = _number(obj["cpu_quota"], "resources.cpu_quota", 0.01, float(os.cpu_count() or 1))
    return Resources(**kwargs)


def _isolation(value: Any) -> Isolation:
    allowed = {"network", "readonly_paths", "writable_paths", "working_directory", "bind_mounts", "hostname"}
    obj = _obj(value, "isolation", allowed)
    kwargs: dict[str, Any] = {}
    if "network" in obj:
        kwargs["network"] = _bool(obj["network"], "isolation.network")
    for name in ("readonly_paths", "writable_paths"):
        if name in obj:
            items = _list(obj[name], f"isolation.{name}", 20)
            kwargs[name] = tuple(_str(p, f"isolation.{name}[{i}]") for i, p in enumerate(items))
    if "working_directory" in obj:
        kwargs["working_directory"] = _str(obj["working_directory"], "isolation.working_directory")
    if "hostname" in obj:
        kwargs["hostname"] = _pattern(obj["hostname"], "isolation.hostname", _HOSTNAME_RE, "a valid host name")
    if "bind_mounts" in obj:
        binds = []
        for i, item in enumerate(_list(obj["bind_mounts"], "isolation.bind_mounts", 20)):
            field = f"isolation.bind_mounts[{i}]"
            spec = _obj(item, field, {"source", "destination", "readonly"})
            for key in ("source", "destination"):
                if key not in spec:
                    raise _bad(f"{field}.{key}", "is required")
            binds.append(BindMount(
                source=_str(spec["source"], f"{field}.source"),
                destination=_str(spec["destination"], f"{field}.destination"),
                readonly=_bool(spec.get("readonly", True), f"{field}.readonly"),
            ))
        kwargs["bind_mounts"] = tuple(binds)
    return Isolation(**kwargs)


def _files(value: Any) -> tuple[FileSpec, ...]:
    specs = []
    for i, item in enumerate(_list(value, "files", 1000)):
        field = f"files[{i}]"
        spec = _obj(item, field, {"path", "content", "encoding", "mode"})
        if "path" not in spec:
            raise _bad(f"{field}.path", "is required")
        path = _str(spec["path"], f"{field}.path")
        encoding = spec.get("encoding", "utf-8")
        if encoding not in ("utf-8", "base64"):
            raise _bad(f"{field}.encoding", "must be \"utf-8\" or \"base64\"")
        content = _decode_blob(spec.get("content", ""), f"{field}.content", encoding)
        mode = _mode(spec.get("mode", 0o644), f"{field}.mode")
        specs.append(FileSpec(path=path, content=content, mode=mode))
    return tuple(specs)


def _stdin(value: Any) -> bytes:
    if isinstance(value, dict):
        obj = _obj(value, "stdin", {"base64"})
        if "base64" not in obj:
            raise _bad("stdin.base64", "is required")
        return _decode_blob(obj["base64"], "stdin.base64", "base64")
    if not isinstance(value, str):
        raise _bad("stdin", f"must be a string or {{\"base64\": ...}}, not {_json_type(value)}")
    return value.encode("utf-8", "surrogatepass")


TOP_LEVEL: dict[str, Callable[[Any], Any]] = {
    "command": lambda v: tuple(_str(a, f"command[{i}]") for i, a in enumerate(_list(v, "command", 1000, 1))),
    "environment": lambda v: _environment(v),
    "stdin": _stdin,
    "timeout_ms": lambda v: _int(v, "timeout_ms", 1, 600_000),
    "execution_id": lambda v: _pattern(v, "execution_id", _ID_RE, "1 to 64 characters of [A-Za-z0-9._-]"),
    "profile": lambda v: _str(v, "profile", max_len=64),
    "resources": _resources,
    "isolation": _isolation,
    "files": _files,
    "collect": lambda v: tuple(_str(p, f"collect[{i}]", max_len=1024) for i, p in enumerate(_list(v, "collect", 100))),
    "session": lambda v: _pattern(v, "session", _ID_RE, "1 to 64 characters of [A-Za-z0-9._-]"),
}


def _environment(value: Any) -> dict[str, str]:
    obj = value if isinstance(value, dict) else None
    if obj is None:
        raise _bad("environment", f"must be an object of strings, not {_json_type(value)}")
    if len(obj) > 100:
        raise _bad("environment", f"must have at most 100 entries, has {len(obj)}")
    env = {}
    for name, val in obj.items():
        field = f"environment.{name}"
        if not _ENV_NAME_RE.fullmatch(name) or len(name) > 255:
            raise _bad(field, "name must match [A-Za-z_][A-Za-z0-9_]*")
        env[name] = _str(val, field, allow_empty=True)
    return env


def new_execution_id() -> str:
    """A random (version 4) UUID, without importing uuid (which imports platform: ~5 ms)."""
    raw = bytearray(os.urandom(16))
    raw[6] = (raw[6] & 0x0F) | 0x40
    raw[8] = (raw[8] & 0x3F) | 0x80
    h = raw.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def request_id(obj: Any) -> str:
    """The execution_id to answer with: the request's own if it is valid, else a fresh UUID."""
    if isinstance(obj, dict):
        value = obj.get("execution_id")
        if isinstance(value, str) and _ID_RE.fullmatch(value):
            return value
    return new_execution_id()


def validate_shape(obj: dict[str, Any]) -> ExecutionRequest:
    """E1002: every field known, of the right type and in range."""
    _obj(obj, "", set(TOP_LEVEL))
    if "command" not in obj:
        raise _bad("command", "is required")
    values = {name: check(obj[name]) for name, check in TOP_LEVEL.items() if name in obj}
    values["execution_id"] = values.get("execution_id") or new_execution_id()
    return ExecutionRequest(**values)


# ---------------------------------------------------------------------- paths (E1003)


def _is_under(path: str, prefix: str) -> bool:
    return path == prefix or path.startswith(prefix.rstrip("/") + "/")


def check_absolute(path: str, field: str) -> None:
    if not path.startswith("/"):
        raise UnsafePath(f"{field}: {path!r} is not an absolute path", field=field)
    parts = path.split("/")
    if ".." in parts or "." in parts or "//" in path or (path != "/" and path.endswith("/")):
        raise UnsafePath(f"{field}: {path!r} is not normalised (no '.', '..', '//' or trailing '/')", field=field)


def check_host_path(path: str, field: str) -> None:
    """A host path to bind: absolute, normalised, and neither a secret place nor above one."""
    check_absolute(path, field)
    forbidden = FORBIDDEN_HOST_PATHS + (state_dir(),)
    # Resolve symlinks as well: /tmp/x -> /etc/shadow must be refused like /etc/shadow.
    for candidate in {path, os.path.realpath(path)}:
        for secret in forbidden:
            if _is_under(candidate, secret) or _is_under(secret, candidate):
                raise UnsafePath(
                    f"{field}: {path!r} would expose {secret} to the sandbox", field=field, forbidden=secret
                )


def check_sandbox_path(path: str, field: str) -> None:
    """A place inside the sandbox: absolute, normalised, not one of the system places."""
    check_absolute(path, field)
    if path == "/":
        raise UnsafePath(f"{field}: the sandbox root cannot be replaced", field=field)
    for reserved in RESERVED_SANDBOX_PATHS:
        if _is_under(path, reserved):
            raise UnsafePath(f"{field}: {path!r} is inside {reserved}, which capsule-run builds itself", field=field)


def check_relative(path: str, field: str) -> None:
    if path.startswith("/") or ".." in path.split("/") or "\x00" in path:
        raise UnsafePath(f"{field}: {path!r} must be relative to the working directory, without '..'", field=field)


def validate_paths(req: ExecutionRequest) -> None:
    iso = req.isolation
    check_sandbox_path(iso.working_directory, "isolation.working_directory")
    for i, path in enumerate(iso.readonly_paths):
        check_host_path(path, f"isolation.readonly_paths[{i}]")
    for i, path in enumerate(iso.writable_paths):
        check_host_path(path, f"isolation.writable_paths[{i}]")
        check_sandbox_path(path, f"isolation.writable_paths[{i}]")
    for i, bind in enumerate(iso.bind_mounts):
        check_host_path(bind.source, f"isolation.bind_mounts[{i}].source")
        check_sandbox_path(bind.destination, f"isolation.bind_mounts[{i}].destination")
    for i, spec in enumerate(req.files):
        check_relative(spec.path, f"files[{i}].path")
        if os.path.normpath(spec.path) in (".", ""):
            raise UnsafePath(f"files[{i}].path: must name a file", field=f"files[{i}].path")
    for i, pattern in enumerate(req.collect):
        check_relative(pattern, f"collect[{i}]")


def validate(obj: dict[str, Any]) -> ExecutionRequest:
    req = validate_shape(obj)
    validate_paths(req)
    return req
