"""The report's what-if and measured-effect section: one function, one template block.

Inputs are plain data so the section renders whatever produced them: ``whatif`` is the document
``wattclass simulate --json`` prints (plus ``span``), ``effects`` the rows ``wattclass effects``
prints, ``truth`` ({"label/cap": [runtime, energy]}) the injected effects of a generated canary
history (the demo) or None on a real cluster.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any


def _ci(r: Mapping[str, Any], k: str) -> str:
    v = r.get(k)
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "n/a"
    lo, hi = r.get(f"{k}_lo"), r.get(f"{k}_hi")
    if lo is None or (isinstance(lo, float) and math.isnan(lo)):
        return f"{v:.3f} [too few keys]"
    return f"{v:.3f} [{lo:.3f}, {hi:.3f}]"


def whatif_effects_vars(whatif: Mapping[str, Any] | None, effects: Sequence[Mapping[str, Any]] | None,
                        truth: Mapping[str, Sequence[float]] | None = None, whatif_why: str = "",
                        effects_why: str = "") -> dict[str, Any]:
    """The variables of templates/sections/whatif_effects.html.j2 (the report's section
    ``sections.whatif_effects`` hands them to the template)."""
    rows = []
    for r in effects or []:
        t = (truth or {}).get(f"{r['label']}/{r['cap']}")
        rows.append({**r, "runtime": _ci(r, "runtime_ratio"), "energy": _ci(r, "energy_ratio"),
                     "truth_runtime": f"{t[0]:.3f}" if t else "-",
                     "truth_energy": f"{t[1]:.3f}" if t else "-"})
    return {"whatif": whatif, "effects": rows, "has_truth": bool(truth),
            "whatif_why": whatif_why or "no policy given (--policy)",
            "effects_why": effects_why
            or "no canary in the label store yet: set [canary] fraction in the policy"}


def whatif_effects_section(whatif: Mapping[str, Any] | None, effects: Sequence[Mapping[str, Any]] | None,
                           truth: Mapping[str, Sequence[float]] | None = None, whatif_why: str = "",
                           effects_why: str = "") -> str:
    """HTML of the section alone (templates/sections/whatif_effects.html.j2)."""
    from wattclass.report.render import environment

    return environment().get_template("sections/whatif_effects.html.j2").render(
        **whatif_effects_vars(whatif, effects, truth, whatif_why, effects_why))
