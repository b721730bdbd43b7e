"""rlimits, set in the workload just before exec.

Only ever lowered: the bounding set here lacks CAP_SYS_RESOURCE, so even root cannot raise a
hard limit (setrlimit(2)); where the host's hard limit is already lower, it is kept.
"""

from __future__ import annotations

import resource

from .errors import RlimitError
from .plan import Rlimit


def apply_rlimits_in_child(rlimits: tuple[Rlimit, ...]) -> None:
    for lim in rlimits:
        try:
            _, hard = resource.getrlimit(lim.resource)
            value = lim.value if hard == resource.RLIM_INFINITY else min(lim.value, hard)
            resource.setrlimit(lim.resource, (value, value))
        except (OSError, ValueError) as exc:
            raise RlimitError(f"setrlimit RLIMIT_{lim.name.upper()}={lim.value}: {exc}", stage="rlimits") from None
