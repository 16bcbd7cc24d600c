"""Rebuild v1 telemetry from raw probe recordings by playing them through the real daemon.

Why: the shipped model must be reproducible from what the repository keeps (the raw 1 Hz
recordings, ``wattclass/data/h200/raw`` and ``collected``), and its training windows must be the
windows the production daemon writes -- same window splitting at job boundaries, same GPM
snapshots per period, same attribution. So instead of a separate converter we run
``telemetry.daemon.Daemon`` with the replay backend on a virtual clock (``--once``) into a
temporary data root, exactly like ``wattclass telemetry run --backend replay:DIR --once``.
Nothing generated is kept: callers pass a temporary folder.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from wattclass.errors import DataError

log = logging.getLogger(__name__)

#: Host name written into replayed rows (one fixed name so rebuilt files are comparable).
REPLAY_HOST = "replay-h200"
#: The energy counter is read at every second window close in a replay, whatever the daemon's
#: default (3 since 2026-12-01). Why: the bundled recordings are replayed into the windows the
#: shipped model is trained and evaluated on, and those were built at 2 (the default then); a
#: replay that followed the default moved the windows' energies in their last bits and the
#: rebuilt model away from the shipped one (issue 13: byte-reproducible from the recordings).
REPLAY_ENERGY_EVERY_WINDOWS = 2


def is_recording(path: Path) -> bool:
    """True for a folder in the probe format (``<part>_samples_1hz.parquet`` files)."""
    p = Path(path)
    return p.is_dir() and any(p.glob("*_samples_1hz.parquet"))


#: The daemon's log lines of a GPU that stops and comes back (telemetry/daemon.py), by format.
_GPU_GAP_FORMATS = ("GPU %d (%s) failed: ", "GPU %d (%s) still failing after ",
                    "GPU %d (%s) answers again after ")


class _RecordingGaps(logging.Filter):
    """Drops the daemon's lines of a GPU that fails and answers again (``_GPU_GAP_FORMATS``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (isinstance(record.msg, str) and record.msg.startswith(_GPU_GAP_FORMATS))


@contextmanager
def _quiet_telemetry_log() -> Iterator[None]:
    """Keep the replayed daemon's GPU-failure ERRORs out of the caller's log.

    Why: a recording folder holds GPUs recorded over different spans (one GPU's parts start
    minutes after the other's), so the replayed daemon meets "no recorded data" on that GPU and
    logs "GPU 1 failed ... still failing after 300 s": gaps in a bundled recording, not a GPU of
    this site, yet they landed in ``wattclass demo``'s output and in the journal of every nightly
    that rebuilt its base training set. Only those are dropped (a filter on the daemon's logger):
    the WAL's ERRORs about rows damaged or lost come with exit status 0, so they must stay in the
    log; a replay that leaves data unconverted fails (DataError)."""
    daemon_log = logging.getLogger("wattclass.telemetry.daemon")
    gaps = _RecordingGaps()
    daemon_log.addFilter(gaps)
    try:
        yield
    finally:
        daemon_log.removeFilter(gaps)


def replay_recording(raw_dir: Path, data_root: Path, host: str = REPLAY_HOST) -> Path:
    """Play one probe-format folder through the daemon into ``data_root``; returns ``data_root``.

    Raises DataError naming the folder if the daemon did not convert everything to Parquet.
    """
    from wattclass.gpu import open_backend
    from wattclass.telemetry.daemon import Daemon, DaemonConfig

    raw_dir = Path(raw_dir)
    if not is_recording(raw_dir):
        raise DataError(f"{raw_dir}: not a probe recording (no *_samples_1hz.parquet files)")
    cfg = DaemonConfig(data_root=Path(data_root), host=host, once=True,
                       energy_every_windows=REPLAY_ENERGY_EVERY_WINDOWS)
    backend = open_backend(f"replay:{raw_dir}", realtime=False)
    with backend, _quiet_telemetry_log():
        rc = Daemon(backend, cfg).run()
    if rc != 0:
        raise DataError(f"{raw_dir}: replay through the telemetry daemon left WAL data unconverted")
    return Path(data_root)


def materialize(sources: Sequence[Path], tmp: Path) -> list[Path]:
    """Each source as v1 telemetry: recordings are replayed under ``tmp/<folder name>``.

    Other sources (v1 files, data roots) pass through. The replayed data root is named after the
    recording folder so training's job-key namespace (``<source>:<job_id>``) stays stable.
    """
    out: list[Path] = []
    for src in sources:
        s = Path(src)
        if is_recording(s):
            root = Path(tmp) / s.resolve().name
            if root.exists():
                raise DataError(f"{s}: two recordings named {s.name!r}; rename one")
            out.append(replay_recording(s, root))
        else:
            out.append(s)
    return out
