"""Render the report: Jinja2 templates fed by one Python function per section.

The page is ``templates/report.html.j2``; each section is a function in ``sections.py`` that
computes what its template shows (numbers, tables, PNGs) and a template
``templates/sections/<function name>.html.j2`` that lays it out. Adding a section = one function
listed in ``sections.SECTIONS`` + one template file. Someone who only wants to change wording or
layout edits the templates and never touches pandas.

Helpers every template can use (filters): ``num`` (digits a person needs), ``kwh`` (kWh or Wh),
``pct``, ``conf`` (confidence, always 2 digits), ``img`` (PNG bytes -> inline data URI).
Macros in ``templates/macros.html.j2``: ``table``, ``na`` (a "not available: why" note),
``card``, ``img``.
"""

from __future__ import annotations

import base64
import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

import jinja2
import pandas as pd
from markupsafe import Markup

#: Values whose magnitude is below this print as 0 (float noise such as 1e-19 kWh from a subtraction).
_ZERO = 1e-9


def num(v: object) -> str:
    """A number with as many digits as a person needs: 12,345 / 12.35 / 0.0123; noise prints as 0,
    tiny values as <0.001."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if isinstance(v, numbers.Integral) and not isinstance(v, bool):  # counts: 58, never 58.00
        return f"{int(v):,d}"
    if not isinstance(v, numbers.Real):
        return str(v)
    v = float(v)
    if math.isnan(v):
        return "-"
    a = abs(float(v))
    if a < _ZERO:
        return "0"
    if a < 1e-3:  # never scientific notation in a table a person reads
        return "<0.001" if v > 0 else ">-0.001"
    return f"{v:,.0f}" if a >= 100 else f"{v:.2f}" if a >= 1 else f"{v:.3g}"


def kwh(v: float) -> str:
    """Energy for people: kWh, or Wh under 1 kWh (a short test run); noise prints as 0 Wh."""
    if abs(v) < _ZERO:
        return "0 Wh"
    return f"{v:,.1f} kWh" if abs(v) >= 1 else f"{v * 1000:,.0f} Wh"


def pct(v: float | None) -> str:
    """A share 0-1 as a whole percentage."""
    if v is None or math.isnan(v):
        return "-"
    return f"{v:.0%}"


def conf(v: object) -> str:
    """A confidence, always with two decimals (never 0.9 next to 0.923)."""
    try:
        f = float(v)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return "-"
    return "-" if math.isnan(f) else f"{f:.2f}"


def data_uri(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


@dataclass(frozen=True)
class Table:
    """A table as the template sees it: header texts and rows of cell texts (already formatted).

    Built here rather than with ``DataFrame.to_html`` so no pandas artefacts reach the page (the
    empty row an index name makes, a ``col_0`` header from an unnamed crosstab axis).
    """

    columns: list[str]
    rows: list[list[str]]


def table(
    df: pd.DataFrame,
    index: str | None = None,
    formats: Mapping[str, Any] | None = None,
) -> Table:
    """``df`` as a Table; ``index``: header of the index column (None: the index is dropped).

    ``formats`` maps a column to a formatter; other numbers go through ``num``.
    """
    fmts = dict(formats or {})
    d = df.reset_index() if index is not None else df.reset_index(drop=True)
    if index is not None:
        d = d.rename(columns={d.columns[0]: index})
    cols = [str(c) for c in d.columns]
    rows = []
    for rec in d.itertuples(index=False, name=None):
        rows.append(
            [fmts.get(c, num)(v) if not isinstance(v, str) else v for c, v in zip(cols, rec, strict=True)]
        )
    return Table(cols, rows)


@cache
def environment() -> jinja2.Environment:
    """The templates' environment: autoescaped (user strings, job names), strict on undefined names."""
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("wattclass.report", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(num=num, kwh=kwh, pct=pct, conf=conf, img=data_uri)
    return env


def render_page(title: str, subtitle: str, sections: Sequence[tuple[str, Mapping[str, Any]]]) -> str:
    """The whole document: each (template name, variables) rendered in order inside the page."""
    env = environment()
    parts = [env.get_template(f"sections/{name}.html.j2").render(**vars_) for name, vars_ in sections]
    return env.get_template("report.html.j2").render(
        title=title, subtitle=subtitle, sections=[Markup(p) for p in parts]
    )
