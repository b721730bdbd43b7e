"""capsule-run: run untrusted commands in a Linux sandbox, one JSON request at a time.

    >>> import capsule
    >>> capsule.execute({"command": ["echo", "hi"]}).to_dict()["stdout"]
    'hi\\n'
"""

from .api import execute
from .models import ExecutionRequest, ExecutionResponse

__all__ = ["ExecutionRequest", "ExecutionResponse", "execute"]
__version__ = "0.1.0"
