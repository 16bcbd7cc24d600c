"""Power caps as text ("60%", "350W") and their value in watts on one GPU.

Separate from the policy module so the Prolog, which only needs this arithmetic, imports neither
tomllib nor dataclasses: Prolog start-up time is a budget (bench/prolog_latency.py).
"""

from __future__ import annotations

import math
import re
from typing import Literal, NamedTuple

from wattclass.errors import ConfigError

_CAP_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*(%|[wW])\s*$")

#: The sane range of a cap. Below 10 % of the default limit no GPU we know keeps working (every
#: NVIDIA datacenter GPU clamps far above that anyway); 50-2000 W covers every GPU's limits
#: (an A2 at 40-60 W .. a GB200 at 1200 W) while catching "0.6" or "5W" typed for 60 %.
PCT_RANGE = (10.0, 100.0)
WATT_RANGE = (50.0, 2000.0)

#: Known NVML power limits (default, min, max in W) for ``policy explain --gpu-model``; values as
#: NVML reports them on SXM boards with default settings (H200: docs/measurements, this repo's
#: recordings; the others from vendor datasheets). A site with other boards passes --limits.
KNOWN_LIMITS_W: dict[str, tuple[float, float, float]] = {
    "H200": (700.0, 200.0, 700.0),
    "H100": (700.0, 200.0, 700.0),
    "A100": (400.0, 100.0, 400.0),
}


class Cap(NamedTuple):
    """A cap as written by the sysadmin: ``unit`` "%" (of the default limit) or "W"."""

    value: float
    unit: Literal["%", "W"]

    def text(self) -> str:
        """Canonical text for admin_comment: "60%" or "350W" (no spaces, no separators)."""
        v = int(self.value) if float(self.value).is_integer() else self.value
        return f"{v}{self.unit}"


def parse_cap(value: object, where: str = "cap") -> Cap:
    """Parse "60%", "350W" or "350 W" and check its range; raise ConfigError naming ``where``.

    A bare number ("60", 0.6, 350) is refused: it used to mean watts, so ``memory = 0.6`` became
    0.6 W and clamped silently to the GPU's minimum, the harshest cap.
    """
    if not isinstance(value, str) or not (m := _CAP_RE.match(value)):
        raise ConfigError(f"{where}: a cap needs a unit, \"N%\" (of the GPU's default limit) or \"NW\" "
                          f"(watts), e.g. \"60%\" or \"350W\"; got {value!r}")
    number = float(m.group(1))
    unit: Literal["%", "W"] = "%" if m.group(2) == "%" else "W"
    lo, hi = PCT_RANGE if unit == "%" else WATT_RANGE
    if not math.isfinite(number) or not lo <= number <= hi:
        what = "of the default limit" if unit == "%" else "watts"
        raise ConfigError(f"{where}: {value!r} is outside the sane range {lo:g}-{hi:g}{unit} ({what})")
    return Cap(number, unit)


def parse_limits(text: str, where: str = "--limits") -> tuple[float, float, float]:
    """"DEFAULT,MIN,MAX" in watts (``policy explain --limits 700,200,700``)."""
    try:
        d, lo, hi = (float(x) for x in text.split(","))
    except ValueError as exc:
        raise ConfigError(f"{where}: expected DEFAULT,MIN,MAX in watts, e.g. 700,200,700; "
                          f"got {text!r}") from exc
    if not (0 < lo <= d <= hi and all(math.isfinite(x) for x in (d, lo, hi))):
        raise ConfigError(f"{where}: need 0 < MIN <= DEFAULT <= MAX, got {text!r}")
    return d, lo, hi


#: Name tokens of boards whose limits differ from the SXM board's of the same GPU: PCIe and NVL
#: cards, the V100 FHHL (a 150 W PCIe card) and the low-power V100 SXM2 "-LS" (250 W).
OTHER_BOARD_TOKENS: frozenset[str] = frozenset({"PCIE", "NVL", "FHHL", "LS"})


def board_key(model: str) -> str:
    """The GPU of an SXM board's model name, upper case ("H200", "A100", "V100"), "" for a PCIe or
    NVL board (``OTHER_BOARD_TOKENS``), whose limits differ from the SXM board's of the same GPU
    (A100 PCIe 250-300 W, not 400 W; H100 PCIe 350 W; H200 NVL 600 W; V100 FHHL 150 W), so a table
    of SXM limits must not be used for it.

    NVML's names: "NVIDIA H200", "NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3",
    "Tesla V100-SXM2-32GB", "NVIDIA A100-PCIE-40GB", "NVIDIA A100 80GB PCIe", "NVIDIA H200 NVL",
    "Tesla V100-FHHL-16GB", "Tesla V100-SXM2-32GB-LS". ``report.limits.board_key_sql`` is its SQL
    twin."""
    name = model.upper().replace("NVIDIA", "").replace("TESLA", "").strip()
    tokens = re.split(r"[\s_-]+", name)
    if OTHER_BOARD_TOKENS & set(tokens[1:]):
        return ""
    return tokens[0]


def known_range_w(model: object) -> tuple[float | None, float | None]:
    """The NVML (min, max) limit of a board ``KNOWN_LIMITS_W`` knows by its model name, else
    (None, None). The Prolog clamps each cap to its GPU's range; the what-if (``simulate``) and the
    report's savings estimate clamp where they know the range (a "20%" cap on an H200 is 200 W, its
    minimum, not 140 W) and leave other boards' caps as the policy says rather than guess."""
    lim = KNOWN_LIMITS_W.get(board_key(model)) if isinstance(model, str) else None
    return (lim[1], lim[2]) if lim is not None else (None, None)


def known_limits(model: str) -> tuple[float, float, float]:
    """NVML limits of a known GPU model ("H200", "NVIDIA H200", "h100"); ConfigError if unknown."""
    key = board_key(model)
    if key not in KNOWN_LIMITS_W:
        raise ConfigError(f"--gpu-model {model!r}: unknown (known: {', '.join(KNOWN_LIMITS_W)}); "
                          "give --limits DEFAULT,MIN,MAX instead")
    return KNOWN_LIMITS_W[key]


def cap_watts(cap: Cap, default_w: float, min_w: float | None, max_w: float | None) -> float:
    """The limit to set on one GPU: a share of its default limit or watts, clamped to [min, max]."""
    watts = default_w * cap.value / 100.0 if cap.unit == "%" else cap.value
    if min_w is not None:
        watts = max(watts, min_w)
    if max_w is not None:
        watts = min(watts, max_w)
    return round(watts, 3)
