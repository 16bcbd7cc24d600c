"""A small client for Prometheus's HTTP API (stdlib only): raw samples of range selectors.

Why raw samples (``/api/v1/query`` with ``metric[range]``) and not ``query_range``: a range query
resamples on its step with a 5-minute lookback, so a missed scrape is filled with the previous
value and a gap becomes invisible; the raw samples carry the scrape times, and the window builder
then treats gaps as it does for the daemon. Long spans are fetched in chunks so that no single
answer exceeds Prometheus's sample limit (``--query.max-samples``).
"""

from __future__ import annotations

import json
import logging
import math
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field

from wattclass.errors import DataError

log = logging.getLogger(__name__)

#: Default chunk: one hour of 1 s scrapes is 3,600 samples per series; with ~20 DCGM fields per GPU,
#: ~70k samples per GPU, so a node of 8 GPUs stays well under the default limit of 50 million.
DEFAULT_CHUNK_S = 3600.0


@dataclass
class Series:
    """One Prometheus series: its labels (``__name__`` included) and samples (time s, value)."""

    labels: dict[str, str]
    t: list[float] = field(default_factory=list)
    v: list[float] = field(default_factory=list)


class PrometheusClient:
    """Reads from one Prometheus server. Errors name the URL and what Prometheus said."""

    def __init__(self, url: str, timeout_s: float = 60.0) -> None:
        u = urllib.parse.urlparse(url)
        if u.scheme not in ("http", "https") or not u.netloc:
            raise DataError(f"--prometheus {url!r}: expected http(s)://host:port")
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s

    def _get(self, path: str, params: dict[str, str]) -> object:
        q = urllib.parse.urlencode(params)
        full = f"{self.url}{path}?{q}"
        try:
            with urllib.request.urlopen(full, timeout=self.timeout_s) as resp:
                body = resp.read()
        except urllib.error.HTTPError as exc:  # Prometheus answers 400/422/503 with a JSON error
            detail = exc.read().decode("utf-8", "replace")[:300]
            raise DataError(f"Prometheus at {self.url}: HTTP {exc.code} for {path}: {detail}") from exc
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise DataError(f"Prometheus at {self.url} is not reachable: {reason}") from exc
        try:
            doc = json.loads(body)
        except ValueError as exc:
            raise DataError(f"Prometheus at {self.url}: {path} did not answer JSON") from exc
        if not isinstance(doc, dict) or doc.get("status") != "success":
            err = doc.get("error") if isinstance(doc, dict) else doc
            raise DataError(f"Prometheus at {self.url}: {path} failed: {err}")
        return doc.get("data")

    def metric_names(self) -> set[str]:
        """Every metric name Prometheus knows (to say which DCGM fields are missing)."""
        data = self._get("/api/v1/label/__name__/values", {})
        return {str(n) for n in data} if isinstance(data, list) else set()

    def raw(self, selector: str, start: float, end: float) -> list[Series]:
        """Raw samples of ``selector`` with start < t <= end (one range-vector query)."""
        span = max(end - start, 0.001)
        rng = f"{math.ceil(span * 1000)}ms"
        data = self._get("/api/v1/query", {"query": f"{selector}[{rng}]", "time": f"{end:.3f}"})
        if not isinstance(data, dict) or data.get("resultType") != "matrix":
            raise DataError(f"Prometheus at {self.url}: expected a matrix for {selector}")
        out = []
        for r in data.get("result", []):
            s = Series(dict(r.get("metric", {})))
            for t, v in r.get("values", []):
                s.t.append(float(t))
                s.v.append(float(v))
            out.append(s)
        return out

    def raw_chunks(self, selector: str, start: float, end: float, chunk_s: float = DEFAULT_CHUNK_S
                   ) -> Iterator[list[Series]]:
        """``raw`` over [start, end] in chunks of ``chunk_s`` (start inclusive)."""
        if end <= start:
            raise DataError(f"--end ({end}) must be after --start ({start})")
        lo = start - 0.001  # range selectors are open on the left: include a sample at ``start``
        while lo < end:
            hi = min(lo + chunk_s, end)
            log.debug("fetching %s (%.3f, %.3f]", selector, lo, hi)
            yield self.raw(selector, lo, hi)
            lo = hi
