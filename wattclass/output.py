"""Print command results either for people or, with ``--json``, as data for scripts."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any


def emit(data: Any, as_json: bool, human: Callable[[Any], str]) -> None:
    """Write ``data`` as JSON (one document, sorted keys) or as ``human(data)`` text to stdout."""
    if as_json:
        json.dump(data, sys.stdout, indent=2, sort_keys=True, default=str)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(human(data).rstrip("\n") + "\n")
