"""Power caps as text ("60%", "350W") and their value in watts on one GPU.

Separate from the policy module so the Prolog, which only needs this arithmetic, imports neither
tomllib nor dataclasses: Prolog start-up time is a budget (bench/prolog_latency.py).
"""

from __future__ import annotations

import math
import re
from typing import Literal, NamedTuple

from wattclass.errors import ConfigError

_CAP_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*(%|[wW])?\s*$")


class Cap(NamedTuple):
    """A cap as written by the sysadmin: ``unit`` "%" (of the default limit) or "W"."""

    value: float
    unit: Literal["%", "W"]

    def text(self) -> str:
        """Canonical text for admin_comment: "60%" or "350W" (no spaces, no separators)."""
        v = int(self.value) if float(self.value).is_integer() else self.value
        return f"{v}{self.unit}"


def parse_cap(value: object, where: str = "cap") -> Cap:
    """Parse "60%", "350W", "350 W" or a number of watts; raise ConfigError naming ``where``."""
    if isinstance(value, bool):
        raise ConfigError(f"{where}: expected \"N%\", \"NW\" or a number of watts, got {value!r}")
    if isinstance(value, int | float):
        watts = float(value)
        unit: Literal["%", "W"] = "W"
    elif isinstance(value, str) and (m := _CAP_RE.match(value)):
        watts = float(m.group(1))
        unit = "%" if m.group(2) == "%" else "W"
    else:
        raise ConfigError(f"{where}: expected \"N%\", \"NW\" or a number of watts, got {value!r}")
    if not math.isfinite(watts) or watts <= 0:
        raise ConfigError(f"{where}: cap must be positive, got {value!r}")
    if unit == "%" and watts > 100:
        raise ConfigError(f"{where}: a cap above 100% of the default limit would raise power: {value!r}")
    return Cap(watts, unit)


def cap_watts(cap: Cap, default_w: float, min_w: float | None, max_w: float | None) -> float:
    """The limit to set on one GPU: a share of its default limit or watts, clamped to [min, max]."""
    watts = default_w * cap.value / 100.0 if cap.unit == "%" else cap.value
    if min_w is not None:
        watts = max(watts, min_w)
    if max_w is not None:
        watts = min(watts, max_w)
    return round(watts, 3)
