"""The `capsule-run` command: I/O and exit status around `capsule.execute()`, nothing more.

Stdout carries exactly one JSON document (or JSON Lines with --stream and `batch`); every log
line goes to stderr. Exit status follows PROTOCOL.md section 1 (timeout(1)'s conventions).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
from typing import Any

import click

from . import api
from .errors import CapsuleError, InternalError, InvalidField, IOFailure, MonitorError
from .models import ExecutionResponse

log = logging.getLogger("capsule")


def _dump(obj: Any, pretty: bool = False) -> str:
    # ASCII with \u escapes: no raw U+2028/U+2029 or NEL that a JSON Lines reader splitting on
    # Unicode line breaks (Python's str.splitlines) would cut a document at.
    return json.dumps(obj, indent=2 if pretty else None, ensure_ascii=True)


def _emit(obj: Any, pretty: bool = False) -> None:
    # Bytes, not text: the protocol is UTF-8 whatever the locale says; a lone surrogate (a
    # file name that was not UTF-8) becomes U+FFFD rather than an exception.
    sys.stdout.buffer.write((_dump(obj, pretty) + "\n").encode("utf-8", "replace"))
    sys.stdout.flush()


def _error_doc(exc: CapsuleError) -> ExecutionResponse:
    from .models import utc_now
    from .validation import request_id

    now = utc_now()
    return ExecutionResponse(execution_id=request_id(None), status="error",
                             timestamps={"started": now, "completed": now}, error=exc.to_dict())


def _read_request(path: str | None) -> bytes | CapsuleError:
    from .validation import MAX_REQUEST_BYTES

    try:
        if path is None or path == "-":
            return sys.stdin.buffer.read(MAX_REQUEST_BYTES + 1)
        with open(path, "rb") as fh:
            return fh.read(MAX_REQUEST_BYTES + 1)
    except OSError as exc:
        return IOFailure(f"reading the request: {exc.strerror}", file=path)


@click.group(invoke_without_command=True, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--request", "request_path", metavar="FILE", help="Read the request from FILE instead of stdin.")
@click.option("--profile", metavar="NAME", help="Profile to apply (wins over the request's `profile`).")
@click.option("--config", metavar="PATH", help="Profile file or directory searched first.")
@click.option("--pretty", is_flag=True, help="Indent the JSON response.")
@click.option("--stream", is_flag=True, help="JSON Lines: started, stdout/stderr chunks, then the result.")
@click.option("-v", "--verbose", count=True, help="More log lines on stderr.")
@click.version_option(package_name="capsule-run", prog_name="capsule-run")
@click.pass_context
def main(ctx: click.Context, request_path: str | None, profile: str | None, config: str | None,
         pretty: bool, stream: bool, verbose: int) -> None:
    """Run one ExecutionRequest (JSON on stdin) in a sandbox; print one ExecutionResponse."""
    logging.basicConfig(level=logging.DEBUG if verbose > 1 else logging.INFO if verbose else logging.WARNING,
                        stream=sys.stderr, format="capsule-run: %(levelname)s: %(message)s")
    ctx.obj = {"profile": profile, "config": config, "pretty": pretty}
    if ctx.invoked_subcommand is not None:
        return
    raw = _read_request(request_path)
    if isinstance(raw, CapsuleError):
        resp = _error_doc(raw)
    else:
        sink = (lambda event: _emit(event)) if stream else None
        resp = api.execute(raw, profile=profile, config=config, on_event=sink)
    if stream:
        _emit({"event": "result", **resp.to_dict()})
    else:
        _emit(resp.to_dict(), pretty)
    ctx.exit(resp.cli_exit_status)


@main.command()
@click.pass_context
def batch(ctx: click.Context) -> None:
    """JSON Lines in, JSON Lines out: one response per request line, in order."""
    for line in sys.stdin.buffer:
        if not line.strip():
            continue
        resp = api.execute(line, profile=ctx.obj["profile"], config=ctx.obj["config"])
        _emit(resp.to_dict())


@main.group(invoke_without_command=True)
@click.pass_context
def profiles(ctx: click.Context) -> None:
    """List the profiles this host knows (`profiles show NAME` for one)."""
    if ctx.invoked_subcommand is None:
        from . import profiles as prof

        names = prof.list_profiles(ctx.obj["config"])
        rows: list[dict[str, Any]] = []
        for name in names:
            try:
                p = prof.load_profile(name, ctx.obj["config"])
                rows.append({"name": name, "description": p.description, "source": p.source})
            except CapsuleError as exc:
                rows.append({"name": name, "error": exc.to_dict()})
        _emit({"profiles": rows}, ctx.obj["pretty"])


@profiles.command("show")
@click.argument("name")
@click.pass_context
def profiles_show(ctx: click.Context, name: str) -> None:
    """Print the effective (merged) profile NAME."""
    from . import profiles as prof

    try:
        p = prof.load_profile(name, ctx.obj["config"])
        doc = p.as_dict()
        doc["defaults"] = {**{k: v for k, v in prof.BUILTIN_DEFAULTS.items()}, **p.defaults}
        _emit(doc, ctx.obj["pretty"])
    except CapsuleError as exc:
        _emit(_error_doc(exc).to_dict(), ctx.obj["pretty"])
        ctx.exit(125)


@main.command()
@click.option("--clean", is_flag=True, help="Also remove what crashed runs left behind.")
@click.pass_context
def check(ctx: click.Context, clean: bool) -> None:
    """Report what this host offers and which profiles can run here."""
    from . import cgroups, host

    cleaned = cgroups.clean_leftovers() if clean else None  # before the report's own probe run
    doc = host.report(ctx.obj["config"])
    if cleaned is not None:
        doc["cleaned"] = cleaned
    _emit(doc, ctx.obj["pretty"])


@main.group()
def sessions() -> None:
    """Manage named session workspaces."""


@sessions.command("list")
def sessions_list() -> None:
    from . import host

    _emit({"sessions": host.list_sessions()})


@sessions.command("rm")
@click.argument("name")
@click.pass_context
def sessions_rm(ctx: click.Context, name: str) -> None:
    from . import host
    from .validation import _ID_RE

    if not _ID_RE.fullmatch(name):
        _emit(_error_doc(InvalidField(f"session name {name!r} is invalid", field="session")).to_dict())
        ctx.exit(125)
    try:
        _emit({"removed": host.remove_session(name), "session": name})
    except CapsuleError as exc:
        _emit(_error_doc(exc).to_dict())
        ctx.exit(125)


class Terminated(KeyboardInterrupt):
    """SIGTERM, turned into an exception so that the run's cleanup (kill the sandbox, reap it,
    remove its cgroup) happens on the way out, as it does for ^C."""


def _on_sigterm(_signum: int, _frame: object) -> None:
    raise Terminated()


def run() -> None:
    """Entry point: every failure, CLI misuse included, still prints one JSON document."""
    signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        code = main.main(standalone_mode=False)  # returns ctx.exit()'s status
        # The answer is out and every sandbox is gone: skip the interpreter's teardown, which
        # costs a CLI call more than a sandbox does (os._exit does not flush: we do).
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code if isinstance(code, int) else 0)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.UsageError as exc:
        _emit(_error_doc(InvalidField(f"command line: {exc.format_message()}", field="argv")).to_dict())
        sys.exit(125)
    except click.Abort as exc:  # click turns KeyboardInterrupt (and our Terminated) into Abort
        term = isinstance(exc.__cause__, Terminated)
        name = "SIGTERM" if term else "SIGINT"
        _emit(_error_doc(MonitorError(f"capsule-run received {name}: the sandbox was stopped and removed",
                                      signal=name, hint="nothing to fix: the caller interrupted the run")).to_dict())
        sys.exit(143 if term else 130)
    except SystemExit:
        raise
    except BaseException as exc:
        log.exception("internal error")
        _emit(_error_doc(InternalError(f"{type(exc).__name__}: {exc}", where="cli")).to_dict())
        sys.exit(125)
