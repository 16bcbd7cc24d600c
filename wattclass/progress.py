"""The one progress bar of the command line: tqdm on stderr, shown only when stderr is a terminal.

Long scans (``classify``, ``nightly``: thousands of telemetry files) report each finished file
through a callback; under systemd or in a pipe the bar is off, so logs stay clean, and tqdm is
not even imported (issue 15: 20 ms of every nightly run by cron or systemd, for a bar it never draws).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import IO, TYPE_CHECKING, Never

if TYPE_CHECKING:
    from tqdm import tqdm


class FileProgress:
    """Callbacks for the labelling engine: ``set_total(n)`` once, then ``self(i, path)`` per file."""

    def __init__(self, stream: IO[str] | None = None, unit: str = "file") -> None:
        # sys.stderr looked up now, not at import: it may have been replaced since (pytest, daemons)
        self.stream = stream if stream is not None else sys.stderr
        self.bar: tqdm[Never] | None = None
        if self.stream.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=0, unit=unit, file=self.stream, dynamic_ncols=True, leave=True)

    def set_total(self, n: int) -> None:
        if self.bar is not None:
            self.bar.reset(total=n)

    def __call__(self, i: int, path: Path) -> None:
        if self.bar is None:
            return
        self.bar.update(1)
        if self.bar.total and self.bar.n >= self.bar.total:
            self.bar.close()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
