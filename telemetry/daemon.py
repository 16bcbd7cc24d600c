"""The poll loop: backend -> attribution -> windows -> WAL -> Parquet.

One thread does everything, on a grid of ``poll_s`` in the backend's clock (wall clock, or the
recording's on replay): poll each GPU, close the windows that poll completes, append them to
the WAL (one fsync per poll that closed anything), roll the WAL into Parquet when the roll
period turns over, and retry rolls that failed (disk full) without ever dropping the WAL.
Windows whose WAL append failed stay in memory and go first into the next append (tried every
``wal_retry_s`` while it fails, with new windows joining them in between); while any
are held, or a segment waits for its Parquet file, the daemon says so (ERROR log, the
``wattclass_wal_*`` metrics), and it exits non-zero if any remain unpersisted at stop. Stopping
never gives up half-way: whatever fails while the last windows are written, the rest of the stop
runs (roll, lock release) and rows not in the WAL are reported LOST (ERROR, exit code 1).
The WAL folder is locked (``wattclass.lockfile``) for the daemon's life: a second daemon on the
same folder would convert and delete the first one's open segment, so it refuses to start.
A GPU that errors is logged once (and again every few minutes while it stays down) and retried
at the next poll, or after 1, 2, 4... polls (at least every 10 s) when its failed calls were slow
(``gpudown``); the other GPUs go on.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from wattclass.errors import ConfigError, GpuError
from wattclass.fsutil import ensure_writable_dir, fsync_dir
from wattclass.gpu.base import GpmMetrics, GpuBackend, GpuInfo
from wattclass.jobmap import JobAssignment, JobMapReader
from wattclass.lockfile import FolderLock
from wattclass.telemetry import wal
from wattclass.telemetry.attribution import Attributor
from wattclass.telemetry.gpudown import DownGpus
from wattclass.telemetry.sink import ParquetSink
from wattclass.telemetry.splitter import Splitter, is_composite
from wattclass.telemetry.windows import Row, WindowBuilder

if TYPE_CHECKING:  # prometheus_client is only needed with --metrics-port
    from wattclass.telemetry.metrics import Health, LatestWindows

log = logging.getLogger(__name__)

#: Appended to the name of a WAL segment that cannot be converted (no longer a segment name).
BAD_SUFFIX = ".bad"

#: Read the energy counter at every 3rd window close (30 s with 10 s windows). Why: the read costs
#: 3.5-6 ms of CPU on an H200 against about 0.2 ms for every other field of a poll, so at every
#: 2nd close it was a quarter of the daemon's CPU, and a one-GPU node sat at the 1 ms line (1.02
#: ms over 22 minutes, issue 15). The job energies split between reads lose nothing measurable
#: (every 3rd: 0.16 % median, 0.91 % max per recorded job; every 2nd: 0.15 %, 1.01 %;
#: docs/benchmarks.md, "Energy split at job changes"); the price is latency: a window reaches the
#: WAL and the exporter up to 20 s after it ends.
DEFAULT_ENERGY_EVERY_WINDOWS = 3


@dataclass
class DaemonConfig:
    data_root: Path
    host: str
    period_s: float = 10.0
    poll_s: float = 1.0
    wal_dir: Path | None = None
    roll_s: float = 3600.0
    retry_s: float = 30.0
    once: bool = False
    job_spool: Path | None = None
    proc_root: Path = Path("/proc")
    #: At stop, how long to keep retrying a WAL append that fails (disk full) before giving up.
    stop_retry_s: float = 10.0
    #: While WAL appends fail (disk full), how often the held rows are written again (s).
    wal_retry_s: float = 5.0
    #: Read the energy counter at every N-th window close (telemetry.windows, "sparse energy").
    #: 3 (DEFAULT_ENERGY_EVERY_WINDOWS): a third of the reads of 1 for the same per-job accuracy
    #: on the H200 recordings (0.15-0.16 % median, ~1 % worst job: docs/benchmarks.md, "Energy
    #: split at job changes"); windows come out up to two windows (20 s) late.
    energy_every_windows: int = DEFAULT_ENERGY_EVERY_WINDOWS

    def check(self) -> None:
        """ConfigError (exit 2, "bad configuration or usage"): these are the sysadmin's options.
        ``wattclass telemetry run`` calls it before it makes the data root (and the Daemon again)."""
        if not (self.period_s > 0 and self.poll_s > 0 and self.period_s >= self.poll_s):
            raise ConfigError(
                f"--period ({self.period_s}) must be >= --poll ({self.poll_s}) and both > 0"
            )
        if self.energy_every_windows < 1:
            raise ConfigError(f"--energy-every-windows must be >= 1, not {self.energy_every_windows}")
        if not self.roll_s > 0:  # the roll epoch is now / roll_s: 0 divided by zero at the first poll
            raise ConfigError(f"--roll-seconds must be > 0, not {self.roll_s}")

    def resolved_wal_dir(self) -> Path:
        return self.wal_dir if self.wal_dir is not None else Path(self.data_root) / "wal" / self.host


@dataclass
class Stats:
    """CPU-time accounting for the overhead benchmark (thread time, seconds).

    GPU polls fall in three kinds: cheap (no energy counter, possibly a window closed and held
    for its counter read), energy (counter read, no rows out: a gap, the first poll) and window
    closes (counter read, rows out).
    """

    polls: int = 0
    gpu_polls: int = 0  # cheap polls
    poll_cpu_s: float = 0.0
    energy_polls: int = 0
    energy_poll_cpu_s: float = 0.0
    closes: int = 0
    close_cpu_s: float = 0.0
    energy_reads: int = 0
    wal_appends: int = 0
    wal_cpu_s: float = 0.0
    rolls: int = 0  # WAL segments converted to Parquet
    roll_cpu_s: float = 0.0
    rows: int = 0
    energy_j: float = 0.0
    gpu_errors: int = 0
    nonfinite_readings: int = 0  # NaN/inf GPU readings taken as missing (telemetry.readings)
    nonfinite_values: int = 0  # row values the WAL wrote as null (telemetry.wal.scrub)

    def summary(self) -> str:
        """One line for the log at stop: counts and mean thread CPU per kind of GPU poll (the
        live benchmark reads it to say where the daemon's CPU went without a profiler)."""

        def ms(cpu_s: float, n: int) -> str:
            return f"{cpu_s * 1e3 / n:.3f}" if n else "-"

        return (f"polls={self.polls} cheap={self.gpu_polls}x{ms(self.poll_cpu_s, self.gpu_polls)}ms "
                f"energy={self.energy_polls}x{ms(self.energy_poll_cpu_s, self.energy_polls)}ms "
                f"close={self.closes}x{ms(self.close_cpu_s, self.closes)}ms "
                f"reads={self.energy_reads} wal={self.wal_appends}x{ms(self.wal_cpu_s, self.wal_appends)}ms "
                f"roll={self.rolls}x{ms(self.roll_cpu_s, self.rolls)}ms "
                f"nonfinite={self.nonfinite_readings}/{self.nonfinite_values}")


class Daemon:
    def __init__(
        self,
        backend: GpuBackend,
        cfg: DaemonConfig,
        sink: ParquetSink | None = None,
        collector: LatestWindows | None = None,
        stop: threading.Event | None = None,
    ) -> None:
        cfg.check()
        self.backend = backend
        self.cfg = cfg
        self.stop = stop or threading.Event()
        self.sink = sink or ParquetSink(cfg.data_root)
        self.collector = collector
        # A shared or MIG GPU's composite segment is split per job with the window's own
        # activity (telemetry.splitter), so its window never waits for a later counter read.
        self.builder = WindowBuilder(cfg.host, cfg.period_s, cfg.poll_s,
                                     energy_every_windows=cfg.energy_every_windows,
                                     exact_key=is_composite)
        jobmap = JobMapReader(cfg.job_spool) if cfg.job_spool is not None else None
        self.attributor = Attributor(backend, jobmap, cfg.proc_root)
        self.splitter = Splitter(backend, self.attributor)
        self.wal_dir = cfg.resolved_wal_dir()
        self.writer = wal.WalWriter(self.wal_dir)
        self.lock = FolderLock(self.wal_dir, "telemetry daemon")
        self.pending_segments: list[Path] = []
        self.set_aside: list[Path] = []  # segments that cannot become Parquet (``_set_aside``)
        self.lost_at_stop = 0  # GPUs whose last windows could not even be closed at stop
        self.stats = Stats()
        self.down = DownGpus(cfg.poll_s)  # failing GPUs and when each is tried again
        self._next_retry = 0.0
        self._next_wal_retry = 0.0  # monotonic: when a failing WAL append is tried again
        self._roll_epoch: int | None = None
        self.gpus: list[GpuInfo] = []

    # -- start-up ---------------------------------------------------------------------------------
    def prepare(self) -> None:
        """Check folders, clean temp files, convert an unfinished WAL from a previous run."""
        ensure_writable_dir(Path(self.cfg.data_root) / "telemetry", "data root")
        ensure_writable_dir(self.wal_dir, "WAL folder")
        self.lock.acquire()  # before touching any segment: another daemon may be writing them
        try:
            self.sink.clean_stale_temps(self.cfg.host)
            old = wal.list_segments(self.wal_dir)
            if old:
                log.info("replaying %d unfinished WAL segment(s) from %s", len(old), self.wal_dir)
            self.pending_segments.extend(old)
            self._convert_pending()
            self.gpus = self.backend.gpus()
            self.splitter.prepare(self.gpus)
        except BaseException:
            self.lock.release()
            raise
        if self.collector is not None:
            self.collector.health = self.health
            self.collector.set_default_caps(
                {g.uuid: g.power_limit_default_w for g in self.gpus if g.power_limit_default_w is not None})
        if not self.gpus:
            log.warning("backend %s reports no GPUs", self.backend.name)
        log.info("polling %d GPU(s) every %g s, %g s windows, host %s, data root %s",
                 len(self.gpus), self.cfg.poll_s, self.cfg.period_s, self.cfg.host, self.cfg.data_root)

    # -- one poll ---------------------------------------------------------------------------------
    def poll_once(self) -> list[Row]:
        rows: list[Row] = []
        self.stats.polls += 1
        for info in self.gpus:
            t0 = self.backend.now()
            if not self.down.due(info.gpu_index, t0):
                continue
            c0 = time.thread_time()
            try:
                # After an error the counter is read again at once, so the outage is one span.
                got, read = self._poll_gpu(info, force_energy=info.gpu_index in self.down)
            except GpuError as exc:
                self._gpu_failed(info, exc, t0)
                continue
            except Exception as exc:  # a bug, here or in a backend: the other GPUs go on
                if info.gpu_index not in self.down:
                    log.exception("GPU %d (%s): polling failed unexpectedly", info.gpu_index, info.uuid)
                self._gpu_failed(info, GpuError(f"{type(exc).__name__}: {str(exc)[:200]}"), t0)
                continue
            dt = time.thread_time() - c0
            if info.gpu_index in self.down:
                self.down.answered(info, self.backend.now())
            if got:
                self.stats.closes += 1
                self.stats.close_cpu_s += dt
            elif read:
                self.stats.energy_polls += 1
                self.stats.energy_poll_cpu_s += dt
            else:
                self.stats.gpu_polls += 1
                self.stats.poll_cpu_s += dt
            rows += got
        return rows

    def _poll_gpu(self, info: GpuInfo, force_energy: bool = False) -> tuple[list[Row], bool]:
        """Poll one GPU: cheap fields, job, then the energy counter only where the builder
        needs it (window close, gap, first poll; not a job change) or ``force_energy``.

        Returns the closed rows and whether the counter was read.
        """
        i = info.gpu_index
        sample = self.backend.sample(i)
        # A GPU several jobs hold (shards, MPS, MIG) gets one composite job per set of jobs;
        # the splitter gathers their activity and splits the closed rows per job.
        job, jobs = self.splitter.job_key(info)
        read = force_energy or self.builder.needs_energy(info, sample, job)
        if read:
            sample = sample._replace(energy_mj=self.backend.energy_mj(i))
            self.stats.energy_reads += 1
        gpm: object | None = None
        gpm_point = self.builder.needs_gpm(info, sample, job)
        if info.gpm_supported and gpm_point:
            try:
                gpm = self.backend.gpm_snapshot(i)
            except GpuError as exc:
                log.debug("GPU %d: GPM snapshot failed: %s", i, exc)
        self.splitter.observe(info, sample.ts, job, jobs, gpm_point)
        rows = self.builder.add(info, sample, job, gpm, self._gpm_fn(info))
        return self.splitter.split(info, rows), read

    def _gpm_fn(self, info: GpuInfo):  # type: ignore[no-untyped-def]
        def fn(first: object, second: object) -> GpmMetrics:
            return self.backend.gpm_metrics(info.gpu_index, first, second)

        return fn

    def _gpu_failed(self, info: GpuInfo, exc: Exception, t0: float) -> None:
        """GPU ``info``'s poll begun at ``t0`` (backend clock) failed: how long it took decides
        when it is tried again (``DownGpus.failed``)."""
        self.stats.gpu_errors += 1
        now = self.backend.now()
        self.down.failed(info, exc, now, took_s=now - t0)

    # -- durability -------------------------------------------------------------------------------
    def record(self, rows: list[Row]) -> None:
        """Append closed windows to the WAL (fsynced) and publish them.

        While appends fail, the held rows are written again at most every ``wal_retry_s`` (the
        stop's last attempts clear ``_next_wal_retry``); in between new rows join them in memory.
        Why: each attempt encodes every held row, so retrying at every poll cost CPU in
        proportion to the outage (1.4 s a poll after 17 hours of a full disk on 8 GPUs, the
        polls came late and the windows with them: review finding).
        """
        if not rows and not self.writer.pending:
            return
        now = time.monotonic()
        c0 = time.thread_time()
        if self.writer.pending and now < self._next_wal_retry:
            self.writer.hold(rows)
        else:
            if not self.writer.append(rows):
                self._next_wal_retry = now + self.cfg.wal_retry_s
            self.pending_segments.extend(self.writer.take_retired())
            self.stats.wal_appends += 1
        self.stats.wal_cpu_s += time.thread_time() - c0
        self.stats.rows += len(rows)
        self.stats.energy_j += sum(r["energy_j"] or 0.0 for r in rows)
        self.stats.nonfinite_readings = self.builder.nonfinite.count
        self.stats.nonfinite_values = self.writer.nonfinite_values
        if self.collector is not None and rows:
            jobs: dict[str, JobAssignment] = {}
            for uuid in {str(r["gpu_uuid"]) for r in rows if r.get("job_id")}:
                for a in self.attributor.assignments_for_uuid(uuid):
                    jobs[a.job_id] = a
            self.collector.update(
                rows,
                labels={j: (a.label, a.label_source or "unknown") for j, a in jobs.items() if a.label},
                accounts={j: a.account for j, a in jobs.items() if a.account},
            )
        self._publish_wal_state()

    def _publish_wal_state(self) -> None:
        if self.collector is not None:
            self.collector.set_wal_state(self.writer.write_errors, len(self.writer.pending),
                                         len(self.pending_segments))

    def unpersisted(self) -> tuple[int, int]:
        """(rows only in memory, WAL segments not yet in Parquet, set aside ones included); a GPU
        whose last windows could not be closed at stop counts as one row (their number is
        unknown)."""
        return (len(self.writer.pending) + self.writer.carry_rows + self.lost_at_stop,
                len(self.pending_segments) + len(self.set_aside))

    def health(self) -> Health:
        """What the exporter reports about the daemon itself."""
        from wattclass.telemetry.metrics import Health

        return Health(gpu_errors=self.stats.gpu_errors, nonfinite_readings=self.builder.nonfinite.count,
                      nonfinite_values=self.writer.nonfinite_values)

    def maybe_roll(self, now: float) -> None:
        epoch = math.floor(now / self.cfg.roll_s)
        if self._roll_epoch is None:
            self._roll_epoch = epoch
        elif epoch != self._roll_epoch and not self.writer.pending:
            self._roll_epoch = epoch
            self.roll()
        if self.pending_segments and now >= self._next_retry:
            self._convert_pending()
            if self.pending_segments:
                self._next_retry = now + self.cfg.retry_s

    def roll(self) -> None:
        seg = self.writer.roll()
        if seg is not None:
            self.pending_segments.append(seg)
        self._convert_pending()

    def _convert_pending(self) -> None:
        while self.pending_segments:
            seg = self.pending_segments[0]
            c0 = time.thread_time()
            try:
                self.sink.convert(seg)
                self.stats.rolls += 1
                self.stats.roll_cpu_s += time.thread_time() - c0
            except OSError as exc:
                if not (isinstance(exc, FileNotFoundError) and exc.filename is not None
                        and Path(exc.filename) == seg):
                    log.error("PARQUET WRITE FAILED for %s (%s): WAL segment kept, retry in %g s",
                              seg, exc.strerror or exc, self.cfg.retry_s)
                    return
                # The segment itself was removed by someone else (its folder deleted): retrying it
                # would hold every later segment back until a restart.
                log.error("WAL segment %s was removed before it reached Parquet; its rows are LOST "
                          "unless it was rescued while open", seg)
            except Exception as exc:  # the segment's content, not the disk: no retry can succeed
                if not self._set_aside(seg, exc):
                    return
            self.pending_segments.pop(0)
        self._publish_wal_state()

    def _set_aside(self, seg: Path, exc: Exception) -> bool:
        """Rename a segment that cannot become Parquet to ``<name>.bad`` (kept for the admin, no
        longer converted); False if even that fails (it stays first in the queue).

        Why: such a segment failed at every roll and every start, so the daemon crashed out of
        its poll loop and then at each restart, for good: no telemetry at all from one bad row
        (a job id of the wrong type; review finding). It counts as unpersisted (exit code 1)."""
        bad = seg.with_name(seg.name + BAD_SUFFIX)
        try:
            os.replace(seg, bad)
            fsync_dir(seg.parent)
        except OSError as err:
            log.error("WAL segment %s cannot be converted to Parquet (%s) nor set aside (%s); retry "
                      "in %g s", seg, str(exc)[:300], err.strerror or err, self.cfg.retry_s)
            return False
        self.set_aside.append(bad)
        log.error("WAL segment %s cannot be converted to Parquet (%s: %s); set aside as %s with its "
                  "rows, later segments go on", seg, type(exc).__name__, str(exc)[:300], bad.name)
        return True

    # -- main loop --------------------------------------------------------------------------------
    def run(self) -> int:
        """Poll until stopped (signal) or, with ``once``, until the backend runs out; then flush."""
        self.prepare()
        poll = self.cfg.poll_s
        t = math.ceil(self.backend.now() / poll) * poll
        try:
            while not self.stop.is_set():
                self.backend.sleep_until(t, self.stop)
                if self.stop.is_set():
                    break
                if self.backend.exhausted():
                    log.info("backend %s has no more data", self.backend.name)
                    break
                self.record(self.poll_once())
                self.maybe_roll(t)
                t += poll
                now = self.backend.now()
                if now - t > poll:  # overran (suspend, slow NVML): skip to the grid, not a burst
                    t = math.ceil(now / poll) * poll
                elif t - now > 2 * poll:  # the clock stepped back (NTP at boot): poll on from now
                    log.warning("the clock stepped back %.1f s; polling on from now", t - now)
                    t = math.ceil(now / poll) * poll
        finally:
            self.shutdown()
        return 0 if self.unpersisted() == (0, 0) else 1

    def shutdown(self) -> None:
        """Settle the energy of the last polls, close every open window, make it durable, roll
        everything to Parquet. Each step runs whatever the one before raised (module docstring)."""
        try:
            self._write_last_windows()
            try:
                self.roll()  # what is in the WAL is intact either way
            except Exception:
                log.exception("shutdown: closing the WAL segment failed; it is converted on next start")
            if self.writer.pending:
                log.error("shutdown: %d window row(s) could not be written to the WAL and are LOST; "
                          "exiting non-zero", len(self.writer.pending))
            if self.pending_segments:
                log.error("shutdown: %d WAL segment(s) not yet in Parquet, kept in %s; converted on "
                          "next start", len(self.pending_segments), self.wal_dir)
            if self.set_aside:
                log.error("shutdown: %d WAL segment(s) could not be converted to Parquet and were set "
                          "aside: %s", len(self.set_aside), ", ".join(str(p) for p in self.set_aside))
            log.info("stopped: %d window row(s), %.1f J", self.stats.rows, self.stats.energy_j)
            log.info("poll-loop CPU: %s", self.stats.summary())
        finally:
            self.lock.release()

    def _write_last_windows(self) -> None:
        """The last polls' rows into the WAL; rows that cannot be written stay in
        ``writer.pending`` (counted as LOST by ``shutdown``)."""
        rows: list[Row] = []
        for info in self.gpus:
            try:
                if self.builder.unsettled(info):  # one last poll with the counter (replay: same sample)
                    try:
                        rows += self._poll_gpu(info, force_energy=True)[0]
                    except GpuError as exc:
                        log.warning("GPU %d: final energy reading failed (%s); its last polls' energy "
                                    "is unknown", info.gpu_index, exc)
                if self.builder.has_open(info):
                    rows += self.splitter.split(info, self.builder.flush(info, self._gpm_final(info),
                                                                         self._gpm_fn(info)))
            except Exception:  # a bug must not cost the other GPUs' windows, nor the roll
                log.exception("shutdown: closing the windows of GPU %d failed; they are LOST",
                              info.gpu_index)
                self.lost_at_stop += 1
        deadline = time.monotonic() + self.cfg.stop_retry_s
        while True:
            try:
                self._next_wal_retry = 0.0  # now, not after wal_retry_s
                self.record(rows)
            except Exception:  # not a full disk (no exception: retried below); rows stay pending
                log.exception("shutdown: writing %d window row(s) to the WAL failed",
                              len(self.writer.pending))
                return
            rows = []
            if not self.writer.pending or time.monotonic() >= deadline:  # disk full: space may come back
                return
            time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))

    def _gpm_final(self, info: GpuInfo) -> object | None:
        if not info.gpm_supported:
            return None
        try:
            return self.backend.gpm_snapshot(info.gpu_index)
        except GpuError:
            return None
