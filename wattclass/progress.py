"""The one progress bar of the command line: tqdm on stderr, shown only when stderr is a terminal.

Long scans (``classify``, ``nightly``: thousands of telemetry files) report each finished file
through a callback; under systemd or in a pipe the bar is off, so logs stay clean.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import IO, Never

from tqdm import tqdm


class FileProgress:
    """Callbacks for the labelling engine: ``set_total(n)`` once, then ``self(i, path)`` per file."""

    def __init__(self, stream: IO[str] | None = None, unit: str = "file") -> None:
        # sys.stderr looked up now, not at import: it may have been replaced since (pytest, daemons)
        self.stream = stream if stream is not None else sys.stderr
        self.bar: tqdm[Never] = tqdm(total=0, unit=unit, file=self.stream, disable=not self.stream.isatty(),
                                    dynamic_ncols=True, leave=True)

    def set_total(self, n: int) -> None:
        self.bar.reset(total=n)

    def __call__(self, i: int, path: Path) -> None:
        self.bar.update(1)
        if self.bar.total and self.bar.n >= self.bar.total:
            self.bar.close()

    def close(self) -> None:
        self.bar.close()
