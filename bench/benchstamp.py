"""The end of every JSON-printing benchmark: the machine it ran on, its load, the time, then stdout.

Shared by the bench scripts so each result says where it was measured in the same keys
(docs/benchmarks.md quotes the load next to each figure).
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from typing import Any


def emit(out: dict[str, Any]) -> int:
    """Add ``machine`` and ``measured_at`` to ``out``, print it as JSON; returns exit status 0."""
    out["machine"] = {"cpus": len(os.sched_getaffinity(0)),
                      "load_avg_1m_at_end": round(os.getloadavg()[0], 2),
                      "python": platform.python_version(), "platform": platform.platform()}
    out["measured_at"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    json.dump(out, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0
