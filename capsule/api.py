"""`capsule.execute()`: one request in, one response out. The CLI is a thin layer over this."""

from __future__ import annotations

import logging
import os
import time
import traceback
from collections.abc import Callable
from typing import Any

from .errors import CapsuleError, InternalError
from .models import ExecutionRequest, ExecutionResponse, utc_now
from .validation import request_id

log = logging.getLogger("capsule")


def _error_response(execution_id: str, started: str, exc: CapsuleError) -> ExecutionResponse:
    status = exc.status if exc.code.startswith(("E3", "E4", "E5")) else "error"
    return ExecutionResponse(
        execution_id=execution_id, status=status, timestamps={"started": started, "completed": utc_now()},
        error=exc.to_dict(), limits_hit=["wall_time"] if status == "timeout" else None,  # a busy session
    )


def execute(
    request: dict[str, Any] | ExecutionRequest | bytes | str,
    *,
    profile: str | None = None,
    config: str | None = None,
    on_event: Callable[[dict[str, Any]], None] | None = None,
) -> ExecutionResponse:
    """Run one request in a fresh sandbox and return its response. Never raises for a bad
    request or a failed sandbox: every outcome is a response (PROTOCOL.md section 1).

    `request` is a dict (as parsed JSON), raw JSON bytes/str, or a validated ExecutionRequest.
    `profile` overrides the request's `profile` field (the CLI's --profile wins).
    """
    from . import profiles, validation
    from .plan import build_plan

    t0 = time.monotonic()
    started = utc_now()
    execution_id = request.execution_id if isinstance(request, ExecutionRequest) else request_id(request)
    try:
        if isinstance(request, (bytes, str)):
            raw = request.encode("utf-8", "surrogatepass") if isinstance(request, str) else request
            request = validation.parse_request_bytes(raw)
            execution_id = request_id(request)
        if isinstance(request, dict):
            req = validation.validate(request)
        elif isinstance(request, ExecutionRequest):
            req = request
            validation.validate_paths(req)
        else:
            raise validation.RequestNotJSON(f"request must be a JSON object, not {type(request).__name__}")
        execution_id = req.execution_id
        prof = profiles.load_profile(profile or req.profile or "default", config)
        limits = profiles.effective_limits(req, prof)
        profiles.check_policy(req, prof)
        from . import host

        warnings = host.check_layers(prof)
        session_dir = host.session_dir_for(req.session, rootless=os.geteuid() != 0) if req.session else None
        from . import cgroups

        plan = build_plan(req, prof, limits, session_dir=session_dir,
                          cgroup_available=cgroups.detect().version != "none")
        from .supervisor import Run

        return Run(plan, started=started, t0=t0, on_event=on_event, warnings=warnings).execute()
    except CapsuleError as exc:
        return _error_response(execution_id, started, exc)
    except Exception as exc:
        where = traceback.extract_tb(exc.__traceback__)[-1]
        log.error("internal error:\n%s", traceback.format_exc())
        return _error_response(execution_id, started, InternalError(
            f"{type(exc).__name__}: {exc}", where=f"{os.path.basename(where.filename)}:{where.lineno}"))
