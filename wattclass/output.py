"""Print command results either for people or, with ``--json``, as data for scripts."""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable
from typing import Any


def json_safe(data: Any) -> Any:
    """``data`` with every NaN or infinite float (a missing label or confidence, an energy summed
    over an infinite reading) as None, in dicts, lists and tuples at any depth.

    Why: ``json.dump`` writes them as ``NaN`` and ``Infinity``, which are not JSON: ``classify
    --json`` printed ``"label": NaN`` for a job nobody could label and ``telemetry inspect
    --json`` ``"energy_j": Infinity``, and a strict reader (jq, JavaScript, Go) refuses the whole
    document."""
    if isinstance(data, float):
        return data if math.isfinite(data) else None
    if isinstance(data, dict):
        return {k: json_safe(v) for k, v in data.items()}
    if isinstance(data, list | tuple):
        return [json_safe(v) for v in data]
    if type(data).__module__ == "numpy" and hasattr(data, "item"):  # a numpy scalar: its Python value
        return json_safe(data.item())
    return data


def emit(data: Any, as_json: bool, human: Callable[[Any], str]) -> None:
    """Write ``data`` as JSON (one document, sorted keys; standard JSON: ``json_safe``) or as
    ``human(data)`` text to stdout."""
    if as_json:
        json.dump(json_safe(data), sys.stdout, indent=2, sort_keys=True, default=str, allow_nan=False)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(human(data).rstrip("\n") + "\n")
